"""The ctypes binding of the CUDA kernel library (``build/accelerated/cuda/libcolibri_cuda.so``,
built by ``cuda_build`` where nvcc exists): one prototype table, named errors.

It has the shape of the C library's binding (``binding.py``: a table applied by the same
``apply``, statuses read in one place, ``CudaDevice._check``) but stays apart: it is another
shared object, absent where nvcc is, loaded only for ``--device cuda``, and its failures are
the CUDA runtime's (a quantized weight's refusal keeps its ``COLI_Q_*`` code,
``CudaQuantRefused``).

Opening a device names the cause when it cannot (:func:`open_device`): the library not built
(no nvcc where ``make build`` ran), no NVIDIA driver, no CUDA device, a driver too old for the
runtime the library links statically -- each a :class:`CudaUnavailable` subclass whose text
the engine reports as its startup error. Failures of a call are :class:`CudaError` subclasses
carrying the runtime's message.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int64,
    c_size_t,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.accelerated.binding import apply
from colibri.accelerated.cuda_build import library_path

from colibri.control_plane import rebuild_hint

F32 = npt.NDArray[np.float32]

#: flags of the products: x already rotated (e8); the generic CPU build's two roundings.
X_ROTATED = 1
TWO_ROUNDINGS = 2
#: ccu_api.h: status = EQUANT_BASE + a COLI_Q_* code (the values of coli_quant.h).
EQUANT_BASE = 100
#: The CUDA runtime's codes the startup error names.
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100

_P = c_void_p
PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "ccu_version": (c_char_p, []),
    "ccu_last_cuda_error": (c_int, []),
    "ccu_last_error": (c_char_p, []),
    "ccu_error_name": (c_char_p, [c_int]),
    "ccu_init": (c_int, [c_int]),
    "ccu_device_count": (c_int, [POINTER(c_int)]),
    "ccu_device_info": (c_int, [c_int, c_char_p, c_size_t, POINTER(c_uint64), POINTER(c_int),
                                POINTER(c_int), POINTER(c_int)]),
    "ccu_mem_info": (c_int, [POINTER(c_uint64), POINTER(c_uint64)]),
    "ccu_synchronize": (c_int, []),
    "ccu_alloc": (c_int, [c_size_t, POINTER(c_void_p)]),
    "ccu_free": (c_int, [_P]),
    "ccu_to_device": (c_int, [_P, _P, c_size_t]),
    "ccu_to_host": (c_int, [_P, _P, c_size_t]),
    "ccu_upload_float": (c_int, [_P, c_int, c_int64, c_int64, POINTER(c_void_p)]),
    "ccu_upload_quant": (c_int, [c_int, c_int, _P, c_int64, _P, c_int64, c_int64, c_int64,
                                 POINTER(c_void_p)]),
    "ccu_weight_free": (c_int, [_P]),
    "ccu_weight_bytes": (c_int64, [_P]),
    "ccu_weight_shape": (c_int, [_P, POINTER(c_int64), POINTER(c_int64)]),
    "ccu_matmul": (c_int, [_P, _P, c_int64, c_int64, _P, c_int64, c_int]),
    "ccu_matmul_host": (c_int, [_P, _P, c_int64, _P, c_int]),
    "ccu_matmul_many_host": (c_int, [c_int, _P, _P, c_int64, _P, c_int]),
    "ccu_rotate": (c_int, [_P, c_int64, c_int64]),
    "ccu_rms_norm": (c_int, [_P, c_int64, c_int64, _P, c_double, _P]),
    "ccu_rope": (c_int, [_P, c_int64, c_int64, c_int64, c_int64, c_int64, _P, _P, c_int]),
    "ccu_silu_mul": (c_int, [_P, _P, c_int64, _P]),
    "ccu_expert_sum": (c_int, [_P, c_int64, c_int64, c_int64, _P, _P, _P, _P, _P]),
    "ccu_expert_mlp": (c_int, [_P, _P, _P, _P, c_int64, _P, c_int]),
    "ccu_expert_mlp_host": (c_int, [_P, _P, _P, _P, c_int64, _P, c_int]),
    "ccu_mla_attention": (c_int, [_P, c_int64, c_int64, c_int64, c_int64, c_int64, _P, _P,
                                  c_int64, _P, c_int64, _P, c_float, _P, c_int]),
    "ccu_index_scores": (c_int, [_P, _P, c_int64, c_int64, _P, c_int64, c_float, _P, c_int]),
}


class CudaUnavailable(RuntimeError):
    """No CUDA device can be opened; the text names the cause."""


class CudaNotBuilt(CudaUnavailable):
    pass


class CudaDriverMissing(CudaUnavailable):
    pass


class CudaNoDevice(CudaUnavailable):
    pass


class CudaDriverTooOld(CudaUnavailable):
    pass


class CudaError(RuntimeError):
    """A call into the CUDA library failed (base of the named errors below)."""


class CudaInvalidArgument(CudaError):
    pass


class CudaOutOfMemory(CudaError):
    pass


class CudaUnsupportedDtype(CudaError):
    pass


class CudaRuntimeError(CudaError):
    pass


class CudaQuantRefused(CudaError):
    """A quantized weight failed the size or content rules; ``code`` is its COLI_Q_* code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


