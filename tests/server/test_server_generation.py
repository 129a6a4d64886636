"""run_engine against an in-memory engine whose frames are queued up front (no timing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from colibri.server.engine_client import (
    Accept,
    Data,
    Done,
    EngineDied,
    EngineErrorFrame,
    Event,
    SubmitRequest,
)
from colibri.server.errors import EngineFailure
from colibri.server.frames import DoneStats, TurnTelemetry
from colibri.server.generation import run_engine
from colibri.server.metrics import GenerationMetrics

DONE = Done(DoneStats(2, 1.0, 0.0, 0.1, 3, False), TurnTelemetry())


class ScriptedEngine:
    """Hands out one queue holding ``frames``; ``on_cancel`` is what CANCEL puts in it."""

    def __init__(self, frames: list[Event], on_cancel: Event | None = None) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        for frame in frames:
            self.queue.put_nowait(frame)
        self.on_cancel = on_cancel
        self.log: list[str] = []

    async def submit(self, request: SubmitRequest) -> tuple[Any, int, asyncio.Queue[Event]]:
        return self, 7, self.queue

    async def stop(self, request_id: int) -> None:
        self.log.append("stop")

    async def cancel(self, request_id: int) -> None:
        self.log.append("cancel")
        if self.on_cancel is not None:
            self.queue.put_nowait(self.on_cancel)

    def release(self, request_id: int) -> None:
        # The terminal answer must have been consumed before the slot is freed.
        self.log.append(f"release(pending={self.queue.qsize()})")


async def _noop(*_: Any) -> None:
    return None


def _run(engine: ScriptedEngine, **callbacks: Any) -> Any:
    kwargs: dict[str, Any] = {"on_accept": _noop, "on_text": _noop, "on_idle": _noop,
                              "stopped": lambda: False, "cancelled": lambda: False}
    kwargs.update(callbacks)
    request = SubmitRequest(slot=0, payload=b"abc", max_tokens=8, temperature=0.0, top_p=1.0)
    return asyncio.run(run_engine(engine, request, GenerationMetrics(),  # type: ignore[arg-type]
                                  **kwargs))


def test_idle_check_runs_while_frames_arrive_that_write_nothing() -> None:
    # A fast stream whose text the tool gate holds back never leaves the queue empty for
    # 50 ms; the keepalive check must still run between its frames.
    frames: list[Event] = [Accept(3)] + [Data(b"x", None) for _ in range(20)] + [DONE]
    engine = ScriptedEngine(frames)
    idles: list[int] = []

    async def on_idle() -> None:
        idles.append(engine.queue.qsize())

    _run(engine, on_idle=on_idle)
    assert idles == list(range(len(frames), 0, -1))  # once before each frame


def test_a_duplicate_accept_cancels_and_waits_for_the_engine_before_release() -> None:
    frames: list[Event] = [Accept(3), Accept(3), Data(b"x", None), Data(b"y", None)]
    engine = ScriptedEngine(frames, on_cancel=EngineErrorFrame("CANCELLED", ()))
    with pytest.raises(EngineFailure, match="duplicate ACCEPT"):
        _run(engine)
    assert engine.log == ["cancel", "release(pending=0)"]


def test_a_failing_callback_cancels_and_releases_after_the_engine_dies() -> None:
    async def on_text(text: str) -> None:
        raise RuntimeError("client write failed")

    engine = ScriptedEngine([Accept(3), Data(b"x", None), Data(b"y", None)],
                            on_cancel=EngineDied("exited"))
    with pytest.raises(RuntimeError, match="client write failed"):
        _run(engine, on_text=on_text)
    assert engine.log == ["cancel", "release(pending=0)"]


def test_a_terminal_error_releases_without_cancel() -> None:
    engine = ScriptedEngine([Accept(3), EngineErrorFrame("FAULT", ())])
    with pytest.raises(EngineFailure):
        _run(engine)
    assert engine.log == ["release(pending=0)"]
