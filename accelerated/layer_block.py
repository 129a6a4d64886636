"""A decoder layer's record for the one C call of ``decoder_stack`` (``csrc/layer.c``).

``LayerBlock`` holds a layer's ``col_layer`` record (built once: dims, epsilons, the router's
settings and the addresses of its mapped weights, which the ``Layer`` keeps alive) and its
expert table: one ``col_mat`` triple per routed expert, filled the first time the expert
store hands the expert out (``hold``). A chosen expert without an entry stops the call
(``COL_EMISSING``); once the store has handed it over, ``routed_held`` finishes the layer.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from colibri.accelerated.binding import f32_ptr
from colibri.accelerated.kernels import (
    F32,
    LAYER_DTYPE,
    MAT_DTYPE,
    KernelInvalidArgument,
    Kernels,
    mat_descriptors,
)
from colibri.accelerated.weights import Expert, Layer, latent_attention
from colibri.reference.config import INDEXER_NORM_EPS, LATENT_NORM_EPS, ModelConfig

from colibri.backend_kit.kv_state import KVLayer

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


def _addr(a: np.ndarray | None) -> int:
    return 0 if a is None else int(a.ctypes.data)


def mapped(a: np.ndarray) -> bool:
    """Whether ``a``'s bytes are a view of a memory map (a checkpoint or container file)."""
    base: object = a
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def expert_arrays(ex: Expert) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for w in (ex.gate, ex.up, ex.down):
        out.extend([w.array] if hasattr(w, "array") else [w.payload, w.scales])
    return out


def layer_record(cfg: ModelConfig, lw: Layer, index_keys: bool,
                 experts: np.ndarray | None) -> np.ndarray:
    """``col_layer`` of ``lw`` (pointers into arrays ``lw`` and the caller keep alive)."""
    aw = latent_attention(lw)
    ix = aw.indexer
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
        assert experts is not None and lw.router_bias is not None
        rec["router"] = mat_descriptors([lw.router_gate])[0]
        for name, value in (("n_group", cfg.n_group), ("topk_group", cfg.topk_group),
                            ("top_k", cfg.num_experts_per_tok),
                            ("norm_topk", int(cfg.norm_topk_prob)),
                            ("routed_scale", np.float32(cfg.routed_scaling_factor)),
                            ("router_bias", _addr(lw.router_bias)), ("experts", _addr(experts))):
            rec[name] = value
        rec["shared"] = 0 if lw.shared is None else _addr(lw.shared.desc)
    elif lw.dense is not None:
        rec["dense"] = _addr(lw.dense.desc)
    return rec


class LayerBlock:
    """One layer's record, its expert table and its call."""

    __slots__ = ("cfg", "layer", "record", "address", "index_keys", "experts", "held",
                 "transient")

    def __init__(self, cfg: ModelConfig, lw: Layer, index_keys: bool) -> None:
        self.cfg, self.layer, self.index_keys = cfg, lw, index_keys
        n_exp = cfg.n_routed_experts if lw.router_gate is not None else 0
        #: The expert table C reads ([E][3] col_mat; data 0: not handed out yet), the
        #: experts whose arrays it points into, and those to forget after the step.
        self.experts = np.zeros(3 * max(n_exp, 1), MAT_DTYPE)
        self.held: list[Expert | None] = [None] * n_exp
        self.transient: list[int] = []
        self.record = layer_record(cfg, lw, index_keys, self.experts if n_exp else None)
        self.address = int(self.record.ctypes.data)

    def hold(self, e: int, ex: Expert) -> None:
        """Give C expert ``e``'s descriptors. Memory-mapped experts stay in the table (their
        bytes are the file's pages, whatever the store keeps); one whose weights were
        converted into process memory is forgotten after the step (``release``), so the
        table never keeps alive what the store's RAM budget let go."""
        if self.held[e] is ex:
            return
        self.held[e] = ex
        self.experts[3 * e : 3 * e + 3] = ex.desc
        if not all(mapped(a) for a in expert_arrays(ex)):
            self.transient.append(e)

    @property
    def routed(self) -> bool:
        """A layer with routed experts (else a dense one)."""
        return bool(self.held)

    def release(self, keep: Callable[[int], bool] | None = None) -> None:
        """Forget the transient experts (those ``keep`` does not keep)."""
        kept = []
        for e in self.transient:
            if keep is not None and keep(e):
                kept.append(e)
                continue
            self.held[e] = None
            self.experts[3 * e : 3 * e + 3] = np.zeros(3, MAT_DTYPE)
        self.transient = kept

    def cache_pointers(self, caches: Sequence[KVLayer], slots: Sequence[int]) -> np.ndarray:
        names = ("latent", "rope_key", "index_key") if self.index_keys else ("latent", "rope_key")
        ptrs = np.zeros((len(names), len(slots)), np.uint64)
        for r, (cache, slot) in enumerate(zip(caches, slots, strict=True)):
            for j, name in enumerate(names):
                a = cache[name]
                ptrs[j, r] = f32_ptr(a, (slot + 1) * cache.widths[name], f"{name} cache")
        return ptrs

    def experts_held(self, k: Kernels, h: F32, chosen: I32, y: F32,
                     done: npt.NDArray[np.uint8]) -> None:
        """Run the held experts the layer chose that are not done yet (and the shared
        expert) into y: the first half of ``routed_held``, in as many rounds as the experts
        arrive (``col_layer_experts``)."""
        k.layer_experts(self.address, h, chosen, y, done)

    def combine(self, k: Kernels, x: F32, chosen: I32, weights: F32, y: F32,
                done: npt.NDArray[np.uint8]) -> None:
        """The second half: x += the weighted sum of y (``col_layer_combine``)."""
        k.layer_combine(self.address, x, chosen, weights, y, done)

    def routed_held(self, k: Kernels, x: F32, h: F32, chosen: I32, weights: F32) -> None:
        """x += the chosen experts' weighted outputs (+ the shared expert) in place, over
        the held experts (``col_layer_routed``)."""
        if chosen.shape != (x.shape[0], self.cfg.num_experts_per_tok):
            raise KernelInvalidArgument("layer routed: chosen does not match x")
        k.layer_routed(self.address, x, h, chosen, weights)
