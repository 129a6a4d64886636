"""syrupy glue for golden outputs compared by the sameness rule (spec/model.md §15).

``assert_same(actual, snapshot, compare)`` stores and recalls JSON snapshots as the plain
JSON extension does, but decides "matches" with ``compare`` (colibri.conformance's
golden_compare): exact everywhere except the kind-(b) fields, which get the model's
tolerance. ``--snapshot-update`` still rewrites a snapshot, and only one that no longer
matches, so a run on another CPU does not churn the committed values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from colibri.conformance.golden_compare import Comparison, FrameComparer, JsonComparer
from colibri.conformance.sameness import Tolerance
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

Compare = Callable[[Any, Any], Comparison]


def assert_same(actual: Any, snapshot: SnapshotAssertion, compare: Compare) -> Comparison:
    """Assert ``actual`` is the same as the stored snapshot under ``compare``."""
    outcome: list[Comparison] = []

    class SameJSON(JSONSnapshotExtension):
        def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
            result = compare(json.loads(serialized_data), json.loads(snapshot_data))
            outcome.append(result)
            return result.ok

    if not snapshot.use_extension(SameJSON) == actual:
        if outcome:
            pytest.fail(f"differs from the snapshot:\n{outcome[-1].report()}", pytrace=False)
        pytest.fail("no stored snapshot (run with --snapshot-update to write it)",
                    pytrace=False)
    return outcome[-1] if outcome else Comparison()


def frames(tolerance: Tolerance) -> Compare:
    """Engine transcripts (lists of normalised frame lines)."""
    comparer = FrameComparer(tolerance)

    def compare(actual: Sequence[str], expected: Sequence[str]) -> Comparison:
        return comparer.lines(list(actual), list(expected))

    return compare


def http(tolerance: Tolerance, schema: str | None) -> Compare:
    """Recorded HTTP exchanges (tests/support/http_transcript.py), bodies walked by ``schema``."""
    comparer = JsonComparer(tolerance)

    def compare(actual: Any, expected: Any) -> Comparison:
        return comparer.transcript(actual, expected, schema)

    return compare


def assert_same_as_file(actual: Any, stored: Path, compare: Compare) -> Comparison:
    """The same comparison against a snapshot of another family (read, never written)."""
    result = compare(actual, json.loads(stored.read_text(encoding="utf-8")))
    if not result.ok:
        pytest.fail(f"differs from {stored.name}:\n{result.report()}", pytrace=False)
    return result
