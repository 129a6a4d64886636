"""A decoder layer in two C calls (``csrc/layer.c``): the attention block, then the MoE or
dense MLP folded into the residual.

``LayerBlock`` holds a layer's ``col_layer`` record (built once: dims, epsilons and the
addresses of its mapped weights, which the ``Layer`` keeps alive) and runs a step's rows
through it. Between the two calls only the router's choice and the grouping of rows by
expert stay in Python (the expert store decides residency and counts each lookup). Every
element is computed by the kernels the per-kernel path of ``model.py`` calls, in the same
order, so both paths give the same bytes; ``model.py`` uses this one whenever no row attends
to a DSA-selected subset of its past.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from colibri.accelerated.kernels import (
    F32,
    LAYER_DTYPE,
    MAT_DTYPE,
    KernelInvalidArgument,
    Kernels,
    _ptr,
    mat_descriptors,
)
from colibri.accelerated.weights import Layer
from colibri.reference.config import INDEXER_NORM_EPS, LATENT_NORM_EPS, ModelConfig
from colibri.reference.kv_cache import KVLayer

I64 = npt.NDArray[np.int64]


def _addr(a: np.ndarray | None) -> int:
    return 0 if a is None else int(a.ctypes.data)


def layer_record(cfg: ModelConfig, lw: Layer, index_keys: bool) -> np.ndarray:
    """``col_layer`` of ``lw`` (pointers into arrays ``lw`` keeps alive)."""
    aw, ix = lw.attention, lw.attention.indexer
    if index_keys and ix is None:
        raise KernelInvalidArgument(f"layer {lw.index}: index keys without an indexer")
    rec = np.zeros((), LAYER_DTYPE)
    for name, value in (("d", cfg.hidden_size), ("heads", cfg.num_attention_heads),
                        ("nope", cfg.qk_nope_head_dim), ("rope", cfg.qk_rope_head_dim),
                        ("vdim", cfg.v_head_dim), ("kvl", cfg.kv_lora_rank),
                        ("q_lora", cfg.q_lora_rank or 0), ("index_hd", cfg.index_head_dim),
                        ("index_keys", int(index_keys)), ("interleave", int(cfg.rope_interleave)),
                        ("n_router", 0 if lw.router_gate is None else cfg.n_routed_experts),
                        ("kv_b_dtype", aw.kv_b.code), ("rms_eps", cfg.rms_norm_eps),
                        ("latent_eps", LATENT_NORM_EPS), ("index_eps", INDEXER_NORM_EPS),
                        ("attn_scale", np.float32(cfg.attn_scale)),
                        ("input_norm", _addr(lw.input_norm)), ("post_norm", _addr(lw.post_norm)),
                        ("q_a_norm", _addr(aw.q_a_norm)), ("kv_a_norm", _addr(aw.kv_a_norm)),
                        ("kv_b", aw.kv_b.ptr)):
        rec[name] = value
    rec["q_first"] = mat_descriptors([aw.q_a if aw.q_a is not None else aw.q_b])[0]
    if aw.q_a is not None:
        rec["q_b"] = mat_descriptors([aw.q_b])[0]
    rec["kv_a"] = mat_descriptors([aw.kv_a])[0]
    rec["o"] = mat_descriptors([aw.o])[0]
    if index_keys:
        assert ix is not None
        rec["wk"] = mat_descriptors([ix.wk])[0]
        rec["ik_norm_w"], rec["ik_norm_b"] = _addr(ix.k_norm_weight), _addr(ix.k_norm_bias)
    if lw.router_gate is not None:
        rec["router"] = mat_descriptors([lw.router_gate])[0]
    return rec


class LayerBlock:
    """One layer's record and its two calls."""

    __slots__ = ("cfg", "layer", "record", "address", "index_keys", "dense_desc", "shared_desc")

    def __init__(self, cfg: ModelConfig, lw: Layer, index_keys: bool) -> None:
        self.cfg, self.layer, self.index_keys = cfg, lw, index_keys
        self.record = layer_record(cfg, lw, index_keys)
        self.address = int(self.record.ctypes.data)
        self.dense_desc = None if lw.dense is None else lw.dense.desc
        self.shared_desc = None if lw.shared is None else lw.shared.desc_bytes

    def attention(self, k: Kernels, x: F32, cos: F32, sin: F32, caches: Sequence[KVLayer],
                  slots: Sequence[int]) -> tuple[F32, F32 | None]:
        """x += attention(x) in place; returns (post-norm h, router logits or None)."""
        cfg = self.cfg
        m, d = x.shape
        if d != cfg.hidden_size or cos.shape != (m, cfg.qk_rope_head_dim // 2) or len(slots) != m:
            raise KernelInvalidArgument("attention block: x, cos/sin or slots do not match")
        names = ("latent", "rope_key", "index_key") if self.index_keys else ("latent", "rope_key")
        ptrs = np.zeros((len(names), m), np.uint64)
        for r, (cache, slot) in enumerate(zip(caches, slots, strict=True)):
            for j, name in enumerate(names):
                a = cache[name]
                ptrs[j, r] = _ptr(a, (slot + 1) * cache.widths[name], f"{name} cache")
        slot_a = np.asarray(slots, np.uint64)
        h = np.empty_like(x)
        logits = None
        n_router = int(self.record["n_router"])
        if n_router:
            logits = np.empty((m, n_router), np.float32)
        index_ptr = int(ptrs.ctypes.data) + 16 * m if self.index_keys else 0
        k._check(k.lib.col_attention_block(
            k.pool, self.address, m, _ptr(x, m * d, "x"), h.ctypes.data, _addr(logits),
            _ptr(cos, cos.size, "cos"), _ptr(sin, sin.size, "sin"), ptrs.ctypes.data,
            int(ptrs.ctypes.data) + 8 * m, index_ptr, slot_a.ctypes.data),
            "col_attention_block")
        return h, logits

    def dense(self, k: Kernels, x: F32, h: F32) -> None:
        """x += dense_mlp(h) in place."""
        assert self.dense_desc is not None
        m = x.shape[0]
        every = np.arange(m, dtype=np.int64)
        k.moe_residual(x, h, self.dense_desc, np.array([0, m], np.int64), every, None, None,
                       every)

    def routed(self, k: Kernels, x: F32, h: F32, chosen: npt.NDArray[np.int32], weights: F32,
               expert_desc: Sequence[bytes], used: I64, counts: I64, order: I64) -> None:
        """x += sum of the chosen experts' outputs weighted (+ the shared expert), in place.
        ``used``/``counts``/``order``: the distinct experts ascending, how many rows each
        takes, and the (row, slot) pairs sorted stably by expert."""
        t, top = chosen.shape
        start = np.zeros(used.shape[0] + 1, np.int64)
        np.cumsum(counts, out=start[1:])
        rows = (order // top).astype(np.int64)
        descs = list(expert_desc)
        extra = None
        if self.shared_desc is not None:  # the shared expert rides along: every row, last block
            descs.append(self.shared_desc)
            extra = np.arange(start[-1], start[-1] + t, dtype=np.int64)
            start = np.append(start, start[-1] + t)
            rows = np.concatenate([rows, np.arange(t, dtype=np.int64)])
        slot_row = np.empty(t * top, np.int64)
        slot_row[order] = np.arange(t * top)
        k.moe_residual(x, h, np.frombuffer(b"".join(descs), MAT_DTYPE), start, rows,
                       slot_row.reshape(t, top), np.ascontiguousarray(weights, np.float32),
                       extra)
