"""The accelerated model: the reference's incremental forward with every hot product in C.

Reading order (spec/model.md): embedding (§3) -> per layer: RMSNorm (§3.1), MLA projections
and RoPE (§4, §5), the DSA indexer (§6), absorbed attention over the latent cache (§5), the
router and experts or the dense MLP (§7) -> final norm and lm_head (§8); MTP (§9). A
standard-attention family (OLMoE, Qwen3-MoE) replaces the MLA steps with §5.3's attention over
a key/value cache (``mha_attention.py``) and noaux_tc with §7.1.1's softmax router
(``softmax_route.py``); its layers always run on the per-kernel path.

What runs where: products with weights (every matmul, the absorbed kv_b products inside
attention, a layer's routed experts in one ``col_moe`` call over float or quantized weights),
norms, RoPE, SwiGLU's gate, attention, the indexer's scores and the router (``col_route``)
are C kernels (``kernels.py``). The layers of a step run as one C call per range of layers
without DSA selection (``decoder_stack.py``): the whole decoder, the ranges between the layers
where some row attends to a DSA-selected subset of its past, the MTP layer. Those selecting
layers, and every layer under ``--device cuda`` (``fused_layers = False``: the CUDA kernels
take single products), run on the per-kernel path below, which computes every element as the
one call does. There light per-row glue stays in numpy, with operations whose per-element
result does not depend on the array's length: the embedding gather, RoPE's cos/sin table
(once per forward), residual adds, and the weighted sum of a row's expert outputs in
ascending expert id order. So a row's logits are the same bytes alone or in any batch, on
either path and for any thread count (spec §10, §15 kind (c)).

States are ``colibri.backend_kit.kv_state.KVState`` (a plain data container: tokens, hidden
states, growable per-layer cache arrays), so the COLIKV1 codec and persistence are shared.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from colibri.accelerated.decoder_stack import DecoderStack
from colibri.accelerated.embedding import load_embedding
from colibri.accelerated.kernels import F32, MAT_DTYPE, Kernels, Products, Weight
from colibri.accelerated.layer_block import LayerBlock
from colibri.accelerated.mha_attention import StandardAttention
from colibri.accelerated.softmax_route import route_softmax
from colibri.accelerated.weights import (
    Attention,
    Expert,
    ExpertSource,
    Layer,
    MhaAttention,
    WeightLoader,
    latent_attention,
    load_layer,
    mapped_experts,
    quantized_experts,
)
from colibri.reference.config import INDEXER_NORM_EPS, LATENT_NORM_EPS, ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.indexer_presence import mtp_indexer_mode, resolve_indexer
from colibri.reference.safetensors import Checkpoint

from colibri.backend_kit.expert_read_ahead import DEFAULT_DEPTH, ReadAhead, RouterGuess
from colibri.backend_kit.kv_state import KVLayer, KVState
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.backend_kit.remote_experts import RemoteExperts, group_rows
from colibri.backend_kit.row_driver import LayerRows, RowModel
from colibri.host_topology import usable_cpus

I32 = npt.NDArray[np.int32]


I64 = npt.NDArray[np.int64]


class ExpertLookup(Protocol):
    """The expert store as the model asks it (a store may also answer ``experts(layer,
    ids)``, a layer's lookups in one call)."""

    def expert(self, layer: int, expert: int) -> Any: ...


def default_threads() -> int:
    raw = os.environ.get("COLIBRI_THREADS") or os.environ.get("THREADS")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"COLIBRI_THREADS must be a whole number, got {raw!r}") from None
        if n >= 1:
            return n
    return max(1, len(usable_cpus()))


def inv_freq(dim: int, theta: float) -> F32:
    """RoPE's frequencies, in float32 as spec/model.md §4 writes them."""
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    out: F32 = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    return out


def _float_rows(w: Weight) -> F32:
    """A router's weight as float32 for guessing (a copy where it is stored as BF16/F16: a
    router is E x d, small beside the layer's experts)."""
    if w.code == 0:
        return w.array
    if w.code == 1:  # BF16: the high half of a float32
        widened = w.array.view(np.uint16).astype(np.uint32) << 16
        return widened.view(np.float32)
    return w.array.view(np.float16).astype(np.float32)


