"""Where each routed expert's weights live, as the telemetry reports it (EMAP tier bits,
TIERS, DONE's hit %, PERF's disk time).

``TierReport`` is what the engine reads; ``ResidentExperts`` is the honest report for a model
that holds every weight in RAM (tier 1 everywhere, every lookup a hit). The tiered store with
a disk tier, a byte-bounded LRU and a pinned hot set lives in expert_store.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

TIER_DISK = 0
TIER_RAM = 1
TIER_VRAM = 2


@dataclass(frozen=True)
class TierCounts:
    vram: int
    ram: int
    disk: int
    vram_bytes: int
    ram_bytes: int


@dataclass
class StoreCounters:
    """Monotonic counters; the engine takes differences over a window."""

    lookups: int = 0
    hits: int = 0
    disk_seconds: float = 0.0
    disk_bytes: int = 0


@dataclass(frozen=True)
class Repin:
    layer: int
    expert: int
    old_tier: int
    gpu: int = -1


class TierReport(Protocol):
    def tier_matrix(self, rows: Sequence[int], n_experts: int) -> npt.NDArray[np.uint8]: ...
    def tier_counts(self, rows: Sequence[int], n_experts: int) -> TierCounts: ...
    def counters(self) -> StoreCounters: ...


class ResidentExperts:
    """Every expert resident in RAM (a model loaded whole): tier 1, all hits."""

    def __init__(self, bytes_per_expert: int = 0) -> None:
        self.bytes_per_expert = bytes_per_expert
        self._counters = StoreCounters()

    def note_lookups(self, n: int) -> None:
        self._counters.lookups += n
        self._counters.hits += n

    def tier_matrix(self, rows: Sequence[int], n_experts: int) -> npt.NDArray[np.uint8]:
        return np.full((len(rows), n_experts), TIER_RAM, np.uint8)

    def tier_counts(self, rows: Sequence[int], n_experts: int) -> TierCounts:
        total = len(rows) * n_experts
        return TierCounts(0, total, 0, 0, total * self.bytes_per_expert)

    def counters(self) -> StoreCounters:
        return StoreCounters(**vars(self._counters))
