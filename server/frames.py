"""Parsing of the engine's stdout lines (mux protocol, spec/protocol.md) into typed frames.

Only the line grammar lives here; reading payload bytes and routing by id is the client's
job. Unknown line kinds are not errors: the protocol's forward-compatibility rule says a
server ignores what it does not recognise, except that payload-framed kinds must still be
consumed so the stream stays in step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from colibri.protocol import LIMITS, SPEC

#: The startup lines an engine sends after READY, in order (spec/protocol.json).
HANDSHAKE: tuple[str, ...] = tuple(SPEC.mux["handshake"])

#: Line kinds followed by ``<n>`` raw payload bytes and one ``\n`` (the size is field 2):
#: DATA and ECHO, plus colibri's other families' kinds (TOOL, GRPP, GRPG) so such an
#: engine's payloads are still consumed, not misread.
PAYLOAD_KINDS: frozenset[str] = SPEC.framed_kinds

#: Largest DATA/ECHO payload (spec/protocol.json ``limits.max_frame_payload_bytes``).
MAX_PAYLOAD = LIMITS["max_frame_payload_bytes"]

#: Largest logprob table an engine writes (``limits.max_logprobs``).
MAX_LOGPROBS = LIMITS["max_logprobs"]


class FrameError(ValueError):
    """A line of a known kind that does not follow its grammar."""


@dataclass(frozen=True)
class TokenRecord:
    """One DATA/ECHO numeric tail: the token's logprob and its top-k candidate table."""

    logprob: float
    candidates: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class DoneStats:
    completion_tokens: int
    tokens_per_second: float
    cache_hit_percent: float
    rss_gb: float
    prompt_tokens: int
    length_limited: bool


@dataclass
class TurnTelemetry:
    """Telemetry lines seen since the previous DONE (the engine's block before each DONE)."""

    perf: dict[str, float | int] | None = None
    entropy: list[float] | None = None
    gpus: list[dict[str, float | int]] | None = None
    repin: list[dict[str, int]] = field(default_factory=list)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise FrameError(f"not a number: {text!r}") from exc


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise FrameError(f"not an integer: {text!r}") from exc


def parse_logprob_tail(fields: list[str]) -> TokenRecord | None:
    """``<lp> <k> (<id> <lp>)×k`` or nothing (a plain frame)."""
    if not fields:
        return None
    if len(fields) < 2:
        raise FrameError("logprob tail without a candidate count")
    lp = _float(fields[0])
    k = _int(fields[1])
    if not 0 <= k <= MAX_LOGPROBS or len(fields) != 2 + 2 * k:
        raise FrameError("logprob tail length does not match its count")
    candidates = []
    seen: set[int] = set()
    for i in range(k):
        token_id = _int(fields[2 + 2 * i])
        if token_id < 0 or token_id in seen:
            raise FrameError("duplicate or negative candidate id")
        seen.add(token_id)
        candidates.append((token_id, _float(fields[3 + 2 * i])))
    return TokenRecord(lp, tuple(candidates))


def parse_done(fields: list[str]) -> DoneStats:
    # DONE <id> STAT <emitted> <tok/s> <hit%> <rss> <prompt_tokens> <length_limited>
    if len(fields) < 9 or fields[2] != "STAT":
        raise FrameError("DONE needs STAT and six values")
    return DoneStats(
        completion_tokens=_int(fields[3]),
        tokens_per_second=_float(fields[4]),
        cache_hit_percent=_float(fields[5]),
        rss_gb=_float(fields[6]),
        prompt_tokens=_int(fields[7]),
        length_limited=_int(fields[8]) != 0,
    )


def parse_prof(fields: list[str]) -> dict[str, float | int]:
    if len(fields) < 10:
        raise FrameError("PROF needs at least 9 values")
    values = fields[1:]
    floats = [_float(v) for v in values[:9]]
    if not all(math.isfinite(v) for v in floats):
        raise FrameError("PROF values must be finite")
    return {
        "wall_s": floats[0], "prompt_tokens": int(floats[1]),
        "completion_tokens": int(floats[2]), "expert_disk_s": floats[3],
        "expert_wait_s": floats[4], "expert_matmul_s": floats[5], "attention_s": floats[6],
        "lm_head_s": floats[7], "forwards": int(floats[8]),
    }


def parse_hwinfo(line: str) -> dict[str, object]:
    fields = line.split()
    if len(fields) < 6:
        raise FrameError("HWINFO needs five values and names")
    names = " ".join(fields[6:])
    cpu, _, gpu = names.partition("|")
    return {"cores": _int(fields[1]), "ram_total_gb": _float(fields[2]),
            "ram_avail_gb": _float(fields[3]), "gpus": _int(fields[4]),
            "vram_total_gb": _float(fields[5]), "cpu": cpu.strip(), "gpu": gpu.strip()}


def parse_tiers(fields: list[str]) -> dict[str, float | int]:
    if len(fields) < 6:
        raise FrameError("TIERS needs five values")
    return {"vram": _int(fields[1]), "ram": _int(fields[2]), "disk": _int(fields[3]),
            "vram_gb": _float(fields[4]), "ram_gb": _float(fields[5])}


def parse_bitmap(fields: list[str]) -> tuple[int, int, str]:
    if len(fields) != 4:
        raise FrameError(f"{fields[0]} needs rows, cols and hex")
    hexdigits = fields[3].lower()
    if any(c not in "0123456789abcdef" for c in hexdigits):
        raise FrameError(f"{fields[0]} payload is not hex")
    return _int(fields[1]), _int(fields[2]), hexdigits


def parse_gpus(fields: list[str]) -> list[dict[str, float | int]]:
    if len(fields) < 2:
        raise FrameError("GPUS needs a count")
    n = _int(fields[1])
    if len(fields) != 2 + 3 * n:
        raise FrameError("GPUS length does not match its count")
    return [{"used_gb": _float(fields[2 + 3 * i]), "total_gb": _float(fields[3 + 3 * i]),
             "experts": _int(fields[4 + 3 * i])} for i in range(n)]


def parse_caps(fields: list[str]) -> dict[str, str]:
    caps: dict[str, str] = {}
    for token in fields[1:]:
        key, sep, value = token.partition("=")
        if sep:
            caps[key] = value
    return caps
