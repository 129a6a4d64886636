"""Run the mux engine in-process on a scripted stdin and read its frames back."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from colibri.reference.engine_model import TextTokenizer
from colibri.reference.engine_runtime import EngineRuntime
from colibri.reference.engine_settings import from_environment
from colibri.reference.mux_engine import MuxEngine
from colibri.reference.wire_input import BytesSource
from colibri.reference.wire_output import FrameWriter
from engine_fakes import FakeCodec, FakeModel

from colibri.protocol import Frame, FrameReader


@dataclass
class EngineRun:
    stdout: bytes
    stderr: str
    preamble: list[bytes]
    frames: list[Frame]
    engine: MuxEngine

    def for_id(self, rid: int) -> list[Frame]:
        """Frames tagged with request id `rid` (ACCEPT, ECHO, DATA, TOPK, PERF, DONE, ERROR)."""
        return [
            f
            for f in self.frames
            if f.parsed is not None and f.parsed.spec.tagged and f.parsed.values.get("id") == rid
        ]


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
    script: bytes,
    *,
    model: FakeModel | None = None,
    tokenizer: TextTokenizer | None = None,
    kv_slots: int = 1,
    ctx: int = 64,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
) -> EngineRun:
    model = model or FakeModel()
    environment = {"COLI_PERSIST": "1" if state_dir else "0", **(env or {})}
    settings = from_environment(
        environment, model_dir=Path("fake-model"), kv_slots=kv_slots, ctx=ctx
    )
    log = io.StringIO()
    runtime = EngineRuntime(
        model,
        tokenizer,
        settings,
        log,
        state_dir=state_dir,
        codec=FakeCodec(model),
        model_tag=0x1234,
    )
    stdout = io.BytesIO()
    engine = MuxEngine(runtime, BytesSource(script), FrameWriter(stdout))
    assert engine.run() == 0
    data = stdout.getvalue()
    reader = FrameReader(io.BytesIO(data))
    preamble = reader.read_preamble()
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame)
    return EngineRun(data, log.getvalue(), preamble, frames, engine)
