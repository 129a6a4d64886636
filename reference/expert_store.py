"""Routed experts in three places, as colibri keeps them: on disk (the memory-mapped
container, read when routed), in a byte-bounded RAM cache (true LRU), and in a pinned hot set
that is never evicted, ranked from the usage history and re-pinned live (REPIN).

The store implements the model's ``ExpertStore`` protocol (``expert(layer, e)``) and the
engine's ``TierReport``, so EMAP's tier bits, TIERS, DONE's hit % and PERF's disk time report
what really happened. Placement never changes the math: a cached or pinned expert holds the
same float32 values as the mapped one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
from colibri.reference.config import ModelConfig
from colibri.reference.expert_lru import ExpertLru, Key
from colibri.reference.experts import ExpertWeights, expert_tensor_names
from colibri.reference.weights import TensorLoader

from colibri.engine.backend import (
    TIER_DISK,
    TIER_RAM,
    Repin,
    StoreCounters,
    TierCounts,
)

#: Reads one expert's float32 weights from the container (the disk tier), uncached.
ExpertReader = Callable[[int, int], ExpertWeights]
#: An expert's bytes as stored in the container (``experts.stored_expert_bytes``).
StoredBytes = Callable[[int, int], int]


def mapped_reader(loader: TensorLoader, cfg: ModelConfig) -> ExpertReader:
    """Float checkpoints: copy the expert out of the memory-mapped safetensors."""
    d, inter = cfg.hidden_size, cfg.moe_intermediate_size

    def read(layer: int, expert: int) -> ExpertWeights:
        gate, up, down = expert_tensor_names(layer, expert)
        return ExpertWeights(
            gate=np.array(loader.get(gate, (inter, d)), dtype=np.float32, copy=True),
            up=np.array(loader.get(up, (inter, d)), dtype=np.float32, copy=True),
            down=np.array(loader.get(down, (d, inter)), dtype=np.float32, copy=True),
        )

    return read


class TieredExpertStore:
    def __init__(
        self,
        read: ExpertReader,
        cfg: ModelConfig,
        layers: Sequence[int],
        ram_budget_bytes: int,
        stored_bytes: StoredBytes,
    ) -> None:
        self.read = read
        self.cfg = cfg
        # Reported bytes (TIERS, disk reads) are stored bytes; the RAM budget bounds what
        # this process really holds (weights.nbytes), which differs between backends.
        self._stored_bytes = stored_bytes
        self._stored: dict[Key, int] = {}
        self.layers = list(layers)
        # RAM_GB=0 means unbounded (colibri).
        self._lru = ExpertLru(ram_budget_bytes or None)
        self._pinned: dict[Key, ExpertWeights] = {}
        self._counters = StoreCounters()
        # Decayed per-expert heat for re-pinning: +1 per use, halved after every pass.
        self._heat: dict[Key, int] = {}
        d, inter = cfg.hidden_size, cfg.moe_intermediate_size
        self.expert_bytes = 3 * d * inter * 4

    # --- the model's ExpertStore protocol -------------------------------------------------

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        key = (layer, expert)
        self._counters.lookups += 1
        self._heat[key] = self._heat.get(key, 0) + 1
        pinned = self._pinned.get(key)
        if pinned is not None:
            self._counters.hits += 1
            return pinned
        cached = self._lru.get(key)
        if cached is not None:
            self._counters.hits += 1
            return cached
        weights = self._read(key)
        self._lru.put(key, weights)
        return weights

    def is_resident(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._pinned or (layer, expert) in self._lru

    def _read(self, key: Key) -> ExpertWeights:
        """Bring an expert from the container (the disk tier) into RAM."""
        started = time.perf_counter()
        weights = self.read(*key)
        self._counters.disk_seconds += time.perf_counter() - started
        self._counters.disk_bytes += self.stored_bytes(key)
        return weights

    def stored_bytes(self, key: Key) -> int:
        """The expert's bytes in the container (what TIERS and the disk counters count)."""
        found = self._stored.get(key)
        if found is None:
            found = self._stored[key] = self._stored_bytes(*key)
        return found

    # --- pinning -----------------------------------------------------------------------------

    def pin(self, ranked: Iterable[Key], budget_bytes: int) -> int:
        """Pin experts in rank order while they fit the budget; returns how many."""
        used = sum(w.nbytes for w in self._pinned.values())
        count = 0
        for key in ranked:
            if key in self._pinned:
                continue
            if used + self.expert_bytes > budget_bytes:
                break
            weights = self._lru.pop(key)
            if weights is None:
                weights = self._read(key)
            self._pinned[key] = weights
            used += weights.nbytes
            count += 1
        return count

    def repin(self) -> list[Repin]:
        """Per layer, swap the coldest pinned expert for the hottest unpinned one when it is
        clearly hotter (colibri's hysteresis: hot > cold + cold/4 + 4); then decay heat."""
        swaps: list[Repin] = []
        for layer in self.layers:
            pinned = [k for k in self._pinned if k[0] == layer]
            if not pinned:
                continue
            cold = min(pinned, key=lambda k: (self._heat.get(k, 0), k[1]))
            candidates = [
                (layer, e)
                for e in range(self.cfg.n_routed_experts)
                if (layer, e) not in self._pinned
            ]
            if not candidates:
                continue
            hot = max(candidates, key=lambda k: (self._heat.get(k, 0), -k[1]))
            h_cold, h_hot = self._heat.get(cold, 0), self._heat.get(hot, 0)
            if h_hot > h_cold + h_cold // 4 + 4:
                old_tier = TIER_RAM if hot in self._lru else TIER_DISK
                weights = self._lru.pop(hot)
                if weights is None:
                    weights = self._read(hot)
                demoted = self._pinned.pop(cold)
                self._pinned[hot] = weights
                self._lru.put(cold, demoted)
                swaps.append(Repin(layer, hot[1], old_tier))
        for key in self._heat:
            self._heat[key] >>= 1
        return swaps

    # --- TierReport ------------------------------------------------------------------------

    def tier_matrix(self, rows: Sequence[int], n_experts: int) -> npt.NDArray[np.uint8]:
        out = np.zeros((len(rows), n_experts), np.uint8)
        for r, layer in enumerate(rows):
            for e in range(n_experts):
                if self.is_resident(layer, e):
                    out[r, e] = TIER_RAM
        return out

    def tier_counts(self, rows: Sequence[int], n_experts: int) -> TierCounts:
        wanted = set(rows)
        resident = [k for k in (*self._pinned, *self._lru) if k[0] in wanted]
        total = len(rows) * n_experts
        # Pinned and cached experts are disjoint: pinning takes an expert out of the LRU.
        ram_bytes = sum(self.stored_bytes(k) for k in resident)
        return TierCounts(0, len(resident), total - len(resident), 0, ram_bytes)

    def counters(self) -> StoreCounters:
        return replace(self._counters)  # a snapshot; vars() fails on mypyc-compiled classes
