"""A range of decoder layers in one C call (``csrc/layer.c`` ``col_decoder_layers``).

Where no row attends to a DSA-selected subset of its past, the layers ``[first, end)`` of a
step run in C from one call over the layers' records (``layer_block``) and every row's cache
rows; ``model.py`` runs the whole decoder this way, or the ranges between the layers that
select, and the MTP layer as a stack of its own. The expert store still sees every lookup in
the order the per-kernel path makes them: one batch per routed layer, layer by layer, each
layer's distinct chosen experts ascending, after the call, from the choices C returns. A
layer that chose an expert C has no descriptor for stops the call (``COL_EMISSING``); its
lookups (and those of the layers before it) are made then, the layer's experts run
(``routed_held``) and the call resumes at the next layer, so nothing computed depends on
when the lookups are made.

On a cluster (``remote``) the engine holds no routed expert: every routed layer stops the call,
the shared expert runs here, the workers fill the routed blocks (``RemoteExperts.fill_blocks``)
and the weighted sum runs here, in the order the one call sums them; the store is not asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.accelerated.kernels import F32, KernelInvalidArgument, Kernels
from colibri.accelerated.layer_block import LayerBlock
from colibri.accelerated.weights import Expert

from colibri.backend_kit.kv_state import KVLayer
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.backend_kit.remote_experts import RemoteExperts

I32 = npt.NDArray[np.int32]
#: The expert store's batch lookup: (layer index, distinct experts ascending) -> the experts.
Lookup = Callable[[int, list[int]], list[Expert]]
#: Whether the expert store still holds (layer, expert) in RAM (``TieredExpertStore``'s
#: ``is_resident``): the table keeps an expert read into process memory exactly that long.
Resident = Callable[[int, int], bool]
#: Its two-half form (``TieredExpertStore.experts_begin``): the lookups made, the resident
#: experts at hand and the misses' reads in flight; None from a store without it.
Begin = Callable[[int, list[int]], Any]
#: ``ReadAhead``: (the block the step is past, -1 before the first; the residual) -> reads.
ReadAheadHook = Callable[[int, F32], int]


class DecoderStack:
    """The records of a run of decoder layers (one ``LayerBlock`` each) and their call."""

    __slots__ = ("blocks", "records", "top_k")

    def __init__(self, blocks: Sequence[LayerBlock], top_k: int) -> None:
        self.blocks = list(blocks)
        self.records = np.array([b.address for b in self.blocks], np.uint64)
        self.top_k = top_k

    def run(self, k: Kernels, x: F32, rope: tuple[F32, F32], caches: Sequence[Sequence[KVLayer]],
            slots: Sequence[int], lookup: Lookup, clock: PhaseClock, first: int = 0,
            end: int | None = None, begin: Begin | None = None,
            resident: Resident | None = None,
            remote: RemoteExperts | None = None,
            ahead: ReadAheadHook | None = None) -> list[I32]:
        """x [m, d] through blocks [first, end) in place (``caches[i]``: the rows' caches of
        block ``first + i``; row r writes slot ``slots[r]``); returns each routed layer's
        choices [m, top_k]. ``ahead`` (the store's ``ReadAhead``) is told where the step is
        (before the first block, and at each layer whose misses are being read) so the
        next layers' likely experts are read meanwhile."""
        end = len(self.blocks) if end is None else end
        m = x.shape[0]
        n = len(self.blocks)
        if not 0 <= first <= end <= n or len(caches) != end - first or len(slots) != m:
            raise KernelInvalidArgument("decoder layers: the range, caches or slots do not match")
        table = np.zeros((n, 3, m), np.uint64)
        for i in range(first, end):
            ptrs = self.blocks[i].cache_pointers(caches[i - first], slots)
            table[i, : ptrs.shape[0]] = ptrs
        slot_a = np.asarray(slots, np.uint64)
        chosen = np.empty((n, m, self.top_k), np.int32)
        weights = np.empty((n, m, self.top_k), np.float32)
        h = np.empty_like(x)
        seconds = np.zeros(2, np.float64)
        cos, sin = rope
        at = first
        for block in self.blocks[first:end]:  # what the store let go between steps (pins...)
            _let_go(block, resident)
        if ahead is not None and remote is None:
            ahead(first - 1, x)
        try:
            while at < end:
                stopped = k.decoder_layers(self.records, at, end, x, h, cos, sin, table, slot_a,
                                           chosen, weights, seconds)
                last = end - 1 if stopped is None else stopped
                pending = None
                for i in range(at, last + 1):
                    block = self.blocks[i]
                    if not block.routed or remote is not None:
                        continue
                    ids = np.unique(chosen[i]).tolist()
                    if i == stopped and begin is not None:
                        pending = begin(block.layer.index, ids)
                        if ahead is not None and pending is not None and pending.waiting:
                            # Behind this layer's misses in the disk's queue.
                            ahead(i, x)
                    if pending is None:
                        for e, ex in zip(ids, lookup(block.layer.index, ids), strict=True):
                            block.hold(e, ex)
                if stopped is not None:
                    block = self.blocks[last]
                    if remote is not None:
                        self._remote(k, block, x, h, chosen[last], weights[last], remote, clock)
                    elif pending is None:
                        started = time.perf_counter()  # the expert products only
                        block.routed_held(k, x, h, chosen[last], weights[last])
                        clock.matmul_s += time.perf_counter() - started
                    else:
                        self._overlapped(k, block, x, h, chosen[last], weights[last],
                                         pending, clock)
                    # Experts the store let go while this layer read its own go now, not at the
                    # step's end: under a RAM budget a step holds one layer's experts beyond
                    # the cache, not every layer's.
                    _let_go(self.blocks[last], resident)
                at = last + 1
        finally:
            for block in self.blocks[first:end]:
                _let_go(block, resident)
        clock.attention_s += float(seconds[0])
        clock.matmul_s += float(seconds[1])
        return [chosen[i] for i in range(first, end) if self.blocks[i].routed]

    @staticmethod
    def _remote(k: Kernels, block: LayerBlock, x: F32, h: F32, chosen: I32, weights: F32,
                remote: RemoteExperts, clock: PhaseClock) -> None:
        """A routed layer on the expert workers: the shared expert here (no routed expert is
        held), the routed blocks from the workers, then the weighted sum; an error from the
        workers leaves x as the attention left it (the step is rolled back)."""
        m, d = x.shape
        y = np.empty(((chosen.shape[1] + 1) * m, d), np.float32)
        done = np.zeros(block.cfg.n_routed_experts + 1, np.uint8)
        started = time.perf_counter()  # the round trip counts as expert products
        block.experts_held(k, h, chosen, y, done)
        remote.fill_blocks(block.layer.index, h, chosen, y, done)
        block.combine(k, x, chosen, weights, y, done)
        clock.matmul_s += time.perf_counter() - started

    @staticmethod
    def _overlapped(k: Kernels, block: LayerBlock, x: F32, h: F32, chosen: I32, weights: F32,
                    pending: Any, clock: PhaseClock) -> None:
        """A routed layer whose misses are being read: its resident experts (and the shared
        one) run while the reads are in flight, each miss as soon as its own read ends (so
        only the last one's products follow the layer's reads), then the weighted sum; the
        bytes are ``routed_held``'s (every output lands in its place, the sum runs once over
        all of them, after the last)."""
        for e, ex in pending.resident():
            block.hold(e, ex)
        m, d = x.shape
        y = np.empty(((chosen.shape[1] + 1) * m, d), np.float32)
        done = np.zeros(block.cfg.n_routed_experts + 1, np.uint8)
        started = time.perf_counter()  # the expert products only: reads are disk time
        block.experts_held(k, h, chosen, y, done)
        clock.matmul_s += time.perf_counter() - started
        for e, ex in pending.arrivals():  # each miss as soon as its read ends
            block.hold(e, ex)
            started = time.perf_counter()
            block.experts_held(k, h, chosen, y, done)
            clock.matmul_s += time.perf_counter() - started
        started = time.perf_counter()
        block.combine(k, x, chosen, weights, y, done)
        clock.matmul_s += time.perf_counter() - started


def _let_go(block: LayerBlock, resident: Resident | None) -> None:
    """Forget the experts of ``block``'s table that were read into process memory and the
    store no longer holds (without a store, all of them): a resident one stays, so C runs its
    layer without stopping while the routing stays among the cached experts."""
    if resident is None:
        block.release()
    else:
        layer = block.layer.index
        block.release(keep=lambda e: resident(layer, e))
