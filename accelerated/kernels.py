"""The C kernels bound to a thread pool (``Kernels``), and the weights they read.

``Kernels`` checks each array's dtype, contiguity and size before C sees its address (numpy
arrays are passed by pointer, never copied in the hot path) and turns a non-zero C status
into a named error (``binding.py``: the one prototype table and error range).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import c_int, c_void_p
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.accelerated.binding import (
    EMISSING,
    EQUANT_BASE,
    KernelError,
    KernelInvalidArgument,
    KernelOutOfMemory,
    KernelThreadError,
    KernelUnsupportedDtype,
    bind,
    f32_ptr,
    library,
    raise_for,
)

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

#: The stored weight dtypes the kernels read directly (colibri.h).
DTYPE_CODES: dict[str, int] = {"F32": 0, "BF16": 1, "F16": 2}

#: colibri.h's ``col_mat``: one expert projection as ``col_moe`` reads it (64 bytes).
MAT_DTYPE = np.dtype([
    ("fmt", "<i4"), ("dtype", "<i4"), ("group_size", "<i4"), ("reserved", "<i4"),
    ("data", "<u8"), ("data_len", "<i8"), ("scales", "<u8"), ("n_scales", "<i8"),
    ("rows", "<u8"), ("cols", "<u8"),
])
#: colibri.h's ``col_layer``: one decoder layer as ``col_decoder_layers`` reads it.
LAYER_DTYPE = np.dtype([
    *((name, "<i8") for name in ("d", "heads", "nope", "rope", "vdim", "kvl", "q_lora",
                                 "index_hd", "index_keys", "interleave", "n_router",
                                 "kv_b_dtype", "n_group", "topk_group", "top_k", "norm_topk")),
    ("rms_eps", "<f8"), ("latent_eps", "<f8"), ("index_eps", "<f8"),
    ("attn_scale", "<f4"), ("routed_scale", "<f4"),
    *((name, "<u8") for name in ("input_norm", "post_norm", "q_a_norm", "kv_a_norm",
                                 "ik_norm_w", "ik_norm_b", "kv_b", "router_bias", "experts",
                                 "shared", "dense")),
    *((name, MAT_DTYPE) for name in ("q_first", "q_b", "kv_a", "wk", "o", "router")),
])
class Weight:
    """A 2-D weight [rows, cols] in its stored dtype (a memory-mapped view, never copied)."""

    __slots__ = ("array", "code", "rows", "cols", "ptr")

    def __init__(self, array: np.ndarray, code: int) -> None:
        if array.ndim != 2 or not array.flags.c_contiguous:
            raise KernelInvalidArgument("a weight must be a C-contiguous 2-D array")
        want_size = 4 if code == 0 else 2
        if array.dtype.itemsize != want_size:
            raise KernelUnsupportedDtype(f"weight dtype {array.dtype} does not match code {code}")
        self.array = array
        self.code = code
        self.rows, self.cols = int(array.shape[0]), int(array.shape[1])
        self.ptr = int(array.ctypes.data)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


class QuantWeight:
    """A dense weight left quantized (a ``QuantMatrix`` of the container's mapped bytes) with
    its ``col_mat`` descriptor; ``Kernels.matmul`` reads it with the fused kernels."""

    __slots__ = ("matrix", "desc", "rows", "cols")

    def __init__(self, matrix: Any) -> None:
        self.matrix = matrix
        self.desc = mat_descriptors([matrix])
        self.rows, self.cols = int(matrix.out_features), int(matrix.in_features)

    @property
    def nbytes(self) -> int:
        return int(self.matrix.nbytes)


class Products:
    """Weights of one width that read the same input, with their ``col_mat`` table (built
    once): ``Kernels.matmul_many`` runs them in one call."""

    __slots__ = ("weights", "desc", "rows", "cols")

    def __init__(self, weights: Sequence[Weight | QuantWeight]) -> None:
        if not weights or len({w.cols for w in weights}) != 1 or len(weights) > 64:
            raise KernelInvalidArgument("products: 1 to 64 weights of one width")
        self.weights = tuple(weights)
        self.desc = mat_descriptors(self.weights)
        self.rows = [w.rows for w in self.weights]
        self.cols = self.weights[0].cols


def mat_descriptors(mats: Sequence[Any]) -> np.ndarray:
    """``col_mat`` records of float ``Weight``s and ``QuantMatrix``es (by pointer: the caller
    keeps the arrays alive while the records are used)."""
    from colibri.accelerated.quant_kernels import QuantMatrix

    out = np.zeros(len(mats), MAT_DTYPE)
    for i, w in enumerate(mats):
        if isinstance(w, QuantWeight):
            w = w.matrix
        if isinstance(w, QuantMatrix):
            out[i] = (int(w.fmt), 0, w.group_size, 0, w.payload.ctypes.data, w.payload.size,
                      w.scales.ctypes.data, w.scales.size, w.out_features, w.in_features)
        elif isinstance(w, Weight):
            out[i] = (0, w.code, 0, 0, w.ptr, w.nbytes, 0, 0, w.rows, w.cols)
        else:
            raise KernelInvalidArgument(f"not an expert weight: {type(w).__name__}")
    return out


class Kernels:
    """The C library bound to one persistent thread pool."""

    def __init__(self, threads: int, lib: ctypes.CDLL | None = None) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.lib = library() if lib is None else bind(lib, LAYER_DTYPE.itemsize)
        pool = c_void_p()
        self._check(self.lib.col_pool_create(threads, ctypes.byref(pool)), "col_pool_create")
        self.pool = pool.value
        self.threads = threads

    def close(self) -> None:
        if self.pool:
            self.lib.col_pool_destroy(self.pool)
            self.pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    @property
    def isa(self) -> str:
        out: bytes = self.lib.col_isa()
        return out.decode()

    def _check(self, status: int, what: str) -> None:
        raise_for(self.lib, status, what)

    # --- products -------------------------------------------------------------------------

    def matmul(self, x: F32, w: Weight | QuantWeight, out: F32 | None = None) -> F32:
        """x [M, K] @ w.T -> [M, rows]; row r's bytes depend only on x[r] and w."""
        m = int(x.shape[0])
        if x.ndim != 2 or x.shape[1] != w.cols:
            raise KernelInvalidArgument(f"matmul: x {list(x.shape)} against weight "
                                        f"[{w.rows}, {w.cols}]")
        if out is None:
            out = np.empty((m, w.rows), np.float32)
        if isinstance(w, QuantWeight):
            self._check(self.lib.col_mat_matmul(self.pool, w.desc.ctypes.data,
                                                f32_ptr(x, m * w.cols, "x"), m, w.cols,
                                                f32_ptr(out, m * w.rows, "out"), w.rows),
                        "col_mat_matmul")
            return out
        self._check(self.lib.col_matmul(self.pool, f32_ptr(x, m * w.cols, "x"), m, w.cols, w.cols,
                                        w.ptr, w.code, w.rows, f32_ptr(out, m * w.rows, "out"),
                                        w.rows), "col_matmul")
        return out

    def matmul_many(self, x: F32, products: Products) -> list[F32]:
        """``[matmul(x, w) for w in products.weights]`` in one C call and one pool run (the
        same bytes: each element is computed as ``matmul`` computes it)."""
        m = int(x.shape[0])
        if x.ndim != 2 or x.shape[1] != products.cols:
            raise KernelInvalidArgument(f"matmul_many: x {list(x.shape)} against weights of "
                                        f"width {products.cols}")
        outs = [np.empty((m, rows), np.float32) for rows in products.rows]
        ptrs = np.array([o.ctypes.data for o in outs], np.uint64)
        self._check(self.lib.col_mats_matmul(self.pool, len(outs), products.desc.ctypes.data,
                                             f32_ptr(x, m * products.cols, "x"), m, products.cols,
                                             ptrs.ctypes.data), "col_mats_matmul")
        return outs

    def all_finite(self, raw: np.ndarray, dtype: int, inline: bool = False) -> bool:
        """Whether the stored weight ``raw`` (C-contiguous, its ``DTYPE_CODES`` code) holds
        only finite values, read on the pool (``csrc/finite.c``); ``inline``: on the calling
        thread alone (a thread other than the one driving the pool)."""
        if not raw.flags.c_contiguous or raw.dtype.itemsize != (
                4 if dtype == DTYPE_CODES["F32"] else 2):
            raise KernelInvalidArgument(f"all_finite: need a C-contiguous array of dtype code "
                                        f"{dtype}, got {raw.dtype} {list(raw.shape)}")
        finite = c_int()
        self._check(self.lib.col_all_finite(None if inline else self.pool, raw.ctypes.data,
                                            dtype, raw.size, ctypes.byref(finite)),
                    "col_all_finite")
        return bool(finite.value)

    def rms_norm(self, x: F32, w: F32, eps: float) -> F32:
        m, d = x.shape
        out = np.empty_like(x)
        self._check(self.lib.col_rms_norm(f32_ptr(x, m * d, "x"), m, d, f32_ptr(w, d, "weight"),
                                          eps, f32_ptr(out, m * d, "out")), "col_rms_norm")
        return out

    def layer_norm(self, x: F32, w: F32, b: F32, eps: float) -> F32:
        m, d = x.shape
        out = np.empty_like(x)
        self._check(self.lib.col_layer_norm(
            f32_ptr(x, m * d, "x"), m, d, f32_ptr(w, d, "weight"), f32_ptr(b, d, "bias"), eps,
            f32_ptr(out, m * d, "out")), "col_layer_norm")
        return out

    def rope(self, x: F32, heads: int, row_stride: int, head_stride: int, offset: int, d: int,
             cos: F32, sin: F32, interleaved: bool) -> None:
        """Rotate, in place, ``d`` values at x.flat[offset + r*row_stride + h*head_stride]."""
        m = int(cos.shape[0])
        if m and offset + (m - 1) * row_stride + (heads - 1) * head_stride + d > x.size:
            raise KernelInvalidArgument("rope: the rotated slices run past the array")
        base = f32_ptr(x, x.size, "x") + 4 * offset
        self._check(self.lib.col_rope(base, m, heads, row_stride, head_stride, d,
                                      f32_ptr(cos, m * d // 2, "cos"),
                                      f32_ptr(sin, m * d // 2, "sin"), int(interleaved)),
                    "col_rope")

    def route(self, logits: F32, bias: F32, n_group: int, topk_group: int, top_k: int,
              norm: bool, scale: float) -> tuple[npt.NDArray[np.int32], F32]:
        """noaux_tc over router logits [m, E] (``col_route``): chosen experts [m, top_k]
        ascending and their weights [m, top_k]."""
        m, n_exp = logits.shape
        if bias.shape != (n_exp,):
            raise KernelInvalidArgument("route: the bias does not match the logits")
        chosen = np.empty((m, top_k), np.int32)
        weights = np.empty((m, top_k), np.float32)
        self._check(self.lib.col_route(f32_ptr(logits, m * n_exp, "logits"), m, n_exp,
                                       f32_ptr(bias, n_exp, "bias"), n_group, topk_group, top_k,
                                       int(norm), scale, chosen.ctypes.data,
                                       weights.ctypes.data), "col_route")
        return chosen, weights

    def moe(self, x: F32, descriptors: np.ndarray, start: npt.NDArray[np.int64],
            rows: npt.NDArray[np.int64]) -> F32:
        """SwiGLU MLPs of one layer in one call: expert e (descriptors[3e:3e+3]) applied to
        x[rows[start[e]:start[e+1]]] -> out[start[e]:start[e+1]] ([start[-1], D])."""
        n_x, d = x.shape
        n_exp = start.shape[0] - 1
        if (descriptors.dtype != MAT_DTYPE or descriptors.shape != (3 * n_exp,)
                or not descriptors.flags.c_contiguous or start.dtype != np.int64
                or rows.dtype != np.int64 or rows.shape[0] != int(start[-1])
                or not start.flags.c_contiguous or not rows.flags.c_contiguous):
            raise KernelInvalidArgument("moe: descriptors, start or rows are malformed")
        out = np.empty((int(start[-1]), d), np.float32)
        self._check(self.lib.col_moe(self.pool, n_exp, descriptors.ctypes.data,
                                     start.ctypes.data, rows.ctypes.data,
                                     f32_ptr(x, n_x * d, "x"), n_x, d, out.ctypes.data),
                    "col_moe")
        return out

    # --- attention ------------------------------------------------------------------------

    def mla_attention(self, q: F32, heads: int, nope: int, rope: int, vdim: int, kvl: int,
                      latents: Sequence[F32], rope_keys: Sequence[F32], seen: Sequence[int],
                      keeps: Sequence[npt.NDArray[np.int64] | None], kv_b: Weight,
                      scale: float) -> F32:
        m = len(seen)
        if kv_b.rows != heads * (nope + vdim) or kv_b.cols != kvl:
            raise KernelInvalidArgument("mla_attention: kv_b has the wrong shape")
        lat_p = np.empty(m, np.uint64)
        rk_p = np.empty(m, np.uint64)
        keep_p = np.zeros(m, np.uint64)
        n_keep = np.zeros(m, np.uint64)
        seen_a = np.asarray(seen, np.uint64)
        for r in range(m):
            lat_p[r] = f32_ptr(latents[r], seen[r] * kvl, "latent cache")
            rk_p[r] = f32_ptr(rope_keys[r], seen[r] * rope, "rope-key cache")
            keep = keeps[r]
            if keep is not None:
                if keep.dtype != np.int64 or not keep.flags.c_contiguous:
                    raise KernelInvalidArgument("mla_attention: keep must be contiguous int64")
                keep_p[r] = keep.ctypes.data
                n_keep[r] = keep.shape[0]
        out = np.empty((m, heads * vdim), np.float32)
        self._check(self.lib.col_mla_attention(
            self.pool, m, heads, nope, rope, vdim, kvl, f32_ptr(q, m * heads * (nope + rope), "q"),
            lat_p.ctypes.data, rk_p.ctypes.data, seen_a.ctypes.data, keep_p.ctypes.data,
            n_keep.ctypes.data, kv_b.ptr, kv_b.code, scale, out.ctypes.data),
            "col_mla_attention")
        return out

    def index_scores(self, q: F32, w: F32, keys: F32, scale: float) -> F32:
        nh, hd = q.shape
        s = int(keys.shape[0])
        out = np.empty(s, np.float32)
        self._check(self.lib.col_index_scores(
            self.pool, f32_ptr(q, nh * hd, "query"), f32_ptr(w, nh, "head weights"), nh, hd,
            f32_ptr(keys, s * hd, "index keys"), s, scale, out.ctypes.data), "col_index_scores")
        return out

    def index_select(self, scores: F32, topk: int) -> I64:
        """The DSA top-k of one query's scores (``col_index_select``): the positions of the
        ``topk`` best, ties to the earlier position, ascending."""
        s = int(scores.shape[0])
        keep = np.empty(topk, np.int64)
        self._check(self.lib.col_index_select(f32_ptr(scores, s, "scores"), s, topk,
                                              keep.ctypes.data), "col_index_select")
        return keep

    # --- decoder layers ---------------------------------------------------------------------

    def decoder_layers(self, records: U64, first: int, end: int, x: F32, h: F32, cos: F32,
                       sin: F32, caches: U64, slots: U64, chosen: I32, weights: F32,
                       seconds: npt.NDArray[np.float64]) -> int | None:
        """Layers [first, end) of ``records`` (``col_layer`` addresses) over x [m, d] in place
        (``col_decoder_layers``; h an [m, d] scratch, caches [layers, 3, m] the rows' cache
        addresses, chosen/weights [layers, m, top_k], seconds [2] accumulated). None when
        every layer ran; else the layer that chose an expert without a descriptor: x holds
        its attention residual and h its post-norm input (``layer_routed`` finishes it)."""
        m, d = x.shape
        n = records.shape[0]
        top_k = int(chosen.shape[2])
        if (not 0 <= first <= end <= n or h.shape != x.shape or caches.shape != (n, 3, m)
                or slots.shape != (m,) or chosen.shape != (n, m, top_k)
                or weights.shape != chosen.shape or seconds.shape != (2,)
                or any(a.dtype != t or not a.flags.c_contiguous for a, t in (
                    (records, np.uint64), (caches, np.uint64), (slots, np.uint64),
                    (chosen, np.int32), (weights, np.float32), (seconds, np.float64)))):
            raise KernelInvalidArgument("decoder layers: the tables do not match x")
        stopped = ctypes.c_size_t()
        status = self.lib.col_decoder_layers(
            self.pool, records.ctypes.data, first, end, m, f32_ptr(x, m * d, "x"),
            f32_ptr(h, m * d, "h"), f32_ptr(cos, cos.size, "cos"),
            f32_ptr(sin, sin.size, "sin"), caches.ctypes.data, slots.ctypes.data, top_k,
            chosen.ctypes.data, weights.ctypes.data, seconds.ctypes.data,
            ctypes.byref(stopped))
        if status == EMISSING:
            return int(stopped.value)
        self._check(status, "col_decoder_layers")
        return None

    def layer_experts(self, record: int, h: F32, chosen: I32, y: F32,
                      done: npt.NDArray[np.uint8]) -> None:
        """Into y, the outputs of the chosen experts of ``record`` that have descriptors and
        are not ``done`` yet (and of the shared expert), marking them done
        (``col_layer_experts``; ``layer_combine`` finishes the layer)."""
        m, d = h.shape
        if (chosen.ndim != 2 or chosen.shape[0] != m or chosen.dtype != np.int32
                or not chosen.flags.c_contiguous or done.dtype != np.uint8
                or not done.flags.c_contiguous or y.shape != ((chosen.shape[1] + 1) * m, d)):
            raise KernelInvalidArgument("layer experts: chosen, y or done do not match h")
        self._check(self.lib.col_layer_experts(
            self.pool, record, m, f32_ptr(h, m * d, "h"), chosen.ctypes.data,
            f32_ptr(y, y.size, "y"), done.ctypes.data), "col_layer_experts")

    def layer_combine(self, record: int, x: F32, chosen: I32, weights: F32, y: F32,
                      done: npt.NDArray[np.uint8]) -> None:
        """x += the weighted sum of the experts' outputs in y (+ the shared expert's), once
        every chosen expert is done (``col_layer_combine``)."""
        m, d = x.shape
        if (chosen.ndim != 2 or chosen.shape[0] != m or chosen.dtype != np.int32
                or not chosen.flags.c_contiguous or done.dtype != np.uint8
                or y.shape != ((chosen.shape[1] + 1) * m, d)):
            raise KernelInvalidArgument("layer combine: chosen, y or done do not match x")
        self._check(self.lib.col_layer_combine(
            record, m, chosen.ctypes.data, f32_ptr(weights, chosen.size, "weights"),
            f32_ptr(y, y.size, "y"), done.ctypes.data, f32_ptr(x, m * d, "x")),
            "col_layer_combine")

    def layer_routed(self, record: int, x: F32, h: F32, chosen: I32, weights: F32) -> None:
        """x += the chosen experts' weighted outputs (+ the shared expert) over h, in place,
        from the expert table of ``record`` (``col_layer_routed``)."""
        m, d = x.shape
        if (h.shape != x.shape or chosen.ndim != 2 or chosen.shape[0] != m
                or chosen.dtype != np.int32 or not chosen.flags.c_contiguous):
            raise KernelInvalidArgument("layer routed: chosen does not match x")
        self._check(self.lib.col_layer_routed(
            self.pool, record, m, f32_ptr(h, m * d, "h"), chosen.ctypes.data,
            f32_ptr(weights, chosen.size, "weights"), f32_ptr(x, m * d, "x")),
            "col_layer_routed")


__all__ = [
    "DTYPE_CODES",
    "EQUANT_BASE",
    "F32",
    "LAYER_DTYPE",
    "MAT_DTYPE",
    "KernelError",
    "KernelInvalidArgument",
    "KernelOutOfMemory",
    "KernelThreadError",
    "KernelUnsupportedDtype",
    "Kernels",
    "Products",
    "QuantWeight",
    "Weight",
    "mat_descriptors",
]
