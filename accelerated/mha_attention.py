"""Standard multi-head attention (OLMoE, Qwen3-MoE) on the accelerated engine's per-kernel path.

Per row (spec/model.md §5.3): the q, k and v products of the normed input in one C call
(float or quantized weights, as the loader gives them), the q/k RMSNorm (``col_rms_norm``
over the whole projection, or over each head's hd values with the rows seen as
[rows * heads, hd]), ``clip_qkv``, rotate-half RoPE (``col_rope``), attention over the row's
cache of rotated keys and values, and the o product.

The attention itself stays in numpy, one row at a time, because that already gives the bytes
spec §15 kind (c) asks for: a row's scores, softmax and weighted sum read only its own query
and its own cache prefix [0, slot], so every array numpy sees has a shape fixed by that row
alone -- the same products alone or in a batch, in a prefill or a decode, cold or over a
reused prefix, for any kernel thread count. (MLA needs its C kernel for the absorbed kv_b
products per head; here each KV head is two small products.)
"""

from __future__ import annotations

import numpy as np
from colibri.accelerated.kernels import F32, Kernels, Products
from colibri.accelerated.weights import MhaAttention
from colibri.reference.config import ModelConfig

from colibri.backend_kit.kv_state import KVLayer


def _softmax(scores: F32) -> F32:
    """Softmax over the last axis in float32: subtract the max, exponentiate, divide by the
    sum (the reference's order of operations, spec §5.3)."""
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    out: F32 = (e / np.sum(e, axis=-1, keepdims=True)).astype(np.float32)
    return out


class StandardAttention:
    """One layer's standard attention: its weights and the products of its normed input."""

    __slots__ = ("cfg", "weights", "products")

    def __init__(self, cfg: ModelConfig, weights: MhaAttention) -> None:
        self.cfg, self.weights = cfg, weights
        #: q, k and v read the same normed input: one C call (``col_mats_matmul``).
        self.products = Products([weights.q, weights.k, weights.v])

    def _norm(self, k: Kernels, x: F32, weight: F32) -> F32:
        """The q or k RMSNorm: over the whole projection, or each head on its own (one weight
        every head shares) -- each C row is one statistic either way."""
        if self.cfg.qk_norm != "head":
            return k.rms_norm(x, weight, self.cfg.rms_norm_eps)
        m, hd = x.shape[0], self.cfg.qk_head_dim
        normed = k.rms_norm(np.ascontiguousarray(x.reshape(-1, hd)), weight,
                            self.cfg.rms_norm_eps)
        return normed.reshape(m, -1)

    def project(self, k: Kernels, h: F32, rope: tuple[F32, F32]) -> tuple[F32, F32, F32]:
        """Normed rows h [m, D] -> rotated queries [m, H*hd], rotated keys [m, KV*hd] and
        values [m, KV*hd]."""
        cfg, w = self.cfg, self.weights
        q, key, v = k.matmul_many(h, self.products)
        q, key = self._norm(k, q, w.q_norm), self._norm(k, key, w.k_norm)
        if cfg.clip_qkv is not None:
            c = np.float32(cfg.clip_qkv)
            q, key, v = np.clip(q, -c, c), np.clip(key, -c, c), np.clip(v, -c, c)
        hd = cfg.qk_head_dim
        cos, sin = rope
        for rows, heads in ((q, cfg.num_attention_heads), (key, cfg.num_key_value_heads)):
            k.rope(rows, heads, heads * hd, hd, 0, hd, cos, sin, False)
        return q, key, v

    def attend_row(self, q: F32, cache: KVLayer, seen: int) -> F32:
        """One row's query [H*hd] over its first ``seen`` cached keys and values -> the heads'
        outputs [H*hd] (query head h reads key/value head h // (H / KV))."""
        cfg = self.cfg
        kv, hd = cfg.num_key_value_heads, cfg.qk_head_dim
        group = cfg.num_attention_heads // kv
        queries = q.reshape(kv, group, hd)
        keys = np.ascontiguousarray(cache["key"][:seen].reshape(seen, kv, hd).transpose(1, 2, 0))
        values = np.ascontiguousarray(cache["value"][:seen].reshape(seen, kv, hd)
                                      .transpose(1, 0, 2))
        scores = (np.matmul(queries, keys) * np.float32(cfg.attn_scale)).astype(np.float32)
        out: F32 = np.matmul(_softmax(scores), values).reshape(-1)  # [KV, G, hd] -> [H*hd]
        return out

    def rows(self, k: Kernels, x: F32, h: F32, caches: list[KVLayer], slots: list[int],
             rope: tuple[F32, F32]) -> F32:
        """x + attention(h) over the rows. Row r writes its key and value at ``slots[r]`` of
        ``caches[r]`` before any row attends, so the rows of one sequence in a prefill see
        each other; it then attends to its cache rows [0, slots[r]]."""
        q, key, v = self.project(k, h, rope)
        for r, (cache, slot) in enumerate(zip(caches, slots, strict=True)):
            cache["key"][slot] = key[r]
            cache["value"][slot] = v[r]
        out = np.empty_like(q)
        for r, (cache, slot) in enumerate(zip(caches, slots, strict=True)):
            out[r] = self.attend_row(q[r], cache, slot + 1)
        return x + k.matmul(out, self.weights.o)
