"""The HTTP conformance cases as pytest tests, against `colibri serve`.

The server runs the reference engine on the embedded default model, which every checkout has:
if it does not start, every case fails with the error (never a fallback to a scripted engine,
which would let a broken engine pass). The suite starts the server itself (`--server-cmd`),
with an API key, so the auth, admission, Host and CORS cases that need their own server flags
run too.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from colibri.conformance.cases import Case, load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.http_runner import HttpRunner, http_runner
from colibri.conformance.http_target import HttpTargetError
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP
from colibri.conformance.runner import run_case, run_suite
from support.conformance_verdict import assert_conformant

SERVE = f"{shlex.quote(sys.executable)} -m colibri serve"
GENERIC = Path(__file__).parents[1] / "support" / "conformance_support" / "generic_openai_server.py"
CASES = load_cases("http")


@pytest.fixture(scope="module")
def runner() -> Iterator[HttpRunner]:
    try:
        executor = http_runner(None, SERVE, None, "conformance-key", timeout=30.0)
    except HttpTargetError as exc:
        pytest.fail(f"`colibri serve` with the reference engine did not start: {exc}",
                    pytrace=False)
    yield executor
    executor.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_http_case(runner: HttpRunner, case: Case) -> None:
    result = run_case(runner, case, Expectations(), reruns=0)
    assert_conformant(case, result)


def test_generic_openai_server_runs_the_portable_subset() -> None:
    """Capability probing: a server without colibri's extensions passes what applies to it
    and skips (never fails) the rest."""
    server = f"{shlex.quote(sys.executable)} {shlex.quote(str(GENERIC))} {{port}}"
    executor = http_runner(None, server, None, None, timeout=10.0)
    assert "colibri_ext" not in executor.capabilities
    assert "anthropic" not in executor.capabilities
    results = run_suite(executor, CASES, Expectations(), reruns=0)
    by_status: dict[str, list[str]] = {}
    for result in results:
        by_status.setdefault(result.status, []).append(result.case_id)
    assert by_status.get(FAIL, []) == [] and by_status.get(ERROR, []) == []
    assert {
        "http.models.list",
        "http.chat.basic",
        "http.chat.stream",
        "http.chat.validation.wrong-model",
        "http.chat.stop-sequence-cut",
    } <= set(by_status[PASS])
    assert "http.ops.metrics-format" in by_status[SKIP]


def test_a_started_colibri_server_is_held_to_colibri_capabilities() -> None:
    """A server the suite starts that says it is colibri but lost its extensions fails the
    cases needing them instead of skipping them (and the run exits non-zero)."""
    server = f"{shlex.quote(sys.executable)} {shlex.quote(str(GENERIC))} {{port}} --claims-colibri"
    executor = http_runner(None, server, None, None, timeout=10.0)
    try:
        assert {"colibri_ext", "metrics", "anthropic", "completions"} <= executor.capabilities
        metrics = next(c for c in CASES if c.id == "http.ops.metrics-format")
        result = run_case(executor, metrics, Expectations(), reruns=0)
    finally:
        executor.close()
    assert result.status == FAIL and result.blocking
