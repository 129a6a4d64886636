"""The engine on the real fixture models (the reference engine behind the protocol)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from colibri.conformance.sameness import Tolerance
from support.engine_harness import EngineRun, ids, run_engine, submit, transcript
from support.engine_waves import comparable, serve_mux_check
from support.golden_snapshots import assert_same, frames
from syrupy.assertion import SnapshotAssertion
from test_engine_batching import assert_mux_check

from colibri import resources

TINY = resources.fixture_model_dir("glm5-tiny")
MTP = resources.fixture_model_dir("glm5-tiny-mtp")
DSA = resources.fixture_model_dir("glm5-tiny-dsa")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]


def _real(model_dir: Path, ctx: int = 256):  # type: ignore[no-untyped-def]
    def runner(waves: list[bytes], slots: int) -> EngineRun:
        return run_engine(waves, kv_slots=slots, ctx=ctx, model_dir=model_dir)

    return runner


@pytest.mark.parametrize("model_dir", [TINY, DSA], ids=["glm5-tiny", "glm5-tiny-dsa"])
def test_serve_mux_check_on_real_models(model_dir: Path) -> None:
    check = serve_mux_check(_real(model_dir), 4, 256)
    assert check.cancelled is not None
    assert_mux_check(check)


def test_greedy_matches_the_oracle() -> None:
    import json

    oracle = json.loads((TINY / "oracle.json").read_text())
    prompt = oracle.get("prompt_ids", PROMPT)
    full = oracle.get("full_ids") or oracle.get("greedy_ids")
    run = run_engine(
        [submit(1, 0, ids(*prompt), len(full) - len(prompt), ext="ids=1")], model_dir=TINY
    )
    out = [int(f.payload or b"") for f in run.for_id(1) if f.kind == "DATA"]
    assert prompt + out == full[: len(prompt) + len(out)]
    assert len(prompt) + len(out) == len(full)


TINY_GOLDEN = [
    submit(1, 0, ids(*PROMPT), 6, ext="ids=1 logprobs=3")
    + submit(2, 1, ids(*PROMPT[:5]), 5, temperature="0.8", top_p="0.9", ext="ids=1 seed=7")
    + b"STOP 2\n",
    submit(3, 0, ids(*PROMPT, 1, 2), 3, ext="ids=1") + b"CANCEL 9\nSUBMIT 4 0 1 1 0 1\n",
]


def test_golden_transcript_glm5_tiny(snapshot_json: SnapshotAssertion) -> None:
    run = run_engine(TINY_GOLDEN, kv_slots=2, model_dir=TINY, env={"SERVE_TOPK": "1"})
    # Logprobs go through BLAS: kind (b), within the model's tolerance; all else exact.
    assert_same(transcript(run), snapshot_json, frames(Tolerance.for_model_dir(TINY, 64)))


def test_mtp_drafting_is_byte_identical_and_reports_acceptance() -> None:
    script = [submit(1, 0, ids(*PROMPT), 24, ext="ids=1 logprobs=2")]
    drafted = run_engine(script, model_dir=MTP)
    plain = run_engine(script, model_dir=MTP, env={"DRAFT": "0"})
    assert comparable(drafted.for_id(1)) == comparable(plain.for_id(1))
    entropy = [[f.line for f in r.frames if f.kind == "ENTROPY"] for r in (drafted, plain)]
    assert entropy[0] == entropy[1]
    assert b"mtp=1" in drafted.stdout and b"mtp=0" in plain.stdout
    assert "drafts accepted" in drafted.stderr
    assert drafted.engine.mtp.drafted > 0
    assert re.search(r"\[MTP\] \d+/\d+ drafts accepted \(\d+\.\d%\)", drafted.stderr)


class _OracleDrafter:
    """A backend whose drafts are exactly what greedy decoding will pick (a step on a copy of
    the state), or always a wrong token: both ends of the accept/reject logic on real rows."""

    has_mtp = True

    def __init__(self, backend: Any, right: bool) -> None:
        self.backend, self.right = backend, right

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def draft(self, state: Any, token: int) -> Any:
        from colibri.engine.backend import Draft, StepRow

        step = self.backend.step([StepRow(copy.deepcopy(state), token, True)])
        logits = step.logits[0] if self.right else -step.logits[0]
        return Draft(logits, step.routes[:0, 0])


@pytest.mark.parametrize("right", [True, False], ids=["all-accepted", "all-rejected"])
def test_speculative_step_accept_and_reject_paths(right: bool) -> None:
    script = [submit(1, 0, ids(*PROMPT), 20, ext="ids=1 logprobs=2")]

    def drafting(backend: Any) -> Any:
        return _OracleDrafter(backend, right)

    drafted = run_engine(script, model_dir=TINY, wrap=drafting)
    plain = run_engine(script, model_dir=TINY)
    assert comparable(drafted.for_id(1)) == comparable(plain.for_id(1))
    entropy = [[f.line for f in r.frames if f.kind == "ENTROPY"] for r in (drafted, plain)]
    assert entropy[0] == entropy[1]
    assert drafted.engine.mtp.drafted > 0
    if right:
        assert drafted.engine.mtp.accepted == drafted.engine.mtp.drafted
        assert drafted.engine.steps < plain.engine.steps
    else:
        assert drafted.engine.mtp.accepted == 0


def test_mtp_guard_pauses_drafting_when_acceptance_is_low() -> None:
    script = [submit(1, 0, ids(*PROMPT), 60, ext="ids=1")]

    def wrong(backend: Any) -> Any:
        return _OracleDrafter(backend, right=False)

    run = run_engine(script, model_dir=TINY, wrap=wrong)
    assert run.engine.mtp.drafted == 24  # one full window, then paused for the rest
    assert "drafting paused for 256 tokens" in run.stderr
    plain = run_engine(script, model_dir=TINY)
    assert comparable(run.for_id(1)) == comparable(plain.for_id(1))


DEEPSEEK = resources.fixture_model_dir("deepseek3-tiny")


@pytest.mark.parametrize(
    "model_dir", [TINY, DSA, DEEPSEEK, MTP], ids=["glm5-tiny", "dsa", "deepseek3", "mtp"]
)
def test_resume_on_real_models(tmp_path: Path, model_dir: Path) -> None:
    first = submit(1, 0, ids(*PROMPT), 5, ext="ids=1")
    a = run_engine([first], model_dir=model_dir, state_dir=tmp_path)
    answer = [int(f.payload or b"") for f in a.for_id(1) if f.kind == "DATA"]
    assert len(answer) == 5
    follow = submit(2, 0, ids(*PROMPT, *answer[:-1], 9, 10), 6, ext="ids=1")
    resumed = run_engine([follow], model_dir=model_dir, state_dir=tmp_path)
    assert "resumed conversation from disk: 16 tokens" in resumed.stderr
    cold = run_engine([follow], model_dir=model_dir)
    assert comparable(resumed.for_id(2)) == comparable(cold.for_id(2))


# glm5-chat-tiny, the random-weight chat fixture (the default until glm5-chat-small): its
# goldens pin the engine's transcript, not the default model's answers.
CHAT = resources.fixture_model_dir("glm5-chat-tiny")


_CHAT_PROMPT = "[gMASK]<sop><|system|>Be brief.<|user|>Hello, colibri!<|assistant|><think></think>"
CHAT_GOLDEN = [
    submit(1, 0, _CHAT_PROMPT.encode(), 8, ext="logprobs=2")
    + submit(2, 1, "héllo wörld".encode(), 6, temperature="0.7", top_p="0.9", ext="seed=3"),
    submit(3, 0, (_CHAT_PROMPT + "Hi").encode(), 4) + submit(4, 1, b"\xff\xfe", 4),
]


def test_golden_transcript_chat_tiny_model(snapshot_json: SnapshotAssertion) -> None:
    """The random-weight chat fixture (a tokenizer, the GLM template rendered by the server)."""
    run = run_engine(CHAT_GOLDEN, kv_slots=2, model_dir=CHAT, env={"SERVE_TOPK": "1"})
    assert b"tokenizer=1" in run.stdout
    assert_same(transcript(run), snapshot_json, frames(Tolerance.for_model_dir(CHAT, 64)))


@pytest.mark.interpreted_only
@pytest.mark.parametrize(("model_dir", "script", "draws"),
                         [(TINY, TINY_GOLDEN, 2), (CHAT, CHAT_GOLDEN, 6)],
                         ids=["glm5-tiny", "glm5-chat-tiny"])
def test_golden_sampled_draws_keep_a_margin(monkeypatch: pytest.MonkeyPatch, model_dir: Path,
                                            script: list[bytes], draws: int) -> None:
    """Every seeded draw of a golden transcript stays farther from each sampler decision
    (nucleus size and set, cumulative boundary) than a kind-(b) perturbation of the logits
    can move it, so its token is exact on every CPU (spec/model.md §15)."""
    from support.sampling_margin import draw_margin

    from colibri.engine import mux as mux_engine
    from colibri.engine.rng import Rng

    seen: list[tuple[Any, float, float, float]] = []
    real = mux_engine.pick

    def spy(row: Any, temperature: float, top_p: float, rng: Rng) -> int:
        if temperature > 0:
            seen.append((row.copy(), temperature, top_p, Rng(rng.state).uniform()))
        return real(row, temperature, top_p, rng)

    monkeypatch.setattr(mux_engine, "pick", spy)
    run_engine(script, kv_slots=2, model_dir=model_dir, env={"SERVE_TOPK": "1"})
    assert len(seen) == draws
    tau = Tolerance.for_model_dir(model_dir, 64).logit
    margins = [draw_margin(row, t, p, u, tau) for row, t, p, u in seen]
    thin = [(i, m) for i, m in enumerate(margins) if not m.ratio > 1.0]
    assert thin == [], f"draws within reach of the tolerance: {thin}"


def test_draw_margin_sees_a_draw_next_to_a_boundary() -> None:
    import numpy as np
    from support.sampling_margin import draw_margin

    row = np.zeros(4, np.float32)  # four equally likely tokens: boundaries at k/4
    assert draw_margin(row, 1.0, 1.0, 0.375, 1e-5).ratio > 1.0
    assert draw_margin(row, 1.0, 1.0, 0.25 + 1e-5, 1e-5).ratio < 1.0
    assert draw_margin(row, 1.0, 1.0, 0.5 - 1e-5, 1e-5).ratio < 1.0
    # top_p 0.5 keeps exactly two tokens: the nucleus set is a tie, not exact.
    tied = draw_margin(row, 1.0, 0.5, 0.3, 1e-5)
    assert tied.ratio < 1.0 and tied.decision.startswith("nucleus")
