"""One engine call, read as the steps an HTTP surface acts on.

``async with EngineTurn(...) as turn`` sends SUBMIT; ``async for step in turn`` yields
:class:`Accepted` (commit a stream), :class:`Output` (pieces of the client's text, already
through the request's :class:`OutputPipeline`: stop sequences, thinking split, tool gate) and
:class:`Quiet` (a stream has been silent for ``keepalive_s``); ``turn.result`` is the turn's
record once the loop ends. Inside, the turn waits on its request's frame queue and on the
client's departure together: a matched stop sequence sends STOP once, a client that left
sends CANCEL once and the turn waits for the engine's acknowledgement, so the KV slot is never
handed on while the engine still holds it. Leaving the ``async with`` early (a write failed,
a protocol fault) does the same.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from colibri.server import errors
from colibri.server.context import Exchange, ServerState
from colibri.server.engine_client import (
    Accept,
    Data,
    Done,
    Echo,
    EngineDied,
    EngineErrorFrame,
    EngineProcess,
    Event,
)
from colibri.server.engine_events import DoneStats, TokenRecord, TurnTelemetry
from colibri.server.errors import ClientCancelled, EngineFailure
from colibri.server.pipeline import OutputPipeline, Piece
from colibri.server.supervisor import EngineUnavailable

from colibri.protocol import SubmitRequest


@dataclass(frozen=True)
class TokenSpan:
    """One DATA/ECHO frame: its bytes, its record, and the characters it completed."""

    payload: bytes
    record: TokenRecord | None
    start: int
    end: int


@dataclass
class EngineResult:
    stats: DoneStats
    telemetry: TurnTelemetry
    raw_text: str
    tokens: list[TokenSpan] = field(default_factory=list)
    echo_text: str = ""
    echo: list[TokenSpan] = field(default_factory=list)


def _decode_spans(pieces: list[tuple[bytes, TokenRecord | None]]) -> tuple[str,
                                                                           list[TokenSpan]]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    spans = []
    for payload, record in pieces:
        piece = decoder.decode(payload)
        spans.append(TokenSpan(payload, record, len(text), len(text) + len(piece)))
        text += piece
    tail = decoder.decode(b"", final=True)
    if tail and spans:
        last = spans[-1]
        spans[-1] = TokenSpan(last.payload, last.record, last.start, last.end + len(tail))
        text += tail
    return text, spans


@dataclass(frozen=True)
class Accepted:
    """The engine took the request (a stream may start now)."""

    prompt_tokens: int


@dataclass(frozen=True)
class Output:
    """Text for the client, as ``(kind, text)`` pieces with kind ``reasoning`` or ``content``."""

    pieces: list[Piece]


@dataclass(frozen=True)
class Quiet:
    """The stream has written nothing for ``keepalive_s``: the surface sends its keepalive."""


Step = Accepted | Output | Quiet
TERMINAL = (Done, EngineErrorFrame, EngineDied)


class EngineTurn:
    def __init__(self, state: ServerState, request: SubmitRequest, exchange: Exchange,
                 pipe: OutputPipeline | None = None, *, stream: bool = False,
                 context_param: str = "messages") -> None:
        self.state = state
        self.request = request
        self.exchange = exchange
        self.pipe = pipe
        self.stream = stream
        self.context_param = context_param
        self.result: EngineResult | None = None
        self._started = 0.0
        self._quiet_at = 0.0
        self._cancel_sent = False
        # DONE, ERROR or the engine's death: the engine is done with the slot.
        self._terminal = False
        self._steps: AsyncGenerator[Step, None] | None = None

    async def __aenter__(self) -> EngineTurn:
        self._started = time.monotonic()
        try:
            self.engine, self.request_id, self.queue = await self.state.supervisor.submit(
                self.request)
        except EngineUnavailable as exc:
            self.state.metrics.engine_call.observe(time.monotonic() - self._started)
            raise errors.engine_unavailable() from exc
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if self._steps is not None:
                await self._steps.aclose()
            if not self._terminal:
                await self._settle()
        finally:
            self.engine.release(self.request_id)
            self.state.metrics.engine_call.observe(time.monotonic() - self._started)

    def __aiter__(self) -> AsyncIterator[Step]:
        self._steps = self._run()
        return self._steps

    async def _run(self) -> AsyncGenerator[Step, None]:
        engine, request_id, pipe = self.engine, self.request_id, self.pipe
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[tuple[bytes, TokenRecord | None]] = []
        echoes: list[tuple[bytes, TokenRecord | None]] = []
        accepted = stop_sent = malformed = first_output = False
        while True:
            if self.exchange.gone.is_set() and not self._cancel_sent:
                self._cancel_sent = True
                await engine.cancel(request_id)
            # Checked before every frame too: a fast stream whose text is all held back (the
            # tool gate) never leaves the queue empty, and must still get its keepalives.
            quiet_in = self._quiet_in()
            if quiet_in is not None and quiet_in <= 0:
                self._quiet_at = time.monotonic()
                yield Quiet()
                quiet_in = self._quiet_in()
            event = await self._next_event(quiet_in)
            if event is None:
                continue  # the client left, or a keepalive is due
            if isinstance(event, Accept):
                if accepted:
                    raise EngineFailure("duplicate ACCEPT")
                accepted = True
                if not self._cancel_sent:
                    yield Accepted(event.prompt_tokens)
            elif isinstance(event, Echo):
                echoes.append((event.payload, event.record))
            elif isinstance(event, Data):
                if not accepted:
                    accepted = True
                    yield Accepted(0)
                pieces.append((event.payload, event.record))
                text = decoder.decode(event.payload)
                if event.malformed and not malformed:
                    # Fail this request when its turn ends; stop spending its budget now.
                    malformed = True
                    if not stop_sent:
                        stop_sent = True
                        await engine.stop(request_id)
                if self._cancel_sent or stop_sent:
                    continue
                if text:
                    if not first_output:
                        first_output = True
                        self.state.metrics.first_output.observe(
                            time.monotonic() - self._started)
                    if pipe is not None:
                        yield Output(pipe.feed(text))
                if pipe is not None and pipe.stopped and not stop_sent:
                    stop_sent = True
                    await engine.stop(request_id)
            elif isinstance(event, Done):
                self._terminal = True
                if self._cancel_sent:
                    raise ClientCancelled()
                if malformed:
                    raise errors.APIError(
                        500, "The engine sent a log-probability record this server cannot "
                        "read.", type="server_error", code="engine_logprob_tail_malformed")
                tail = decoder.decode(b"", final=True)
                raw, spans = _decode_spans(pieces)
                echo_text, echo_spans = _decode_spans(echoes)
                self.result = EngineResult(event.stats, event.telemetry, raw, spans,
                                           echo_text, echo_spans)
                if pipe is not None:
                    if tail and not stop_sent:
                        yield Output(pipe.feed(tail))
                    yield Output(pipe.finish())
                return
            elif isinstance(event, EngineErrorFrame):
                self._terminal = True
                if event.code == "CANCELLED" or self._cancel_sent:
                    raise ClientCancelled()
                if event.code == "CONTEXT_EXCEEDED":
                    raise errors.context_exceeded(event.args, self.context_param)
                raise EngineFailure(f"engine error {event.code}")
            elif isinstance(event, EngineDied):
                self._terminal = True
                raise EngineFailure(event.reason)

    def outcome(self) -> EngineResult:
        """The finished turn's record (after the ``async for`` ran to its end)."""
        assert self.result is not None, "the turn has not finished"
        return self.result

    def _quiet_in(self) -> float | None:
        """Seconds until a keepalive is due; None while none applies (not an open stream,
        or the turn is being cancelled)."""
        if not (self.stream and self.exchange.streaming) or self._cancel_sent:
            return None
        last = max(self.exchange.last_write, self._quiet_at)
        return last + self.state.config.keepalive_s - time.monotonic()

    async def _next_event(self, timeout: float | None) -> Event | None:
        """The request's next frame; None when the client left first or ``timeout`` passed.
        The frame queue and the client's departure are awaited together: nothing polls."""
        if not self.queue.empty():
            return self.queue.get_nowait()
        if timeout is not None and timeout <= 0:
            return None
        get = asyncio.ensure_future(self.queue.get())
        waits: list[asyncio.Future[Any]] = [get]
        if not self._cancel_sent:
            waits.append(asyncio.ensure_future(self.exchange.gone.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                # A get cancelled after the queue woke it leaves its frame in the queue.
                waiter.cancel()
        return get.result() if get.done() and not get.cancelled() else None

    async def _settle(self) -> None:
        """The turn ended before its terminal frame (a protocol fault, or the surface raised):
        CANCEL it and wait for the engine's answer, because the engine still runs the request
        and its slot must not be handed to another one before it lets go (spec/http.md)."""
        engine: EngineProcess = self.engine
        if not self._cancel_sent:
            self._cancel_sent = True
            await engine.cancel(self.request_id)
        while not isinstance(await self.queue.get(), TERMINAL):
            pass
