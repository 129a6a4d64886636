"""How the pytest entry points turn one conformance Result into a pytest outcome."""

from __future__ import annotations

import pytest
from colibri.conformance.cases import Case
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL, Result


def assert_conformant(case: Case, result: Result) -> None:
    """Skips and expected failures skip; a failing `should` case skips with its reason
    (it is advisory by definition); a failing `must` case fails the test."""
    if result.status in (SKIP, XFAIL):
        pytest.skip(result.message)
    if result.status in (FAIL, ERROR):
        if case.level == "should":
            pytest.skip(f"should-level case failed: {result.message}")
        pytest.fail(result.message, pytrace=False)
    assert result.status == PASS
