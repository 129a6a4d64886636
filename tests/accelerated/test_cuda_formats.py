"""The CUDA kernels' device math, checked on the CPU (no nvcc, no GPU needed).

``accelerated/cuda/ccu_formats.h`` holds every per-format decoding, scale lookup, size rule,
conversion and per-lane summation step the .cu kernels run, and ``ccu_orders.h`` the warp
item of a product (its lanes and the shuffle tree). The shim (tests/support/cuda_shim.c, built
with the system cc) runs those functions on an emulated warp, lane by lane, then the tests
hold them against the CPU library: decoded values against the reference's ``dequantize``,
products against ``coli_q_matmul`` / ``col_matmul`` of the avx2 build (fused multiply-add
mode) and the generic build (two roundings), byte for byte -- the determinism claim of
spec/DEVIATIONS.md ("CUDA kernels") as far as it can be verified without a GPU. Conversions
are checked exhaustively over their whole input range. The tree alone, and the attention and
elementwise kernels, are test_cuda_orders.py's.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from colibri.reference.quant import quantize
from colibri.reference.quant.codec import dequantize_stored
from colibri.reference.quant.e8_iq3 import grid_bytes
from colibri.reference.quant.formats import GROUP_SIZES, Fmt
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accelerated_support import needs_library
from support.cuda_shim import FUSED, addr, cpu_pool, cpu_variant, runnable_variants, shim

pytestmark = needs_library

QUANT = (Fmt.INT8_ROW, Fmt.INT4_ROW, Fmt.INT2_ROW, Fmt.INT4_GROUPED, Fmt.INT3_G64, Fmt.E8_IQ3,
         Fmt.FP8_E4M3_B128)
GRID = np.ascontiguousarray(grid_bytes())


def _convert(kind: int, values: np.ndarray) -> np.ndarray:
    src = np.ascontiguousarray(values, np.uint32)
    out = np.empty(src.shape[0], np.float32)
    shim().shim_convert(kind, addr(src), src.shape[0], addr(out))
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit patterns, any NaN equal to any NaN (payloads are not part of the rule)."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))
                and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def test_bf16_and_f16_decode_every_value_exactly() -> None:
    every = np.arange(1 << 16, dtype=np.uint32)
    bf16 = (every << 16).view(np.float32)
    assert _same_bits(_convert(0, every), bf16)
    f16 = every.astype(np.uint16).view(np.float16).astype(np.float32)
    assert _same_bits(_convert(1, every), f16)


def test_e8_half_matches_the_cpu_decoder_on_every_value() -> None:
    every = np.arange(1 << 16, dtype=np.uint32)
    cpu = cpu_variant(runnable_variants()[0])
    want = np.array([cpu.coli_qi_e8_half(int(h)) for h in every], np.float32)
    assert _same_bits(_convert(2, every), want)


def test_e4m3_matches_ml_dtypes_on_every_byte() -> None:
    every = np.arange(256, dtype=np.uint32)
    want = every.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert _same_bits(_convert(3, every), want)


@given(fmt=st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
       gs=st.sampled_from([0, 8, 16, 32, 48, 50, 64, 96, 128, 192, 256, 512]),
       rows=st.sampled_from([-1, 0, 1, 2, 127, 128, 129, 1 << 31, (1 << 31) + 1]),
       cols=st.sampled_from([-3, 0, 1, 7, 63, 64, 65, 255, 256, 512, 1 << 31]))
def test_size_rules_are_the_cpu_librarys(fmt: int, gs: int, rows: int, cols: int) -> None:
    cpu = cpu_variant(runnable_variants()[0])
    got = [ctypes.c_int64(-1), ctypes.c_int64(-1)]
    want = [ctypes.c_int64(-1), ctypes.c_int64(-1)]
    rc = shim().shim_q_sizes(fmt, gs, rows, cols, *(ctypes.byref(v) for v in got))
    rc_cpu = cpu.coli_q_sizes(fmt, gs, rows, cols, *(ctypes.byref(v) for v in want))
    assert (rc, [v.value for v in got]) == (rc_cpu, [v.value for v in want])


def _matrix(fmt: Fmt, rows: int, cols: int, gs: int, seed: int, raw: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """(payload, scales): quantized random weights, or (raw) random bytes made valid."""
    rng = np.random.default_rng(seed)
    if not raw:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        payload, scales = quantize(fmt, w, group_size=gs, rotate=False)
        return np.ascontiguousarray(payload, np.uint8), np.ascontiguousarray(scales, np.float32)
    n_bytes, n_scales = ctypes.c_int64(), ctypes.c_int64()
    assert shim().shim_q_sizes(int(fmt), gs, rows, cols, ctypes.byref(n_bytes),
                               ctypes.byref(n_scales)) == 0
    payload = rng.integers(0, 256, n_bytes.value, dtype=np.uint8)
    scales = (rng.standard_normal(n_scales.value) * 0.05).astype(np.float32)
    if fmt == Fmt.FP8_E4M3_B128:
        payload[(payload & 0x7F) == 0x7F] ^= 1  # no NaN codes (the loader refuses them)
    if fmt == Fmt.E8_IQ3:
        payload.reshape(-1, 98)[:, 97] &= 0x3B  # super-scale exponent below 31: finite
        scales = np.array([6.0], np.float32)
    return payload, scales


def _widths(fmt: Fmt) -> st.SearchStrategy[int]:
    if fmt == Fmt.E8_IQ3:
        return st.sampled_from([256, 512, 768])
    return st.sampled_from([1, 2, 3, 5, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 257])


@st.composite
def matrices(draw: st.DrawFn) -> tuple[Fmt, int, int, int, np.ndarray, np.ndarray]:
    fmt = draw(st.sampled_from(QUANT))
    rows = draw(st.sampled_from([1, 2, 3, 7, 129]))
    cols = draw(_widths(fmt))
    gs = draw(st.sampled_from(GROUP_SIZES)) if fmt == Fmt.INT4_GROUPED else 64
    payload, scales = _matrix(fmt, rows, cols, gs, draw(st.integers(0, 2**32 - 1)),
                              draw(st.booleans()))
    return fmt, rows, cols, gs, payload, scales


def _decode(fmt: Fmt, rows: int, cols: int, gs: int, payload: np.ndarray, scales: np.ndarray
            ) -> np.ndarray:
    """q * s per element, as the kernels' decoding gives them."""
    group = {Fmt.INT4_GROUPED: gs, Fmt.INT3_G64: 64, Fmt.E8_IQ3: 32,
             Fmt.FP8_E4M3_B128: 128}.get(fmt, cols)
    per_row = -(-cols // group)
    q = np.empty((rows, cols), np.float32)
    s = np.empty((rows, per_row), np.float32)
    rc = shim().shim_q_decode(int(fmt), gs, addr(payload), payload.size, addr(scales),
                              scales.size, rows, cols, addr(GRID), addr(q), addr(s))
    assert rc == 0
    return q * np.repeat(s, group, axis=1)[:, :cols]


@settings(max_examples=60)
@given(case=matrices())
def test_decoding_is_the_references_bit_for_bit(
        case: tuple[Fmt, int, int, int, np.ndarray, np.ndarray]) -> None:
    fmt, rows, cols, gs, payload, scales = case
    want = dequantize_stored(fmt, payload, scales, (rows, cols), group_size=gs)
    got = _decode(fmt, rows, cols, gs, payload, scales)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", QUANT, ids=lambda f: f.name)
def test_every_byte_value_decodes_as_the_reference(fmt: Fmt) -> None:
    """Each byte value at each position of its group (edge bytes: 0x00, 0x7f, 0x80, 0xff...)."""
    rows, cols = (4, 256) if fmt == Fmt.E8_IQ3 else (5, 257)
    payload, scales = _matrix(fmt, rows, cols, 32, 3, raw=True)
    every = np.resize(np.arange(256, dtype=np.uint8), payload.size)
    if fmt == Fmt.FP8_E4M3_B128:
        every[(every & 0x7F) == 0x7F] ^= 1
    if fmt == Fmt.E8_IQ3:
        every.reshape(-1, 98)[:, 97] &= 0x3B
    want = dequantize_stored(fmt, every, scales, (rows, cols), group_size=32)
    got = _decode(fmt, rows, cols, 32, every, scales)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _cpu_qmatmul(variant: str, fmt: Fmt, rows: int, cols: int, gs: int, payload: np.ndarray,
                 scales: np.ndarray, x: np.ndarray) -> np.ndarray:
    y = np.empty((x.shape[0], rows), np.float32)
    rc = cpu_variant(variant).coli_q_matmul(int(fmt), gs, addr(payload), payload.size,
                                            addr(scales), scales.size, rows, cols, addr(x),
                                            x.shape[0], cols, addr(y), rows, 0, rows, 1)
    assert rc == 0
    return y


def _rotated(variant: str, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    assert cpu_variant(variant).coli_q_rotate(addr(x), x.shape[0], x.shape[1], x.shape[1],
                                              addr(out), x.shape[1]) == 0
    return out


@settings(max_examples=60)
@given(case=matrices(), m=st.sampled_from([1, 2, 5, 9]), seed=st.integers(0, 2**32 - 1),
       tile=st.sampled_from([1, 3, 8]))
def test_quantized_warp_products_are_the_cpu_builds_bits(
        case: tuple[Fmt, int, int, int, np.ndarray, np.ndarray], m: int, seed: int,
        tile: int) -> None:
    """Whatever row tile a warp takes (alone, 3 rows, the kernels' 8), each row's bits are the
    CPU build's."""
    fmt, rows, cols, gs, payload, scales = case
    x = np.random.default_rng(seed).standard_normal((m, cols)).astype(np.float32)
    for variant in runnable_variants():
        xr = _rotated(variant, x) if fmt == Fmt.E8_IQ3 else x
        want = _cpu_qmatmul(variant, fmt, rows, cols, gs, payload, scales, xr)
        got = np.empty((m, rows), np.float32)
        assert shim().shim_q_matmul(int(fmt), gs, addr(payload), payload.size, addr(scales),
                                    scales.size, rows, cols, addr(GRID), addr(xr), m,
                                    addr(got), FUSED[variant], tile) == 0
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), variant


@settings(max_examples=40)
@given(dtype=st.sampled_from([0, 1, 2]), rows=st.sampled_from([1, 3, 17]),
       k=st.sampled_from([1, 5, 31, 32, 33, 64, 96, 100, 257]), m=st.sampled_from([1, 3, 4, 9]),
       seed=st.integers(0, 2**32 - 1), tile=st.sampled_from([1, 3, 8]))
def test_float_warp_products_are_the_cpu_builds_bits(dtype: int, rows: int, k: int, m: int,
                                                     seed: int, tile: int) -> None:
    rng = np.random.default_rng(seed)
    w32 = rng.standard_normal((rows, k)).astype(np.float32)
    w = {0: w32, 1: w32.astype(ml_dtypes.bfloat16), 2: w32.astype(np.float16)}[dtype]
    w = np.ascontiguousarray(w)
    x = rng.standard_normal((m, k)).astype(np.float32)
    for variant in runnable_variants():
        want = np.empty((m, rows), np.float32)
        assert cpu_variant(variant).col_matmul(cpu_pool(variant), addr(x), m, k, k, addr(w),
                                               dtype, rows, addr(want), rows) == 0
        got = np.empty((m, rows), np.float32)
        assert shim().shim_f_matmul(addr(w), dtype, rows, k, addr(x), m, addr(got),
                                    FUSED[variant], tile) == 0
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), variant


