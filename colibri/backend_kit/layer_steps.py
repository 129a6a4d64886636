"""The step wrapper: a decoder layer over rows run as the backend's math steps, in the order
of spec/model.md §3, with the phase clock read around them (PERF/PROF, spec/protocol.md 2.6).

    h = x + attention(input_norm(x))                     -> clock.attention_s
    y = h + moe(post_attention_norm(h))  (or dense MLP)  -> the expert products: clock.matmul_s

The hooks are the backend's math, pure functions of their inputs; the expert store is passed
to the routed-expert step as the data source it is. On a cluster (``remote_experts`` set) the
routed experts' outputs come from the expert workers instead, in the same [rows, k, D] layout
and bytes, and the residual step sums them as it sums local ones. This module decides only
the order of the steps and which seconds count as which phase: the attention phase is the
attention step, the expert products are the routed and shared experts' products of a sparse
layer without the expert reads (reads are disk time, which the store reports; ``ReadClock``
times them around the store so that they can be taken out; a cluster's round trip counts as
expert products). The row driver times the head.
"""

from __future__ import annotations

import time

from colibri.backend_kit.kv_state import KVLayer
from colibri.backend_kit.remote_experts import RemoteExperts
from colibri.backend_kit.row_driver import LayerRows, RowModel
from colibri.reference.experts import ExpertStore, ExpertWeights
from colibri.reference.tensors import F32, I32, I64


class ReadClock:
    """An expert store that adds the seconds spent reading experts to ``seconds``."""

    def __init__(self, store: ExpertStore) -> None:
        self.store = store
        self.seconds = 0.0

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        started = time.perf_counter()
        weights = self.store.expert(layer, expert)
        self.seconds += time.perf_counter() - started
        return weights

    def is_resident(self, layer: int, expert: int) -> bool:
        return self.store.is_resident(layer, expert)


class SteppedRowModel(RowModel):
    """A row model whose decoder and MTP layers are the backend's math steps (the hooks
    below), run and timed here. ``layer`` num_hidden_layers is the MTP layer."""

    #: Where routed experts come from.
    experts: ExpertStore
    #: On a cluster: the workers that compute the routed experts (the store is not asked).
    remote_experts: RemoteExperts | None = None

    # --- the hooks: one step of a layer each -------------------------------------------------

    def _input_norm(self, layer: int, x: F32) -> F32:
        raise NotImplementedError

    def _attention_rows(self, layer: int, x: F32, xn: F32, caches: list[KVLayer],
                        slots: list[int], keeps: list[I64 | None],
                        rope: tuple[F32, F32]) -> tuple[F32, list[I64 | None]]:
        """(h = x + attention(xn), each row's DSA keep-set), the rows' cache entries written
        at ``slots``."""
        raise NotImplementedError

    def _post_attention_norm(self, layer: int, h: F32) -> F32:
        raise NotImplementedError

    def _route(self, layer: int, xn: F32) -> tuple[I32, F32] | None:
        """(each row's experts [rows, k], their weights); None on a dense layer."""
        raise NotImplementedError

    def _dense_residual(self, layer: int, h: F32, xn: F32) -> F32:
        raise NotImplementedError

    def _routed_experts(self, layer: int, xn: F32, chosen: I32, experts: ExpertStore) -> F32:
        """Each row's chosen experts applied to it, [rows, k, D], read from ``experts``."""
        raise NotImplementedError

    def _shared_expert(self, layer: int, xn: F32) -> F32 | None:
        raise NotImplementedError

    def _moe_residual(self, h: F32, outputs: F32, weights: F32, shared: F32 | None) -> F32:
        raise NotImplementedError

    # --- the layers, as the row driver asks for them -------------------------------------------

    def _decoder_rows(self, layer: int, x: F32, positions: list[int], caches: list[KVLayer],
                      keeps: list[I64 | None], rope: tuple[F32, F32]) -> LayerRows:
        return self._layer_rows(layer, x, caches, positions, keeps, rope)

    def _mtp_rows(self, z: F32, positions: list[int], caches: list[KVLayer], slots: list[int],
                  rope: tuple[F32, F32]) -> LayerRows:
        return self._layer_rows(self.config.num_hidden_layers, z, caches, slots,
                                [None] * len(slots), rope)

    def _layer_rows(self, layer: int, x: F32, caches: list[KVLayer], slots: list[int],
                    keeps: list[I64 | None], rope: tuple[F32, F32]) -> LayerRows:
        """One layer over the rows (§3): (y, each row's DSA keep-set, the experts each row
        chose; None on a dense layer)."""
        clock = self.clock
        xn = self._input_norm(layer, x)
        started = time.perf_counter()
        h, keeps = self._attention_rows(layer, x, xn, caches, slots, keeps, rope)
        clock.attention_s += time.perf_counter() - started
        xn = self._post_attention_norm(layer, h)
        routed = self._route(layer, xn)
        if routed is None:
            return self._dense_residual(layer, h, xn), keeps, None
        chosen, weights = routed
        reads = ReadClock(self.experts)
        started = time.perf_counter()
        if self.remote_experts is not None:
            # The round trip counts as expert products: it is where they are computed.
            outputs = self.remote_experts.routed_outputs(layer, xn, chosen)
        else:
            outputs = self._routed_experts(layer, xn, chosen, reads)
        shared = self._shared_expert(layer, xn)
        clock.matmul_s += time.perf_counter() - started - reads.seconds
        return self._moe_residual(h, outputs, weights, shared), keeps, chosen
