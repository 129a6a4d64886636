"""The mux loop against the protocol: validation order, frame order, clamps, STOP/CANCEL/EOF.

Driven in-process on the deterministic fake model (engine_fakes.py) so every case is fast and
exact; the same machinery runs the real fixture models in test_engine_models.py.
"""

from __future__ import annotations

import pytest
from support.engine_fakes import FakeBackend, FakeConfig
from support.engine_harness import ids, run_engine, submit, transcript
from syrupy.assertion import SnapshotAssertion

from colibri.protocol import load_spec, parse_line


def kinds(frames: list) -> list[str]:  # type: ignore[type-arg]
    return [f.kind for f in frames]


def test_handshake_order_and_grammar() -> None:
    run = run_engine(b"")
    assert run.stdout.startswith(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 ")
    assert kinds(run.frames) == load_spec().mux["handshake"][1:]
    caps = parse_line(run.frames[1].line[:-1])
    assert caps is not None and caps.kind == "CAPS"
    assert "[API] 0 decode steps, 0 rows" in run.stderr


TURN_END = ["HWINFO", "GPUS", "TIERS", "EMAP", "HITS", "ENTROPY", "PERF", "PROF", "DONE"]


def test_request_frame_sequence() -> None:
    run = run_engine(submit(5, 0, ids(3, 4, 5), 4, ext="ids=1"))
    body = run.frames[6:]
    assert kinds(body) == ["ACCEPT", "DATA", "DATA", "DATA", "DATA", *TURN_END]
    done = body[-1].parsed
    assert done is not None
    assert done.get_int("emitted") == 4
    assert done.get_int("prompt_tokens") == 3
    assert done.get_int("length_limited") == 1


ERROR_CASES = [
    # (script, expected reply)
    (b"PING\n", "ERROR 0 BAD_REQUEST"),
    (b"\n", "ERROR 0 BAD_REQUEST"),
    (b"STOP\n", "ERROR 0 BAD_REQUEST"),
    (b"STOP 0\n", "ERROR 0 BAD_REQUEST"),
    (b"STOP 5 6\n", "ERROR 0 BAD_REQUEST"),
    (b"CANCEL 5\r\n", "ERROR 0 BAD_REQUEST"),
    (b"STOP 7\n", "ERROR 7 NOT_FOUND"),
    (b"CANCEL 7\n", "ERROR 7 NOT_FOUND"),
    (b"SUBMIT x 0 1 1 0 1\nA\n", "ERROR 0 BAD_REQUEST"),
    (b"SUBMIT 1 0 99999999 1 0 1\n", "ERROR 0 BAD_REQUEST"),
    (b"SUBMIT 1 0 1 1 0 1 2000000\n", "ERROR 0 BAD_REQUEST"),
    (b"SUBMIT 1 0 1 1 nan 1\n", "ERROR 0 BAD_REQUEST"),
    (b"SUBMIT 1 0 1 1 0 1 0 LOGPROBS=1\n", "ERROR 0 BAD_REQUEST"),
    (b"SUBMIT  1 0 1 1 0 1\n", "ERROR 0 BAD_REQUEST"),
    (b"X" * 5000 + b"\n", "ERROR 0 BAD_REQUEST"),
    (submit(3, 0, b"1 2", ext="ids=1")[:-1] + b"X", "ERROR 3 BAD_FRAME"),
    (submit(0, 0, b"1 2", ext="ids=1"), "ERROR 0 BAD_REQUEST"),
    (submit(3, 1, b"1 2", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", temperature="2.5", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", top_p="0", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", top_p="1.01", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", max_tokens=0, ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", max_tokens=2**31, ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", ext="ids=1 ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", ext="ids=2"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", ext="ids=1 logprobs=33"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", ext="ids=1 colour=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1\x002", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 2", ext="ids=1", grammar=b"root\x00"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 x", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"1 64", ext="ids=1"), "ERROR 3 BAD_REQUEST"),
    (submit(3, 0, b"hello"), "ERROR 3 BAD_REQUEST"),  # no tokenizer: ids=1 only
    (submit(3, 0, b" \n\t ", ext="ids=1"), "ERROR 3 EMPTY_PROMPT"),
    (submit(3, 0, ids(*range(2, 20)), ext="ids=1"), "ERROR 3 CONTEXT_EXCEEDED 18 14"),
]


@pytest.mark.parametrize(("script", "reply"), ERROR_CASES)
def test_validation_replies(script: bytes, reply: str) -> None:
    run = run_engine(script, ctx=16)
    lines = [f.line.decode("latin-1").rstrip("\n") for f in run.frames[6:]]
    assert lines[0] == reply
    errors = [line for line in lines if line.startswith("ERROR")]
    if reply.startswith("ERROR 0") and b"SUBMIT" in script and script.count(b"\n") > 1:
        # An unframeable header's payload is not drained: its bytes are read as commands.
        assert len(errors) >= 1
    else:
        assert lines == [reply]


def test_slot_busy_comes_before_duplicate_id() -> None:
    script = (
        submit(1, 0, ids(2, 3), 30, ext="ids=1")
        + submit(1, 0, ids(2, 3), ext="ids=1")
        + submit(1, 1, ids(2, 3), ext="ids=1")
        + submit(2, 0, ids(2, 3), ext="ids=1")
    )
    run = run_engine(script, kv_slots=2, model=FakeBackend(FakeConfig(eos_token_ids=())))
    errors = [f.line.decode().strip() for f in run.frames if f.kind == "ERROR"]
    assert errors == ["ERROR 1 SLOT_BUSY", "ERROR 1 DUPLICATE_ID", "ERROR 2 SLOT_BUSY"]


def test_bad_frame_stops_reading_but_finishes_active() -> None:
    script = (
        submit(1, 0, ids(2, 3), 10, ext="ids=1")
        + b"SUBMIT 2 1 3 4 0 1\nabcX"
        + submit(3, 1, ids(2, 3), ext="ids=1")
    )
    run = run_engine(script, kv_slots=2, model=FakeBackend(FakeConfig(eos_token_ids=())))
    lines = [f.line.decode().strip() for f in run.frames]
    assert "ERROR 2 BAD_FRAME" in lines
    assert not any(line.startswith("ACCEPT 3") for line in lines)
    assert lines[-1].startswith("DONE 1 STAT 10 ")


def test_eof_inside_payload_is_eof() -> None:
    run = run_engine(submit(1, 0, ids(2, 3), ext="ids=1")[:-3])
    assert kinds(run.frames[6:]) == []


def test_stop_after_first_data_and_cancel() -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    script = (
        submit(1, 0, ids(2, 3), 50, ext="ids=1")
        + submit(2, 1, ids(4, 5), 50, ext="ids=1")
        + b"STOP 1\nCANCEL 2\nCANCEL 2\n"
    )
    run = run_engine(script, kv_slots=2, model=model)
    one = kinds(run.for_id(1))
    two = kinds(run.for_id(2))
    assert one[0] == "ACCEPT" and one[-1] == "DONE" and "PERF" in one
    done = run.for_id(1)[-1].parsed
    assert done is not None and done.get_int("length_limited") == 0
    assert two[0] == "ACCEPT" and two[-1] == "ERROR" and "DONE" not in two
    lines = [f.line.decode().strip() for f in run.frames]
    assert lines.count("ERROR 2 CANCELLED") == 1
    assert lines[-1] == "ERROR 2 NOT_FOUND"


def test_clamp_to_context_and_length_limited() -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    run = run_engine(submit(1, 0, ids(*range(2, 12)), 100, ext="ids=1"), ctx=16, model=model)
    frames = run.for_id(1)
    assert kinds(frames).count("DATA") == 16 - 10 - 1
    done = frames[-1].parsed
    assert done is not None and done.get_int("length_limited") == 1


def test_stop_token_first_gives_done_without_data() -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=(1,)), eos_bias=100.0)
    run = run_engine(submit(1, 0, ids(2, 3), 5, ext="ids=1"), model=model)
    assert kinds(run.for_id(1)) == ["ACCEPT", "PERF", "DONE"]
    done = run.for_id(1)[-1].parsed
    assert done is not None and done.get_int("emitted") == 0
    assert done.get_int("length_limited") == 0


