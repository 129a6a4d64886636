"""Keeps one engine process running: start, watch, restart with backoff, report state.

Requests go through :meth:`EngineSupervisor.submit`; while the engine is (re)starting they
are refused with :class:`EngineUnavailable` rather than queued behind an engine that may
never come back. ``/health`` reads :attr:`state`, :attr:`restarts` and :attr:`last_exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Mapping, Sequence

from colibri.server.engine_client import (
    EngineProcess,
    EngineStartError,
    Event,
    Telemetry,
)

from colibri.protocol import SubmitRequest

log = logging.getLogger("colibri.server")

BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0


class EngineUnavailable(RuntimeError):
    """No engine is ready to take a request right now."""


class EngineSupervisor:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str],
                 ready_timeout: float = 600.0) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.ready_timeout = ready_timeout
        self.engine: EngineProcess | None = None
        self.state = "starting"
        self.restarts = 0
        self.last_exit: str | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closing = False
        self.telemetry = Telemetry()

    @property
    def pid(self) -> int | None:
        return self.engine.pid if self.engine else None

    @property
    def supports_seeds(self) -> bool:
        return self.engine is not None and self.engine.supports_seeds

    async def start(self) -> None:
        """Start the first engine; raises EngineStartError if it never gets READY."""
        await self._spawn()
        self._watch = asyncio.create_task(self._watch_loop())

    async def _spawn(self) -> None:
        engine = EngineProcess(self.argv, self.env)
        # Keep telemetry across restarts: the dashboard should not blank out.
        engine.telemetry = self.telemetry
        await engine.start(self.ready_timeout)
        self.engine = engine
        self.state = "ready"

    async def _watch_loop(self) -> None:
        backoff = BACKOFF_START_S
        while not self._closing:
            engine = self.engine
            assert engine is not None and engine.exited is not None
            reason = await engine.exited
            if self.closing():
                return
            self.last_exit = reason
            self.state = "restarting"
            print(f"[colibri] engine exited: {reason}; restarting", file=sys.stderr)
            while not self.closing():
                await asyncio.sleep(backoff)
                try:
                    await self._spawn()
                except (EngineStartError, OSError) as exc:
                    self.last_exit = str(exc)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                self.restarts += 1
                backoff = BACKOFF_START_S
                break

    def closing(self) -> bool:
        return self._closing

    async def submit(self, request: SubmitRequest) -> tuple[EngineProcess, int,
                                                            asyncio.Queue[Event]]:
        engine = self.engine
        if self.state != "ready" or engine is None or not engine.alive():
            raise EngineUnavailable("engine not ready")
        try:
            request_id, queue = await engine.submit(request)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise EngineUnavailable("engine pipe closed") from exc
        return engine, request_id, queue

    async def close(self, drain_s: float = 30.0) -> None:
        self._closing = True
        self.state = "down"
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self.engine is not None:
            await self.engine.close(drain_s)
