"""The expectations files shipped for other engines (fixtures/targets/): each loads, names
only cases of the catalogue, and says for every known deviation which clause it breaks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from colibri.conformance.cases import load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.target_file import TargetDescription

TARGETS = Path(__file__).parents[2] / "fixtures" / "targets"
EXPECTATION_FILES = sorted(TARGETS.glob("*.expectations.json"))
#: A reason names the clause it departs from: a spec section, a spec file or a public API
#: reference (the HTTP profiles cite those).
CLAUSE = re.compile(r"§|\.md\b|API reference")


def test_there_are_shipped_expectation_files() -> None:
    assert EXPECTATION_FILES, f"no *.expectations.json in {TARGETS}"


@pytest.mark.parametrize("path", EXPECTATION_FILES, ids=lambda p: p.name)
def test_expectations_name_catalogue_cases_with_a_clause_and_a_reason(path: Path) -> None:
    expectations = Expectations.load(path)  # statuses and non-empty reasons are checked here
    assert expectations.target.strip(), f"{path.name} does not say which target it describes"
    assert expectations.cases, f"{path.name} lists no case"
    known = {c.id for suite in ("protocol", "http") for c in load_cases(suite)}
    assert expectations.unknown_ids(known) == []
    for case_id, entry in expectations.cases.items():
        assert CLAUSE.search(entry.reason), f"{case_id}: the reason names no clause"


@pytest.mark.parametrize("path", sorted(TARGETS.glob("*.target.json")), ids=lambda p: p.name)
def test_target_descriptions_point_at_shipped_expectations(path: Path) -> None:
    description = TargetDescription.load(path)
    named = json.loads(path.read_text(encoding="utf-8")).get("expectations")
    if named is not None:
        assert description.expectations is not None and description.expectations.is_file()
