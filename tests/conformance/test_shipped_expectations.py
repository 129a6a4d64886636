"""The expectations files shipped for other engines (fixtures/targets/): each loads, names
only cases of the catalogue, and says for every known deviation which clause it breaks."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from colibri.conformance.cases import cases_dir
from colibri.conformance.expectations import Expectations
from colibri.conformance.target_file import TargetDescription

TARGETS = Path(__file__).parents[2] / "fixtures" / "targets"
EXPECTATION_FILES = sorted(TARGETS.glob("*.expectations.json"))
#: A reason names the clause it departs from: a spec section, a spec file or a public API
#: reference (the HTTP profiles cite those).
CLAUSE = re.compile(r"§|\.md\b|API reference")


@functools.cache
def _catalogue() -> frozenset[str]:
    """Every case id (read straight from the case files: their schema has its own tests)."""
    files = sorted(cases_dir().glob("*/*.json"))
    return frozenset(c["id"] for f in files for c in json.loads(f.read_text(encoding="utf-8")))


def test_there_are_shipped_expectation_files() -> None:
    assert EXPECTATION_FILES, f"no *.expectations.json in {TARGETS}"


@pytest.mark.parametrize("path", EXPECTATION_FILES, ids=lambda p: p.name)
def test_expectations_name_catalogue_cases_with_a_clause_and_a_reason(path: Path) -> None:
    expectations = Expectations.load(path)  # statuses and non-empty reasons are checked here
    assert expectations.target.strip(), f"{path.name} does not say which target it describes"
    assert expectations.cases, f"{path.name} lists no case"
    assert expectations.unknown_ids(set(_catalogue())) == []
    for case_id, entry in expectations.cases.items():
        assert CLAUSE.search(entry.reason), f"{case_id}: the reason names no clause"


@pytest.mark.parametrize("path", sorted(TARGETS.glob("*.target.json")), ids=lambda p: p.name)
def test_target_descriptions_point_at_shipped_expectations(path: Path) -> None:
    description = TargetDescription.load(path)
    named = json.loads(path.read_text(encoding="utf-8")).get("expectations")
    if named is not None:
        assert description.expectations is not None and description.expectations.is_file()