@settings(max_examples=30)
@given(cols=st.sampled_from([1, 2, 3, 8, 96, 256, 768, 1000, 4096 + 64]),
       m=st.sampled_from([1, 3]), seed=st.integers(0, 2**32 - 1))
def test_rotation_as_the_gpu_runs_it_is_the_cpu_rotation(cols: int, m: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((m, cols)).astype(np.float32)
    want = _rotated(runnable_variants()[0], x)
    got = x.copy()
    shim().shim_rotate(addr(got), m, cols)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", QUANT, ids=lambda f: f.name)
@pytest.mark.parametrize("damage", ["scale_nan", "scale_inf", "fp8_nan", "e8_tag", "e8_half",
                                    "short", "long", "few_scales"])
def test_upload_validation_refuses_what_coli_q_check_refuses(fmt: Fmt, damage: str) -> None:
    cols = 256 if fmt == Fmt.E8_IQ3 else 129
    payload, scales = _matrix(fmt, 3, cols, 32, 7, raw=True)
    payload, scales = payload.copy(), scales.copy()
    if damage == "scale_nan":
        scales[-1] = np.nan
    elif damage == "scale_inf":
        scales[0] = np.inf
    elif damage == "fp8_nan":
        payload[5] = 0xFF
    elif damage == "e8_tag":
        scales[0] = 5.0
    elif damage == "e8_half":
        payload[97] = 0x7C  # exponent 31: an infinite super-scale
    elif damage == "short":
        payload = payload[:-1].copy()
    elif damage == "long":
        payload = np.append(payload, np.uint8(0))
    elif damage == "few_scales":
        scales = scales[:-1].copy() if scales.size > 1 else np.zeros(0, np.float32)
    cpu = cpu_variant(runnable_variants()[0])
    args = (int(fmt), 32, addr(payload), payload.size, addr(scales) if scales.size else 0,
            scales.size, 3, cols)
    want = cpu.coli_q_check(*args)
    assert shim().shim_q_check(*args) == want
