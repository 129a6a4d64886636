"""colibri's serve_mux_check, in-process: waves of requests over several slots, compared with
the same requests served one at a time on a single slot.

Wave 1 gives every slot a new conversation (every other one with logprobs=2, some sampled
with a seed). Wave 2 per slot: extend the conversation with wave 1's answer and more tokens,
rewind to inside the wave-1 prompt (logprobs=1), or start over. In wave 2 one request is
STOPped and one CANCELled right after their first DATA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from colibri.protocol import WireFrame
from support.engine_harness import EngineRun, submit


@dataclass
class Req:
    rid: int
    slot: int
    prompt: list[int]
    max_tokens: int
    ext: str
    temperature: str = "0"
    top_p: str = "1"

    def frame(self, rid: int | None = None, slot: int | None = None) -> bytes:
        payload = " ".join(str(t) for t in self.prompt).encode()
        return submit(
            self.rid if rid is None else rid,
            self.slot if slot is None else slot,
            payload,
            self.max_tokens,
            self.temperature,
            self.top_p,
            ext=self.ext,
        )


def comparable(frames: list[WireFrame]) -> list[str]:
    """A request's tagged frames without ids and measurements (ids differ between runs)."""
    out = []
    for frame in frames:
        kind = frame.kind
        if kind == "PERF":
            continue
        fields = frame.line.decode("latin-1").rstrip("\n").split(" ")
        fields[1] = "#"
        if kind == "DONE":
            fields = [fields[0], fields[3], fields[7], fields[8]]  # emitted, prompt, limited
        text = " ".join(fields)
        if frame.payload is not None:
            text += " | " + frame.payload.hex()
        out.append(text)
    return out


def generated_ids(frames: list[WireFrame]) -> list[int]:
    return [int(f.payload.decode()) for f in frames if f.kind == "DATA" and f.payload]


Runner = Callable[[list[bytes], int], EngineRun]


@dataclass
class MuxCheck:
    batched: EngineRun
    alone: dict[int, list[str]]  # request id -> its frames when served alone
    stopped: int
    cancelled: int | None
    alone_run: EngineRun


def serve_mux_check(run: Runner, slots: int, vocab: int) -> MuxCheck:
    """Run the waves batched over `slots` slots, and every request alone on a 1-slot engine
    (in the same order, so prefix reuse differs between the two runs)."""
    base = 3
    wave1 = []
    for s in range(slots):
        prompt = [(base + 7 * s + 3 * i) % (vocab - 2) + 2 for i in range(4 + s)]
        ext = "ids=1 logprobs=2" if s % 2 else "ids=1"
        temperature, top_p = ("0.8", "0.9") if s % 3 == 2 else ("0", "1")
        if temperature != "0":
            ext += f" seed={100 + s}"
        wave1.append(Req(1 + s, s, prompt, 6 + s, ext, temperature, top_p))
    first = run([r.frame(slot=0) for r in wave1], 1)
    wave2 = []
    for s, prev in enumerate(wave1):
        answer = generated_ids(first.for_id(prev.rid))
        mode = s % 3
        if mode == 0:
            prompt = prev.prompt + answer[:-1] + [5, 6]
            ext = "ids=1"
        elif mode == 1:
            prompt = prev.prompt[:2] + [9]
            ext = "ids=1 logprobs=1"
        else:
            prompt = [11 + s, 12, 13]
            ext = "ids=1"
        wave2.append(Req(100 + s, s, prompt, 20, ext))
    alone_run = run([r.frame(slot=0) for r in wave1 + wave2], 1)
    alone = {r.rid: comparable(alone_run.for_id(r.rid)) for r in wave1 + wave2}

    def runs_long(req: Req) -> bool:
        return alone[req.rid][-1].endswith(" 1") and len(alone[req.rid]) > 4

    # STOP and CANCEL go to requests that would otherwise run to their budget, so the control
    # lines (read after every wave-2 SUBMIT has had its turn) find them still active.
    long = [r.rid for r in wave2 if runs_long(r)]
    assert long, "no wave-2 request runs long enough to be stopped"
    stopped = long[0]
    cancelled = long[1] if len(long) > 1 else None
    control = f"STOP {stopped}\n".encode()
    if cancelled is not None:
        control += f"CANCEL {cancelled}\n".encode()
    waves = [
        b"".join(r.frame() for r in wave1),
        b"".join(r.frame() for r in wave2) + control,
    ]
    return MuxCheck(run(waves, slots), alone, stopped, cancelled, alone_run)