class Model(RowModel):
    def __init__(self, config: ModelConfig, checkpoint: Checkpoint, kernels: Kernels,
                 experts: ExpertSource | None = None, model_dir: Path | None = None) -> None:
        #: A config whose indexer the checkpoint does not store runs without it.
        self.config, self.indexer = resolve_indexer(config, checkpoint.tensors)
        cfg = self.config
        self.checkpoint = checkpoint
        self.kernels = kernels
        #: PERF/PROF phases, as the reference times them (backend_kit/phase_clock.py).
        self.clock = PhaseClock()
        t = WeightLoader(checkpoint, kernels.all_finite)
        d, v = cfg.hidden_size, cfg.vocab_size
        self.embed = load_embedding(t, (v, d))
        self.final_norm = t.vector("model.norm.weight", (d,))
        self.lm_head = self.embed.head if cfg.tie_word_embeddings else t.product(
            "lm_head.weight", (v, d))
        self.indexer_modes: list[str | None] = [
            cfg.indexer_types[i] if cfg.indexer_types else None
            for i in range(cfg.num_hidden_layers)
        ]
        self.layers = [load_layer(t, cfg, i, cfg.is_sparse(i), self.indexer_modes[i] == "full")
                       for i in range(cfg.num_hidden_layers)]
        sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
        n = cfg.num_hidden_layers
        self.mtp_layer: Layer | None = None
        self.mtp_indexer_mode: str | None = None
        if t.has(f"model.layers.{n}.eh_proj.weight"):
            p = f"model.layers.{n}."
            self.mtp_indexer_mode = mtp_indexer_mode(cfg, checkpoint.tensors)
            self.eh_proj = t.product(p + "eh_proj.weight", (d, 2 * d))
            self.enorm = t.vector(p + "enorm.weight", (d,))
            self.hnorm = t.vector(p + "hnorm.weight", (d,))
            self.head_norm = t.vector(p + "shared_head.norm.weight", (d,))
            self.mtp_layer = load_layer(t, cfg, n, True, self.mtp_indexer_mode == "full")
            sparse.append(n)
        self.sparse_layers = sparse
        #: Standard-attention families (OLMoE, Qwen3-MoE): each layer's attention, which runs
        #: on the per-kernel path (the one C call implements MLA layers only).
        self._standard = {lw.index: StandardAttention(cfg, lw.attention) for lw in self.layers
                          if isinstance(lw.attention, MhaAttention)}
        if (experts is None and model_dir is not None
                and any(name.endswith(".qs") for name in checkpoint.tensors)):
            experts = quantized_experts(model_dir, cfg, t, sparse)
        self._read_expert = experts or mapped_experts(t, cfg, sparse)
        self._experts: dict[tuple[int, int], Expert] = {}
        #: A tiered store (the backend's) that decides residency and counts lookups; the
        #: model's own unbounded cache otherwise.
        self.store: ExpertLookup | None = None
        #: Routed layers read ahead under a RAM budget (``READ_AHEAD``; 0: none).
        self.read_ahead_depth = DEFAULT_DEPTH
        self._ahead: ReadAhead | None = None
        self._inv_freq = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta)
        self._products: dict[tuple[int, bool, bool], Products] = {}
        #: Ranges of layers in one C call (``decoder_stack``) wherever no row selects; False
        #: runs every layer on the per-kernel path (the CUDA placement; the tests compare the
        #: paths byte for byte).
        self.fused_layers = True
        self._stack: DecoderStack | None = None
        self._mtp_stack: DecoderStack | None = None
        #: On a cluster: the workers that compute the routed experts (the store is not asked).
        self.remote_experts: RemoteExperts | None = None

    @property
    def mtp(self) -> Layer | None:
        return self.mtp_layer

    def read_expert(self, layer: int, e: int) -> Expert:
        """An expert straight from the checkpoint or container (mapped views, float or
        quantized)."""
        return self._read_expert(layer, e)

    def expert(self, layer: int, e: int) -> Expert:
        return self.experts(layer, [e])[0]

    def experts(self, layer: int, ids: list[int]) -> list[Expert]:
        """Experts ``ids`` of ``layer`` (a step's distinct choices there, ascending), asked of
        the store in one call where it answers a layer's batch (so it can read the ones it
        misses together), else one by one in that order; the model's own unbounded cache
        when there is no store."""
        if self.store is None:
            for e in ids:
                if (layer, e) not in self._experts:
                    self._experts[(layer, e)] = self._read_expert(layer, e)
            return [self._experts[(layer, e)] for e in ids]
        batch = getattr(self.store, "experts", None)
        found = (list(batch(layer, ids)) if callable(batch)
                 else [self.store.expert(layer, e) for e in ids])
        if len(found) != len(ids) or not all(isinstance(ex, Expert) for ex in found):
            raise TypeError(f"the expert store answered layer {layer}'s lookup with "
                            f"{[type(ex).__name__ for ex in found]} for experts {ids}")
        return found

    def _resident(self) -> Any:
        """The store's residency test (``is_resident``), or None for a store without one."""
        test = getattr(self.store, "is_resident", None)
        return test if callable(test) else None

    def _read_ahead(self) -> ReadAhead | None:
        """The store's read-ahead over this model's routers (``expert_read_ahead``), for a
        store whose reads overlap the step (a disk tier); None otherwise."""
        prefetch = getattr(self.store, "prefetch", None)
        if (self.read_ahead_depth <= 0 or not callable(prefetch)
                or not getattr(self.store, "reads_overlap", False)):
            return None  # (no router copies are made for nothing)
        if self._ahead is None:
            cfg = self.config
            guesses = [RouterGuess(lw.index, lw.post_norm, _float_rows(lw.router_gate),
                                   lw.router_bias, cfg.rms_norm_eps, cfg.num_experts_per_tok)
                       if isinstance(lw.router_gate, Weight) else None for lw in self.layers]
            # Read ahead only in steps of at most half the rows a budget's step reserve holds
            # (the store's ``read_ahead_bytes`` is the other half).
            rows = (self.max_step_rows or 0) // 2
            self._ahead = ReadAhead(guesses, prefetch, self.read_ahead_depth, rows)
        return self._ahead

    def experts_begin(self, layer: int, ids: list[int]) -> Any:
        """The store's two-half lookup (``TieredExpertStore.experts_begin``: the resident
        experts now, the misses' reads in flight), or None for a store without one."""
        begin = getattr(self.store, "experts_begin", None)
        return begin(layer, ids) if callable(begin) else None

    def close(self) -> None:
        self.kernels.close()

    # --- helpers ------------------------------------------------------------------------------

    def _rope(self, positions: Sequence[int]) -> tuple[F32, F32]:
        angles = np.asarray(positions).astype(np.float32)[:, None] * self._inv_freq[None, :]
        return (np.ascontiguousarray(np.cos(angles), dtype=np.float32),
                np.ascontiguousarray(np.sin(angles), dtype=np.float32))

    def _embed(self, ids: Sequence[int]) -> F32:
        return self.embed.rows(ids)

    # --- the model API --------------------------------------------------------------------------

    def forward(self, ids: Sequence[int]) -> F32:
        """Logits [T, vocab] for every position of ``ids`` (teacher forcing from position 0),
        computed by the incremental path over a fresh state."""
        if len(ids) == 0:
            raise ValueError("forward needs at least one token")
        return self.prefill(self.new_state(), ids)

    # --- the row hooks of RowModel (prefill, decode, decode_batch, forward_rows, mtp_draft) --

    def _decoder_layers(self, states: Sequence[KVState], positions: list[int], x: F32,
                        rope: tuple[F32, F32]) -> tuple[F32, list[I32]]:
        """The decoder layers over the rows: each maximal range of layers where no row
        attends to a DSA-selected subset of its past in one C call, the others on the
        per-kernel path."""
        n = self.config.num_hidden_layers
        keeps: list[I64 | None] = [None] * len(positions)
        routes: list[I32] = []
        first = 0
        while first < n:
            if self._per_kernel(self.layers[first], self.indexer_modes[first], positions, keeps):
                caches = [s.layers[first] for s in states]
                x, keeps, chosen = self._kernel_layer(x, self.layers[first],
                                                      self.indexer_modes[first], positions,
                                                      caches, positions, keeps, rope)
                routes += [] if chosen is None else [chosen]
                first += 1
                continue
            keeps = [None] * len(positions)  # a stacked layer attends to every position
            end = first + 1
            while end < n and not self._per_kernel(self.layers[end], self.indexer_modes[end],
                                                   positions, keeps):
                end += 1
            x = np.array(x, dtype=np.float32, order="C")  # the stack updates it in place
            routes += self._decoder_stack().run(
                self.kernels, x, rope, [[s.layers[i] for s in states] for i in range(first, end)],
                positions, self.experts, self.clock, first, end, begin=self.experts_begin,
                remote=self.remote_experts, resident=self._resident(),
                ahead=self._read_ahead())
            first = end
        return x, routes

    def _per_kernel(self, lw: Layer, mode: str | None, slots: list[int],
                    prev_keep: list[I64 | None]) -> bool:
        """Whether layer ``lw`` runs on the per-kernel path: always without ``fused_layers``,
        else where a row attends to a DSA-selected subset of its past (it selects past
        index_topk, or a shared layer inherits a selection), which the one call lacks; and
        every standard-attention layer (the one call runs MLA layers only)."""
        if not isinstance(lw.attention, Attention):
            return True
        selecting = (mode == "full" and lw.attention.indexer is not None
                     and any(s + 1 > self.config.index_topk for s in slots))
        return (not self.fused_layers or selecting
                or any(keep is not None for keep in prev_keep))

    def _block(self, lw: Layer, mode: str | None) -> LayerBlock:
        return LayerBlock(self.config, lw,
                          mode == "full" and latent_attention(lw).indexer is not None)

    def _decoder_stack(self) -> DecoderStack:
        if self._stack is None:
            self._stack = DecoderStack([self._block(lw, mode) for lw, mode in
                                        zip(self.layers, self.indexer_modes, strict=True)],
                                       self.config.num_experts_per_tok)
        return self._stack

    def _head(self, x: F32, mtp: bool) -> F32:
        k = self.kernels
        norm = self.head_norm if mtp else self.final_norm
        return k.matmul(k.rms_norm(x, norm, self.config.rms_norm_eps), self.lm_head)

    @property
    def has_mtp(self) -> bool:
        return self.mtp_layer is not None

    def _mtp_input(self, next_tokens: Sequence[int], hidden: F32) -> F32:
        k, eps = self.kernels, self.config.rms_norm_eps
        e = k.rms_norm(self._embed(next_tokens), self.enorm, eps)
        g = k.rms_norm(k.rms_norm(hidden, self.final_norm, eps), self.hnorm, eps)
        return k.matmul(np.ascontiguousarray(np.concatenate([e, g], axis=-1)), self.eh_proj)

    def _mtp_rows(self, z: F32, positions: list[int], caches: list[KVLayer], slots: list[int],
                  rope: tuple[F32, F32]) -> LayerRows:
        lw = self.mtp_layer
        assert lw is not None
        keeps: list[I64 | None] = [None] * len(positions)
        if self._per_kernel(lw, self.mtp_indexer_mode, slots, keeps):
            return self._kernel_layer(z, lw, self.mtp_indexer_mode, positions, caches, slots,
                                      keeps, rope)
        if self._mtp_stack is None:
            self._mtp_stack = DecoderStack([self._block(lw, self.mtp_indexer_mode)],
                                           self.config.num_experts_per_tok)
        z = np.array(z, dtype=np.float32, order="C")  # updated in place
        routes = self._mtp_stack.run(self.kernels, z, rope, [caches], slots, self.experts,
                                     self.clock, begin=self.experts_begin,
                                     remote=self.remote_experts, resident=self._resident())
        return z, keeps, routes[0]

    # --- one decoder layer over rows (spec §3) ----------------------------------------------

    def _input_products(self, lw: Layer, keys: bool, head_weights: bool) -> Products:
        """The products of a layer's normed input h, built once per layer and variant: the
        query's first projection, kv_a, and the indexer's key and head-weight projections
        when the step needs them."""
        found = self._products.get((lw.index, keys, head_weights))
        if found is None:
            aw = latent_attention(lw)
            ix = aw.indexer
            weights = [aw.q_a if aw.q_a is not None else aw.q_b, aw.kv_a]
            if keys:
                assert ix is not None
                weights.append(ix.wk)
            if head_weights:
                assert ix is not None
                weights.append(ix.weights_proj)
            found = self._products[(lw.index, keys, head_weights)] = Products(weights)
        return found

    def _route_rows(self, logits: F32, lw: Layer) -> tuple[I32, F32]:
        """Every row's routed experts (ascending) and weights: the family's router (spec
        §7.1 ``col_route``, as the one-call layer routes; §7.1.1 the softmax router)."""
        cfg = self.config
        if cfg.router == "softmax":
            return route_softmax(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        assert lw.router_bias is not None
        return self.kernels.route(logits, lw.router_bias, cfg.n_group, cfg.topk_group,
                                  cfg.num_experts_per_tok, cfg.norm_topk_prob,
                                  cfg.routed_scaling_factor)

    def _kernel_layer(self, x: F32, lw: Layer, mode: str | None, positions: list[int],
                      caches: list[KVLayer], slots: list[int], prev_keep: list[I64 | None],
                      rope: tuple[F32, F32]) -> tuple[F32, list[I64 | None], I32 | None]:
        """One decoder layer over the rows: h = x + attention(input_norm(x)) with the family's
        attention, then h + the routed experts or the dense MLP of post_norm(h) (spec §3)."""
        cfg, k = self.config, self.kernels
        started = time.perf_counter()
        m = x.shape[0]
        h = k.rms_norm(x, lw.input_norm, cfg.rms_norm_eps)
        keeps: list[I64 | None]
        if isinstance(lw.attention, MhaAttention):
            x = self._standard[lw.index].rows(k, x, h, caches, slots, rope)
            keeps = [None] * m  # no DSA selection
        else:
            x, keeps = self._latent_rows(x, h, lw, lw.attention, mode, caches, slots,
                                         prev_keep, rope)
        self.clock.attention_s += time.perf_counter() - started
        h = k.rms_norm(x, lw.post_norm, cfg.rms_norm_eps)
        if lw.dense is not None:
            every = np.arange(m, dtype=np.int64)
            dense = k.moe(h, lw.dense.desc, np.array([0, m], np.int64), every)
            return x + dense, keeps, None
        y, chosen = self._moe(h, lw)
        return x + y, keeps, chosen

    def _latent_rows(self, x: F32, h: F32, lw: Layer, aw: Attention, mode: str | None,
                     caches: list[KVLayer], slots: list[int], prev_keep: list[I64 | None],
                     rope: tuple[F32, F32]) -> tuple[F32, list[I64 | None]]:
        """x + MLA attention of the normed rows h (spec §4-§6): the rows' latent, rope-key and
        indexer-key cache entries written, and each row's DSA keep-set."""
        cfg, k = self.config, self.kernels
        m = x.shape[0]
        cos, sin = rope
        heads, nope, rdim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        qk, kvl = cfg.qk_head_dim, cfg.kv_lora_rank
        ix = aw.indexer
        run_indexer = mode == "full" and ix is not None
        select_rows = [run_indexer and slots[r] + 1 > cfg.index_topk
                       for r in range(m)]
        # Every product of h in one call: [q_a or q_b, kv_a, (wk), (weights_proj)].
        outs = k.matmul_many(h, self._input_products(lw, run_indexer, any(select_rows)))
        q_resid: F32 | None = None
        if aw.q_a is not None and aw.q_a_norm is not None:
            q_resid = k.rms_norm(outs[0], aw.q_a_norm, LATENT_NORM_EPS)
            q = k.matmul(q_resid, aw.q_b)
        else:
            q = outs[0]
        k.rope(q, heads, heads * qk, qk, nope, rdim, cos, sin, cfg.rope_interleave)
        c = outs[1]
        latent = k.rms_norm(np.ascontiguousarray(c[:, :kvl]), aw.kv_a_norm, LATENT_NORM_EPS)
        rope_key = np.ascontiguousarray(c[:, kvl:])
        k.rope(rope_key, 1, rdim, rdim, 0, rdim, cos, sin, cfg.rope_interleave)
        if run_indexer:
            assert ix is not None
            hd = cfg.index_head_dim
            ikeys = k.layer_norm(outs[2], ix.k_norm_weight, ix.k_norm_bias, INDEXER_NORM_EPS)
            k.rope(ikeys, 1, hd, hd, 0, rdim, cos, sin, True)
        if any(select_rows):
            assert ix is not None and q_resid is not None
            nh = cfg.index_n_heads
            iq = k.matmul(q_resid, ix.wq_b)
            k.rope(iq, nh, nh * hd, hd, 0, rdim, cos, sin, True)
            iw = outs[3] * np.float32(nh**-0.5)
        for r in range(m):
            caches[r]["latent"][slots[r]] = latent[r]
            caches[r]["rope_key"][slots[r]] = rope_key[r]
            if run_indexer:
                caches[r]["index_key"][slots[r]] = ikeys[r]
        keeps: list[I64 | None] = []
        for r in range(m):
            keep: I64 | None = None
            if select_rows[r]:
                scores = k.index_scores(np.ascontiguousarray(iq[r].reshape(nh, hd)),
                                        np.ascontiguousarray(iw[r]), caches[r]["index_key"],
                                        float(np.float32(hd**-0.5)))[: slots[r] + 1]
                if scores.shape[0] > cfg.index_topk:  # else every position is kept
                    keep = k.index_select(scores, cfg.index_topk)
            elif mode == "shared":
                keep = prev_keep[r]
            keeps.append(keep)
        attn = k.mla_attention(q, heads, nope, rdim, cfg.v_head_dim, kvl,
                               [cache["latent"] for cache in caches],
                               [cache["rope_key"] for cache in caches],
                               [s + 1 for s in slots], keeps, aw.kv_b,
                               float(np.float32(cfg.attn_scale)))
        return x + k.matmul(attn, aw.o), keeps

    def _moe(self, x: F32, lw: Layer) -> tuple[F32, I32]:
        """Routed experts (each read once per step for all rows routed to it) + shared."""
        cfg, k = self.config, self.kernels
        assert lw.router_gate is not None
        t, top = x.shape[0], cfg.num_experts_per_tok
        chosen, w = self._route_rows(k.matmul(x, lw.router_gate), lw)
        if self.remote_experts is not None:
            return self._remote_moe(x, lw, chosen, w), chosen
        # Group the (row, slot) pairs by expert, rows ascending: each routed expert is read
        # once per step for all its rows, in one C call for the whole layer.
        flat = chosen.reshape(-1)
        order = np.argsort(flat, kind="stable")
        used, counts = np.unique(flat, return_counts=True)
        start = np.zeros(used.shape[0] + 1, np.int64)
        np.cumsum(counts, out=start[1:])
        experts = self.experts(lw.index, used.tolist())
        rows = (order // top).astype(np.int64)
        descs = [ex.desc_bytes for ex in experts]
        if lw.shared is not None:  # the shared expert rides along: every row, last block
            descs.append(lw.shared.desc_bytes)
            start = np.append(start, start[-1] + t)
            rows = np.concatenate([rows, np.arange(t, dtype=np.int64)])
        started = time.perf_counter()  # the expert products only: the reads above are disk time
        y = k.moe(x, np.frombuffer(b"".join(descs), MAT_DTYPE), start, rows)
        self.clock.matmul_s += time.perf_counter() - started
        where = np.empty(t * top, np.int64)
        where[order] = np.arange(t * top)
        outputs = y[where].reshape(t, top, cfg.hidden_size)
        # The weighted sum in ascending expert id (slot) order, elementwise per row.
        out = np.zeros((t, cfg.hidden_size), dtype=np.float32)
        for slot in range(top):
            out = out + w[:, slot : slot + 1] * outputs[:, slot]
        if lw.shared is not None:
            out = out + y[t * top :]
        return out, chosen

    def _remote_moe(self, x: F32, lw: Layer, chosen: I32, w: F32) -> F32:
        """``_moe``'s sum over the expert workers' outputs: the routed pairs in ``_moe``'s
        grouped order from the workers, the shared expert here (a row's bytes do not depend
        on the rows or experts computed beside it)."""
        assert self.remote_experts is not None
        t, top, k = x.shape[0], self.config.num_experts_per_tok, self.kernels
        groups = group_rows(chosen)
        started = time.perf_counter()  # the round trip counts as expert products
        outputs = np.empty((t * top, x.shape[1]), np.float32)
        outputs[groups.pairs] = self.remote_experts.grouped(lw.index, x, groups)
        shared = None
        if lw.shared is not None:
            shared = k.moe(x, np.frombuffer(lw.shared.desc_bytes, MAT_DTYPE),
                           np.array([0, t], np.int64), np.arange(t, dtype=np.int64))
        self.clock.matmul_s += time.perf_counter() - started
        outputs = outputs.reshape(t, top, x.shape[1])
        out = np.zeros((t, x.shape[1]), dtype=np.float32)
        for slot in range(top):
            out = out + w[:, slot : slot + 1] * outputs[:, slot]
        if shared is not None:
            out = out + shared
        return out


def open_model(model_dir: str | Path, threads: int | None = None,
               kernels: Kernels | None = None) -> Model:
    """``kernels``: a ready kernel set (the CUDA placement's); else the CPU kernels with
    ``threads`` threads."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    config = ModelConfig.from_dir(path)
    checkpoint = Checkpoint(path)
    return Model(config, checkpoint, kernels or Kernels(threads or default_threads()),
                 model_dir=path)


__all__ = ["Model", "Weight", "open_model"]
