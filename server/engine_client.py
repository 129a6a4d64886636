"""An asyncio client for one engine process speaking the mux protocol on stdin/stdout.

The client spawns the process and feeds its stdout, as it arrives, to
``colibri.protocol.FrameParser`` (the one frame reader); it discards everything before
READY, then one reader task demultiplexes frames by request id into per-request queues
and keeps the untagged telemetry. Writes of one request are a single ``write`` so frames of
concurrent requests never interleave. When the process exits every in-flight request receives an
:class:`EngineDied` event; the supervisor decides what happens next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from colibri.server import frames
from colibri.server.frames import DoneStats, FrameError, TokenRecord, TurnTelemetry

from colibri.protocol import BROKEN, FrameParser, SubmitRequest, WireFrame
from colibri.protocol.records import Cancel, Stop, Submit

#: How much of the engine's stdout one read takes.
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Accept:
    prompt_tokens: int


@dataclass(frozen=True)
class Data:
    payload: bytes
    record: TokenRecord | None
    #: The numeric tail could not be read: this request fails, the engine carries on.
    malformed: bool = False


@dataclass(frozen=True)
class Echo:
    payload: bytes
    position: int
    record: TokenRecord | None


@dataclass(frozen=True)
class Done:
    stats: DoneStats
    telemetry: TurnTelemetry


@dataclass(frozen=True)
class EngineErrorFrame:
    code: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class EngineDied:
    reason: str


Event = Accept | Data | Echo | Done | EngineErrorFrame | EngineDied


class EngineStartError(RuntimeError):
    """The process exited or spoke garbage before READY."""


@dataclass
class Telemetry:
    """The latest engine-wide telemetry, as the HTTP side reports it."""

    hwinfo: dict[str, object] | None = None
    tiers: dict[str, float | int] | None = None
    emap: tuple[int, int, str] | None = None
    hits: str = ""
    hits_seq: int = 0
    profile: list[dict[str, float | int]] = field(default_factory=list)
    profile_seq: int = 0
    caps: dict[str, str] = field(default_factory=dict)


PROFILE_RING = 120

#: How long to wait for each handshake line after STAT.
HANDSHAKE_TAIL_S = 0.5


def submit_header(request_id: int, request: SubmitRequest) -> bytes:
    """The SUBMIT line; gbytes is written whenever there is a grammar or an extension."""
    return Submit(request_id, request).line().encode("ascii") + b"\n"


class EngineProcess:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.telemetry = Telemetry()
        self.process: asyncio.subprocess.Process | None = None
        self._queues: dict[int, asyncio.Queue[Event]] = {}
        self._next_id = 1
        self._turn = TurnTelemetry()
        self._reader: asyncio.Task[None] | None = None
        self.exited: asyncio.Future[str] | None = None
        self._write_lock = asyncio.Lock()
        self._parser = FrameParser()
        self._frames: deque[WireFrame] = deque()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def supports_seeds(self) -> bool:
        return self.telemetry.caps.get("seed") == "1"

    async def start(self, ready_timeout: float = 600.0) -> None:
        self.exited = asyncio.get_running_loop().create_future()
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=self.env, limit=1 << 20, start_new_session=True)
        assert self.process.stdout is not None
        try:
            await asyncio.wait_for(self._await_ready(self.process.stdout), ready_timeout)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                FrameError, ValueError) as exc:
            code = await self._reap()
            raise EngineStartError(
                f"engine {self.argv[0]!r} did not become READY (exit status {code})") from exc
        self._reader = asyncio.create_task(self._read_loop(self.process.stdout))

    async def _next_frame(
        self, stdout: asyncio.StreamReader, timeout: float | None = None
    ) -> WireFrame | None:
        """The parser's next frame, reading more of stdout as needed; None at EOF."""
        while not self._frames:
            read = stdout.read(_READ_CHUNK)
            chunk = await (asyncio.wait_for(read, timeout) if timeout is not None else read)
            if not chunk:
                self._frames.extend(self._parser.finish())
                if not self._frames:
                    return None
                break
            self._frames.extend(self._parser.feed(chunk))
        frame = self._frames.popleft()
        if frame.kind == BROKEN:
            raise FrameError(f"invalid engine output ({frame.problem}): {frame.describe()!r}")
        return frame

    async def _await_ready(self, stdout: asyncio.StreamReader) -> None:
        while (frame := await self._next_frame(stdout)) is None or frame.kind != "READY":
            if frame is None:
                raise asyncio.IncompleteReadError(b"", None)
        # Read the handshake (spec/protocol.md: STAT, CAPS, HWINFO, ...) before declaring the
        # engine ready, so capabilities such as per-request seeds are known before the first
        # request. colibri's own engines put CAPS before STAT and stop after EMAP; lines after
        # STAT are awaited briefly only, so an engine with a shorter handshake still starts.
        last = frames.HANDSHAKE[-1]
        seen_stat = False
        while True:
            try:
                frame = await self._next_frame(stdout, HANDSHAKE_TAIL_S if seen_stat else None)
            except TimeoutError:
                return
            if frame is None:
                raise asyncio.IncompleteReadError(b"", None)
            text = frame.header.decode("utf-8", "replace")
            fields = text.split()
            if not fields:
                continue
            if frame.payload is not None:
                raise FrameError("unexpected payload frame during the handshake")
            self._dispatch(fields[0], fields, b"", text)
            seen_stat = seen_stat or fields[0] == "STAT"
            if fields[0] == last:
                return

    async def _reap(self) -> int | None:
        if self.process is None:
            return None
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        return await self.process.wait()

    # ---- requests -------------------------------------------------------------------

    def alive(self) -> bool:
        return (self.process is not None and self.process.returncode is None
                and self.exited is not None and not self.exited.done())

    async def submit(self, request: SubmitRequest) -> tuple[int, asyncio.Queue[Event]]:
        if not self.alive():
            raise BrokenPipeError("engine is not running")
        request_id = self._next_id
        self._next_id += 1
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues[request_id] = queue
        frame = Submit(request_id, request).encode()
        try:
            await self._write(frame)
        except (BrokenPipeError, ConnectionResetError):
            self._queues.pop(request_id, None)
            raise
        return request_id, queue

    async def stop(self, request_id: int) -> None:
        if request_id in self._queues:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self._write(Stop(request_id).encode())

    async def cancel(self, request_id: int) -> None:
        if request_id in self._queues:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self._write(Cancel(request_id).encode())

    def release(self, request_id: int) -> None:
        """Forget a request (after its terminal event, or when its caller gave up)."""
        self._queues.pop(request_id, None)

    async def _write(self, data: bytes) -> None:
        assert self.process is not None and self.process.stdin is not None
        async with self._write_lock:
            self.process.stdin.write(data)
            await self.process.stdin.drain()

    # ---- reading --------------------------------------------------------------------

    async def _read_loop(self, stdout: asyncio.StreamReader) -> None:
        reason = "engine closed its stdout"
        try:
            while (frame := await self._next_frame(stdout)) is not None:
                text = frame.header.decode("utf-8", "replace")
                fields = text.split()
                if fields:
                    self._dispatch(fields[0], fields, frame.payload or b"", text)
        except (FrameError, asyncio.IncompleteReadError, ValueError) as exc:
            reason = f"engine protocol error: {exc}"
        except asyncio.CancelledError:
            reason = "engine client closed"
        code = await self._reap()
        message = f"{reason} (exit status {code})"
        for queue in self._queues.values():
            queue.put_nowait(EngineDied(message))
        self._queues.clear()
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(message)

    def _deliver(self, fields: list[str], event: Event, terminal: bool) -> None:
        try:
            request_id = int(fields[1])
        except (IndexError, ValueError):
            return
        queue = self._queues.pop(request_id, None) if terminal else self._queues.get(
            request_id)
        if queue is not None:
            queue.put_nowait(event)

    def _dispatch(self, kind: str, fields: list[str], payload: bytes, line: str) -> None:
        tele = self.telemetry
        if kind == "DATA":
            try:
                data = Data(payload, frames.parse_logprob_tail(fields[3:]))
            except FrameError:
                data = Data(payload, None, malformed=True)
            self._deliver(fields, data, False)
        elif kind == "ECHO":
            if len(fields) < 4:
                raise FrameError("ECHO needs a position")
            position = int(fields[3])
            self._deliver(fields, Echo(payload, position,
                                       frames.parse_logprob_tail(fields[4:])), False)
        elif kind == "ACCEPT":
            if len(fields) < 3:
                raise FrameError("ACCEPT needs a token count")
            self._deliver(fields, Accept(int(fields[2])), False)
        elif kind == "DONE":
            stats = frames.parse_done(fields)
            turn, self._turn = self._turn, TurnTelemetry()
            self._deliver(fields, Done(stats, turn), True)
        elif kind == "ERROR":
            if len(fields) < 3:
                raise FrameError("ERROR needs a code")
            self._deliver(fields, EngineErrorFrame(fields[2], tuple(fields[3:])), True)
        elif kind == "HWINFO":
            tele.hwinfo = frames.parse_hwinfo(line)
        elif kind == "TIERS":
            tele.tiers = frames.parse_tiers(fields)
        elif kind == "EMAP":
            tele.emap = frames.parse_bitmap(fields)
        elif kind == "HITS":
            tele.hits = frames.parse_bitmap(fields)[2]
            tele.hits_seq += 1
        elif kind == "PROF":
            prof = frames.parse_prof(fields)
            self._turn.perf = prof
            tele.profile.append(prof)
            del tele.profile[:-PROFILE_RING]
            tele.profile_seq += 1
        elif kind == "ENTROPY":
            self._turn.entropy = [float(v) for v in fields[1:]]
        elif kind == "GPUS":
            self._turn.gpus = frames.parse_gpus(fields)
        elif kind == "REPIN" and len(fields) == 5:
            self._turn.repin.append({"layer": int(fields[1]), "expert": int(fields[2]),
                                     "old_tier": int(fields[3]), "gpu": int(fields[4])})
        elif kind == "CAPS":
            tele.caps.update(frames.parse_caps(fields))
        # STAT, PERF, TOPK, GPUDETAIL and unknown kinds are advisory: ignored.

    # ---- shutdown -------------------------------------------------------------------

    async def close(self, drain_s: float = 5.0) -> None:
        """Close stdin (the protocol's graceful shutdown), then escalate."""
        process = self.process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), drain_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
