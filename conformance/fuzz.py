"""Bounded robustness: malformed input must not crash the engine nor disturb another slot.

A sentinel request decodes on one slot while a burst of malformed commands arrives; its
stream must equal the same request served without the noise, every line the engine writes
must match the grammar, and the engine must exit cleanly on EOF. The noise is generated
from a fixed seed (the pytest suite adds hypothesis-driven variants of the same check), so
a verdict is reproducible.
"""

from __future__ import annotations

import random

from colibri.conformance.engine import EngineSession
from colibri.conformance.frames import Frame
from colibri.conformance.grammar import Grammar
from colibri.conformance.outcome import CheckFailure
from colibri.conformance.prompts import PromptCodec

from colibri.protocol import SubmitRequest
from colibri.protocol.records import Submit

#: Ids far away from anything the noise can produce, so noise never names the sentinel.
SENTINEL_ID = 987654321
SENTINEL_PROMPT = "The sentinel request keeps decoding"


def _mutations(rng: random.Random) -> bytes:
    """One malformed command (always newline-terminated, never a valid SUBMIT frame)."""
    fields = ["SUBMIT", str(rng.randint(1, 999)), "0", "5", "4", "0", "1"]
    choice = rng.randrange(12)
    if choice == 0:
        fields[rng.randrange(1, 7)] = rng.choice(["-1", "nan", "inf", "x", "", "1e400", "0x10"])
    elif choice == 1:
        fields.append(rng.choice(["junk", "7", "logprobs=99", "ids=2", "a=b"]))
    elif choice == 2:
        fields = fields[: rng.randrange(1, 6)]
    elif choice == 3:
        return rng.choice([b"STOP\n", b"STOP 0\n", b"CANCEL x\n", b"STOP 1 2\n", b"CANCEL -4\n"])
    elif choice == 4:
        return bytes(rng.randrange(32, 127) for _ in range(rng.randrange(0, 80))) + b"\n"
    elif choice == 5:
        return b"\x00\x01\x02 \xff\xfe\n"
    elif choice == 6:
        return b"\n"
    elif choice == 7:
        return b"PING\n"
    elif choice == 8:
        return b"X" * rng.randrange(1000, 8000) + b"\n"
    elif choice == 9:
        fields[3] = str(rng.choice([1 << 25, 1 << 40]))  # oversize byte count
    elif choice == 10:
        fields[2] = str(rng.choice([99, 4096, -3]))  # slot out of range
    else:
        return b"SUBMIT  1  0 5 4 0 1\r\n"
    return " ".join(fields).encode() + b"\n"


def noise(seed: int, examples: int) -> list[bytes]:
    rng = random.Random(seed)
    return [_mutations(rng) for _ in range(examples)]


def _sentinel_stream(frames: list[Frame]) -> list[bytes]:
    """The sentinel's tokens and final counts (DONE's timing fields legitimately vary)."""
    out = []
    for f in frames:
        if f.request_id != SENTINEL_ID:
            continue
        if f.kind == "DONE":
            fields = f.fields
            out.append(" ".join(fields[i] for i in (0, 3, 7, 8) if i < len(fields)).encode())
        elif f.kind in ("DATA", "ERROR"):
            out.append(f.header.split(b" ", 2)[-1] + b"|" + (f.payload or b""))
    return out


def _first_change(got: list[bytes], want: list[bytes]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"frame {i}: {a!r} instead of {b!r}"
    return f"{len(got)} frames instead of {len(want)} (last: {got[-1:]!r})"


def run_fuzz(
    engine: EngineSession,
    codec: PromptCodec,
    grammar: Grammar,
    examples: int,
    slot: int,
    timeout: float,
    seed: int = 20250,
    commands: list[bytes] | None = None,
) -> None:
    """Baseline the sentinel, rerun it under noise, compare; the engine then exits on EOF.

    ``commands`` replaces the seeded noise (the pytest suite feeds hypothesis examples).
    """
    payload = codec.encode(SENTINEL_PROMPT)
    ext = {"ids": 1} if payload.ids else {}
    frame = Submit(SENTINEL_ID, SubmitRequest(slot, payload.data, 12, 0.0, 1.0,
                                              extensions=ext)).encode()
    start = len(engine.frames)
    engine.send(frame)
    engine.wait_for(
        lambda f: f.request_id == SENTINEL_ID and f.kind in ("DONE", "ERROR"),
        timeout,
        "the sentinel's baseline DONE",
        start=start,
    )
    baseline = _sentinel_stream(engine.frames[start:])
    if not baseline or not baseline[-1].startswith(b"DONE"):
        raise CheckFailure(f"sentinel baseline did not complete: {baseline[-1:]!r}")
    second = len(engine.frames)
    burst = commands if commands is not None else noise(seed, examples)
    engine.send(frame + b"".join(burst))
    # EOF makes the engine finish what it accepted and exit; the noise may legitimately
    # end stdin processing early (BAD_FRAME), never the sentinel's decode.
    engine.close_stdin()
    code = engine.await_exit(timeout)
    under_noise = _sentinel_stream(engine.frames[second:])
    if under_noise != baseline:
        raise CheckFailure(
            "sentinel stream changed under malformed input: " + _first_change(under_noise, baseline)
        )
    problems = [p for p in (grammar.check(f) for f in engine.frames[second:]) if p]
    if problems:
        raise CheckFailure("malformed answer to malformed input: " + "; ".join(problems[:3]))
    if code != 0:
        raise CheckFailure(f"engine exited with status {code} after malformed input")
