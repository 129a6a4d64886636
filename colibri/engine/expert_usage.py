"""Routed-expert usage: cumulative counters (heat), HITS bitmaps and per-window entropy.

Every routed expert kept for a token bumps ``counts[layer][expert]`` (u32, saturating), the
history persisted in ``.coli_usage``. EMAP's heat is the bit length of that count; HITS is
the set of experts routed since the previous HITS (spec/protocol.md 2.6). Per-turn routing
entropy is turn_routes.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

U32_MAX = (1 << 32) - 1


def add_selections(counts: npt.NDArray[Any], rows: npt.NDArray[np.intp],
                   experts: npt.NDArray[Any]) -> None:
    """``counts[rows[j], e] += 1`` for every expert ``e`` of ``experts[..., j, :]``, repeats
    counted, in one bincount over the flattened table: ``np.add.at`` per layer cost 5-7 µs a
    call here, with one call per routed layer every decode step (75 on GLM-5)."""
    width = counts.shape[1]
    if experts.size and not (0 <= int(experts.min()) and int(experts.max()) < width):
        # A flat index past the row would land in the next layer's counts: refuse first.
        raise IndexError(f"expert ids {int(experts.min())}..{int(experts.max())} outside "
                         f"0..{width - 1}")
    flat = (rows[:, None] * width + experts.astype(np.intp)).reshape(-1)
    tally = np.bincount(flat, minlength=counts.size).reshape(counts.shape)
    counts += tally.astype(counts.dtype, copy=False)


def heat(count: int) -> int:
    """Bit length of the count, capped at 63 (0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ...)."""
    return min(int(count).bit_length(), 63)


class ExpertUsage:
    """Counters for decoder layers ``rows`` (EMAP row order) over ``n_experts`` experts.

    ``counts`` spans every decoder layer 0..n_layers (n_layers = the MTP layer) like colibri's
    table; only the routed rows can be non-zero.
    """

    def __init__(self, n_layers: int, n_experts: int, rows: Sequence[int]) -> None:
        self.n_layers = n_layers
        self.n_experts = n_experts
        self.rows = list(rows)
        self._row_of = {layer: i for i, layer in enumerate(self.rows)}
        self.counts: npt.NDArray[np.uint64] = np.zeros((n_layers + 1, n_experts), np.uint64)
        self._hits = np.zeros((len(self.rows), n_experts), np.bool_)
        self._index_cache: dict[
            tuple[int, ...], tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], list[int]]] = {}

    def observe(self, layer: int, experts: Sequence[int] | npt.NDArray[np.int32]) -> None:
        """``experts`` were chosen at ``layer`` (one selection each)."""
        ids = np.asarray(experts, dtype=np.intp).reshape(1, 1, -1)
        self.observe_routes([layer], ids)

    def observe_routes(self, layers: Sequence[int], routes: npt.NDArray[np.integer[Any]]
                       ) -> None:
        """Every row of ``routes`` ([rows, len(layers), k]) chose its experts at ``layers``;
        layers without an EMAP row are not counted."""
        layer_index, row_index, keep = self._indices(tuple(layers))
        if not keep:
            return
        chosen = routes if len(keep) == len(layers) else routes[:, keep, :]
        add_selections(self.counts, layer_index, chosen)
        self._hits[row_index[None, :, None], chosen] = True

    def _indices(self, layers: tuple[int, ...]
                 ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], list[int]]:
        """For ``layers``: their counts rows, their EMAP rows, and which of them have one
        (cached: a runtime passes the same routed layers every step)."""
        cached = self._index_cache.get(layers)
        if cached is None:
            keep = [j for j, layer in enumerate(layers) if layer in self._row_of]
            cached = (np.asarray([layers[j] for j in keep], np.intp),
                      np.asarray([self._row_of[layers[j]] for j in keep], np.intp), keep)
            self._index_cache[layers] = cached
        return cached

    def add_history(self, history: npt.NDArray[np.uint64]) -> None:
        """Add loaded counts (history accumulates across runs)."""
        np.add(self.counts, history, out=self.counts)

    def saturated(self) -> npt.NDArray[np.uint64]:
        return np.minimum(self.counts, np.uint64(U32_MAX))

    def heat_matrix(self) -> list[list[int]]:
        counts = self.saturated()
        return [[heat(int(c)) for c in counts[layer]] for layer in self.rows]

    def emap_bytes(self, tier_of: npt.NDArray[np.uint8]) -> bytes:
        """EMAP bytes: (tier << 6) | heat, row-major; ``tier_of`` is [rows, experts]."""
        out = bytearray()
        for r, heats in enumerate(self.heat_matrix()):
            for e, h in enumerate(heats):
                out.append((int(tier_of[r, e]) << 6) | h)
        return bytes(out)

    def take_hits_hex(self) -> str:
        return self.take_hits_bytes().hex()

    def take_hits_bytes(self) -> bytes:
        """The HITS bitmap (LSB-first bytes) since the previous call, then reset."""
        bits = self._hits.reshape(-1)
        out = bytearray((bits.size + 7) // 8)
        for index in np.nonzero(bits)[0]:
            out[int(index) >> 3] |= 1 << (int(index) & 7)
        self._hits[:] = False
        return bytes(out)
