"""Fused dequantize-and-dot over colibri's quantized expert formats (C, ``csrc/quant/``).

``y = x @ W.T`` with ``W`` left in the bytes and ``.qs`` scales a container stores
(spec/model.md §14): int8-row, int4-row, int4-grouped (any recognised group size),
int3-g64, int2-row, e8-iq3-lattice and fp8-e4m3-b128. The kernels decode one chunk of a
weight row onto the stack and dot it with every activation row, so an expert stays quantized
in memory (memory-mapped from the container) and is read once per batch.

How the accelerated engine uses them (spec §7.2): each projection of a routed expert is a
:class:`QuantMatrix` made once at load by :func:`container_matrix` (``weights.py``,
``quantized_experts``; the e8 all-or-none rule is checked there, by the container's expert
formats), and the MoE kernel (``col_moe``) reads it through its descriptor; a quantized dense
weight is a product operand the same way. Standalone, one product is::

    w = container_matrix(container, name, (rows, cols))   # once: headers and content checked
    y = qmatmul(w, x)    # [n, rows] from x [n, cols]; for e8, x is rotated (Q^T x) inside,
                         # or pass rotate(x) once with x_rotated=True for several products

A thread pool splits one product by output rows: give each worker its own ``o_range`` and
the same ``out`` (and, for e8, an already rotated ``x`` with ``x_rotated=True``, so no worker
repeats the rotation). Each output element has one summation order, fixed in the C source
(``coli_quant.h``), whatever the batch size or split: a row's result is byte-identical alone
or inside any batch, with 1 or N threads (sameness kind (c)). ctypes releases the GIL for
the call.

Sizes are validated in C before anything is read (``coli_q_matmul`` is O(1) in checks); the
content a kernel trusts -- finite scales, no fp8 NaN byte, finite e8 super-scales, the e8
tag -- is scanned once by :func:`quant_matrix` (``coli_q_check``). Every C error code is a
named :class:`QuantKernelError` subclass. The functions are declared, and their codes read,
by the engine's one binding of the library (``binding.py``).
"""

from __future__ import annotations

import ctypes
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import ml_dtypes
import numpy as np
import numpy.typing as npt
from colibri.accelerated.binding import (
    EQUANT_BASE,
    QUANT_ERRORS,
    E8TagError,
    Fp8NanError,
    GroupSizeError,
    KernelMemoryError,
    NonFiniteScaleError,
    NullPointerError,
    OutputRangeError,
    PayloadSizeError,
    QuantKernelError,
    ScaleCountError,
    ShapeError,
    StrideError,
    UnknownFormatError,
    bind,
    library,
    raise_for,
)
from colibri.reference.quant.codec import group_size_from_scales
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.formats import FORMAT_NAMES, Fmt, parse_format

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

#: ``flags`` bit of ``coli_q_matmul``: ``x`` is already ``rotate(x)`` (e8 only).
X_ROTATED = 1

QUANT_FORMATS = (
    Fmt.INT8_ROW,
    Fmt.INT4_ROW,
    Fmt.INT2_ROW,
    Fmt.INT4_GROUPED,
    Fmt.INT3_G64,
    Fmt.E8_IQ3,
    Fmt.FP8_E4M3_B128,
)


#: COLI_Q_* code -> its named error (``binding.QUANT_ERRORS``).
ERRORS = QUANT_ERRORS


@dataclass(frozen=True)
class QuantMatrix:
    """One quantized ``[out_features, in_features]`` weight as the kernels read it.

    ``payload`` is the flat ``uint8`` blob (typically a read-only memory map of the container,
    never copied); ``scales`` the flat float32 ``.qs`` values (copied only when the file
    leaves them unaligned: they are a tiny fraction of the payload).
    """

    name: str
    fmt: Fmt
    group_size: int
    out_features: int
    in_features: int
    payload: U8
    scales: F32

    @property
    def nbytes(self) -> int:
        return int(self.payload.nbytes + self.scales.nbytes)

    @property
    def rotated(self) -> bool:
        """True for e8: its kernel dots with ``rotate(x)``."""
        return self.fmt == Fmt.E8_IQ3


