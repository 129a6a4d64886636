"""One decoder layer, in the two execution forms of the engine.

    h = x + attention(rms_norm(x, input_norm))
    y = h + mlp(rms_norm(h, post_attention_norm))     mlp = dense SwiGLU or MoE + shared

``full_sequence_layer`` is the textbook form: T tokens at once, naive (expanded) MLA, gemm
products. ``row_layer`` is the incremental form: M rows, each at its own position of its own
cache (rows of one sequence in a prefill, or one row per sequence in a batched decode),
absorbed MLA over the latent cache, and products that are computed row by row
(``tensors.row_matmul``), so that a row's bytes never depend on the other rows.

Both take the RoPE ``cos``/``sin`` of their rows' positions from the caller: they depend only
on the positions, so the model computes them once per forward, not once per layer.

Spec: spec/model.md §3.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from colibri.reference import dsa
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertStore
from colibri.reference.mla import (
    absorb_queries,
    expand_contexts,
    latent_attention_row,
    naive_attention,
    project,
)
from colibri.reference.mlp import Matmul, swiglu
from colibri.reference.moe import moe
from colibri.reference.norms import rms_norm
from colibri.reference.phase_times import PhaseTimes
from colibri.reference.tensors import F32, I32, I64, dense_matmul, row_matmul
from colibri.reference.weights import LayerWeights


@dataclass(frozen=True)
class LayerContext:
    """What a layer needs besides its own weights."""

    cfg: ModelConfig
    store: ExpertStore
    #: "full" (runs its indexer), "shared" (reuses the last full layer's selection) or None.
    indexer_mode: str | None
    #: Attention and expert products add their seconds here (reference/phase_times.py).
    clock: PhaseTimes


#: What ``row_layer`` returns: the rows' new hidden states, each row's DSA keep-set for the
#: next shared layer (None: all keys), and the experts each row chose ([rows, k]; None: dense).
RowLayerResult = tuple[F32, list[I64 | None], I32 | None]


class LayerCache(Protocol):
    """One layer's cache of one sequence, by array name ("latent", "rope_key", "index_key"):
    rows are positions (or MTP slots), written and read in place."""

    def __getitem__(self, name: str) -> F32: ...


def _feed_forward(
    h: F32, lw: LayerWeights, ctx: LayerContext, mm: Matmul
) -> tuple[F32, I32 | None]:
    """(the MLP's output, the experts each row chose; None on a dense layer)."""
    if lw.dense is not None:
        return swiglu(h, lw.dense.gate, lw.dense.up, lw.dense.down, mm), None
    return moe(h, lw, ctx.store, ctx.cfg, mm, ctx.clock)


# ---------------------------------------------------------------------------------------------
# Full sequence (teacher forcing, the oracle comparison)


def full_sequence_layer(
    x: F32,
    lw: LayerWeights,
    ctx: LayerContext,
    prev_allowed: np.ndarray | None,
    rope: tuple[F32, F32],
) -> tuple[F32, np.ndarray]:
    """x [T, D] at positions 0..T-1 -> (y [T, D], the [T, T] mask of keys each query saw).

    ``rope`` is ``cos_sin`` of positions 0..T-1."""
    h, allowed = full_sequence_attention(x, lw, ctx, prev_allowed, rope)
    return full_sequence_feed_forward(h, lw, ctx), allowed


def full_sequence_attention(
    x: F32,
    lw: LayerWeights,
    ctx: LayerContext,
    prev_allowed: np.ndarray | None,
    rope: tuple[F32, F32],
) -> tuple[F32, np.ndarray]:
    """The first half of a layer: (h = x + attention(rms_norm(x)), the key mask)."""
    cfg = ctx.cfg
    t = x.shape[0]
    cos, sin = rope
    h = rms_norm(x, lw.input_norm, cfg.rms_norm_eps)
    started = time.perf_counter()
    aw = lw.attention
    p = project(h, aw, cfg, cos, sin, dense_matmul)
    allowed = np.tril(np.ones((t, t), dtype=bool))
    if ctx.indexer_mode == "full" and aw.indexer is not None:
        assert p.q_resid is not None
        keys = dsa.index_keys(h, aw.indexer, cfg, cos, sin, dense_matmul)
        queries = dsa.index_queries(p.q_resid, aw.indexer, cfg, cos, sin, dense_matmul)
        weights = dsa.head_weights(h, aw.indexer, cfg, dense_matmul)
        for i in range(t):
            kept = dsa.select(dsa.scores_row(queries[i], weights[i], keys[: i + 1], cfg),
                              cfg.index_topk)
            if kept is not None:
                allowed[i] = False
                allowed[i, kept] = True
    elif ctx.indexer_mode == "shared" and prev_allowed is not None:
        allowed = prev_allowed
    attn = naive_attention(p, p.latent, p.rope_key, allowed, aw, cfg)
    x = x + dense_matmul(attn, aw.o)
    ctx.clock.attention_s += time.perf_counter() - started
    return x, allowed


def full_sequence_feed_forward(h: F32, lw: LayerWeights, ctx: LayerContext) -> F32:
    """The second half of a layer: h + mlp(rms_norm(h, post_attention_norm))."""
    y, _ = _feed_forward(rms_norm(h, lw.post_norm, ctx.cfg.rms_norm_eps), lw, ctx, dense_matmul)
    return h + y


# ---------------------------------------------------------------------------------------------
# Rows over a cache (prefill, decode, batched decode, MTP)


def row_layer(
    x: F32,
    lw: LayerWeights,
    ctx: LayerContext,
    positions: list[int],
    caches: Sequence[LayerCache],
    slots: list[int],
    prev_keep: list[I64 | None],
    rope: tuple[F32, F32],
) -> RowLayerResult:
    """M rows -> (y [M, D], the kept key slots of each row (None meaning all), the experts
    each row chose [M, k] (None on a dense layer)).

    Row r sits at rope position ``positions[r]``, writes its cache entries at row ``slots[r]``
    of ``caches[r]`` and attends to rows [0, slots[r]] of that cache. Every row's cache
    entries are written before any row attends, so rows of one sequence see each other.
    ``rope`` is ``cos_sin`` of ``positions``.
    """
    cfg = ctx.cfg
    m = x.shape[0]
    cos, sin = rope
    h = rms_norm(x, lw.input_norm, cfg.rms_norm_eps)
    started = time.perf_counter()
    aw = lw.attention
    p = project(h, aw, cfg, cos, sin, row_matmul)
    run_indexer = ctx.indexer_mode == "full" and aw.indexer is not None
    # A row that sees at most index_topk keys keeps them all (dsa.select), so the indexer's
    # queries, head weights and scores matter only when some row sees more; the keys are
    # always cached, for the rows that will. Each row's products are computed row by row, so
    # skipping them changes no byte of the rows that remain.
    select_rows = [run_indexer and slots[r] + 1 > cfg.index_topk for r in range(m)]
    if run_indexer:
        assert aw.indexer is not None and p.q_resid is not None
        ikeys = dsa.index_keys(h, aw.indexer, cfg, cos, sin, row_matmul)
    if any(select_rows):
        assert aw.indexer is not None and p.q_resid is not None
        iqueries = dsa.index_queries(p.q_resid, aw.indexer, cfg, cos, sin, row_matmul)
        iweights = dsa.head_weights(h, aw.indexer, cfg, row_matmul)
    for r in range(m):
        caches[r]["latent"][slots[r]] = p.latent[r]
        caches[r]["rope_key"][slots[r]] = p.rope_key[r]
        if run_indexer:
            caches[r]["index_key"][slots[r]] = ikeys[r]
    kv_b_k, kv_b_v = aw.kv_b_heads(cfg)
    qabs = absorb_queries(p.q_nope, kv_b_k)
    context = np.empty((m, cfg.num_attention_heads, cfg.kv_lora_rank), dtype=np.float32)
    keeps: list[I64 | None] = []
    for r in range(m):
        seen = slots[r] + 1
        latent = caches[r]["latent"][:seen]
        rope_key = caches[r]["rope_key"][:seen]
        keep: I64 | None = None
        if select_rows[r]:
            scores = dsa.scores_row(iqueries[r], iweights[r], caches[r]["index_key"][:seen], cfg)
            keep = dsa.select(scores, cfg.index_topk)
        elif ctx.indexer_mode == "shared":
            keep = prev_keep[r]
        keeps.append(keep)
        if keep is not None:
            latent, rope_key = latent[keep], rope_key[keep]
        context[r] = latent_attention_row(qabs[r], p.q_rope[r], latent, rope_key, cfg)
    x = x + row_matmul(expand_contexts(context, kv_b_v), aw.o)
    ctx.clock.attention_s += time.perf_counter() - started
    h = rms_norm(x, lw.post_norm, cfg.rms_norm_eps)
    y, chosen = _feed_forward(h, lw, ctx, row_matmul)
    return x + y, keeps, chosen
