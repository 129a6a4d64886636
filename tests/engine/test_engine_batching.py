"""Continuous batching changes no byte: colibri's serve_mux_check on the fake model."""

from __future__ import annotations

import pytest
from support.engine_fakes import FakeBackend, FakeConfig
from support.engine_harness import EngineRun, run_engine
from support.engine_waves import MuxCheck, comparable, serve_mux_check


def _runner(waves: list[bytes], slots: int) -> EngineRun:
    return run_engine(
        waves, kv_slots=slots, ctx=128, model=FakeBackend(FakeConfig(vocab_size=64), eos_bias=-1.0)
    )


@pytest.mark.parametrize("slots", [2, 4])
def test_batched_frames_equal_alone(slots: int) -> None:
    check = serve_mux_check(_runner, slots, 64)
    assert_mux_check(check)
    if slots >= 4:
        assert check.cancelled is not None


def assert_mux_check(check: MuxCheck) -> None:
    batched = check.batched
    for rid, alone in check.alone.items():
        got = comparable(batched.for_id(rid))
        if rid == check.stopped:
            assert got[-1].startswith("DONE") and got[-1].endswith(" 0"), got
            body = got[:-1]
            assert body == alone[: len(body)]
            assert any(g.startswith("DATA") for g in body)
            assert len(body) < len(alone) - 1
        elif rid == check.cancelled:
            assert got[-1] == "ERROR # CANCELLED", got
            assert got[:-1] == alone[: len(got) - 1]
        else:
            assert got == alone, rid
    assert batched.engine.rows > batched.engine.steps
    assert "decode steps" in batched.stderr


def _entropy_before_done(run: EngineRun) -> dict[int, str]:
    out: dict[int, str] = {}
    last = ""
    for frame in run.frames:
        if frame.kind == "ENTROPY":
            last = frame.line.decode()
        elif frame.kind == "DONE" and frame.parsed is not None:
            out[frame.parsed.get_int("id")] = last
    return out


def test_turn_entropy_is_the_same_batched_or_alone() -> None:
    """ENTROPY credits only the rows that forward a turn's generated tokens, so it does not
    depend on the other slots nor on how much of the prompt was cached."""
    check = serve_mux_check(_runner, 4, 64)
    batched = _entropy_before_done(check.batched)
    alone = _entropy_before_done(check.alone_run)
    compared = [rid for rid in alone if rid not in (check.stopped, check.cancelled)]
    assert len(compared) >= 6
    for rid in compared:
        assert batched[rid] == alone[rid], rid
    assert any(line != "ENTROPY 0.000 0.000" for line in batched.values())