class QuantKernels:
    """The quantized kernels of one loaded library (the chosen variant, or any by path)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        """``lib``: a bound library (``binding.bind``)."""
        self.lib = lib

    @classmethod
    def from_path(cls, path: str | Path) -> QuantKernels:
        from colibri.accelerated.kernels import LAYER_DTYPE

        return cls(bind(ctypes.CDLL(str(path)), LAYER_DTYPE.itemsize))

    def _raise(self, code: int, tensor: str) -> None:
        """A COLI_Q_* code, in the binding's one range."""
        raise_for(self.lib, EQUANT_BASE + code if code else 0, tensor)

    def sizes(self, fmt: Fmt, out_features: int, in_features: int, group_size: int = 0
              ) -> tuple[int, int]:
        """``(payload bytes, .qs float count)`` of an ``[out, in]`` tensor in ``fmt``."""
        nb, ns = ctypes.c_int64(), ctypes.c_int64()
        rc = self.lib.coli_q_sizes(int(fmt), group_size, out_features, in_features,
                                   ctypes.byref(nb), ctypes.byref(ns))
        self._raise(rc, FORMAT_NAMES.get(fmt, str(fmt)))
        return nb.value, ns.value

    def check(self, m: QuantMatrix) -> None:
        rc = self.lib.coli_q_check(int(m.fmt), m.group_size, m.payload.ctypes.data,
                                   m.payload.size, m.scales.ctypes.data, m.scales.size,
                                   m.out_features, m.in_features)
        self._raise(rc, m.name)

    def matmul(
        self,
        m: QuantMatrix,
        x: npt.ArrayLike,
        out: F32 | None = None,
        o_range: tuple[int, int] | None = None,
        x_rotated: bool = False,
    ) -> F32:
        xa = _rows(x)
        rows = xa.shape[0]
        o0, o1 = (0, m.out_features) if o_range is None else (int(o_range[0]), int(o_range[1]))
        if xa.shape[1] != m.in_features:
            raise ShapeError(m.name, f"x has {xa.shape[1]} columns, the matrix {m.in_features}")
        if out is None:
            alloc = np.empty if o_range is None else np.zeros
            y: F32 = alloc((rows, m.out_features), dtype=np.float32)
        else:
            y = out if out.ndim == 2 else out.reshape(1, -1)
            if (
                y.dtype != np.float32
                or y.shape != (rows, m.out_features)
                or y.strides[1] != 4
                or y.strides[0] % 4
                or not y.flags.writeable
                or not y.flags.aligned
            ):
                raise StrideError(
                    m.name,
                    f"out must be a writeable float32 [{rows}, {m.out_features}] array with "
                    f"contiguous rows, got {y.dtype} {y.shape} strides {y.strides}",
                )
        rc = self.lib.coli_q_matmul(
            int(m.fmt), m.group_size, m.payload.ctypes.data, m.payload.size,
            m.scales.ctypes.data, m.scales.size, m.out_features, m.in_features,
            xa.ctypes.data, rows, xa.strides[0] // 4, y.ctypes.data, y.strides[0] // 4,
            o0, o1, X_ROTATED if x_rotated else 0,
        )
        self._raise(rc, m.name)
        if out is not None:
            return out
        return y.reshape(-1) if np.ndim(x) == 1 else y

    def rotate(self, x: npt.ArrayLike) -> F32:
        xa = _rows(x)
        y = np.empty(xa.shape, dtype=np.float32)
        rc = self.lib.coli_q_rotate(xa.ctypes.data, xa.shape[0], xa.strides[0] // 4,
                                    xa.shape[1], y.ctypes.data, xa.shape[1])
        self._raise(rc, "rotate")
        return y.reshape(-1) if np.ndim(x) == 1 else y

    def tables(self) -> tuple[U8, F32]:
        """The iq3xxs grid ``[256, 4]`` and the e4m3 table ``[256]`` compiled into the kernels."""
        grid = np.zeros((256, 4), dtype=np.uint8)
        lut = np.zeros(256, dtype=np.float32)
        self.lib.coli_q_tables(grid.ctypes.data, lut.ctypes.data)
        return grid, lut


def _rows(x: npt.ArrayLike) -> F32:
    """``x`` as float32 rows the C side can walk (copied only when it is not already)."""
    arr = np.asarray(x)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise ShapeError("x", f"activations must be [rows, cols], got shape {arr.shape}")
    if (
        arr.dtype != np.float32
        or arr.strides[1] != 4
        or arr.strides[0] % 4
        or arr.strides[0] < 4 * arr.shape[1]
        or not arr.flags.aligned
    ):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


@cache
def kernels() -> QuantKernels:
    """The kernels of the library variant this CPU runs (``COLIBRI_ISA`` may force one)."""
    return QuantKernels(library())