def test_logprobs_echo_and_tails() -> None:
    run = run_engine(submit(1, 0, ids(2, 3, 4), 3, ext="ids=1 logprobs=3"))
    frames = run.for_id(1)
    assert kinds(frames)[:5] == ["ACCEPT", "ECHO", "ECHO", "ECHO", "DATA"]
    echo0 = frames[1].parsed
    assert echo0 is not None and frames[1].line == b"ECHO 1 2 0 nan 0\n"
    assert [f.parsed.get_int("pos") for f in frames[1:4] if f.parsed] == [0, 1, 2]
    data = frames[4].parsed
    assert data is not None and data.get_int("k") == 3
    top = data.values["top"]
    assert isinstance(top, list)
    values = [entry["logprob"] for entry in top]
    assert all(v <= 0 for v in values)
    # colibri's table: the k largest, in min-replacement slot order (not sorted)
    assert len({e["token"] for e in top}) == 3
    lp = data.get_float("logprob")
    chosen = [e["logprob"] for e in top if e["token"] == int(frames[4].payload or b"0")]
    assert chosen == [lp]  # greedy: the chosen token is in its own table, same spelling


def test_scoring_request_max_tokens_zero() -> None:
    run = run_engine(submit(1, 0, ids(2, 3, 4), 0, ext="ids=1 logprobs=1"))
    assert kinds(run.for_id(1)) == ["ACCEPT", "ECHO", "ECHO", "ECHO", "PERF", "DONE"]
    done = run.for_id(1)[-1].parsed
    assert done is not None and done.get_int("length_limited") == 1


