"""The CUDA kernels' device math on the host: ``cuda_shim.c`` compiled with the system cc
against ``accelerated/cuda/ccu_formats.h`` and ``ccu_orders.h`` (no nvcc, no GPU), and the
two CPU library variants it is held against (``avx2`` for the fused-multiply-add bits,
``generic`` for the twice-rounded ones)."""

from __future__ import annotations

import atexit
import ctypes
import shutil
import subprocess
import tempfile
from ctypes import POINTER, c_int, c_int64, c_void_p
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
from colibri.accelerated.native import supported_variants
from colibri.accelerated.native_build import DEFAULT_OUT, LIBRARY_NAME, compiler

REPO = Path(__file__).resolve().parents[2]
HEADER_DIR = REPO / "accelerated" / "cuda"
CSRC_DIR = REPO / "accelerated" / "csrc"  # coli_quant.h, which ccu_formats.h includes
SHIM = Path(__file__).with_name("cuda_shim.c")
F32 = npt.NDArray[np.float32]

_SHIM_PROTOTYPES = {
    "shim_q_sizes": (c_int, [c_int, c_int, c_int64, c_int64, POINTER(c_int64), POINTER(c_int64)]),
    "shim_q_check": (c_int, [c_int, c_int, c_void_p, c_int64, c_void_p, c_int64, c_int64,
                             c_int64]),
    "shim_q_decode": (c_int, [c_int, c_int, c_void_p, c_int64, c_void_p, c_int64, c_int64,
                              c_int64, c_void_p, c_void_p, c_void_p]),
    "shim_q_matmul": (c_int, [c_int, c_int, c_void_p, c_int64, c_void_p, c_int64, c_int64,
                              c_int64, c_void_p, c_void_p, c_int64, c_void_p, c_int, c_int]),
    "shim_f_matmul": (c_int, [c_void_p, c_int, c_int64, c_int64, c_void_p, c_int64, c_void_p,
                              c_int, c_int]),
    "shim_warp_tree": (c_int, [c_void_p, c_int64, c_int, c_void_p]),
    "shim_mla_attention": (c_int, [c_void_p, c_int64, c_int64, c_int64, c_int64, c_int64,
                                   c_void_p, c_void_p, c_int64, c_void_p, c_int64, c_void_p,
                                   c_int, ctypes.c_float, c_void_p, c_int]),
    "shim_index_scores": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_void_p, c_int64,
                                  ctypes.c_float, c_void_p, c_int]),
    "shim_rms_norm": (None, [c_void_p, c_int64, c_int64, c_void_p, ctypes.c_double, c_void_p]),
    "shim_rope": (None, [c_void_p, c_int64, c_int64, c_int64, c_int64, c_int64, c_void_p,
                         c_void_p, c_int]),
    "shim_silu_mul": (None, [c_void_p, c_void_p, c_int64, c_void_p]),
    "shim_expert_sum": (None, [c_void_p, c_int64, c_int64, c_int64, c_void_p, c_void_p,
                               c_void_p, c_void_p, c_void_p]),
    "shim_convert": (None, [c_int, c_void_p, c_int64, c_void_p]),
    "shim_rotate": (None, [c_void_p, c_int64, c_int64]),
}

_CPU_PROTOTYPES = {
    "coli_q_sizes": (c_int, [c_int, c_int, c_int64, c_int64, POINTER(c_int64), POINTER(c_int64)]),
    "coli_q_check": (c_int, [c_int, c_int, c_void_p, c_int64, c_void_p, c_int64, c_int64,
                             c_int64]),
    "coli_q_matmul": (c_int, [c_int, c_int, c_void_p, c_int64, c_void_p, c_int64, c_int64,
                              c_int64, c_void_p, c_int64, c_int64, c_void_p, c_int64, c_int64,
                              c_int64, c_int]),
    "coli_q_rotate": (c_int, [c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int64]),
    "coli_qi_e8_half": (ctypes.c_float, [ctypes.c_uint16]),
    "col_pool_create": (c_int, [ctypes.c_size_t, POINTER(c_void_p)]),
    "col_matmul": (c_int, [c_void_p, c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                           ctypes.c_size_t, c_void_p, c_int, ctypes.c_size_t, c_void_p,
                           ctypes.c_size_t]),
    "col_mla_attention": (c_int, [c_void_p, *[ctypes.c_size_t] * 6, c_void_p, c_void_p,
                                  c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int,
                                  ctypes.c_float, c_void_p]),
    "col_index_scores": (c_int, [c_void_p, c_void_p, c_void_p, ctypes.c_size_t,
                                 ctypes.c_size_t, c_void_p, ctypes.c_size_t, ctypes.c_float,
                                 c_void_p]),
    "col_rms_norm": (c_int, [c_void_p, ctypes.c_size_t, ctypes.c_size_t, c_void_p,
                             ctypes.c_double, c_void_p]),
    "col_rope": (c_int, [c_void_p, *[ctypes.c_size_t] * 5, c_void_p, c_void_p, c_int]),
    "col_silu_mul": (c_int, [c_void_p, c_void_p, ctypes.c_size_t, c_void_p]),
}


def _bind(lib: ctypes.CDLL, table: dict[str, tuple[object, list[object]]]) -> ctypes.CDLL:
    for name, (restype, argtypes) in table.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


@cache
def _build_shim() -> ctypes.CDLL | str:
    """The shim, or why cc refused it; built once per session into a temporary directory."""
    cc = compiler()
    if cc is None:
        return "no C compiler"
    folder = Path(tempfile.mkdtemp(prefix="colibri-cuda-shim-"))
    atexit.register(shutil.rmtree, folder, True)  # the loaded library needs no file after exit
    out = folder / "libccu_shim.so"
    built = subprocess.run([cc, "-std=c11", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
                            "-fno-fast-math", "-Wall", "-Wextra", "-Werror", f"-I{HEADER_DIR}",
                            f"-I{CSRC_DIR}", str(SHIM), "-o", str(out), "-lm"],
                           capture_output=True, text=True, check=False)
    if built.returncode:
        return f"cc refused the CUDA headers' host build:\n{built.stderr}"
    return _bind(ctypes.CDLL(str(out)), _SHIM_PROTOTYPES)


def shim() -> ctypes.CDLL:
    """The shim; a failed build is reported by every test that needs it, and tried once."""
    built = _build_shim()
    if isinstance(built, str):
        raise RuntimeError(built)
    return built


#: variant -> whether its products use fused multiply-adds (the shim's ``fused`` flag).
FUSED = {"avx512": 1, "avx2": 1, "generic": 0}


@cache
def cpu_variant(name: str) -> ctypes.CDLL:
    path = DEFAULT_OUT / name / LIBRARY_NAME
    return _bind(ctypes.CDLL(str(path)), _CPU_PROTOTYPES)


def runnable_variants() -> list[str]:
    return [v for v in supported_variants() if (DEFAULT_OUT / v / LIBRARY_NAME).is_file()]


@cache
def cpu_pool(name: str) -> int:
    pool = c_void_p()
    if cpu_variant(name).col_pool_create(1, ctypes.byref(pool)):
        raise RuntimeError("col_pool_create failed")
    assert pool.value is not None
    return pool.value


def addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)
