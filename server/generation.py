"""One engine call: SUBMIT, then frames until DONE, with STOP, CANCEL and idle callbacks.

The HTTP layers hand in callbacks: ``on_accept`` (commits a stream), ``on_text`` (each
decoded piece, UTF-8 reassembled across frames), ``on_idle`` (before every wait for a frame,
so at least every 50 ms: the keepalive check, which must also run while frames arrive that
put nothing on the wire, e.g. text held by the tool-call gate), ``stopped()`` (a stop
sequence matched: send STOP once) and ``cancelled()`` (the client left: send CANCEL once
and wait for the engine's acknowledgement, so the KV slot is never reused while the engine
still holds it).
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from colibri.server import errors
from colibri.server.engine_client import (
    Accept,
    Data,
    Done,
    Echo,
    EngineDied,
    EngineErrorFrame,
    EngineProcess,
    Event,
    SubmitRequest,
)
from colibri.server.errors import ClientCancelled, EngineFailure
from colibri.server.frames import DoneStats, TokenRecord, TurnTelemetry
from colibri.server.metrics import GenerationMetrics
from colibri.server.supervisor import EngineSupervisor, EngineUnavailable

IDLE_S = 0.05


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


OnAccept = Callable[[int], Awaitable[None]]
OnText = Callable[[str], Awaitable[None]]
OnIdle = Callable[[], Awaitable[None]]


async def run_engine(supervisor: EngineSupervisor, request: SubmitRequest,
                     metrics: GenerationMetrics, *, on_accept: OnAccept, on_text: OnText,
                     on_idle: OnIdle, stopped: Callable[[], bool],
                     cancelled: Callable[[], bool], context_param: str = "messages",
                     ) -> EngineResult:
    started = time.monotonic()
    first_output = False
    try:
        engine, request_id, queue = await supervisor.submit(request)
    except EngineUnavailable as exc:
        metrics.engine_call.observe(time.monotonic() - started)
        raise errors.engine_unavailable() from exc
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces: list[tuple[bytes, TokenRecord | None]] = []
    echoes: list[tuple[bytes, TokenRecord | None]] = []
    accepted = False
    stop_sent = cancel_sent = False
    malformed = False
    terminal = False  # DONE, ERROR or the engine's death: the engine is done with the slot
    try:
        while True:
            if cancelled() and not cancel_sent:
                cancel_sent = True
                await engine.cancel(request_id)
            if not cancel_sent:
                # Also after frames: a fast stream whose text is all held back (tool gate,
                # dropped empty pieces) must still get its keepalives.
                await on_idle()
            try:
                event = await asyncio.wait_for(queue.get(), IDLE_S)
            except TimeoutError:
                continue
            if isinstance(event, Accept):
                if accepted:
                    raise EngineFailure("duplicate ACCEPT")
                accepted = True
                if not cancel_sent:
                    await on_accept(event.prompt_tokens)
            elif isinstance(event, Echo):
                echoes.append((event.payload, event.record))
            elif isinstance(event, Data):
                if not accepted:
                    accepted = True
                    await on_accept(0)
                pieces.append((event.payload, event.record))
                text = decoder.decode(event.payload)
                if event.malformed and not malformed:
                    # Fail this request when its turn ends; stop spending its budget now.
                    malformed = True
                    if not stop_sent:
                        stop_sent = True
                        await engine.stop(request_id)
                if cancel_sent or stop_sent:
                    continue
                if text:
                    if not first_output:
                        first_output = True
                        metrics.first_output.observe(time.monotonic() - started)
                    await on_text(text)
                if stopped() and not stop_sent:
                    stop_sent = True
                    await engine.stop(request_id)
            elif isinstance(event, Done):
                terminal = True
                if cancel_sent:
                    raise ClientCancelled()
                if malformed:
                    raise errors.APIError(
                        500, "The engine sent a log-probability record this server cannot "
                        "read.", type="server_error", code="engine_logprob_tail_malformed")
                tail = decoder.decode(b"", final=True)
                if tail and not stop_sent:
                    await on_text(tail)
                raw, spans = _decode_spans(pieces)
                echo_text, echo_spans = _decode_spans(echoes)
                return EngineResult(event.stats, event.telemetry, raw, spans, echo_text,
                                    echo_spans)
            elif isinstance(event, EngineErrorFrame):
                terminal = True
                if event.code == "CANCELLED" or cancel_sent:
                    raise ClientCancelled()
                if event.code == "CONTEXT_EXCEEDED":
                    raise errors.context_exceeded(event.args, context_param)
                raise EngineFailure(f"engine error {event.code}")
            elif isinstance(event, EngineDied):
                terminal = True
                raise EngineFailure(event.reason)
    finally:
        if not terminal:
            await _settle(engine, request_id, queue, cancel_sent)
        engine.release(request_id)
        metrics.engine_call.observe(time.monotonic() - started)


async def _settle(engine: EngineProcess, request_id: int, queue: asyncio.Queue[Event],
                  cancel_sent: bool) -> None:
    """The turn ended before its terminal frame (a protocol fault, or a callback raised):
    CANCEL it and wait for the engine's answer, because the engine still runs the request
    and its slot must not be handed to another one before it lets go (spec/http.md)."""
    if not cancel_sent:
        await engine.cancel(request_id)
    while not isinstance(await queue.get(), Done | EngineErrorFrame | EngineDied):
        pass
