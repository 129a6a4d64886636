"""Multi-head latent attention (MLA), in its two equal forms.

Per token x (already input-normed), with H heads:

    q        = q_b(rms_norm(q_a(x)))            -> [H, nope + rope]    (q_proj(x) without q_lora)
    q_nope   = q[:, :nope];  q_rope = rope(q[:, nope:], pos)
    c        = kv_a(x)                          -> [kv_lora + rope]
    latent   = rms_norm(c[:kv_lora])            (cached)
    rope_key = rope(c[kv_lora:], pos)           (cached; one key shared by every head)

Naive form (the textbook; used by the full-sequence forward): expand each cached latent with
kv_b into per-head keys and values,

    [k_nope_h | v_h] = kv_b_h @ latent_t
    score_h,t = (q_nope_h . k_nope_h,t + q_rope_h . rope_key_t) / sqrt(nope + rope)
    out_h = sum_t softmax_t(score_h) v_h,t

Absorbed form (the incremental path; only the latent cache is read): fold kv_b into the query
and the output instead of into every key,

    qabs_h = kv_b_k_h^T q_nope_h                  -> [kv_lora]
    score_h,t = (qabs_h . latent_t + q_rope_h . rope_key_t) / sqrt(nope + rope)
    out_h = kv_b_v_h @ (sum_t softmax_t(score_h) latent_t)

Both give the same numbers up to float32 rounding (associativity of the products).

Spec: spec/model.md §5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from colibri.reference.activations import softmax
from colibri.reference.config import LATENT_NORM_EPS, ModelConfig
from colibri.reference.norms import rms_norm
from colibri.reference.rope import apply_rope
from colibri.reference.tensors import F32, aligned_copy
from colibri.reference.weights import AttentionWeights

Matmul = Callable[[F32, F32], F32]


@dataclass(frozen=True)
class Projections:
    """Everything attention needs from the rows being processed."""

    q_nope: F32  # [T, H, nope]
    q_rope: F32  # [T, H, rope]  (rotated)
    q_resid: F32 | None  # [T, q_lora]  normed q_a output (the DSA indexer's query input)
    latent: F32  # [T, kv_lora]  normed latent (what the cache stores)
    rope_key: F32  # [T, rope]  rotated shared key (what the cache stores)


def project(
    x: F32, w: AttentionWeights, cfg: ModelConfig, cos: F32, sin: F32, mm: Matmul
) -> Projections:
    t, h = x.shape[0], cfg.num_attention_heads
    if w.q_a is not None and w.q_a_norm is not None:
        q_resid = rms_norm(mm(x, w.q_a), w.q_a_norm, LATENT_NORM_EPS)
        q = mm(q_resid, w.q_b)
    else:
        q_resid = None
        q = mm(x, w.q_b)
    q = q.reshape(t, h, cfg.qk_head_dim)
    q_nope = np.ascontiguousarray(q[..., : cfg.qk_nope_head_dim])
    q_rope = apply_rope(q[..., cfg.qk_nope_head_dim :], cos, sin, cfg.rope_interleave)
    c = mm(x, w.kv_a)
    latent = rms_norm(c[:, : cfg.kv_lora_rank], w.kv_a_norm, LATENT_NORM_EPS)
    rope_key = apply_rope(c[:, cfg.kv_lora_rank :], cos, sin, cfg.rope_interleave)
    return Projections(q_nope, q_rope, q_resid, latent, rope_key)


def naive_attention(
    p: Projections,
    latent: F32,
    rope_key: F32,
    allowed: np.ndarray,
    w: AttentionWeights,
    cfg: ModelConfig,
) -> F32:
    """Expanded-K/V attention of T queries over S keys; ``allowed`` is a [T, S] bool mask."""
    h, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
    s = latent.shape[0]
    kv = np.matmul(latent, w.kv_b.T).reshape(s, h, nope + cfg.v_head_dim)
    k_nope = kv[..., :nope].transpose(1, 0, 2)  # [H, S, nope]
    v = kv[..., nope:].transpose(1, 0, 2)  # [H, S, v]
    q_nope = p.q_nope.transpose(1, 0, 2)  # [H, T, nope]
    q_rope = p.q_rope.transpose(1, 0, 2)  # [H, T, rope]
    scores = np.matmul(q_nope, k_nope.transpose(0, 2, 1)) + np.matmul(q_rope, rope_key.T)
    scores = (scores * np.float32(cfg.attn_scale)).astype(np.float32)
    scores = np.where(allowed[None], scores, np.float32(-np.inf))
    probs = softmax(scores)  # [H, T, S]
    out = np.matmul(probs, v)  # [H, T, v]
    result: F32 = np.ascontiguousarray(out.transpose(1, 0, 2)).reshape(p.q_nope.shape[0], -1)
    return result


def absorb_queries(q_nope: F32, kv_b_k: F32) -> F32:
    """qabs[r, h] = kv_b_k[h]^T q_nope[r, h] for M rows: [M, H, nope] -> [M, H, kv_lora].

    Head blocks outside, rows inside, one gemv per (head, row): a row's result never depends
    on the other rows, and each head's block of kv_b is read once per step (see row_matmul).
    """
    m, h, _ = q_nope.shape
    out = np.empty((m, h, kv_b_k.shape[2]), dtype=np.float32)
    for head in range(h):
        for r in range(m):
            out[r, head] = aligned_copy(q_nope[r, head]) @ kv_b_k[head]
    return out


def expand_contexts(context: F32, kv_b_v: F32) -> F32:
    """out[r, h] = kv_b_v[h] context[r, h] for M rows: [M, H, kv_lora] -> [M, H * v]."""
    m, h, _ = context.shape
    out = np.empty((m, h, kv_b_v.shape[1]), dtype=np.float32)
    for head in range(h):
        for r in range(m):
            out[r, head] = kv_b_v[head] @ aligned_copy(context[r, head])
    return out.reshape(m, -1)


def latent_attention_row(
    qabs: F32, q_rope: F32, latent: F32, rope_key: F32, cfg: ModelConfig
) -> F32:
    """One row's attention in latent space: [H, kv_lora] queries over the keys it may see
    (already selected) -> the attention-weighted latent per head [H, kv_lora]."""
    scores = (qabs @ latent.T + q_rope @ rope_key.T) * np.float32(cfg.attn_scale)
    probs = softmax(scores.astype(np.float32))  # [H, S]
    context: F32 = probs @ latent
    return context


def absorbed_attention_row(
    q_nope: F32,
    q_rope: F32,
    latent: F32,
    rope_key: F32,
    kv_b_k: F32,
    kv_b_v: F32,
    cfg: ModelConfig,
) -> F32:
    """One query row against the cached latents it may see: -> [H * v] (the three steps)."""
    qabs = absorb_queries(q_nope[None], kv_b_k)[0]
    context = latent_attention_row(qabs, q_rope, latent, rope_key, cfg)
    out: F32 = expand_contexts(context[None], kv_b_v)[0]
    return out
