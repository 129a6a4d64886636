"""Standard multi-head attention (the "mha" families: OLMoE, Qwen3-MoE), full-sequence and
over a cache.

Per token x (already input-normed), with H query heads, KV key/value heads (each shared by
G = H / KV query heads) and head dimension hd:

    q = rms_norm(q_proj x, q_norm)        [H * hd]   one norm over every head (OLMoE),
                                                     or each head by itself (Qwen3-MoE)
    k = rms_norm(k_proj x, k_norm)        [KV * hd]
    v = v_proj x                          [KV * hd]
    (q, k, v clamped to [-clip_qkv, clip_qkv] when the config sets it)
    q_h = rope(q_h, pos);  k_j = rope(k_j, pos)       rotate-half layout over the whole head
    score_h,t = q_h . k_{h // G, t} / sqrt(hd)
    out_h = sum_t softmax_t(score_h) v_{h // G, t}
    y = o_proj [out_1 ... out_H]

The cache keeps each position's rotated key and its value ("key", "value", [KV * hd] each);
the full-sequence form computes the same from the projections of every position at once.

Spec: spec/model.md §5.3.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from colibri.reference.activations import softmax
from colibri.reference.config import ModelConfig
from colibri.reference.layer_cache import LayerCache
from colibri.reference.mlp import Matmul
from colibri.reference.norms import rms_norm
from colibri.reference.rope import apply_rope
from colibri.reference.tensors import F32, dense_matmul, row_matmul
from colibri.reference.weights import MhaWeights


def project(x: F32, w: MhaWeights, cfg: ModelConfig, cos: F32, sin: F32,
            mm: Matmul) -> tuple[F32, F32, F32]:
    """Rows x [T, D] -> (rotated queries [T, H, hd], rotated keys [T, KV, hd], values
    [T, KV, hd])."""
    t, hd = x.shape[0], cfg.qk_head_dim
    q, k = mm(x, w.q), mm(x, w.k)
    if cfg.qk_norm == "head":  # the norm's statistics over each head's hd values
        q, k = q.reshape(t, -1, hd), k.reshape(t, -1, hd)
    q = rms_norm(q, w.q_norm, cfg.rms_norm_eps).reshape(t, -1)
    k = rms_norm(k, w.k_norm, cfg.rms_norm_eps).reshape(t, -1)
    v = mm(x, w.v)
    if cfg.clip_qkv is not None:
        c = np.float32(cfg.clip_qkv)
        q, k, v = np.clip(q, -c, c), np.clip(k, -c, c), np.clip(v, -c, c)
    q_rot = apply_rope(q.reshape(t, cfg.num_attention_heads, hd), cos, sin, interleaved=False)
    k_rot = apply_rope(k.reshape(t, cfg.num_key_value_heads, hd), cos, sin, interleaved=False)
    return q_rot, k_rot, v.reshape(t, cfg.num_key_value_heads, hd)


def _per_query_head(kv: F32, cfg: ModelConfig) -> F32:
    """[S, KV, hd] -> [H, S, hd]: each key/value head repeated for the query heads sharing it."""
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    out: F32 = np.repeat(kv, group, axis=1).transpose(1, 0, 2)
    return out


def attend(q: F32, keys: F32, values: F32, allowed: np.ndarray, cfg: ModelConfig) -> F32:
    """Queries [T, H, hd] over keys and values [S, KV, hd]; ``allowed`` is a [T, S] bool mask
    -> the heads' outputs [T, H * hd], before o_proj."""
    k, v = _per_query_head(keys, cfg), _per_query_head(values, cfg)  # [H, S, hd]
    scores = np.matmul(q.transpose(1, 0, 2), k.transpose(0, 2, 1))  # [H, T, S]
    scores = (scores * np.float32(cfg.attn_scale)).astype(np.float32)
    scores = np.where(allowed[None], scores, np.float32(-np.inf))
    out = np.matmul(softmax(scores), v)  # [H, T, hd]
    result: F32 = np.ascontiguousarray(out.transpose(1, 0, 2)).reshape(q.shape[0], -1)
    return result


def full_sequence_attention(xn: F32, w: MhaWeights, cfg: ModelConfig,
                            rope: tuple[F32, F32]) -> F32:
    """attention(xn) for positions 0..T-1 at once, causal: [T, D] (o_proj applied)."""
    t = xn.shape[0]
    q, k, v = project(xn, w, cfg, *rope, dense_matmul)
    causal = np.tril(np.ones((t, t), dtype=bool))
    return dense_matmul(attend(q, k, v, causal, cfg), w.o)


def attention_rows(x: F32, xn: F32, w: MhaWeights, cfg: ModelConfig,
                   caches: Sequence[LayerCache], slots: list[int],
                   rope: tuple[F32, F32]) -> F32:
    """M rows -> h = x + attention(xn) [M, D]. Row r writes its key and value at row
    ``slots[r]`` of ``caches[r]`` and attends to rows [0, slots[r]]; every row's entries are
    written before any row attends, so rows of one sequence see each other. Each row's
    products are its own (row_matmul, one row's attention at a time), so its bytes do not
    depend on the other rows (§10)."""
    m, kv, hd = x.shape[0], cfg.num_key_value_heads, cfg.qk_head_dim
    q, k, v = project(xn, w, cfg, *rope, row_matmul)
    for r in range(m):
        caches[r]["key"][slots[r]] = k[r].reshape(-1)
        caches[r]["value"][slots[r]] = v[r].reshape(-1)
    out = np.empty((m, cfg.num_attention_heads * hd), dtype=np.float32)
    for r in range(m):
        seen = slots[r] + 1
        keys = caches[r]["key"][:seen].reshape(seen, kv, hd)
        values = caches[r]["value"][:seen].reshape(seen, kv, hd)
        out[r] = attend(q[r : r + 1], keys, values, np.ones((1, seen), dtype=bool), cfg)[0]
    return x + row_matmul(out, w.o)
