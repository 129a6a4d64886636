"""colibri's RAM expert cache: one true LRU per layer, the byte budget split evenly.

colibri gives every sparse layer the same number of expert slots (``CAP``) and evicts a
layer's least recently used expert when a miss of that layer needs a slot. A token visits the
layers in order, so a single LRU over all layers would behave much the same on uniform
routing; per layer, a layer whose experts are hot cannot crowd out another layer's, and the
residency a report shows per layer is the one colibri would show.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from colibri.reference.expert_lru import ExpertLru, Key
from colibri.reference.experts import ExpertWeights


class PerLayerLru:
    def __init__(self, layers: Sequence[int], budget_bytes: int | None) -> None:
        self._layers = list(layers)
        self._lrus = {layer: ExpertLru(None) for layer in self._layers}
        self.resize(budget_bytes)

    def resize(self, budget_bytes: int | None) -> None:
        """A new total budget (None: unbounded), each layer's share evicting down to it."""
        self.budget_bytes = budget_bytes
        share = None if budget_bytes is None else budget_bytes // max(len(self._layers), 1)
        for lru in self._lrus.values():
            lru.resize(share)

    def _of(self, key: Key) -> ExpertLru:
        lru = self._lrus.get(key[0])
        if lru is None:
            raise KeyError(f"layer {key[0]} has no routed experts")
        return lru

    @property
    def bytes(self) -> int:
        return sum(lru.bytes for lru in self._lrus.values())

    @property
    def evictions(self) -> int:
        return sum(lru.evictions for lru in self._lrus.values())

    def __len__(self) -> int:
        return sum(len(lru) for lru in self._lrus.values())

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        lru = self._lrus.get(key[0])
        return lru is not None and key in lru

    def __iter__(self) -> Iterator[Key]:
        for lru in self._lrus.values():
            yield from lru

    def get(self, key: Key) -> ExpertWeights | None:
        return self._of(key).get(key)

    def peek(self, key: Key) -> ExpertWeights | None:
        return self._of(key).peek(key)

    def put(self, key: Key, weights: ExpertWeights) -> None:
        self._of(key).put(key, weights)

    def replace(self, key: Key, weights: ExpertWeights) -> None:
        self._of(key).replace(key, weights)

    def pop(self, key: Key) -> ExpertWeights | None:
        return self._of(key).pop(key)
