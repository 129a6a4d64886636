"""Run the mux engine in-process on a scripted stdin and read its frames back."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from colibri.engine.backend import Backend
from colibri.engine.main import backend_options, build_runtime
from colibri.engine.mux import MuxEngine
from colibri.engine.registry import open_backend
from colibri.engine.runtime import TextTokenizer
from colibri.engine.settings import from_environment
from colibri.engine.wire_input import BytesSource, Source
from colibri.engine.wire_output import FrameWriter
from colibri.protocol import FrameReader, WireFrame
from support.engine_fakes import FakeBackend


class Waves:
    """Scripted stdin in waves (a ``Source``): the next wave arrives only once the engine is idle.

    The loop polls with timeout 0 while requests are active and waits when idle, so a wave is
    what a server sends after every earlier request has finished (DONE or ERROR).
    """

    def __init__(self, waves: list[bytes]) -> None:
        self._waves = list(waves)

    def poll(self, timeout: float | None) -> bool:
        if timeout == 0.0:
            return False
        return True

    def fill(self) -> bytes:
        while self._waves:
            wave = self._waves.pop(0)
            if wave:
                return wave
        return b""


@dataclass
class EngineRun:
    stdout: bytes
    stderr: str
    preamble: list[bytes]
    frames: list[WireFrame]
    engine: MuxEngine

    def for_id(self, rid: int) -> list[WireFrame]:
        """Frames tagged with request id `rid` (ACCEPT, ECHO, DATA, TOPK, PERF, DONE, ERROR)."""
        return [
            f
            for f in self.frames
            if f.parsed is not None and f.parsed.spec.tagged and f.parsed.values.get("id") == rid
        ]

    def payloads(self, rid: int) -> list[bytes]:
        """The bytes of request `rid`'s DATA frames, in order."""
        return [f.payload or b"" for f in self.for_id(rid) if f.kind == "DATA"]

    def greedy_ids(self, rid: int) -> list[int]:
        """The chosen tokens of a greedy request made with logprobs=1: the one-entry table of
        ``DATA <id> <n> <lp> 1 <token> <lp>`` holds the largest logit's token, the one chosen."""
        return [int(f.line.split()[5]) for f in self.for_id(rid) if f.kind == "DATA"]


def submit(
    rid: int,
    slot: int,
    payload: bytes,
    max_tokens: int = 8,
    temperature: str = "0",
    top_p: str = "1",
    ext: str = "",
    grammar: bytes | None = None,
) -> bytes:
    header = f"SUBMIT {rid} {slot} {len(payload)} {max_tokens} {temperature} {top_p}"
    if grammar is not None or ext:
        header += f" {len(grammar or b'')}"
    if ext:
        header += f" {ext}"
    return header.encode() + b"\n" + payload + (grammar or b"") + b"\n"


def ids(*tokens: int) -> bytes:
    return " ".join(str(t) for t in tokens).encode()


def run_engine(
    script: bytes | list[bytes],
    *,
    model: FakeBackend | None = None,
    tokenizer: TextTokenizer | None = None,
    kv_slots: int = 1,
    ctx: int = 64,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
    model_dir: Path | None = None,
    wrap: Callable[[Backend], Backend] | None = None,
    backend_name: str = "reference",
) -> EngineRun:
    """Run on the fake backend (`model`), or with `model_dir` on a real model (the
    `backend_name` backend, the reference by default); `wrap` replaces the backend with a
    wrapper of it."""
    environment = {"COLI_PERSIST": "1" if state_dir else "0", **(env or {})}
    if state_dir is not None:
        environment["COLI_STATE_DIR"] = str(state_dir)
    log = io.StringIO()
    backend: Backend
    if model_dir is not None:
        settings = from_environment(environment, model_dir=model_dir, kv_slots=kv_slots, ctx=ctx)
        options = backend_options(settings, ctx)
        backend = open_backend(backend_name, model_dir, options, log)
    else:
        settings = from_environment(
            environment, model_dir=Path("fake-model"), kv_slots=kv_slots, ctx=ctx
        )
        backend = model or FakeBackend()
    if wrap is not None:
        backend = wrap(backend)
    runtime = build_runtime(settings, environment, log, backend=backend, tokenizer=tokenizer)
    stdout = io.BytesIO()
    source: Source = BytesSource(script) if isinstance(script, bytes) else Waves(script)
    engine = MuxEngine(runtime, source, FrameWriter(stdout))
    assert engine.run() == 0
    data = stdout.getvalue()
    reader = FrameReader(io.BytesIO(data))
    preamble = reader.read_preamble()
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame)
    return EngineRun(data, log.getvalue(), preamble, frames, engine)


_TIMING_KINDS = {
    # kind -> indexes of whitespace fields (after the kind) that are measurements, not results
    "STAT": (3,),
    "HWINFO": None,  # the whole host description
    "DONE": (3, 5),
    "PERF": (1, 2, 3, 4, 5, 6, 7),
    "PROF": (0, 3, 4, 5, 6, 7, 9, 10, 11, 14, 15, 16),
}


def normalize(frame: WireFrame) -> str:
    """The frame as text with host- and time-dependent fields replaced by '*'."""
    text = frame.line.decode("latin-1").rstrip("\n")
    fields = text.split(" ")
    timing = _TIMING_KINDS.get(fields[0], ())
    if timing is None:
        return f"{fields[0]} *"
    for index in timing:
        if index + 1 < len(fields):
            fields[index + 1] = "*"
    normalized = " ".join(fields)
    if frame.payload is not None:
        normalized += " | " + frame.payload.decode("latin-1")
    return normalized


def transcript(run: EngineRun) -> list[str]:
    return [normalize(f) for f in run.frames]


def run_legacy(
    script: bytes,
    *,
    model: FakeBackend | None = None,
    env: Mapping[str, str] | None = None,
    ctx: int = 64,
    state_dir: Path | None = None,
) -> tuple[bytes, str]:
    from colibri.engine.legacy import LegacyEngine

    model = model or FakeBackend()
    environment = {"COLI_PERSIST": "1" if state_dir else "0", **(env or {})}
    if state_dir is not None:
        environment["COLI_STATE_DIR"] = str(state_dir)
    settings = from_environment(environment, model_dir=Path("fake-model"), ctx=ctx, legacy=True)
    log = io.StringIO()
    runtime = build_runtime(settings, environment, log, backend=model)
    stdout = io.BytesIO()
    assert LegacyEngine(runtime, BytesSource(script), FrameWriter(stdout)).run() == 0
    return stdout.getvalue(), log.getvalue()
