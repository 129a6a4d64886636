"""The ctypes binding of the C kernels: one prototype table, named errors, zero-copy arrays.

Every exported C function is declared once in ``PROTOTYPES``; ``Kernels`` checks each
array's dtype, contiguity and size before C sees its address (numpy arrays are passed by
pointer, never copied in the hot path), and turns a non-zero C status into a named error.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_void_p
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.accelerated.native import load_library

from colibri.control_plane import rebuild_hint

F32 = npt.NDArray[np.float32]

#: The stored weight dtypes the kernels read directly (colibri.h).
DTYPE_CODES: dict[str, int] = {"F32": 0, "BF16": 1, "F16": 2}
_NUMPY_DTYPES = {0: np.dtype("<f4"), 1: None, 2: np.dtype("<f2")}

#: name -> (restype, argtypes): every function the binding calls.
PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "col_version": (c_char_p, []),
    "col_isa": (c_char_p, []),
    "col_strerror": (c_char_p, [c_int]),
    "col_pool_create": (c_int, [c_size_t, POINTER(c_void_p)]),
    "col_pool_destroy": (None, [c_void_p]),
    "col_pool_threads": (c_size_t, [c_void_p]),
    "col_matmul": (c_int, [c_void_p, c_void_p, c_size_t, c_size_t, c_size_t, c_void_p, c_int,
                           c_size_t, c_void_p, c_size_t]),
    "col_rms_norm": (c_int, [c_void_p, c_size_t, c_size_t, c_void_p, c_double, c_void_p]),
    "col_all_finite": (c_int, [c_void_p, c_void_p, c_int, c_size_t, POINTER(c_int)]),
    "col_layer_norm": (c_int, [c_void_p, c_size_t, c_size_t, c_void_p, c_void_p, c_double,
                               c_void_p]),
    "col_rope": (c_int, [c_void_p, c_size_t, c_size_t, c_size_t, c_size_t, c_size_t, c_void_p,
                         c_void_p, c_int]),
    "col_mla_attention": (c_int, [c_void_p, c_size_t, c_size_t, c_size_t, c_size_t, c_size_t,
                                  c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                  c_void_p, c_void_p, c_int, c_float, c_void_p]),
    "col_index_scores": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_size_t, c_void_p,
                                 c_size_t, c_float, c_void_p]),
    "col_mat_matmul": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_size_t, c_void_p,
                               c_size_t]),
    "col_mats_matmul": (c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_size_t, c_size_t,
                                c_void_p]),
    "col_moe": (c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                        c_size_t, c_void_p]),
    "col_layer_size": (c_size_t, []),
    "col_moe_residual": (c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p,
                                 c_size_t, c_size_t, c_size_t, c_void_p, c_void_p, c_void_p,
                                 c_void_p]),
    "col_route": (c_int, [c_void_p, c_size_t, c_size_t, c_void_p, c_size_t, c_size_t, c_size_t,
                          c_int, c_float, c_void_p, c_void_p]),
    "col_layer_step": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_void_p, c_void_p,
                               c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                               c_void_p, c_void_p]),
    "col_decoder_layers": (c_int, [c_void_p, c_size_t, c_void_p, c_size_t, c_size_t, c_void_p,
                                   c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                                   c_void_p, c_void_p, c_void_p, c_void_p]),
    "col_layer_routed": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_void_p, c_void_p,
                                 c_void_p]),
}

#: colibri.h's ``col_mat``: one expert projection as ``col_moe`` reads it (64 bytes).
MAT_DTYPE = np.dtype([
    ("fmt", "<i4"), ("dtype", "<i4"), ("group_size", "<i4"), ("reserved", "<i4"),
    ("data", "<u8"), ("data_len", "<i8"), ("scales", "<u8"), ("n_scales", "<i8"),
    ("rows", "<u8"), ("cols", "<u8"),
])
#: colibri.h's ``col_layer``: one decoder layer as ``col_attention_block`` reads it.
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
#: colibri.h's COL_EMISSING: col_layer_step stopped before a chosen expert it has no
#: descriptor for (not an error: the caller brings the expert in and finishes the layer).
EMISSING = 5
#: colibri.h's COL_EQUANT_BASE: status = base + a quantized kernel's COLI_Q_* code.
EQUANT_BASE = 100


class KernelError(RuntimeError):
    """A C kernel refused its arguments or failed (the base of the named errors below)."""


class KernelInvalidArgument(KernelError):
    pass


class KernelOutOfMemory(KernelError):
    pass


class KernelUnsupportedDtype(KernelError):
    pass


class KernelThreadError(KernelError):
    pass


_ERRORS: dict[int, type[KernelError]] = {
    1: KernelInvalidArgument, 2: KernelOutOfMemory, 3: KernelUnsupportedDtype,
    4: KernelThreadError,
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Apply the prototype table to ``lib`` (a missing symbol means a stale build)."""
    from colibri.accelerated.native import LibraryNotBuilt

    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryNotBuilt(
                f"the C library lacks {name} (a stale build): {rebuild_hint()}"
            ) from None
        fn.restype = restype
        fn.argtypes = argtypes
    if lib.col_layer_size() != LAYER_DTYPE.itemsize:
        raise LibraryNotBuilt(f"the C library's col_layer is {lib.col_layer_size()} bytes, the "
                              f"binding's {LAYER_DTYPE.itemsize} (a stale build): {rebuild_hint()}")
    return lib


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


