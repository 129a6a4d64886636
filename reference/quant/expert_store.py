"""Routed experts of a quantized container, dequantized on first use into a byte-bounded LRU.

numpy dequantization costs about a hundred times the matmul it feeds, so an expert is decoded
once and kept while it stays among the most recently used within ``budget_bytes`` of float32
weights. The three projections of an expert are decoded together: routing selects experts,
not single matrices.

Spec: spec/model.md §14 "Engine use and fixtures".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from colibri.reference.expert_lru import ExpertLru
from colibri.reference.experts import ExpertWeights, expert_tensor_names
from colibri.reference.quant.container import QuantContainer, TensorFormat
from colibri.reference.quant.errors import QuantFormatError
from colibri.reference.quant.formats import Fmt

#: In the order of ``expert_tensor_names``: gate, up, down.
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
DEFAULT_BUDGET_BYTES = 256 << 20


def _tensor_names(layer: int, expert: int) -> dict[str, str]:
    """Projection -> checkpoint tensor name, the float checkpoint's names (one naming rule)."""
    return dict(zip(PROJECTIONS, expert_tensor_names(layer, expert), strict=True))


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class QuantizedExpertStore:
    """The reference engine's ``ExpertStore`` over a container: decodes lazily, bounded by bytes.

    ``expert(layer, e)`` returns the float32 ``ExpertWeights`` (HF layout: gate/up ``[M, D]``,
    down ``[D, M]``), whatever format each projection is stored in.
    """

    def __init__(
        self,
        container: QuantContainer,
        hidden_size: int,
        moe_intermediate_size: int,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
    ) -> None:
        self.container = container
        self.hidden = hidden_size
        self.inter = moe_intermediate_size
        self.budget_bytes = budget_bytes
        self.stats = StoreStats()
        self._cache = ExpertLru(budget_bytes)

    @property
    def resident_bytes(self) -> int:
        return self._cache.bytes

    def __len__(self) -> int:
        return len(self._cache)

    def shapes(self) -> dict[str, tuple[int, int]]:
        return {
            "gate_proj": (self.inter, self.hidden),
            "up_proj": (self.inter, self.hidden),
            "down_proj": (self.hidden, self.inter),
        }

    def formats(self, layer: int, expert: int) -> dict[str, TensorFormat]:
        """The stored format of each projection; fmt6 must cover all three or none."""
        shapes = self.shapes()
        names = _tensor_names(layer, expert)
        out = {p: self.container.tensor_format(names[p], shapes[p]) for p in PROJECTIONS}
        e8 = [p for p, f in out.items() if f.fmt == Fmt.E8_IQ3]
        if e8 and len(e8) != len(PROJECTIONS):
            raise QuantFormatError(
                names[e8[0]],
                "e8-iq3-lattice must cover all three projections of an expert "
                f"(only {', '.join(e8)} are e8)",
            )
        return out

    def bytes_on_disk(self, layer: int, expert: int) -> int:
        return sum(f.nbytes for f in self.formats(layer, expert).values())

    def check_present(self, layers: Iterable[int], n_experts: int) -> None:
        """Resolve every expert's format up front, so a bad container is refused at load."""
        for layer in layers:
            for e in range(n_experts):
                self.formats(layer, e)

    def is_resident(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._cache

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        key = (layer, expert)
        cached = self._cache.get(key)
        if cached is not None:
            self.stats.hits += 1
            return cached
        self.stats.misses += 1
        self.formats(layer, expert)
        shapes = self.shapes()
        names = _tensor_names(layer, expert)
        gate, up, down = (self.container.weight(names[p], shapes[p]) for p in PROJECTIONS)
        weights = ExpertWeights(gate, up, down)
        evicted = self._cache.evictions
        self._cache.put(key, weights)
        self.stats.evictions += self._cache.evictions - evicted
        return weights
