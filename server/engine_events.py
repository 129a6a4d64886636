"""What the engine client hands a request's consumer: one event per frame that concerns the
request (ACCEPT, DATA, ECHO, DONE, ERROR) and the turn's telemetry, in the server's terms.

The frames themselves are read by the one wire codec (``colibri.protocol.records``, tolerant
reading); these types are what the HTTP side keeps of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from colibri.protocol.records import Logprobs


@dataclass(frozen=True)
class TokenRecord:
    """One DATA/ECHO numeric tail: the token's logprob and its top-k candidate table."""

    logprob: float
    candidates: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, logprobs: Logprobs | None) -> TokenRecord | None:
        return None if logprobs is None else cls(logprobs.logprob, logprobs.top)


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