_ERRORS: dict[int, type[CudaError]] = {1: CudaInvalidArgument, 2: CudaOutOfMemory,
                                       3: CudaUnsupportedDtype, 4: CudaRuntimeError}


def not_built(path: Path) -> str:
    """Why the CUDA library at ``path`` is absent, and what builds it."""
    hint = rebuild_hint("run make build on a machine with the CUDA toolkit")
    return f"built without nvcc: {hint} ({path} is missing)"


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    return apply(lib, PROTOTYPES, CudaNotBuilt)


@cache
def load_library() -> ctypes.CDLL:
    path = library_path()
    if not path.is_file():
        raise CudaNotBuilt(not_built(path))
    try:
        return bind(ctypes.CDLL(str(path)))
    except OSError as exc:
        raise CudaNotBuilt(f"{path} does not load: {exc}; {rebuild_hint()}") from exc


def driver_present() -> bool:
    """Whether the NVIDIA driver's user-space library loads in this process."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _text(raw: bytes | None) -> str:
    return raw.decode(errors="replace") if raw else ""


def unavailable(lib: ctypes.CDLL, code: int) -> CudaUnavailable:
    """The startup error of a failed ccu_init, naming its cause."""
    name = _text(lib.ccu_error_name(code))
    if code == CUDA_ERROR_INSUFFICIENT_DRIVER and not driver_present():
        return CudaDriverMissing("no NVIDIA driver (libcuda.so.1 not found)")
    if code == CUDA_ERROR_INSUFFICIENT_DRIVER:
        return CudaDriverTooOld(f"the NVIDIA driver is older than the CUDA runtime of this build "
                                f"({name}); update the driver")
    if code == CUDA_ERROR_NO_DEVICE:
        return CudaNoDevice(f"no CUDA device ({name})")
    return CudaUnavailable(f"the CUDA device cannot be opened: {_text(lib.ccu_last_error())}")


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    total_bytes: int
    major: int
    minor: int
    multiprocessors: int


class GpuWeight:
    """A weight in device memory (freed by :meth:`CudaDevice.free` or at close)."""

    __slots__ = ("handle", "rows", "cols", "nbytes", "quantized")

    def __init__(self, handle: int, rows: int, cols: int, nbytes: int, quantized: bool) -> None:
        self.handle, self.rows, self.cols = handle, rows, cols
        self.nbytes, self.quantized = nbytes, quantized


def _f32(a: np.ndarray, what: str) -> F32:
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise CudaInvalidArgument(f"{what}: need a C-contiguous float32 array, got {a.dtype}")
    return a


class CudaDevice:
    """One opened CUDA device and the weights uploaded to it."""

    def __init__(self, index: int = 0, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib or load_library()
        code = int(self.lib.ccu_init(index))
        if code:
            raise unavailable(self.lib, code)
        self.index = index
        self._weights: dict[int, GpuWeight] = {}
        self._info: DeviceInfo | None = None

    def _check(self, status: int, what: str) -> None:
        if status == 0:
            return
        message = f"{what}: {_text(self.lib.ccu_last_error())}"
        if status >= EQUANT_BASE:
            raise CudaQuantRefused(f"{message} (quantized rule {status - EQUANT_BASE})",
                                   status - EQUANT_BASE)
        raise _ERRORS.get(status, CudaError)(f"{message} (code {status})")

    # --- the device ---------------------------------------------------------------------

    def info(self) -> DeviceInfo:
        """The device's properties (read once: they do not change while it is open)."""
        if self._info is None:
            self._info = self._read_info()
        return self._info

    def _read_info(self) -> DeviceInfo:
        name = ctypes.create_string_buffer(256)
        total, major, minor, sms = c_uint64(), c_int(), c_int(), c_int()
        code = self.lib.ccu_device_info(self.index, name, 256, ctypes.byref(total),
                                        ctypes.byref(major), ctypes.byref(minor),
                                        ctypes.byref(sms))
        if code:
            raise CudaRuntimeError(_text(self.lib.ccu_last_error()))
        return DeviceInfo(self.index, _text(name.value), total.value, major.value, minor.value,
                          sms.value)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        free, total = c_uint64(), c_uint64()
        if self.lib.ccu_mem_info(ctypes.byref(free), ctypes.byref(total)):
            raise CudaRuntimeError(_text(self.lib.ccu_last_error()))
        return free.value, total.value

    @property
    def used_bytes(self) -> int:
        return sum(w.nbytes for w in self._weights.values())

    # --- weights ------------------------------------------------------------------------

    def upload_float(self, array: np.ndarray, dtype_code: int) -> GpuWeight:
        """A float weight [rows, cols] in its stored dtype (0 f32, 1 bf16, 2 f16)."""
        if array.ndim != 2 or not array.flags.c_contiguous:
            raise CudaInvalidArgument("a weight must be a C-contiguous 2-D array")
        if array.dtype.itemsize != (4 if dtype_code == 0 else 2):
            raise CudaUnsupportedDtype(f"weight dtype {array.dtype} does not match code "
                                       f"{dtype_code}")
        handle = c_void_p()
        rows, cols = int(array.shape[0]), int(array.shape[1])
        self._check(self.lib.ccu_upload_float(array.ctypes.data, dtype_code, rows, cols,
                                              ctypes.byref(handle)), "ccu_upload_float")
        return self._keep(handle, rows, cols, False)

    def upload_quant(self, fmt: int, group_size: int, payload: npt.NDArray[np.uint8],
                     scales: F32, rows: int, cols: int) -> GpuWeight:
        if payload.dtype != np.uint8 or not payload.flags.c_contiguous:
            raise CudaInvalidArgument("payload: need C-contiguous uint8")
        _f32(scales, "scales")
        handle = c_void_p()
        self._check(self.lib.ccu_upload_quant(fmt, group_size, payload.ctypes.data, payload.size,
                                              scales.ctypes.data, scales.size, rows, cols,
                                              ctypes.byref(handle)), "ccu_upload_quant")
        return self._keep(handle, rows, cols, True)

    def _keep(self, handle: c_void_p, rows: int, cols: int, quantized: bool) -> GpuWeight:
        assert handle.value is not None
        w = GpuWeight(handle.value, rows, cols, int(self.lib.ccu_weight_bytes(handle.value)),
                      quantized)
        self._weights[w.handle] = w
        return w

    def free(self, w: GpuWeight) -> None:
        if self._weights.pop(w.handle, None) is not None:
            self._check(self.lib.ccu_weight_free(w.handle), "ccu_weight_free")

    def close(self) -> None:
        for w in list(self._weights.values()):
            self.free(w)

    # --- compute (host arrays in and out) ---------------------------------------------------

    def matmul(self, x: F32, w: GpuWeight, flags: int = 0) -> F32:
        """x [m, cols] @ w.T -> [m, rows]."""
        _f32(x, "x")
        if x.ndim != 2 or x.shape[1] != w.cols:
            raise CudaInvalidArgument(f"matmul: x {list(x.shape)} against [{w.rows}, {w.cols}]")
        out = np.empty((x.shape[0], w.rows), np.float32)
        self._check(self.lib.ccu_matmul_host(w.handle, x.ctypes.data, x.shape[0],
                                             out.ctypes.data, flags), "ccu_matmul")
        return out

    def matmul_many(self, x: F32, weights: list[GpuWeight], flags: int = 0) -> list[F32]:
        """``[matmul(x, w) for w in weights]`` (weights of one width), x copied once."""
        _f32(x, "x")
        if not weights or x.ndim != 2 or any(w.cols != x.shape[1] for w in weights):
            raise CudaInvalidArgument(f"matmul_many: x {list(x.shape)} against weights of "
                                      f"widths {[w.cols for w in weights]}")
        outs = [np.empty((x.shape[0], w.rows), np.float32) for w in weights]
        handles = np.array([w.handle for w in weights], np.uint64)
        ptrs = np.array([o.ctypes.data for o in outs], np.uint64)
        self._check(self.lib.ccu_matmul_many_host(len(weights), handles.ctypes.data,
                                                  x.ctypes.data, x.shape[0], ptrs.ctypes.data,
                                                  flags), "ccu_matmul_many_host")
        return outs

    def expert_mlp(self, gate: GpuWeight, up: GpuWeight, down: GpuWeight, x: F32,
                   flags: int = 0) -> F32:
        _f32(x, "x")
        if x.ndim != 2 or x.shape[1] != gate.cols:
            raise CudaInvalidArgument(f"expert_mlp: x {list(x.shape)} against width {gate.cols}")
        out = np.empty((x.shape[0], down.rows), np.float32)
        self._check(self.lib.ccu_expert_mlp_host(gate.handle, up.handle, down.handle,
                                                 x.ctypes.data, x.shape[0], out.ctypes.data,
                                                 flags), "ccu_expert_mlp")
        return out

    def on_device(self, call: str, arrays: list[np.ndarray], *args: Any) -> None:
        """``ccu_<call>(*args)`` over device copies of ``arrays``: each ``None`` in ``args`` is,
        in order, the device buffer of the next array; every array is copied in before the
        call and back after it (so in-place kernels and outputs both land in the host
        arrays). The GPU tests drive the elementwise and attention kernels through this."""
        buffers: list[int] = []
        try:
            for a in arrays:
                if not a.flags.c_contiguous:
                    raise CudaInvalidArgument(f"ccu_{call}: arrays must be C-contiguous")
                ptr = c_void_p()
                self._check(self.lib.ccu_alloc(max(a.nbytes, 1), ctypes.byref(ptr)), "ccu_alloc")
                assert ptr.value is not None
                buffers.append(ptr.value)
                self._check(self.lib.ccu_to_device(ptr.value, a.ctypes.data, a.nbytes),
                            "ccu_to_device")
            it = iter(buffers)
            self._check(getattr(self.lib, f"ccu_{call}")(*(next(it) if a is None else a
                                                            for a in args)), f"ccu_{call}")
            for a, ptr_value in zip(arrays, buffers, strict=True):
                self._check(self.lib.ccu_to_host(a.ctypes.data, ptr_value, a.nbytes),
                            "ccu_to_host")
        finally:
            for b in buffers:
                self.lib.ccu_free(b)


def open_device(index: int = 0) -> CudaDevice:
    """The device, or a :class:`CudaUnavailable` naming why there is none."""
    return CudaDevice(index)
