"""The byte-bounded LRU of float32 experts, shared by every store that caches them (the
tiered engine store's RAM tier, the quantized container's decoded experts).

True LRU: a lookup refreshes an entry, an insert evicts the least recently used entries
until the total fits. An expert larger than the whole budget is never cached (it would
evict everything, itself included). ``budget_bytes=None`` is unbounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from colibri.reference.experts import ExpertWeights

Key = tuple[int, int]


class ExpertLru:
    def __init__(self, budget_bytes: int | None) -> None:
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"expert cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Key, ExpertWeights] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Key]:
        return iter(self._entries)

    def get(self, key: Key) -> ExpertWeights | None:
        """The entry, refreshed as most recently used; None when absent."""
        weights = self._entries.get(key)
        if weights is not None:
            self._entries.move_to_end(key)
        return weights

    def peek(self, key: Key) -> ExpertWeights | None:
        """The entry without refreshing it; None when absent."""
        return self._entries.get(key)

    def items(self) -> list[tuple[Key, ExpertWeights]]:
        """Every entry, least recently used first, without refreshing any (for reports)."""
        return list(self._entries.items())

    def resize(self, budget_bytes: int | None) -> None:
        """A new budget; the least recently used entries go until the cache fits it."""
        self.budget_bytes = budget_bytes
        self._evict()

    def _evict(self) -> None:
        while self.budget_bytes is not None and self.bytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.evictions += 1

    def put(self, key: Key, weights: ExpertWeights) -> None:
        if self.budget_bytes is not None and weights.nbytes > self.budget_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._entries[key] = weights
        self.bytes += weights.nbytes
        self._evict()

    def replace(self, key: Key, weights: ExpertWeights) -> None:
        """Swap an entry's value in place (its recency unchanged, nothing evicted): a
        reservation made before the expert was read becomes the expert."""
        old = self._entries.get(key)
        if old is not None:
            self._entries[key] = weights
            self.bytes += weights.nbytes - old.nbytes

    def pop(self, key: Key) -> ExpertWeights | None:
        weights = self._entries.pop(key, None)
        if weights is not None:
            self.bytes -= weights.nbytes
        return weights