def quant_matrix(
    fmt: int | str | Fmt,
    payload: npt.ArrayLike,
    scales: npt.ArrayLike,
    shape: Sequence[int],
    *,
    group_size: int | None = None,
    name: str = "tensor",
    check: bool = True,
    lib: QuantKernels | None = None,
) -> QuantMatrix:
    """Wrap stored bytes and scales (as ``reference.quant.quantize`` returns them) for the kernels.

    int4-grouped takes its group size from the scale count when none is given (the finest
    match first, as the container reader does). ``check`` scans the content once.
    """
    f = parse_format(fmt)
    if f not in QUANT_FORMATS:
        raise UnknownFormatError(name, f"{FORMAT_NAMES.get(f, f)} has no quantized kernel")
    rows, cols = (int(d) for d in shape)
    data = np.asarray(payload)
    if data.dtype != np.uint8:
        raise PayloadSizeError(name, f"payload must be uint8 bytes, got {data.dtype}")
    data = data.reshape(-1)
    if not data.flags.c_contiguous:
        data = np.ascontiguousarray(data)
    sc = np.asarray(scales)
    if sc.dtype != np.float32:
        raise ScaleCountError(name, f".qs scales must be float32, got {sc.dtype}")
    sc = sc.reshape(-1)
    if not (sc.flags.c_contiguous and sc.flags.aligned):
        sc = np.array(sc, dtype=np.float32)
    gs = 0
    if f == Fmt.INT4_GROUPED:
        gs = group_size or group_size_from_scales(rows, cols, sc.size)
    m = QuantMatrix(name, f, gs, rows, cols, data, sc)
    k = lib or kernels()
    if check:
        k.check(m)
    return m


def container_matrix(
    container: QuantContainer, name: str, shape: tuple[int, int], *, lib: QuantKernels | None = None
) -> QuantMatrix:
    """A container tensor, resolved and checked as the reference reader does, left quantized."""
    info = container.tensor_format(name, shape)
    if info.fmt == Fmt.F32:
        raise UnknownFormatError(name, "stored as a float tensor, not quantized")
    return container.decode(info, shape, functools.partial(quant_matrix, lib=lib))


def qmatmul(
    m: QuantMatrix,
    x: npt.ArrayLike,
    out: F32 | None = None,
    o_range: tuple[int, int] | None = None,
    x_rotated: bool = False,
) -> F32:
    """``x @ W.T`` for ``x`` of shape ``[rows, in_features]`` (or one row ``[in_features]``).

    Returns ``[rows, out_features]`` float32 (into ``out`` when given). With ``o_range =
    (o0, o1)`` only those output columns are written (the others of a fresh array are 0).
    ``x_rotated``: for e8, ``x`` is already :func:`rotate` of the activations.
    """
    return kernels().matmul(m, x, out=out, o_range=o_range, x_rotated=x_rotated)


def rotate(x: npt.ArrayLike) -> F32:
    """fmt6's activation rotation ``Q^T x`` per row, bit-identical to the reference's."""
    return kernels().rotate(x)


def render_tables_header() -> str:
    """The text of ``csrc/quant/coli_quant_tables.h`` (regenerate the file with it)."""
    text = resources.files("colibri.reference.quant").joinpath("iq3xxs_grid.json").read_text()
    grid = json.loads(text)
    lut = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    lines = [
        "/* Generated by colibri.accelerated.quant_kernels.render_tables_header() from",
        " * reference/quant/iq3xxs_grid.json and ml_dtypes' float8_e4m3fn; a test keeps them"
        " equal. */",
        "#ifndef COLI_QUANT_TABLES_H",
        "#define COLI_QUANT_TABLES_H",
        "#include <math.h>",
        "#include <stdint.h>",
        "",
        "/* iq3xxs grid: 256 rows of 4 doubled magnitudes (4, 12, ..., 52, 62). */",
        "static const uint8_t coli_q_iq3_grid[256][4] = {",
    ]
    for i in range(0, 256, 4):
        cells = " ".join("{" + ", ".join(str(v) for v in grid[j]) + "}," for j in range(i, i + 4))
        lines.append("    " + cells)
    lines += [
        "};",
        "",
        "/* The same grid in weight units (halved), as the e8 decoder multiplies it. */",
        "static const float coli_q_iq3_gridf[256][4] = {",
    ]
    for i in range(0, 256, 4):
        cells = " ".join(
            "{" + ", ".join(f"{v * 0.5!r}f" for v in grid[j]) + "},"
            for j in range(i, i + 4)
        )
        lines.append("    " + cells)
    lines += [
        "};",
        "",
        "/* OCP e4m3fn byte -> float (0x7f and 0xff are NaN; the loader refuses them). */",
        "static const float coli_q_e4m3_lut[256] = {",
    ]
    for i in range(0, 256, 8):
        vals = [lut[j] for j in range(i, i + 8)]
        lines.append(
            "    " + " ".join(("NAN" if np.isnan(v) else float(v).hex() + "f") + "," for v in vals)
        )
    lines += ["};", "", "#endif"]
    return "\n".join(lines) + "\n"


__all__ = [
    "ERRORS",
    "E8TagError",
    "Fp8NanError",
    "GroupSizeError",
    "KernelMemoryError",
    "NonFiniteScaleError",
    "NullPointerError",
    "OutputRangeError",
    "PayloadSizeError",
    "ScaleCountError",
    "ShapeError",
    "StrideError",
    "UnknownFormatError",
    "X_ROTATED",
    "QuantKernelError",
    "QuantKernels",
    "QuantMatrix",
    "container_matrix",
    "kernels",
    "qmatmul",
    "quant_matrix",
    "render_tables_header",
    "rotate",
]
