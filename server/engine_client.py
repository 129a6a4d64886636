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

from colibri.server.engine_events import (
    Accept,
    Data,
    Done,
    DoneStats,
    Echo,
    EngineDied,
    EngineErrorFrame,
    Event,
    TokenRecord,
    TurnTelemetry,
)

from colibri.protocol import BROKEN, SPEC, FrameParser, ProtocolViolation, SubmitRequest, WireFrame
from colibri.protocol import records as r
from colibri.protocol.lines import parse_line

__all__ = [
    "Accept", "Data", "Done", "Echo", "EngineDied", "EngineErrorFrame", "EngineProcess",
    "EngineStartError", "Event", "SubmitRequest", "Telemetry", "submit_header",
]

#: How much of the engine's stdout one read takes.
_READ_CHUNK = 1 << 16

#: The startup lines an engine sends after READY, in order (spec/protocol.json).
HANDSHAKE: tuple[str, ...] = tuple(SPEC.mux["handshake"])


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
    return r.Submit(request_id, request).line().encode("ascii") + b"\n"


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
                ValueError) as exc:
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
            raise ProtocolViolation(frame.kind, f"invalid engine output ({frame.problem})",
                                    frame.describe())
        return frame

    async def _await_ready(self, stdout: asyncio.StreamReader) -> None:
        while (frame := await self._next_frame(stdout)) is None or frame.kind != "READY":
            if frame is None:
                raise asyncio.IncompleteReadError(b"", None)
        # Read the handshake (spec/protocol.md: STAT, CAPS, HWINFO, ...) before declaring the
        # engine ready, so capabilities such as per-request seeds are known before the first
        # request. colibri's own engines put CAPS before STAT and stop after EMAP; lines after
        # STAT are awaited briefly only, so an engine with a shorter handshake still starts.
        last = HANDSHAKE[-1]
        seen_stat = False
        while True:
            try:
                frame = await self._next_frame(stdout, HANDSHAKE_TAIL_S if seen_stat else None)
            except TimeoutError:
                return
            if frame is None:
                raise asyncio.IncompleteReadError(b"", None)
            if frame.payload is not None:
                raise ProtocolViolation(frame.kind, "a payload frame during the handshake",
                                        frame.describe())
            self._dispatch(frame)
            seen_stat = seen_stat or frame.kind == "STAT"
            if frame.kind == last:
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
        frame = r.Submit(request_id, request).encode()
        try:
            await self._write(frame)
        except (BrokenPipeError, ConnectionResetError):
            self._queues.pop(request_id, None)
            raise
        return request_id, queue

    async def stop(self, request_id: int) -> None:
        if request_id in self._queues:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self._write(r.Stop(request_id).encode())

    async def cancel(self, request_id: int) -> None:
        if request_id in self._queues:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self._write(r.Cancel(request_id).encode())

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
                self._dispatch(frame)
        except (asyncio.IncompleteReadError, ValueError) as exc:
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

    def _deliver(self, frame: WireFrame, event: Event, terminal: bool) -> None:
        request_id = frame.request_id
        if request_id is None:
            return
        queue = self._queues.pop(request_id, None) if terminal else self._queues.get(
            request_id)
        if queue is not None:
            queue.put_nowait(event)

    def _dispatch(self, frame: WireFrame) -> None:
        """One frame into an event or the telemetry. The kinds the server has no use for
        (STAT, PERF, TOPK) and unknown kinds are not read at all (forward compatibility); a
        known kind is read with the codec's tolerant reading, and a line it cannot read is a
        protocol error (``ProtocolViolation``) that ends this engine, except a DATA's, which
        fails only its request."""
        if frame.kind not in _READ:
            return
        text = frame.header.decode("utf-8", "replace")
        try:
            parsed = parse_line(text, strict=False)
            assert parsed is not None
            record = r.ENGINE_RECORDS[parsed.kind].from_line(parsed, text, frame.payload)
        except ProtocolViolation:
            if frame.kind != "DATA":
                raise
            self._deliver(frame, Data(frame.payload or b"", None, malformed=True), False)
            return
        self._take(frame, record, parsed.extra)

    def _take(self, frame: WireFrame, record: r.Record, extra: tuple[str, ...]) -> None:
        tele, turn = self.telemetry, self._turn
        match record:
            case r.Data(payload=payload, logprobs=logprobs):
                top = logprobs.top if logprobs is not None else ()
                # A top-k table that names a token twice is no distribution: the request fails.
                bad = len({token for token, _ in top}) != len(top)
                self._deliver(frame, Data(payload, None, malformed=True) if bad
                              else Data(payload, TokenRecord.of(logprobs)), False)
            case r.Echo():
                self._deliver(frame, Echo(record.payload, record.pos,
                                          TokenRecord.of(record.logprobs)), False)
            case r.Accept():
                self._deliver(frame, Accept(record.prompt_tokens), False)
            case r.Done():
                stats = DoneStats(record.emitted, record.tok_s, record.hit_pct, record.rss_gb,
                                  record.prompt_tokens, record.length_limited)
                self._turn = TurnTelemetry()
                self._deliver(frame, Done(stats, turn), True)
            case r.Error():
                # CONTEXT_EXCEEDED's two numbers, or what another family writes there instead
                # (key=value pairs), as the request's error arguments.
                numbers = () if record.prompt_tokens is None else (
                    str(record.prompt_tokens), str(record.limit))
                self._deliver(frame, EngineErrorFrame(record.code, numbers + extra), True)
            case r.HwInfo():
                tele.hwinfo = {
                    "cores": record.cores, "ram_total_gb": record.ram_total_gb,
                    "ram_avail_gb": record.ram_avail_gb, "gpus": record.ngpu,
                    "vram_total_gb": record.vram_total_gb, "cpu": record.cpu.strip(),
                    "gpu": record.gpu.strip()}
            case r.Tiers():
                tele.tiers = {"vram": record.vram, "ram": record.ram, "disk": record.disk,
                              "vram_gb": record.vram_gb, "ram_gb": record.ram_gb}
            case r.Emap():
                tele.emap = (record.rows, record.cols, record.map.hex())
            case r.Hits():
                tele.hits = record.bits.hex()
                tele.hits_seq += 1
            case r.Prof():
                turn.perf = {
                    "wall_s": record.wall_s, "prompt_tokens": record.prompt_tokens,
                    "completion_tokens": record.completion_tokens,
                    "expert_disk_s": record.edisk_s, "expert_wait_s": record.ewait_s,
                    "expert_matmul_s": record.emm_s, "attention_s": record.attn_s,
                    "lm_head_s": record.head_s, "forwards": record.forwards}
                tele.profile.append(turn.perf)
                del tele.profile[:-PROFILE_RING]
                tele.profile_seq += 1
            case r.Entropy():
                turn.entropy = list(record.layers)
            case r.Gpus():
                turn.gpus = [{"used_gb": d.used_gb, "total_gb": d.total_gb,
                              "experts": d.experts} for d in record.devices]
            case r.Repin():
                turn.repin.append({"layer": record.layer, "expert": record.eid,
                                   "old_tier": record.old_tier, "gpu": record.gpu})
            case r.Caps():
                tele.caps.update((key, str(value)) for key, value in record.caps)

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


#: The kinds the server reads; STAT, PERF, TOPK and kinds it does not know are advisory.
_READ = frozenset({"ACCEPT", "DATA", "ECHO", "DONE", "ERROR", "CAPS", "HWINFO", "GPUS", "TIERS",
                   "EMAP", "HITS", "PROF", "ENTROPY", "REPIN"})
