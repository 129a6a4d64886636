"""One request in flight (what it asked, how far it got) and the measurements its turn-end
block reports: PERF, PROF and DONE's numbers (spec/protocol.md 2.5 and 2.6)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from colibri.engine.backend import StepTiming, StoreCounters
from colibri.engine.host_info import physical_read_bytes
from colibri.engine.rng import Rng
from colibri.protocol.records import Perf, Prof
from colibri.text.grammar import Matcher


@dataclass
class Request:
    rid: int
    slot: int
    temperature: float
    top_p: float
    logprobs: int
    rng: Rng
    prompt_tokens: int
    maximum: int
    submitted_at: float
    emitted: int = 0
    pending: int | None = None  # sampled and emitted, not yet forwarded
    decode_started: float = 0.0
    first_token_at: float | None = None
    forwards: int = 0
    forward_ms: list[float] = field(default_factory=list)
    store_at_start: tuple[int, int, float] = (0, 0, 0.0)
    physical_at_start: int | None = None
    kv_seconds: float = 0.0
    #: The backend's phase times of the decode steps this request took part in.
    matmul_s: float = 0.0
    attention_s: float = 0.0
    head_s: float = 0.0

    def add_step(self, timing: StepTiming) -> None:
        """A decode step this request had a row in: all of its phases fell in its window."""
        self.matmul_s += timing.matmul_s
        self.attention_s += timing.attention_s
        self.head_s += timing.head_s
    #: The SUBMIT's grammar state; None when it sent no grammar.
    matcher: Matcher | None = None


@dataclass(frozen=True)
class TurnNumbers:
    decode_s: float
    tok_s: float
    hit_pct: float
    disk_s: float


def turn_numbers(request: Request, counters: StoreCounters) -> TurnNumbers:
    """Decode time since the end of prefill, tok/s over it, and the expert store's hit % and
    disk time over the request's window (engine-wide counters)."""
    decode_s = max(time.perf_counter() - request.decode_started, 0.0)
    tok_s = request.emitted / decode_s if request.emitted and decode_s > 0 else 0.0
    lookups0, hits0, disk0 = request.store_at_start
    lookups = counters.lookups - lookups0
    return TurnNumbers(
        decode_s, tok_s, hit_percent(lookups, counters.hits - hits0), counters.disk_seconds - disk0
    )


def hit_percent(lookups: int, hits: int) -> float:
    """Expert RAM-cache hits / lookups x 100 over a window; 0.0 without lookups."""
    return 100.0 * hits / lookups if lookups else 0.0


def perf_record(request: Request, numbers: TurnNumbers) -> Perf:
    """PERF: decode time, the store's disk time, the backend's phases, KV bookkeeping.
    Expert waits are 0: no backend loads experts asynchronously (spec/protocol.md 2.6)."""
    return Perf(request.rid, numbers.decode_s, numbers.disk_s, 0.0, request.matmul_s,
                request.attention_s, request.kv_seconds, request.head_s)


def prof_record(request: Request, numbers: TurnNumbers) -> Prof:
    """PROF in colibri's newest 17-field form."""
    samples = sorted(request.forward_ms)
    if samples:
        p50 = samples[(len(samples) - 1) // 2]
        p99 = samples[min(len(samples) - 1, int(0.99 * (len(samples) - 1) + 0.5))]
    else:
        p50 = p99 = -1.0
    physical_now = physical_read_bytes()
    valid = physical_now is not None and request.physical_at_start is not None
    physical = (physical_now or 0) - (request.physical_at_start or 0) if valid else 0
    ttft = (
        (request.first_token_at - request.submitted_at) * 1000.0
        if request.first_token_at is not None
        else 0.0
    )
    return Prof(numbers.decode_s, request.prompt_tokens, request.emitted, numbers.disk_s, 0.0,
                request.matmul_s, request.attention_s, request.head_s, request.forwards, p50,
                p99, max(physical, 0), 0, 0, ttft, 0.0, valid)
