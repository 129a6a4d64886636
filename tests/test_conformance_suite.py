"""The conformance suite as pytest tests: every protocol case against `colibri engine` on
the glm5-tiny fixture (ids=1 payloads) and on the default chat model (text payloads).

One test per case and target, so CI shows per-case verdicts: `must` failures fail the test,
`should` failures and capability skips are reported as skips with their reason.
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Iterator

import pytest
from colibri.conformance.cases import Case, load_cases
from colibri.conformance.engine import EngineError
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL
from colibri.conformance.protocol_runner import ProtocolRunner
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_case

from colibri.resources import DEFAULT_MODEL_NAME, fixture_model_dir

ENGINE = f"{shlex.quote(sys.executable)} -m colibri engine"
TARGETS = ["glm5-tiny", DEFAULT_MODEL_NAME]
CASES = load_cases("protocol")


@functools.cache
def _runner(model: str) -> ProtocolRunner | str:
    """The runner for a model, or why it cannot run (a model not committed yet)."""
    directory = fixture_model_dir(model)
    if not (directory / "config.json").is_file():
        return f"fixture model {model} is not in this checkout"
    try:
        return protocol_runner(ENGINE, directory, timeout=30.0)
    except EngineError as exc:
        return f"colibri engine cannot serve {model}: {exc}"


@pytest.fixture(scope="module", autouse=True)
def _close_runners() -> Iterator[None]:
    yield
    for model in TARGETS:
        runner = _runner(model)
        if isinstance(runner, ProtocolRunner):
            runner.close()


@pytest.mark.parametrize("model", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_protocol_case(model: str, case: Case) -> None:
    runner = _runner(model)
    if isinstance(runner, str):
        if model == "glm5-tiny":
            pytest.fail(runner)
        pytest.skip(runner)
    result = run_case(runner, case, Expectations(), reruns=0)
    if result.status in (SKIP, XFAIL):
        pytest.skip(result.message)
    if result.status in (FAIL, ERROR):
        if case.level == "should":
            pytest.skip(f"should-level case failed: {result.message}")
        pytest.fail(result.message, pytrace=False)
    assert result.status == PASS
