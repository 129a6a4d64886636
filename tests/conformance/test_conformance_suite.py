"""The conformance suite as pytest tests: every protocol case against `colibri engine` on
the glm5-tiny fixture (ids=1 payloads) and on the default chat model (text payloads), and
against `colibri engine --accelerated` on glm5-tiny (skipped only while `make build` has not
built the accelerated engine's C library).

Both targets run once, side by side (each on a few engines, `run_parallel`), the first time a
test needs a verdict; each test then reports its case: `must` failures fail, `should`
failures fail too (the reference must meet them); capability skips skip with their reason.
"""

from __future__ import annotations

import functools
import shlex
import sys
import threading
from typing import Any

import pytest
from colibri.conformance.capabilities import CODEC, SERVE_CODEC
from colibri.conformance.cases import Case, load_cases
from colibri.conformance.engine import EngineError
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import PASS, SKIP, Result
from colibri.conformance.profile_report import lacking, profile_counts
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_parallel
from support.accelerated_support import BUILT, NOT_BUILT_REASON
from support.conformance_verdict import assert_conformant

from colibri.resources import fixture_model_dir

ENGINE = f"{shlex.quote(sys.executable)} -m colibri engine"
ENGINES = {"reference": ENGINE, "accelerated": ENGINE + " --accelerated"}
#: (engine, model) pairs; a target's id is "model" on the reference, "accelerated:model" else.
# glm5-chat-tiny: the chat fixture the golden cases were recorded on (the default model until
# glm5-chat-small; the cases pin the engines, not the default model's answers).
TARGETS = ["glm5-tiny", "glm5-chat-tiny", "accelerated:glm5-tiny"]
CASES = load_cases("protocol")


def _split(target: str) -> tuple[str, str]:
    engine, _, model = target.rpartition(":")
    return engine or "reference", model


def _target_params() -> list[object]:
    unbuilt = pytest.mark.skipif(not BUILT, reason=NOT_BUILT_REASON or "built")
    return [pytest.param(t, marks=unbuilt) if t.startswith("accelerated:") else t
            for t in TARGETS]


def _run_target(target: str) -> dict[str, Result] | str:
    engine, model = _split(target)
    if engine == "accelerated" and not BUILT:
        return NOT_BUILT_REASON
    directory = fixture_model_dir(model)
    try:
        runner = protocol_runner(ENGINES[engine], directory, timeout=30.0)
    except EngineError as exc:
        return f"colibri engine ({engine}) cannot serve {model}: {exc}"
    results = run_parallel(runner, CASES, Expectations(), reruns=0, jobs=2)
    return {r.case_id: r for r in results}


