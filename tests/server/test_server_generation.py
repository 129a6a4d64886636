"""EngineTurn against an in-memory engine whose frames are queued up front (no timing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from colibri.server.context import ServerConfig, ServerState
from colibri.server.engine_client import (
    Accept,
    Data,
    Done,
    EngineDied,
    EngineErrorFrame,
    Event,
    SubmitRequest,
)
from colibri.server.engine_events import DoneStats, TurnTelemetry
from colibri.server.errors import ClientCancelled, EngineFailure
from colibri.server.generation import Accepted, EngineTurn, Output, Quiet, Step
from colibri.server.pipeline import OutputPipeline, stop_filter

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


class FakeExchange:
    """An open stream whose last write is long past, so a keepalive is always due."""

    def __init__(self, streaming: bool = True) -> None:
        self.gone = asyncio.Event()
        self.streaming = streaming
        self.last_write = time.monotonic() - 3600


def _turn(engine: ScriptedEngine, exchange: FakeExchange, *, stream: bool = True,
          pipe: OutputPipeline | None = None) -> EngineTurn:
    state = ServerState(ServerConfig(), engine)  # type: ignore[arg-type]
    request = SubmitRequest(slot=0, payload=b"abc", max_tokens=8, temperature=0.0, top_p=1.0)
    return EngineTurn(state, request, exchange, pipe, stream=stream)


async def _steps(turn: EngineTurn, fail_on: type | None = None) -> list[Step]:
    seen: list[Step] = []
    async with turn:
        async for step in turn:
            seen.append(step)
            if fail_on is not None and isinstance(step, fail_on):
                raise RuntimeError("client write failed")
    return seen


def test_a_keepalive_is_offered_before_frames_that_write_nothing() -> None:
    # A fast stream whose text the tool gate holds back never leaves the queue empty; the
    # keepalive check must still run between its frames, at most once per keepalive_s.
    frames: list[Event] = [Accept(3)] + [Data(b"x", None) for _ in range(20)] + [DONE]
    engine = ScriptedEngine(frames)
    steps = asyncio.run(_steps(_turn(engine, FakeExchange())))
    assert [type(s) for s in steps[:2]] == [Quiet, Accepted]
    assert sum(isinstance(s, Quiet) for s in steps) == 1
    assert engine.log == ["release(pending=0)"]


def test_text_goes_through_the_pipeline_and_a_matched_stop_sends_stop_once() -> None:
    frames: list[Event] = [Accept(3), Data(b"ab", None), Data(b"cSTO", None),
                           Data(b"Pxyz", None), Data(b"more", None), DONE]
    engine = ScriptedEngine(frames)
    pipe = OutputPipeline(stop_filter(("STOP",), False, chat=False), None, False, True)
    turn = _turn(engine, FakeExchange(streaming=False), pipe=pipe)
    steps = asyncio.run(_steps(turn))
    shown = "".join(t for s in steps if isinstance(s, Output) for _, t in s.pieces)
    assert shown == pipe.answer == "abc"
    assert engine.log == ["stop", "release(pending=0)"]
    assert turn.outcome().raw_text == "abcSTOPxyzmore"


def test_a_client_that_leaves_mid_wait_is_cancelled_at_the_engine_at_once() -> None:
    async def scenario() -> tuple[list[str], type[BaseException] | None]:
        engine = ScriptedEngine([Accept(3)], on_cancel=EngineErrorFrame("CANCELLED", ()))
        exchange = FakeExchange(streaming=False)
        raised: type[BaseException] | None = None

        async def leave() -> None:
            await asyncio.sleep(0)
            exchange.gone.set()

        leaving = asyncio.ensure_future(leave())
        try:
            await asyncio.wait_for(_steps(_turn(engine, exchange, stream=False)), 5)
        except ClientCancelled as exc:
            raised = type(exc)
        await leaving
        return engine.log, raised

    log, raised = asyncio.run(scenario())
    assert raised is ClientCancelled
    assert log == ["cancel", "release(pending=0)"]


def test_a_duplicate_accept_cancels_and_waits_for_the_engine_before_release() -> None:
    frames: list[Event] = [Accept(3), Accept(3), Data(b"x", None), Data(b"y", None)]
    engine = ScriptedEngine(frames, on_cancel=EngineErrorFrame("CANCELLED", ()))
    with pytest.raises(EngineFailure, match="duplicate ACCEPT"):
        asyncio.run(_steps(_turn(engine, FakeExchange(), stream=False)))
    assert engine.log == ["cancel", "release(pending=0)"]


def test_a_failing_surface_cancels_and_releases_after_the_engine_dies() -> None:
    engine = ScriptedEngine([Accept(3), Data(b"x", None), Data(b"y", None)],
                            on_cancel=EngineDied("exited"))
    with pytest.raises(RuntimeError, match="client write failed"):
        asyncio.run(_steps(_turn(engine, FakeExchange(), stream=False), fail_on=Accepted))
    assert engine.log == ["cancel", "release(pending=0)"]


def test_a_terminal_error_releases_without_cancel() -> None:
    engine = ScriptedEngine([Accept(3), EngineErrorFrame("FAULT", ())])
    with pytest.raises(EngineFailure):
        asyncio.run(_steps(_turn(engine, FakeExchange(), stream=False)))
    assert engine.log == ["release(pending=0)"]