def test_topk_frames_follow_data() -> None:
    run = run_engine(submit(1, 0, ids(2, 3), 3, ext="ids=1"), env={"SERVE_TOPK": "1"})
    seq = kinds(run.for_id(1))
    assert seq[:7] == ["ACCEPT", "DATA", "TOPK", "DATA", "TOPK", "DATA", "TOPK"]


def test_prefix_reuse_is_reported_and_exact() -> None:
    first = submit(1, 0, ids(2, 3, 4, 5), 4, ext="ids=1")
    again = submit(2, 0, ids(2, 3, 4, 5, 9), 4, ext="ids=1")
    warm = run_engine([first, again])
    cold = run_engine([again])
    assert "prefix 4/5" in warm.stderr
    data = [f.payload for f in warm.for_id(2) if f.kind == "DATA"]
    assert data == [f.payload for f in cold.for_id(2) if f.kind == "DATA"]


def test_golden_transcript(snapshot_json: SnapshotAssertion) -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    script = (
        submit(1, 0, ids(2, 3, 4), 3, ext="ids=1 logprobs=2")
        + submit(2, 1, ids(7, 8), 4, temperature="0.7", top_p="0.9", ext="ids=1 seed=42")
        + b"STOP 1\n"
        + submit(3, 1, ids(7), 2, ext="ids=1")
        + b"CANCEL 2\nBOGUS\n"
    )
    run = run_engine(script, kv_slots=2, model=model, env={"SERVE_TOPK": "1"})
    # Exact, not kind (b): the fake model's logits come from a seeded generator, not from a
    # BLAS product, and every sum after them is a sequential float64 sum in id order, so
    # nothing here depends on the CPU's kernels (spec/model.md §15).
    assert transcript(run) == snapshot_json


@pytest.mark.interpreted_only
def test_data_tail_and_topk_share_one_normaliser_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from colibri.engine import sampling

    calls = []
    real = sampling.log_normalizer

    def counting(logits: object) -> float:
        calls.append(1)
        return real(logits)  # type: ignore[arg-type]

    monkeypatch.setattr(sampling, "log_normalizer", counting)
    prompt = (3, 4, 5)
    run = run_engine(
        submit(1, 0, ids(*prompt), 4, ext="ids=1 logprobs=2"),
        model=FakeBackend(FakeConfig(eos_token_ids=())),
        env={"SERVE_TOPK": "1"},
    )
    data = [f for f in run.for_id(1) if f.kind == "DATA"]
    assert len(data) == 4
    assert len([f for f in run.frames if f.kind == "TOPK"]) == 4
    # one per ECHO position with a predictor, one per DATA row (its tail and TOPK together)
    assert len(calls) == (len(prompt) - 1) + len(data)
