"""The DSA "lightning indexer": which cached tokens each query may attend to.

GLM-5 layers marked "full" run an indexer; "shared" layers reuse the selection of the most
recent full layer for the same query. Per token (x input-normed, q_resid = the normed q_a
output of the same layer's attention):

    k_t   = rope(layer_norm(wk x_t))        rope on the first qk_rope dims, the rest passes
    q_h   = rope(wq_b q_resid)              per index head h (same split)
    w_h   = weights_proj(x) / sqrt(n_heads)
    score_t = sum_h w_h * relu(q_h . k_t / sqrt(head_dim))

A query at position p sees keys 0..p. When there are at most ``index_topk`` of them it sees all
of them (plain causal attention); otherwise it keeps the ``index_topk`` best-scoring keys.
Tie rule (the reference's own; HF's top-k order is implementation-defined): higher score
first, equal scores go to the earlier position.

Spec: spec/model.md §6.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from colibri.reference.config import INDEXER_NORM_EPS, ModelConfig
from colibri.reference.norms import layer_norm
from colibri.reference.rope import apply_rope
from colibri.reference.tensors import F32, I64
from colibri.reference.weights import IndexerWeights

Matmul = Callable[[F32, F32], F32]


def index_keys(x: F32, w: IndexerWeights, cfg: ModelConfig, cos: F32, sin: F32, mm: Matmul) -> F32:
    """The indexer keys of T rows: [T, head_dim] (what the indexer cache stores)."""
    k = layer_norm(mm(x, w.wk), w.k_norm_weight, w.k_norm_bias, INDEXER_NORM_EPS)
    r = cfg.qk_rope_head_dim
    rotated = apply_rope(k[:, :r], cos, sin, interleaved=True)
    out: F32 = np.concatenate([rotated, k[:, r:]], axis=-1)
    return out


def index_queries(
    q_resid: F32, w: IndexerWeights, cfg: ModelConfig, cos: F32, sin: F32, mm: Matmul
) -> F32:
    """The indexer queries of T rows: [T, n_heads, head_dim]."""
    t = q_resid.shape[0]
    q = mm(q_resid, w.wq_b).reshape(t, cfg.index_n_heads, cfg.index_head_dim)
    r = cfg.qk_rope_head_dim
    rotated = apply_rope(q[..., :r], cos, sin, interleaved=True)
    out: F32 = np.concatenate([rotated, q[..., r:]], axis=-1)
    return out


def head_weights(x: F32, w: IndexerWeights, cfg: ModelConfig, mm: Matmul) -> F32:
    """Per-row head weights [T, n_heads], already scaled by 1/sqrt(n_heads)."""
    out: F32 = mm(x, w.weights_proj) * np.float32(cfg.index_n_heads**-0.5)
    return out


def scores_row(query: F32, weights: F32, keys: F32, cfg: ModelConfig) -> F32:
    """Index scores of one query row [n_heads, head_dim] against keys [S, head_dim] -> [S]."""
    per_head = np.maximum(query @ keys.T * np.float32(cfg.index_head_dim**-0.5), np.float32(0))
    out: F32 = weights @ per_head
    return out


def select(scores: F32, topk: int) -> I64 | None:
    """Kept key positions in ascending order, or None when every key is kept."""
    if scores.shape[0] <= topk:
        return None
    order = np.argsort(-scores, kind="stable")[:topk]
    kept: I64 = np.sort(order).astype(np.int64)
    return kept
