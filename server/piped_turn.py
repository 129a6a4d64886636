"""One engine turn seen through an :class:`OutputPipeline`, as every HTTP surface runs it.

Engine text goes through the pipeline (stop sequences, thinking split, tool gate) and out via
the surface's ``emit``; a matched stop sends STOP, a client that left sends CANCEL, and a
stream idle for ``keepalive_s`` gets the surface's keepalive. The pipeline's tail is emitted
once the engine is done.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from colibri.server.context import Exchange, ServerState
from colibri.server.engine_client import SubmitRequest
from colibri.server.generation import EngineResult, OnAccept, run_engine
from colibri.server.pipeline import OutputPipeline, Piece

Emit = Callable[[list[Piece]], Awaitable[None]]


async def run_piped(
    state: ServerState,
    request: SubmitRequest,
    exchange: Exchange,
    pipe: OutputPipeline,
    *,
    stream: bool,
    on_accept: OnAccept,
    emit: Emit,
    keepalive: Callable[[], Awaitable[None]],
    context_param: str = "messages",
    drop_empty_pieces: bool = False,
) -> EngineResult:
    """Run ``request`` to its end; ``drop_empty_pieces`` leaves out empty pieces the pipeline
    yields while the engine runs (the final flush is emitted as it comes)."""

    async def on_text(text: str) -> None:
        pieces = pipe.feed(text)
        await emit([p for p in pieces if p[1]] if drop_empty_pieces else pieces)

    async def on_idle() -> None:
        if stream and exchange.streaming and (
                time.monotonic() - exchange.last_write >= state.config.keepalive_s):
            await keepalive()

    result = await run_engine(state.supervisor, request, state.metrics,
                              on_accept=on_accept, on_text=on_text, on_idle=on_idle,
                              stopped=lambda: pipe.stopped,
                              cancelled=lambda: exchange.gone, context_param=context_param)
    await emit(pipe.finish())
    return result
