"""Every decoder layer of a step in one C call (``csrc/layer.c`` ``col_decoder_layers``).

When no row attends to a DSA-selected subset of its past, a step's decoder layers are the
one-call layers of ``layer_block`` back to back; C runs them all from one call over the
layers' records and every row's cache rows. The expert store still sees every lookup in the
order the per-layer path makes them (layer by layer, each layer's distinct chosen experts
ascending): after the call, from the choices C returns. A layer that chose an expert C has
no descriptor for stops the call (``COL_EMISSING``); its lookups (and those of the layers
before it) are made then, the layer's experts run (``routed_held``) and the call resumes at
the next layer, so nothing computed depends on when the lookups are made.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from colibri.accelerated.kernels import EMISSING, F32, KernelInvalidArgument, Kernels, _ptr
from colibri.accelerated.layer_block import LayerBlock
from colibri.accelerated.weights import Expert

from colibri.backend_kit.kv_state import KVState
from colibri.backend_kit.phase_clock import PhaseClock

I32 = npt.NDArray[np.int32]


class DecoderStack:
    """The records of a model's decoder layers (one ``LayerBlock`` each) and their call."""

    __slots__ = ("blocks", "records", "top_k")

    def __init__(self, blocks: Sequence[LayerBlock], top_k: int) -> None:
        self.blocks = list(blocks)
        self.records = np.array([b.address for b in self.blocks], np.uint64)
        self.top_k = top_k

    def run(self, k: Kernels, x: F32, rope: tuple[F32, F32], states: Sequence[KVState],
            positions: Sequence[int], lookup: Callable[[int, int], Expert],
            clock: PhaseClock) -> list[I32]:
        """x [m, d] through every layer, in place; returns each sparse layer's choices."""
        m, d = x.shape
        n = len(self.blocks)
        cos, sin = rope
        if not x.flags.c_contiguous or len(states) != m or len(positions) != m:
            raise KernelInvalidArgument("decoder layers: x, states or positions do not match")
        caches = np.zeros((n, 3, m), np.uint64)
        for i, block in enumerate(self.blocks):
            ptrs = block.cache_pointers([s.layers[i] for s in states], positions)
            caches[i, : ptrs.shape[0]] = ptrs
        slots = np.asarray(positions, np.uint64)
        chosen = np.empty((n, m, self.top_k), np.int32)
        weights = np.empty((n, m, self.top_k), np.float32)
        h = np.empty_like(x)
        seconds = np.zeros(2, np.float64)
        stopped = ctypes.c_size_t()
        first = 0
        while first < n:
            status = k.lib.col_decoder_layers(
                k.pool, n, self.records.ctypes.data, first, m, _ptr(x, m * d, "x"),
                h.ctypes.data, _ptr(cos, cos.size, "cos"), _ptr(sin, sin.size, "sin"),
                caches.ctypes.data, slots.ctypes.data, self.top_k, chosen.ctypes.data,
                weights.ctypes.data, seconds.ctypes.data, ctypes.byref(stopped))
            if status not in (0, EMISSING):
                k._check(status, "col_decoder_layers")
            last = int(stopped.value) if status == EMISSING else n - 1
            for i in range(first, last + 1):
                block = self.blocks[i]
                if block.routed:
                    for e in np.unique(chosen[i]).tolist():
                        block.hold(e, lookup(block.layer.index, e))
            if status == EMISSING:
                started = time.perf_counter()  # the expert products only: reads are disk time
                self.blocks[last].routed_held(k, x, h, chosen[last], weights[last])
                clock.matmul_s += time.perf_counter() - started
            first = last + 1
        for block in self.blocks:
            block.release()
        clock.attention_s += float(seconds[0])
        clock.matmul_s += float(seconds[1])
        return [chosen[i] for i, block in enumerate(self.blocks) if block.routed]
