"""The ctypes binding of the accelerated engine's C library (``libcolibri.so``): one prototype
table, one error range, the library bound once.

Every function the engine calls in the library -- the float kernels (``col_*``) and the
quantized ones (``coli_q_*``, ``csrc/quant``) -- is declared once in ``PROTOTYPES``;
:func:`bind` applies the table and refuses a stale build. Every status the library returns
is read by :func:`raise_for` in one range: 0 is success, 1-5 the ``COL_E*`` codes of
``colibri.h``, and ``EQUANT_BASE + c`` the quantized kernels' ``COLI_Q_*`` code ``c``
(``coli_q_*`` functions return ``c`` itself; their callers add the base). Each code is a
named error class, the kernel errors and the quantized-weight errors of ``QUANT_ERRORS``.

The only callers of the bound functions are ``Kernels`` (``kernels.py``: products,
norms, attention, the decoder layers) and ``QuantKernels`` (``quant_kernels.py``: sizes,
checks and standalone products of quantized weights); the rest of the engine calls their
methods, never ``lib``. The CUDA library (``cuda_native.py``) is another shared object,
built only where nvcc exists and loaded only for ``--device cuda``: it has its own table,
applied by the same :func:`apply`, and its own errors (CUDA runtime failures, not kernel
arguments).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_void_p
from functools import cache
from typing import Any

import numpy as np
from colibri.accelerated.native import LibraryNotBuilt, load_library

from colibri.control_plane import rebuild_hint

_P = c_void_p
_Z = c_size_t
_I64 = c_int64

#: name -> (restype, argtypes): every function of libcolibri.so the engine calls.
PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "col_version": (c_char_p, []),
    "col_isa": (c_char_p, []),
    "col_strerror": (c_char_p, [c_int]),
    "col_pool_create": (c_int, [_Z, POINTER(_P)]),
    "col_pool_destroy": (None, [_P]),
    "col_pool_threads": (_Z, [_P]),
    "col_matmul": (c_int, [_P, _P, _Z, _Z, _Z, _P, c_int, _Z, _P, _Z]),
    "col_rms_norm": (c_int, [_P, _Z, _Z, _P, c_double, _P]),
    "col_all_finite": (c_int, [_P, _P, c_int, _Z, POINTER(c_int)]),
    "col_layer_norm": (c_int, [_P, _Z, _Z, _P, _P, c_double, _P]),
    "col_rope": (c_int, [_P, _Z, _Z, _Z, _Z, _Z, _P, _P, c_int]),
    "col_mla_attention": (c_int, [_P, _Z, _Z, _Z, _Z, _Z, _Z, _P, _P, _P, _P, _P, _P, _P, c_int,
                                  c_float, _P]),
    "col_index_scores": (c_int, [_P, _P, _P, _Z, _Z, _P, _Z, c_float, _P]),
    "col_index_select": (c_int, [_P, _Z, _Z, _P]),
    "col_mat_matmul": (c_int, [_P, _P, _P, _Z, _Z, _P, _Z]),
    "col_mats_matmul": (c_int, [_P, _Z, _P, _P, _Z, _Z, _P]),
    "col_moe": (c_int, [_P, _Z, _P, _P, _P, _P, _Z, _Z, _P]),
    "col_route": (c_int, [_P, _Z, _Z, _P, _Z, _Z, _Z, c_int, c_float, _P, _P]),
    "col_layer_size": (_Z, []),
    "col_decoder_layers": (c_int, [_P, _P, _Z, _Z, _Z, _P, _P, _P, _P, _P, _P, _Z, _P, _P, _P,
                                   _P]),
    "col_layer_routed": (c_int, [_P, _P, _Z, _P, _P, _P, _P]),
    "col_layer_experts": (c_int, [_P, _P, _Z, _P, _P, _P, _P]),
    "col_layer_combine": (c_int, [_P, _Z, _P, _P, _P, _P, _P]),
    "coli_q_sizes": (c_int, [c_int, c_int, _I64, _I64, POINTER(_I64), POINTER(_I64)]),
    "coli_q_check": (c_int, [c_int, c_int, _P, _I64, _P, _I64, _I64, _I64]),
    "coli_q_matmul": (c_int, [c_int, c_int, _P, _I64, _P, _I64, _I64, _I64, _P, _I64, _I64, _P,
                              _I64, _I64, _I64, c_int]),
    "coli_q_rotate": (c_int, [_P, _I64, _I64, _I64, _P, _I64]),
    "coli_q_tables": (None, [_P, _P]),
    "coli_q_strerror": (c_char_p, [c_int]),
}

#: colibri.h's COL_EMISSING: col_decoder_layers stopped at a layer that chose an expert it has
#: no descriptor for (not an error: the caller brings the expert in and finishes the layer).
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


class QuantKernelError(ValueError):
    """A quantized kernel refused its arguments (the C return code is ``code``)."""

    code = -1

    def __init__(self, tensor: str, detail: str) -> None:
        super().__init__(f"{tensor}: {detail}")
        self.tensor = tensor


class UnknownFormatError(QuantKernelError):
    code = 1


class ShapeError(QuantKernelError):
    code = 2


class PayloadSizeError(QuantKernelError):
    code = 3


class ScaleCountError(QuantKernelError):
    code = 4


class GroupSizeError(QuantKernelError):
    code = 5


class OutputRangeError(QuantKernelError):
    code = 6


class StrideError(QuantKernelError):
    code = 7


class NullPointerError(QuantKernelError):
    code = 8


class NonFiniteScaleError(QuantKernelError):
    code = 9


class Fp8NanError(QuantKernelError):
    code = 10


class E8TagError(QuantKernelError):
    code = 11


class KernelMemoryError(QuantKernelError):
    code = 12


KERNEL_ERRORS: dict[int, type[KernelError]] = {
    1: KernelInvalidArgument, 2: KernelOutOfMemory, 3: KernelUnsupportedDtype,
    4: KernelThreadError,
}
#: COLI_Q_* code -> its error (the status ``EQUANT_BASE + code`` of the one range).
QUANT_ERRORS: dict[int, type[QuantKernelError]] = {
    cls.code: cls
    for cls in (UnknownFormatError, ShapeError, PayloadSizeError, ScaleCountError,
                GroupSizeError, OutputRangeError, StrideError, NullPointerError,
                NonFiniteScaleError, Fp8NanError, E8TagError, KernelMemoryError)
}


def apply(lib: ctypes.CDLL, table: dict[str, tuple[Any, list[Any]]],
          stale: type[Exception]) -> ctypes.CDLL:
    """Give each function of ``table`` its prototype (a missing symbol is a ``stale``
    build)."""
    for name, (restype, argtypes) in table.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise stale(f"the library lacks {name} (a stale build): {rebuild_hint()}") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def bind(lib: ctypes.CDLL, layer_bytes: int) -> ctypes.CDLL:
    """``PROTOTYPES`` applied to ``lib``, whose ``col_layer`` must be ``layer_bytes`` long
    (the binding's record of it)."""
    apply(lib, PROTOTYPES, LibraryNotBuilt)
    if lib.col_layer_size() != layer_bytes:
        raise LibraryNotBuilt(f"the C library's col_layer is {lib.col_layer_size()} bytes, the "
                              f"binding's {layer_bytes} (a stale build): {rebuild_hint()}")
    return lib


@cache
def library() -> ctypes.CDLL:
    """The variant of the library this CPU runs, bound (``native.load_library``)."""
    from colibri.accelerated.kernels import LAYER_DTYPE

    return bind(load_library(), LAYER_DTYPE.itemsize)


def _text(raw: bytes | None) -> str:
    return raw.decode(errors="replace") if raw else ""


def raise_for(lib: ctypes.CDLL, status: int, what: str) -> None:
    """Nothing for 0; else the status's named error, with the library's message."""
    if status == 0:
        return
    if status >= EQUANT_BASE:
        code = status - EQUANT_BASE
        text = f"{_text(lib.coli_q_strerror(code))} (code {code})"
        raise QUANT_ERRORS.get(code, QuantKernelError)(what, text)
    raise KERNEL_ERRORS.get(status, KernelError)(
        f"{what}: {_text(lib.col_strerror(status))} (code {status})")


def f32_ptr(a: np.ndarray, n: int, what: str) -> int:
    """The address of ``a``'s values, checked: C-contiguous float32, at least ``n`` of them."""
    if a.dtype != np.float32 or not a.flags.c_contiguous or a.size < n:
        raise KernelInvalidArgument(
            f"{what}: need a C-contiguous float32 array of at least {n} values, got "
            f"{a.dtype} {list(a.shape)}"
        )
    return int(a.ctypes.data)
