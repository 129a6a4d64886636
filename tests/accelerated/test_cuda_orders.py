"""The CUDA kernels' summation orders, checked on the CPU (no nvcc, no GPU needed).

``accelerated/cuda/ccu_orders.h`` is the one definition of the warp tree and of every
attention and elementwise kernel's per-item arithmetic; the .cu files only spread those items
over threads. The shim (tests/support/cuda_shim.c) compiles the same header with the system cc
and runs the warp functions on an emulated warp, lane by lane, so what is held here against
the CPU builds, bit for bit, is the device's order itself:

- the tree over 32 lane values against the CPU builds' own trees (col_dot_f32's reduce32
  through ``col_matmul``, coli_quant.h's through ``coli_q_matmul``), both pairings;
- RMSNorm, RoPE, SwiGLU's gate, the indexer's scores and MLA attention against the CPU
  library's kernels, and the weighted expert sum against model.py's order.

The exponential is the one operation not checked here: on the host the header's ``ccu_expf``
is the CPU build's ``expf``, on the device a float64 exp (test_cuda_gpu.py checks that one).
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accelerated_support import needs_library
from support.cuda_shim import FUSED, addr, cpu_pool, cpu_variant, runnable_variants, shim
from support.expert_sum_case import expert_sum_case

pytestmark = needs_library


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _lanes(n: int, seed: int) -> np.ndarray:
    """n warps' worth of lane values of both signs over a few binades, so that nearly every
    add rounds and a different pairing gives different bits."""
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-2, 3, (n, 32))).astype(np.float32)
    return np.ascontiguousarray(rng.standard_normal((n, 32)).astype(np.float32) * scale)


def _shim_tree(lanes: np.ndarray, quantized: int) -> np.ndarray:
    out = np.empty(lanes.shape[0], np.float32)
    assert shim().shim_warp_tree(addr(lanes), lanes.shape[0], quantized, addr(out)) == 0
    return out


def _cpu_float_tree(variant: str, lanes: np.ndarray) -> np.ndarray:
    """col_dot_f32's tree over the lanes: a product with a row of ones puts lane value v_l
    (exactly v_l * 1) in lane l, then the CPU build reduces."""
    n = lanes.shape[0]
    ones = np.ones((1, 32), np.float32)
    y = np.empty((n, 1), np.float32)
    assert cpu_variant(variant).col_matmul(cpu_pool(variant), addr(lanes), n, 32, 32,
                                           addr(ones), 0, 1, addr(y), 1) == 0
    return y[:, 0]


def _cpu_quant_tree(variant: str, lanes: np.ndarray) -> np.ndarray:
    """coli_quant.h's tree over the lanes: int8 weights of 1 with scale 1 leave t[l] = v_l."""
    n = lanes.shape[0]
    payload = np.ones(32, np.uint8)
    scales = np.ones(1, np.float32)
    y = np.empty((n, 1), np.float32)
    assert cpu_variant(variant).coli_q_matmul(1, 0, addr(payload), 32, addr(scales), 1, 1, 32,
                                              addr(lanes), n, 32, addr(y), 1, 0, 1, 0) == 0
    return y[:, 0]


def test_the_warp_tree_is_each_cpu_builds_tree_bit_for_bit() -> None:
    lanes = _lanes(4096, 1)
    float_tree, quant_tree = _shim_tree(lanes, 0), _shim_tree(lanes, 1)
    # The data tells pairings apart: the two trees (which share their last three levels)
    # part on about half the warps, a running sum on three in four, so an emulated tree that
    # paired lanes differently could not pass.
    running = np.zeros(lanes.shape[0], np.float32)
    for lane in range(32):
        running = running + lanes[:, lane]
    assert np.mean(_bits(float_tree) != _bits(quant_tree)) > 0.4
    assert np.mean(_bits(float_tree) != _bits(running)) > 0.6
    for variant in runnable_variants():
        assert np.array_equal(_bits(float_tree), _bits(_cpu_float_tree(variant, lanes))), variant
        assert np.array_equal(_bits(quant_tree), _bits(_cpu_quant_tree(variant, lanes))), variant


@settings(max_examples=25)
@given(m=st.integers(1, 3), d=st.sampled_from([1, 7, 32, 100, 1000]),
       eps=st.sampled_from([1e-6, 1e-5]), seed=st.integers(0, 2**32 - 1))
