"""One decoder layer, in the two execution forms of the engine.

    h = x + attention(rms_norm(x, input_norm))
    y = h + mlp(rms_norm(h, post_attention_norm))     mlp = dense SwiGLU or MoE + shared

``full_sequence_layer`` is the textbook form: T tokens at once, naive (expanded) MLA, gemm
products. The row form is the incremental one: M rows, each at its own position of its own
cache (rows of one sequence in a prefill, or one row per sequence in a batched decode),
absorbed MLA over the latent cache (``attention_rows``), and products that are computed row by
row (``tensors.row_matmul``), so that a row's bytes never depend on the other rows. Its steps
run one by one from the backend kit's step wrapper, which reads the phase clock between them:
``input_norm``, ``attention_rows``, ``post_attention_norm``, then ``dense_residual`` or the
MoE steps (``moe.py``) and ``moe_residual``. The full-sequence form composes the same
norms and feed-forward steps here.

Both take the RoPE ``cos``/``sin`` of their rows' positions from the caller: they depend only
on the positions, so the model computes them once per forward, not once per layer. A family
with standard multi-head attention (OLMoE, families.py) runs ``mha.py`` in the attention step
instead of MLA; every other step is the same.

Spec: spec/model.md §3.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from colibri.reference import dsa, mha
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertStore
from colibri.reference.layer_cache import LayerCache
from colibri.reference.mla import (
    absorb_queries,
    expand_contexts,
    latent_attention_row,
    naive_attention,
    project,
)
from colibri.reference.mlp import Matmul, swiglu
from colibri.reference.moe import expert_sum, moe
from colibri.reference.norms import rms_norm
from colibri.reference.tensors import F32, I64, dense_matmul, row_matmul
from colibri.reference.weights import LayerWeights, MhaWeights

# ---------------------------------------------------------------------------------------------
# The steps of a layer


def input_norm(x: F32, lw: LayerWeights, cfg: ModelConfig) -> F32:
    """The attention's input: rms_norm(x, input_layernorm) (§3, §3.1)."""
    return rms_norm(x, lw.input_norm, cfg.rms_norm_eps)


def post_attention_norm(h: F32, lw: LayerWeights, cfg: ModelConfig) -> F32:
    """The feed-forward's input: rms_norm(h, post_attention_layernorm) (§3, §3.1)."""
    return rms_norm(h, lw.post_norm, cfg.rms_norm_eps)


def dense_residual(h: F32, xn: F32, lw: LayerWeights, mm: Matmul) -> F32:
    """A dense layer's output: h + SwiGLU(xn) (§3, §7.3)."""
    assert lw.dense is not None
    return h + swiglu(xn, lw.dense.gate, lw.dense.up, lw.dense.down, mm)


def moe_residual(h: F32, outputs: F32, weights: F32, shared: F32 | None) -> F32:
    """A sparse layer's output: h + the routed and shared experts' sum (§3, §7.2)."""
    return h + expert_sum(outputs, weights, shared)


# ---------------------------------------------------------------------------------------------
# Full sequence (teacher forcing, the oracle comparison)


def full_sequence_layer(
    x: F32,
    lw: LayerWeights,
    cfg: ModelConfig,
    indexer_mode: str | None,
    experts: ExpertStore,
    prev_allowed: np.ndarray | None,
    rope: tuple[F32, F32],
) -> tuple[F32, np.ndarray]:
    """x [T, D] at positions 0..T-1 -> (y [T, D], the [T, T] mask of keys each query saw).

    ``indexer_mode`` is the layer's DSA indexer: "full" (runs it), "shared" (reuses the last
    full layer's selection) or None; ``rope`` is ``cos_sin`` of positions 0..T-1."""
    h, allowed = full_sequence_attention(x, lw, cfg, indexer_mode, prev_allowed, rope)
    return full_sequence_feed_forward(h, lw, cfg, experts), allowed


