"""The accelerated model: the reference's incremental forward with every hot product in C.

Reading order (spec/model.md): embedding (§3) -> per layer: RMSNorm (§3.1), MLA projections
and RoPE (§4, §5), the DSA indexer (§6), absorbed attention over the latent cache (§5), the
router and experts or the dense MLP (§7) -> final norm and lm_head (§8); MTP (§9).

What runs where: products with weights (every matmul, the absorbed kv_b products inside
attention, a layer's routed experts in one ``col_moe`` call over float or quantized weights),
norms, RoPE, SwiGLU's gate, attention, the indexer's scores and the router (``col_route``)
are C kernels (``kernels.py``); a layer without DSA selection is one C call
(``layer_block.py``). On the per-kernel path light per-row glue stays in numpy, with
operations whose per-element result does not depend on the array's length: the embedding
gather, RoPE's cos/sin table (once per forward), residual adds, the DSA top-k over a row's
scores, and the weighted sum of a row's expert outputs in ascending expert id order. So a
row's logits are the same bytes alone or in any batch and for any thread count (spec §10,
§15 kind (c)).

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
from colibri.accelerated.weights import (
    Expert,
    ExpertSource,
    Layer,
    WeightLoader,
    load_layer,
    mapped_experts,
    quantized_experts,
)
from colibri.reference.config import INDEXER_NORM_EPS, LATENT_NORM_EPS, ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.indexer_presence import mtp_indexer_mode, resolve_indexer
from colibri.reference.safetensors import Checkpoint

from colibri.backend_kit.kv_state import KVLayer, KVState
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.backend_kit.row_driver import LayerRows, RowModel
from colibri.host_topology import usable_cpus

I32 = npt.NDArray[np.int32]


class ExpertLookup(Protocol):
    def expert(self, layer: int, expert: int) -> Any: ...

I64 = npt.NDArray[np.int64]


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
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    out: F32 = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    return out


def dsa_select(scores: F32, topk: int) -> I64 | None:
    """Kept positions ascending (spec §6): best scores, ties to the earlier position."""
    if scores.shape[0] <= topk:
        return None
    kept: I64 = np.sort(np.argsort(-scores, kind="stable")[:topk]).astype(np.int64)
    return kept


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
        if (experts is None and model_dir is not None
                and any(name.endswith(".qs") for name in checkpoint.tensors)):
            experts = quantized_experts(model_dir, cfg, t, sparse)
        self._read_expert = experts or mapped_experts(t, cfg, sparse)
        self._experts: dict[tuple[int, int], Expert] = {}
        #: A tiered store (the backend's) that decides residency and counts lookups; the
        #: model's own unbounded cache otherwise.
        self.store: ExpertLookup | None = None
        self._inv_freq = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta)
        self._products: dict[tuple[int, bool, bool], Products] = {}
        self._blocks: dict[int, LayerBlock] = {}
        #: Layers in one C call where they can be (``layer_block``), and a step's decoder
        #: layers all in one (``decoder_stack``) when none selects; False forces the
        #: per-kernel path everywhere (the tests compare the paths byte for byte).
        self.fused_layers = True
        self.fused_stack = True
        self._stack: DecoderStack | None = None

    @property
    def mtp(self) -> Layer | None:
        return self.mtp_layer

    def read_expert(self, layer: int, e: int) -> Expert:
        """An expert straight from the checkpoint or container (mapped views, float or
        quantized)."""
        return self._read_expert(layer, e)

    def expert(self, layer: int, e: int) -> Expert:
        if self.store is not None:
            held = self.store.expert(layer, e)
            assert isinstance(held, Expert)
            return held
        found = self._experts.get((layer, e))
        if found is None:
            found = self._experts[(layer, e)] = self._read_expert(layer, e)
        return found

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
        """All decoder layers in one C call unless some row would attend to a DSA-selected
        subset of its past (then layer by layer, ``_row_layer``)."""
        cfg = self.config
        selecting = any(p + 1 > cfg.index_topk for p in positions) and any(
            mode == "full" and lw.attention.indexer is not None
            for mode, lw in zip(self.indexer_modes, self.layers, strict=True))
        if not (self.fused_layers and self.fused_stack) or selecting:
            return super()._decoder_layers(states, positions, x, rope)
        if self._stack is None:
            self._stack = DecoderStack([self._block(lw, mode == "full"
                                                    and lw.attention.indexer is not None)
                                        for lw, mode in zip(self.layers, self.indexer_modes,
                                                            strict=True)],
                                       cfg.num_experts_per_tok)
        x = np.array(x, dtype=np.float32, order="C")  # updated in place
        routes = self._stack.run(self.kernels, x, rope, states, positions, self.expert,
                                 self.clock)
        return x, routes

    def _block(self, lw: Layer, index_keys: bool) -> LayerBlock:
        """The layer's one-call record (one per layer: the decoder stack and the per-layer
        path share its expert table)."""
        block = self._blocks.get(lw.index)
        if block is None or block.index_keys != index_keys:
            block = self._blocks[lw.index] = LayerBlock(self.config, lw, index_keys)
            if lw.index < len(self.layers):  # the stack's records point at its own blocks
                self._stack = None
        return block

    def _decoder_rows(self, layer: int, x: F32, positions: list[int], caches: list[KVLayer],
                      keeps: list[I64 | None], rope: tuple[F32, F32]) -> LayerRows:
        return self._row_layer(x, self.layers[layer], self.indexer_modes[layer], positions,
                               caches, positions, keeps, rope)

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
        assert self.mtp_layer is not None
        return self._row_layer(z, self.mtp_layer, self.mtp_indexer_mode, positions, caches,
                               slots, [None] * len(positions), rope)

    # --- one decoder layer over rows (spec §3) ----------------------------------------------

    def _input_products(self, lw: Layer, keys: bool, head_weights: bool) -> Products:
        """The products of a layer's normed input h, built once per layer and variant: the
        query's first projection, kv_a, and the indexer's key and head-weight projections
        when the step needs them."""
        found = self._products.get((lw.index, keys, head_weights))
        if found is None:
            aw, ix = lw.attention, lw.attention.indexer
            weights = [aw.q_a if aw.q_a is not None else aw.q_b, aw.kv_a]
            if keys:
                assert ix is not None
                weights.append(ix.wk)
            if head_weights:
                assert ix is not None
                weights.append(ix.weights_proj)
            found = self._products[(lw.index, keys, head_weights)] = Products(weights)
        return found

    def _row_layer(self, x: F32, lw: Layer, mode: str | None, positions: list[int],
                   caches: list[KVLayer], slots: list[int], prev_keep: list[I64 | None],
                   rope: tuple[F32, F32]) -> tuple[F32, list[I64 | None], I32 | None]:
        """One decoder layer over the step's rows: in two C calls (``layer_block``) unless a
        row attends to a DSA-selected subset of its past, which the per-kernel path below
        handles (it has the indexer's scoring and top-k)."""
        cfg = self.config
        selecting = (mode == "full" and lw.attention.indexer is not None
                     and any(s + 1 > cfg.index_topk for s in slots))
        if (not self.fused_layers or selecting
                or any(keep is not None for keep in prev_keep)):
            return self._kernel_layer(x, lw, mode, positions, caches, slots, prev_keep, rope)
        return self._fused_layer(x, lw, mode == "full" and lw.attention.indexer is not None,
                                 caches, slots, rope)

    def _fused_layer(self, x: F32, lw: Layer, index_keys: bool, caches: list[KVLayer],
                     slots: list[int], rope: tuple[F32, F32]
                     ) -> tuple[F32, list[I64 | None], I32 | None]:
        block = self._block(lw, index_keys)
        k, clock = self.kernels, self.clock
        m = x.shape[0]
        x = np.array(x, dtype=np.float32, order="C")  # updated in place below
        seconds = np.zeros(2, np.float64)
        h, chosen, weights, missing = block.step(k, x, rope[0], rope[1], caches, slots, seconds)
        clock.attention_s += float(seconds[0])
        clock.matmul_s += float(seconds[1])
        keeps: list[I64 | None] = [None] * m
        if chosen is None:
            return x, keeps, None
        # The store's lookups, as the per-kernel path makes them (each distinct expert the
        # rows chose, ascending), now that C has chosen; an expert C had no descriptor for
        # is handed to it here and the layer's experts run now.
        for e in np.unique(chosen).tolist():
            block.hold(e, self.expert(lw.index, e))
        if missing:
            assert weights is not None
            started = time.perf_counter()  # the expert products only: reads are disk time
            block.routed_held(k, x, h, chosen, weights)
            clock.matmul_s += time.perf_counter() - started
        block.release()
        return x, keeps, chosen

    def _route_rows(self, logits: F32, lw: Layer) -> tuple[I32, F32]:
        """Every row's routed experts (ascending) and weights (spec §7.1; ``col_route``, as
        the one-call layer routes)."""
        assert lw.router_bias is not None
        cfg = self.config
        return self.kernels.route(logits, lw.router_bias, cfg.n_group, cfg.topk_group,
                                  cfg.num_experts_per_tok, cfg.norm_topk_prob,
                                  cfg.routed_scaling_factor)

    def _kernel_layer(self, x: F32, lw: Layer, mode: str | None, positions: list[int],
                      caches: list[KVLayer], slots: list[int], prev_keep: list[I64 | None],
                      rope: tuple[F32, F32]) -> tuple[F32, list[I64 | None], I32 | None]:
        cfg, k = self.config, self.kernels
        started = time.perf_counter()
        m = x.shape[0]
        cos, sin = rope
        heads, nope, rdim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        qk, kvl = cfg.qk_head_dim, cfg.kv_lora_rank
        h = k.rms_norm(x, lw.input_norm, cfg.rms_norm_eps)
        aw = lw.attention
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
                keep = dsa_select(scores, cfg.index_topk)
            elif mode == "shared":
                keep = prev_keep[r]
            keeps.append(keep)
        attn = k.mla_attention(q, heads, nope, rdim, cfg.v_head_dim, kvl,
                               [cache["latent"] for cache in caches],
                               [cache["rope_key"] for cache in caches],
                               [s + 1 for s in slots], keeps, aw.kv_b,
                               float(np.float32(cfg.attn_scale)))
        x = x + k.matmul(attn, aw.o)
        self.clock.attention_s += time.perf_counter() - started
        h = k.rms_norm(x, lw.post_norm, cfg.rms_norm_eps)
        if lw.dense is not None:
            every = np.arange(m, dtype=np.int64)
            dense = k.moe(h, lw.dense.desc, np.array([0, m], np.int64), every)
            return x + dense, keeps, None
        y, chosen = self._moe(h, lw)
        return x + y, keeps, chosen

    def _moe(self, x: F32, lw: Layer) -> tuple[F32, I32]:
        """Routed experts (each read once per step for all rows routed to it) + shared."""
        cfg, k = self.config, self.kernels
        assert lw.router_gate is not None and lw.router_bias is not None
        t, top = x.shape[0], cfg.num_experts_per_tok
        chosen, w = self._route_rows(k.matmul(x, lw.router_gate), lw)
        # Group the (row, slot) pairs by expert, rows ascending: each routed expert is read
        # once per step for all its rows, in one C call for the whole layer.
        flat = chosen.reshape(-1)
        order = np.argsort(flat, kind="stable")
        used, counts = np.unique(flat, return_counts=True)
        start = np.zeros(used.shape[0] + 1, np.int64)
        np.cumsum(counts, out=start[1:])
        experts = [self.expert(lw.index, int(e)) for e in used]
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