def test_rms_norm_is_the_cpu_kernels_bits(m: int, d: int, eps: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    got = np.empty_like(x)
    shim().shim_rms_norm(addr(x), m, d, addr(w), eps, addr(got))
    for variant in runnable_variants():
        want = np.empty_like(x)
        assert cpu_variant(variant).col_rms_norm(addr(x), m, d, addr(w), eps, addr(want)) == 0
        assert np.array_equal(_bits(got), _bits(want)), variant


@settings(max_examples=25)
@given(m=st.integers(1, 3), heads=st.integers(1, 3), d=st.sampled_from([2, 8, 64, 72]),
       interleaved=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_rope_is_the_cpu_kernels_bits(m: int, heads: int, d: int, interleaved: bool,
                                      seed: int) -> None:
    rng = np.random.default_rng(seed)
    stride = heads * d + 3  # rows with room between them, which neither kernel may touch
    x = rng.standard_normal((m, stride)).astype(np.float32)
    angles = rng.standard_normal((m, d // 2)).astype(np.float32) * 10
    cos, sin = np.cos(angles), np.sin(angles)
    got = x.copy()
    shim().shim_rope(addr(got), m, heads, stride, d, d, addr(cos), addr(sin), int(interleaved))
    for variant in runnable_variants():
        want = x.copy()
        assert cpu_variant(variant).col_rope(addr(want), m, heads, stride, d, d, addr(cos),
                                             addr(sin), int(interleaved)) == 0
        assert np.array_equal(_bits(got), _bits(want)), variant


def test_silu_gate_around_the_exponential_is_the_cpu_kernels_bits() -> None:
    rng = np.random.default_rng(5)
    g = (rng.standard_normal(20000) * 6).astype(np.float32)
    u = rng.standard_normal(20000).astype(np.float32)
    got = np.empty_like(g)
    shim().shim_silu_mul(addr(g), addr(u), g.size, addr(got))
    for variant in runnable_variants():
        want = np.empty_like(g)
        assert cpu_variant(variant).col_silu_mul(addr(g), addr(u), g.size, addr(want)) == 0
        assert np.array_equal(_bits(got), _bits(want)), variant


@settings(max_examples=25)
@given(m=st.integers(1, 4), d=st.sampled_from([1, 40, 257]), top=st.integers(0, 6),
       shared=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_expert_sum_is_model_py_order(m: int, d: int, top: int, shared: bool, seed: int) -> None:
    c = expert_sum_case(np.random.default_rng(seed), m, d, top, shared)
    got, got_x = np.empty((m, d), np.float32), c.resid.copy()
    shim().shim_expert_sum(addr(c.y), m, d, top, addr(c.weights), addr(c.slot_row),
                           addr(c.extra) if shared else None, addr(got), addr(got_x))
    assert np.array_equal(_bits(got), _bits(c.summed))
    assert np.array_equal(_bits(got_x), _bits(c.resid + c.summed))


@settings(max_examples=25)
@given(nh=st.integers(1, 5), hd=st.sampled_from([1, 31, 32, 64, 100]), s=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1))
def test_index_scores_are_each_cpu_builds_bits(nh: int, hd: int, s: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nh, hd)).astype(np.float32)
    w = rng.standard_normal(nh).astype(np.float32)
    keys = rng.standard_normal((s, hd)).astype(np.float32)
    for variant in runnable_variants():
        got, want = np.empty(s, np.float32), np.empty(s, np.float32)
        assert shim().shim_index_scores(addr(q), addr(w), nh, hd, addr(keys), s, 0.125,
                                        addr(got), FUSED[variant]) == 0
        assert cpu_variant(variant).col_index_scores(cpu_pool(variant), addr(q), addr(w), nh,
                                                     hd, addr(keys), s, 0.125, addr(want)) == 0
        assert np.array_equal(_bits(got), _bits(want)), variant


def _ptrs(*arrays: np.ndarray | None) -> np.ndarray:
    return np.array([0 if a is None else addr(a) for a in arrays], np.uint64)


@settings(max_examples=25)
@given(heads=st.integers(1, 3), nope=st.sampled_from([0, 3, 16]), rope=st.sampled_from([0, 8]),
       vdim=st.sampled_from([1, 16]), kvl=st.sampled_from([1, 33, 64]), seen=st.integers(1, 23),
       dtype=st.sampled_from([0, 1, 2]), dsa=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_mla_attention_is_each_cpu_builds_bits_around_the_exponential(
        heads: int, nope: int, rope: int, vdim: int, kvl: int, seen: int, dtype: int, dsa: bool,
        seed: int) -> None:
    rng = np.random.default_rng(seed)
    kv_b32 = rng.standard_normal((heads * (nope + vdim), kvl)).astype(np.float32)
    kv_b = np.ascontiguousarray({0: kv_b32, 1: kv_b32.astype(ml_dtypes.bfloat16),
                                 2: kv_b32.astype(np.float16)}[dtype])
    q = rng.standard_normal(heads * (nope + rope)).astype(np.float32)
    latent = rng.standard_normal((seen, kvl)).astype(np.float32)
    rope_key = rng.standard_normal((seen, max(rope, 1))).astype(np.float32)
    keep = (np.sort(rng.choice(seen, size=rng.integers(1, seen + 1), replace=False))
            .astype(np.int64) if dsa else None)
    n_keep = 0 if keep is None else keep.shape[0]
    scale = 0.1
    for variant in runnable_variants():
        got = np.empty(heads * vdim, np.float32)
        assert shim().shim_mla_attention(addr(q), heads, nope, rope, vdim, kvl, addr(latent),
                                         addr(rope_key), seen,
                                         None if keep is None else addr(keep), n_keep,
                                         addr(kv_b), dtype, scale, addr(got),
                                         FUSED[variant]) == 0
        want = np.empty(heads * vdim, np.float32)
        row_ptrs = (_ptrs(latent), _ptrs(rope_key), np.array([seen], np.uint64), _ptrs(keep),
                    np.array([n_keep], np.uint64))
        assert cpu_variant(variant).col_mla_attention(
            cpu_pool(variant), 1, heads, nope, rope, vdim, kvl, addr(q),
            *(addr(a) for a in row_ptrs), addr(kv_b), dtype, ctypes.c_float(scale),
            addr(want)) == 0
        assert np.array_equal(_bits(got), _bits(want)), variant


@pytest.mark.parametrize("quantized", [0, 1])
def test_every_lane_reaches_lane_0_exactly_once(quantized: int) -> None:
    """One-hot warps: lane 0's sum is 1 only if the offsets carry every lane's value to lane 0
    once (lanes past 31 hand back their own value, which must reach no lane-0 sum)."""
    lanes = np.eye(32, dtype=np.float32)
    assert np.array_equal(_shim_tree(lanes, quantized), np.ones(32, np.float32))
