"""The conformance suite as pytest tests: every protocol case against the reference engine.

One test per case, so CI shows per-case verdicts. `must` failures fail the test; `should`
failures and capability skips are reported as skips with the reason. The engine is the
reference mux engine on the engine tests' fake model (fast); the real checkpoints run through
`colibri conformance` in tests/test_conformance_cli.py.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from colibri.conformance.cases import Case, load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL
from colibri.conformance.protocol_runner import ProtocolRunner
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_case

SUPPORT = Path(__file__).parent / "conformance_support"
ENGINE = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'mux_fake_model.py'))}"
CASES = load_cases("protocol")


@pytest.fixture(scope="module")
def runner() -> Iterator[ProtocolRunner]:
    executor = protocol_runner(ENGINE, SUPPORT / "fake-model", timeout=15.0)
    yield executor
    executor.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_protocol_case(runner: ProtocolRunner, case: Case) -> None:
    result = run_case(runner, case, Expectations(), reruns=0)
    if result.status == SKIP or result.status == XFAIL:
        pytest.skip(result.message)
    if result.status in (FAIL, ERROR):
        if case.level == "should":
            pytest.skip(f"should-level case failed: {result.message}")
        pytest.fail(result.message, pytrace=False)
    assert result.status == PASS