def _ptr(a: np.ndarray, n: int, what: str) -> int:
    if a.dtype != np.float32 or not a.flags.c_contiguous or a.size < n:
        raise KernelInvalidArgument(
            f"{what}: need a C-contiguous float32 array of at least {n} values, got "
            f"{a.dtype} {list(a.shape)}"
        )
    return int(a.ctypes.data)


class Kernels:
    """The C library bound to one persistent thread pool."""

    def __init__(self, threads: int, lib: ctypes.CDLL | None = None) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.lib = bind(lib or load_library())
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
        if status >= EQUANT_BASE:
            from colibri.accelerated.quant_kernels import ERRORS, QuantKernelError, kernels

            code = status - EQUANT_BASE
            detail = kernels().lib.coli_q_strerror(code)
            text = detail.decode() if isinstance(detail, bytes) else str(detail)
            raise ERRORS.get(code, QuantKernelError)(what, f"{text} (code {code})")
        if status:
            message: bytes = self.lib.col_strerror(status)
            raise _ERRORS.get(status, KernelError)(f"{what}: {message.decode()} (code {status})")

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
                                                _ptr(x, m * w.cols, "x"), m, w.cols,
                                                _ptr(out, m * w.rows, "out"), w.rows),
                        "col_mat_matmul")
            return out
        self._check(self.lib.col_matmul(self.pool, _ptr(x, m * w.cols, "x"), m, w.cols, w.cols,
                                        w.ptr, w.code, w.rows, _ptr(out, m * w.rows, "out"),
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
                                             _ptr(x, m * products.cols, "x"), m, products.cols,
                                             ptrs.ctypes.data), "col_mats_matmul")
        return outs

    def all_finite(self, raw: np.ndarray, dtype: int) -> bool:
        """Whether the stored weight ``raw`` (C-contiguous, its ``DTYPE_CODES`` code) holds
        only finite values, read on the pool (``csrc/finite.c``)."""
        if not raw.flags.c_contiguous or raw.dtype.itemsize != (
                4 if dtype == DTYPE_CODES["F32"] else 2):
            raise KernelInvalidArgument(f"all_finite: need a C-contiguous array of dtype code "
                                        f"{dtype}, got {raw.dtype} {list(raw.shape)}")
        finite = c_int()
        self._check(self.lib.col_all_finite(self.pool, raw.ctypes.data, dtype, raw.size,
                                            ctypes.byref(finite)), "col_all_finite")
        return bool(finite.value)

    def rms_norm(self, x: F32, w: F32, eps: float) -> F32:
        m, d = x.shape
        out = np.empty_like(x)
        self._check(self.lib.col_rms_norm(_ptr(x, m * d, "x"), m, d, _ptr(w, d, "weight"), eps,
                                          _ptr(out, m * d, "out")), "col_rms_norm")
        return out

    def layer_norm(self, x: F32, w: F32, b: F32, eps: float) -> F32:
        m, d = x.shape
        out = np.empty_like(x)
        self._check(self.lib.col_layer_norm(_ptr(x, m * d, "x"), m, d, _ptr(w, d, "weight"),
                                            _ptr(b, d, "bias"), eps, _ptr(out, m * d, "out")),
                    "col_layer_norm")
        return out

    def rope(self, x: F32, heads: int, row_stride: int, head_stride: int, offset: int, d: int,
             cos: F32, sin: F32, interleaved: bool) -> None:
        """Rotate, in place, ``d`` values at x.flat[offset + r*row_stride + h*head_stride]."""
        m = int(cos.shape[0])
        if m and offset + (m - 1) * row_stride + (heads - 1) * head_stride + d > x.size:
            raise KernelInvalidArgument("rope: the rotated slices run past the array")
        base = _ptr(x, x.size, "x") + 4 * offset
        self._check(self.lib.col_rope(base, m, heads, row_stride, head_stride, d,
                                      _ptr(cos, m * d // 2, "cos"), _ptr(sin, m * d // 2, "sin"),
                                      int(interleaved)), "col_rope")

    def route(self, logits: F32, bias: F32, n_group: int, topk_group: int, top_k: int,
              norm: bool, scale: float) -> tuple[npt.NDArray[np.int32], F32]:
        """noaux_tc over router logits [m, E] (``col_route``): chosen experts [m, top_k]
        ascending and their weights [m, top_k]."""
        m, n_exp = logits.shape
        if bias.shape != (n_exp,):
            raise KernelInvalidArgument("route: the bias does not match the logits")
        chosen = np.empty((m, top_k), np.int32)
        weights = np.empty((m, top_k), np.float32)
        self._check(self.lib.col_route(_ptr(logits, m * n_exp, "logits"), m, n_exp,
                                       _ptr(bias, n_exp, "bias"), n_group, topk_group, top_k,
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
                                     _ptr(x, n_x * d, "x"), n_x, d, out.ctypes.data),
                    "col_moe")
        return out

    def moe_residual(self, x: F32, h: F32, descriptors: np.ndarray,
                     start: npt.NDArray[np.int64], rows: npt.NDArray[np.int64],
                     slot_row: npt.NDArray[np.int64] | None, weights: F32 | None,
                     extra_row: npt.NDArray[np.int64] | None) -> None:
        """``moe`` over h, then, in place, x[r] += sum_s weights[r, s] * y[slot_row[r, s]]
        (slots ascending) + y[extra_row[r]] (colibri.h, ``col_moe_residual``)."""
        m, d = x.shape
        n_exp = start.shape[0] - 1
        k = 0 if slot_row is None else int(slot_row.shape[1])
        arrays = [a for a in (start, rows, slot_row, extra_row) if a is not None]
        if (descriptors.dtype != MAT_DTYPE or descriptors.shape != (3 * n_exp,)
                or not descriptors.flags.c_contiguous or h.shape != x.shape
                or rows.shape[0] != int(start[-1])
                or any(a.dtype != np.int64 or not a.flags.c_contiguous for a in arrays)
                or (slot_row is not None and slot_row.shape != (m, k))
                or (extra_row is not None and extra_row.shape != (m,))
                or (k and (weights is None or weights.shape != (m, k)))):
            raise KernelInvalidArgument("moe_residual: descriptors or row tables are malformed")
        self._check(self.lib.col_moe_residual(
            self.pool, n_exp, descriptors.ctypes.data, start.ctypes.data, rows.ctypes.data,
            _ptr(h, m * d, "h"), m, d, k, 0 if slot_row is None else slot_row.ctypes.data,
            0 if weights is None else _ptr(weights, m * k, "weights"),
            0 if extra_row is None else extra_row.ctypes.data, _ptr(x, m * d, "x")),
            "col_moe_residual")

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
            lat_p[r] = _ptr(latents[r], seen[r] * kvl, "latent cache")
            rk_p[r] = _ptr(rope_keys[r], seen[r] * rope, "rope-key cache")
            keep = keeps[r]
            if keep is not None:
                if keep.dtype != np.int64 or not keep.flags.c_contiguous:
                    raise KernelInvalidArgument("mla_attention: keep must be contiguous int64")
                keep_p[r] = keep.ctypes.data
                n_keep[r] = keep.shape[0]
        out = np.empty((m, heads * vdim), np.float32)
        self._check(self.lib.col_mla_attention(
            self.pool, m, heads, nope, rope, vdim, kvl, _ptr(q, m * heads * (nope + rope), "q"),
            lat_p.ctypes.data, rk_p.ctypes.data, seen_a.ctypes.data, keep_p.ctypes.data,
            n_keep.ctypes.data, kv_b.ptr, kv_b.code, scale, out.ctypes.data),
            "col_mla_attention")
        return out

    def index_scores(self, q: F32, w: F32, keys: F32, scale: float) -> F32:
        nh, hd = q.shape
        s = int(keys.shape[0])
        out = np.empty(s, np.float32)
        self._check(self.lib.col_index_scores(
            self.pool, _ptr(q, nh * hd, "query"), _ptr(w, nh, "head weights"), nh, hd,
            _ptr(keys, s * hd, "index keys"), s, scale, out.ctypes.data), "col_index_scores")
        return out
