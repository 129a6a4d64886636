"""`echo_at=<byte>`: score only the tokens that cover payload bytes >= byte, keeping the
slot's cached prefix (spec/protocol.md 2.2 and 2.8) -- the channel System One scores options
through, so N options that share a document cost one document prefill."""

from __future__ import annotations

from support.engine_harness import run_engine, submit

from colibri.engine.mux import first_token_at
from colibri.resources import default_model_dir

PROMPT = "[gMASK]<sop><|user|>Is the sky blue?<|assistant|><think></think>"
AT = len(PROMPT.encode())


def score(rid: int, text: str, echo_at: int | None) -> bytes:
    ext = "logprobs=1" + (f" echo_at={echo_at}" if echo_at is not None else "")
    return submit(rid, 0, text.encode(), 0, ext=ext)


def echoes(run: object, rid: int) -> list[bytes]:
    return [f.line + (f.payload or b"") for f in run.for_id(rid) if f.kind == "ECHO"]  # type: ignore[attr-defined]


def test_first_token_at_covers_the_boundary() -> None:
    ends = [3, 5, 9]
    assert first_token_at(ends, 0) == 0
    assert first_token_at(ends, 3) == 1  # token 1 starts at byte 3
    assert first_token_at(ends, 4) == 1  # byte 4 is inside token 1: a merged token is scored
    assert first_token_at(ends, 9) == 3  # past the end: nothing is scored


def test_echo_at_keeps_the_prefix_and_matches_a_cold_full_echo() -> None:
    model = default_model_dir()
    yes, no = PROMPT + "yes indeed", PROMPT + "no"
    warm = run_engine(
        [score(1, yes, AT), score(2, no, AT), score(3, yes, AT)], model_dir=model, ctx=256
    )
    cold_yes = run_engine([score(9, yes, None)], model_dir=model, ctx=256)
    cold_no = run_engine([score(9, no, None)], model_dir=model, ctx=256)
    # the second and third option prefill only from the token before the option
    assert warm.stderr.count("[API] KV slot 0 prefix") == 2
    full_yes = [line.split(b" ", 2)[2] for line in echoes(cold_yes, 9)]
    full_no = [line.split(b" ", 2)[2] for line in echoes(cold_no, 9)]
    got_yes = [line.split(b" ", 2)[2] for line in echoes(warm, 1)]
    got_no = [line.split(b" ", 2)[2] for line in echoes(warm, 2)]
    # kind (c): byte-exact with a reused prefix; the frames are the tail of the full echo
    assert got_yes and full_yes[-len(got_yes) :] == got_yes
    assert got_no and full_no[-len(got_no) :] == got_no
    assert [line.split(b" ", 2)[2] for line in echoes(warm, 3)] == got_yes
    # exactly the tokens covering the option bytes: their payloads spell the option
    payloads = b"".join(f.payload or b"" for f in warm.for_id(1) if f.kind == "ECHO")
    assert payloads == b"yes indeed"


def test_echo_at_past_the_end_scores_nothing_and_needs_logprobs() -> None:
    model = default_model_dir()
    text = PROMPT + "yes"
    run = run_engine(
        [score(1, text, len(text.encode())), submit(2, 0, text.encode(), 0, ext="echo_at=3")],
        model_dir=model,
        ctx=256,
    )
    assert [f.kind for f in run.for_id(1)][0] == "ACCEPT"
    assert echoes(run, 1) == []
    assert run.for_id(1)[-1].kind == "DONE"
    assert [f.line for f in run.for_id(2)] == [b"ERROR 2 BAD_REQUEST\n"]


def test_echo_at_is_refused_with_id_payloads() -> None:
    run = run_engine(submit(1, 0, b"2 3 4", 0, ext="ids=1 logprobs=1 echo_at=1"))
    assert [f.line for f in run.for_id(1)] == [b"ERROR 1 BAD_REQUEST\n"]