@functools.cache
def _verdicts() -> dict[str, dict[str, Result] | str]:
    verdicts: dict[str, dict[str, Result] | str] = {}

    def run(model: str) -> None:
        verdicts[model] = _run_target(model)

    threads = [threading.Thread(target=run, args=(m,)) for m in TARGETS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return verdicts


@pytest.mark.parametrize("model", _target_params())
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_protocol_case(model: str, case: Case) -> None:
    outcome = _verdicts()[model]
    if isinstance(outcome, str):
        # Every target is a committed fixture on a built engine: not starting is a failure.
        pytest.fail(outcome, pytrace=False)
    result = outcome[case.id]
    assert_conformant(case, result)


def _fixture_models() -> list[str]:
    root = fixture_model_dir("glm5-tiny").parent
    return sorted(p.name for p in root.iterdir() if (p / "oracle.json").is_file())


#: The golden cases that read ids and logprobs; the byte-level one has its own test below.
GOLDEN = [c for c in CASES if c.area == "golden" and "byte_tokenizer" not in c.requires]


def _golden_targets() -> list[Any]:
    built = pytest.mark.skipif(not BUILT, reason=NOT_BUILT_REASON or "built")
    return [pytest.param(model, "reference", id=f"{model}-reference")
            for model in _fixture_models()] + [
        pytest.param(model, "accelerated", id=f"{model}-accelerated", marks=built)
        for model in _fixture_models()]


@pytest.mark.parametrize(("model", "engine"), _golden_targets())
def test_golden_cases_on_every_fixture_model(model: str, engine: str) -> None:
    """Greedy tokens and teacher-forced argmaxes match each fixture's oracle.json (quantized
    containers included) on both engines; the capabilities are known, so no handshake probe
    is needed."""
    runner = protocol_runner(
        ENGINES[engine],
        fixture_model_dir(model),
        timeout=30.0,
        capabilities={"mux", "oracle", "logprobs", "ids"},
    )
    results = run_parallel(runner, GOLDEN, Expectations(), reruns=0, jobs=1)
    assert {r.case_id: r.status for r in results} == dict.fromkeys((c.id for c in GOLDEN), PASS), [
        r.message for r in results if r.status != PASS
    ]


@pytest.mark.parametrize("area", ["echo_at", "stats"])
def test_the_reference_runs_the_extension_cases(area: str) -> None:
    """echo_at and the STATS dump are probed (CAPS, a dump at exit), not assumed: on the
    reference engine with a tokenizer every such case must run and pass, never skip."""
    outcome = _verdicts()["glm5-chat-tiny"]  # the chat target (a tokenizer) of TARGETS
    assert not isinstance(outcome, str), outcome
    ids = [c.id for c in CASES if c.area == area]
    assert ids and {i: outcome[i].status for i in ids} == dict.fromkeys(ids, PASS)


def test_the_reference_is_reported_lacking_the_serve_codec_dialect() -> None:
    """colibri engine speaks the GLM dialect (protocol.md §2), not the family engines' (§5):
    every serve_codec case is skipped for the dialect's capabilities, none fails."""
    outcome = _verdicts()["glm5-tiny"]
    assert not isinstance(outcome, str), outcome
    results = list(outcome.values())
    codec = [r for r in results if r.profile == SERVE_CODEC]
    assert codec and all(r.status == SKIP and r.lacks and set(r.lacks) <= CODEC for r in codec)
    assert CODEC <= set(lacking(results))
    assert profile_counts(results)[SERVE_CODEC] == {PASS: 0, "fail": 0, "xfail": 0,
                                                    SKIP: len(codec)}


BYTES_GOLDEN = [c for c in CASES if c.id == "protocol.golden.oracle-greedy-bytes"]


@pytest.mark.parametrize("engine", [
    "reference",
    pytest.param("accelerated", marks=pytest.mark.skipif(not BUILT,
                                                         reason=NOT_BUILT_REASON or "built")),
])
@pytest.mark.parametrize("model", [m for m in _fixture_models() if not any(
    (fixture_model_dir(m) / name).is_file() for name in ("tokenizer.json", "tiktoken.model"))])
def test_greedy_data_bytes_match_the_oracle_through_the_byte_tokenizer(
    model: str, engine: str
) -> None:
    """The core golden case, which needs neither ids=1 nor logprobs, on every fixture model
    without a tokenizer: the engine is driven through the generated byte-level tokenizer."""
    runner = protocol_runner(
        ENGINES[engine], fixture_model_dir(model), prompts="bytes", timeout=30.0,
        capabilities={"mux", "oracle", "byte_tokenizer"},
    )
    results = run_parallel(runner, BYTES_GOLDEN, Expectations(), reruns=0, jobs=1)
    assert [(r.status, r.message) for r in results] == [(PASS, "")]


#: The cases that need an MTP head: no target of TARGETS has one, so they run here.
MTP_CASES = [c for c in CASES if "mtp" in c.requires]


@pytest.mark.parametrize("engine", [
    "reference",
    pytest.param("accelerated", marks=pytest.mark.skipif(not BUILT,
                                                         reason=NOT_BUILT_REASON or "built")),
])
def test_mtp_cases_run_and_pass_on_the_mtp_fixture(engine: str) -> None:
    """The engine announces MTP drafting for a model with an MTP head (CAPS), so every MTP
    case must run there and pass: none may skip for a missing capability."""
    runner = protocol_runner(ENGINES[engine], fixture_model_dir("glm5-tiny-mtp"), timeout=30.0)
    assert "mtp" in runner.capabilities
    results = run_parallel(runner, MTP_CASES, Expectations(), reruns=0, jobs=1)
    assert MTP_CASES and {r.case_id: r.status for r in results} == dict.fromkeys(
        (c.id for c in MTP_CASES), PASS), [r.message for r in results if r.status != PASS]