def full_sequence_attention(
    x: F32,
    lw: LayerWeights,
    cfg: ModelConfig,
    indexer_mode: str | None,
    prev_allowed: np.ndarray | None,
    rope: tuple[F32, F32],
) -> tuple[F32, np.ndarray]:
    """The first half of a layer: (h = x + attention(rms_norm(x)), the key mask)."""
    t = x.shape[0]
    cos, sin = rope
    h = input_norm(x, lw, cfg)
    aw = lw.attention
    if isinstance(aw, MhaWeights):
        return x + mha.full_sequence_attention(h, aw, cfg, rope), np.tril(np.ones((t, t), bool))
    p = project(h, aw, cfg, cos, sin, dense_matmul)
    allowed = np.tril(np.ones((t, t), dtype=bool))
    if indexer_mode == "full" and aw.indexer is not None:
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
    elif indexer_mode == "shared" and prev_allowed is not None:
        allowed = prev_allowed
    attn = naive_attention(p, p.latent, p.rope_key, allowed, aw, cfg)
    return x + dense_matmul(attn, aw.o), allowed


def full_sequence_feed_forward(
    h: F32, lw: LayerWeights, cfg: ModelConfig, experts: ExpertStore
) -> F32:
    """The second half of a layer: h + mlp(rms_norm(h, post_attention_norm))."""
    xn = post_attention_norm(h, lw, cfg)
    if lw.dense is not None:
        return dense_residual(h, xn, lw, dense_matmul)
    return h + moe(xn, lw, experts, cfg, dense_matmul)[0]


# ---------------------------------------------------------------------------------------------
# Rows over a cache (prefill, decode, batched decode, MTP)


def attention_rows(
    x: F32,
    xn: F32,
    lw: LayerWeights,
    cfg: ModelConfig,
    indexer_mode: str | None,
    caches: Sequence[LayerCache],
    slots: list[int],
    prev_keep: list[I64 | None],
    rope: tuple[F32, F32],
) -> tuple[F32, list[I64 | None]]:
    """M rows -> (h = x + attention(xn) [M, D], the kept key slots of each row, None meaning
    all), with ``xn`` the rows' ``input_norm`` (§5 absorbed, §6).

    Row r writes its cache entries at row ``slots[r]`` of ``caches[r]`` and attends to rows
    [0, slots[r]] of that cache. Every row's cache entries are written before any row
    attends, so rows of one sequence see each other. ``rope`` is ``cos_sin`` of the rows'
    positions; ``prev_keep`` is each row's selection at the last "full" indexer layer, which a
    "shared" layer reuses.
    """
    m = x.shape[0]
    cos, sin = rope
    aw = lw.attention
    if isinstance(aw, MhaWeights):  # a standard-attention family: no DSA selection
        return mha.attention_rows(x, xn, aw, cfg, caches, slots, rope), [None] * m
    p = project(xn, aw, cfg, cos, sin, row_matmul)
    run_indexer = indexer_mode == "full" and aw.indexer is not None
    # A row that sees at most index_topk keys keeps them all (dsa.select), so the indexer's
    # queries, head weights and scores matter only when some row sees more; the keys are
    # always cached, for the rows that will. Each row's products are computed row by row, so
    # skipping them changes no byte of the rows that remain.
    select_rows = [run_indexer and slots[r] + 1 > cfg.index_topk for r in range(m)]
    if run_indexer:
        assert aw.indexer is not None and p.q_resid is not None
        ikeys = dsa.index_keys(xn, aw.indexer, cfg, cos, sin, row_matmul)
    if any(select_rows):
        assert aw.indexer is not None and p.q_resid is not None
        iqueries = dsa.index_queries(p.q_resid, aw.indexer, cfg, cos, sin, row_matmul)
        iweights = dsa.head_weights(xn, aw.indexer, cfg, row_matmul)
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
        elif indexer_mode == "shared":
            keep = prev_keep[r]
        keeps.append(keep)
        if keep is not None:
            latent, rope_key = latent[keep], rope_key[keep]
        context[r] = latent_attention_row(qabs[r], p.q_rope[r], latent, rope_key, cfg)
    return x + row_matmul(expand_contexts(context, kv_b_v), aw.o), keeps
