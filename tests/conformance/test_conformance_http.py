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
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, Result
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


def test_the_served_default_model_counts_tokens(runner: HttpRunner) -> None:
    """count_tokens is probed (a server may not know its engine's tokenizer); `colibri serve`
    on the default model knows it, so its count_tokens cases run instead of skipping."""
    assert "count_tokens" in runner.capabilities


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_http_case(runner: HttpRunner, case: Case) -> None:
    result = run_case(runner, case, Expectations(), reruns=0)
    assert_conformant(case, result)


def _generic(*flags: str) -> HttpRunner:
    server = f"{shlex.quote(sys.executable)} {shlex.quote(str(GENERIC))} {{port}} {' '.join(flags)}"
    return http_runner(None, server, None, None, timeout=10.0)


def _by_status(results: list[Result]) -> dict[str, set[str]]:
    by_status: dict[str, set[str]] = {}
    for result in results:
        by_status.setdefault(result.status, set()).add(result.case_id)
    return by_status


def test_generic_openai_server_is_judged_on_the_openai_profile() -> None:
    """A server without colibri's extensions that does what OpenAI documents passes every
    `openai` case that applies to it (all but the completions and auth ones it has no
    endpoint or key for) and skips, never fails, the `anthropic` and `colibri` profiles."""
    executor = _generic()
    assert "colibri_ext" not in executor.capabilities
    assert "anthropic" not in executor.capabilities
    results = run_suite(executor, CASES, Expectations(), reruns=0)
    by_status = _by_status(results)
    assert by_status.get(FAIL, set()) == set() and by_status.get(ERROR, set()) == set()
    openai = {c.id for c in CASES if c.profile == "openai"}
    inapplicable = {c.id for c in CASES if c.requires & {"completions", "auth"}}
    assert openai - inapplicable <= by_status[PASS]
    assert {c.id for c in CASES if c.profile in ("anthropic", "colibri")} <= by_status[SKIP]


def test_the_openai_profile_catches_a_lenient_server() -> None:
    """The divergences measured on llama.cpp's server (no request validation, no usage
    chunk) fail `openai` cases; before profiles they were colibri-only skips."""
    executor = _generic("--lenient")
    chosen = [c for c in CASES if c.profile == "openai"]
    by_status = _by_status(run_suite(executor, chosen, Expectations(), reruns=0))
    errors = {c.id for c in chosen if c.id.startswith("http.openai.errors.")}
    caught = errors - {"http.openai.errors.invalid-json", "http.openai.errors.unknown-path"}
    assert caught | {"http.openai.stream.include-usage"} <= by_status[FAIL]
    assert "http.openai.chat.object" in by_status[PASS]


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
