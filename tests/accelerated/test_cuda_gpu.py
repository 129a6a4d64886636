"""The CUDA kernels on a GPU (marker ``gpu``: skipped, with the reason, where no device is
usable). Written before any GPU run; what they check is the claim spec/DEVIATIONS.md
("CUDA kernels") records as unverified until they pass:

- every product (f32/bf16/f16 and every quantized expert format) bit-identical to the CPU
  build beside it -- the avx2 build with fused multiply-adds, the generic build with
  ``TWO_ROUNDINGS`` -- and to itself alone or inside a batch of 8 (kind (c));
- RMSNorm, RoPE, the DSA scores and the expert sum bit-identical to the CPU kernels; SwiGLU
  and attention (an exponential each) within kind (b);
- ``--device cuda`` greedy tokens equal to the reference on every fixture and logits within
  the fixture's tolerance, with VRAM-tier experts too; a row's logits the same bytes alone
  or batched; ``colibri conformance protocol`` passing on the CUDA engine.

Importable and collectable without a GPU: nothing touches the device before a test runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from colibri.accelerated.cuda_native import TWO_ROUNDINGS, CudaDevice, open_device
from colibri.accelerated.kernels import Kernels, Weight
from colibri.conformance.sameness import SAFETY_FACTOR, UNIT_ROUNDOFF, Tolerance, max_excess
from colibri.reference.quant import quantize
from colibri.reference.quant.formats import Fmt
from support.accelerated_support import ALL_FIXTURES, assert_decode_batch_invariant, reference
from support.cuda_shim import addr, cpu_pool, cpu_variant, runnable_variants
from support.expert_sum_case import expert_sum_case
from support.reference_support import greedy

from colibri.resources import fixture_model_dir

pytestmark = pytest.mark.gpu

QUANT = (Fmt.INT8_ROW, Fmt.INT4_ROW, Fmt.INT2_ROW, Fmt.INT4_GROUPED, Fmt.INT3_G64, Fmt.E8_IQ3,
         Fmt.FP8_E4M3_B128)
FLAGS = {"avx2": 0, "generic": TWO_ROUNDINGS}


@pytest.fixture(scope="module")
def gpu() -> Iterator[CudaDevice]:
    device = open_device(0)
    yield device
    device.close()


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _quant_case(fmt: Fmt, gs: int = 64) -> tuple[np.ndarray, np.ndarray, int, int]:
    rows, cols = (129, 512) if fmt == Fmt.E8_IQ3 else (129, 257)
    w = np.random.default_rng(int(fmt)).standard_normal((rows, cols)).astype(np.float32)
    payload, scales = quantize(fmt, w, group_size=gs, rotate=False)
    return np.ascontiguousarray(payload), np.ascontiguousarray(scales), rows, cols


@pytest.mark.parametrize("fmt", QUANT, ids=lambda f: f.name)
def test_quantized_products_are_the_cpu_builds_bits(gpu: CudaDevice, fmt: Fmt) -> None:
    payload, scales, rows, cols = _quant_case(fmt)
    w = gpu.upload_quant(int(fmt), 64, payload, scales, rows, cols)
    x = np.random.default_rng(5).standard_normal((3, cols)).astype(np.float32)
    for variant in runnable_variants():
        want = np.empty((3, rows), np.float32)
        assert cpu_variant(variant).coli_q_matmul(int(fmt), 64, addr(payload), payload.size,
                                                  addr(scales), scales.size, rows, cols,
                                                  addr(x), 3, cols, addr(want), rows, 0, rows,
                                                  0) == 0
        assert _bits_equal(gpu.matmul(x, w, FLAGS[variant]), want), variant
    gpu.free(w)


@pytest.mark.parametrize("dtype", [0, 1, 2], ids=["f32", "bf16", "f16"])
def test_float_products_are_the_cpu_builds_bits(gpu: CudaDevice, dtype: int) -> None:
    rng = np.random.default_rng(dtype)
    w32 = rng.standard_normal((65, 1000)).astype(np.float32)
    w = np.ascontiguousarray({0: w32, 1: w32.astype(ml_dtypes.bfloat16),
                              2: w32.astype(np.float16)}[dtype])
    gw = gpu.upload_float(w, dtype)
    x = rng.standard_normal((5, 1000)).astype(np.float32)
    for variant in runnable_variants():
        want = np.empty((5, 65), np.float32)
        assert cpu_variant(variant).col_matmul(cpu_pool(variant), addr(x), 5, 1000, 1000,
                                               addr(w), dtype, 65, addr(want), 65) == 0
        assert _bits_equal(gpu.matmul(x, gw, FLAGS[variant]), want), variant
    gpu.free(gw)


@pytest.mark.parametrize("fmt", [Fmt.INT4_GROUPED, Fmt.E8_IQ3, Fmt.F32], ids=lambda f: f.name)
def test_a_row_is_the_same_bytes_alone_and_in_a_batch_of_8(gpu: CudaDevice, fmt: Fmt) -> None:
    if fmt == Fmt.F32:
        w32 = np.random.default_rng(0).standard_normal((300, 512)).astype(np.float32)
        gw = gpu.upload_float(w32, 0)
    else:
        payload, scales, rows, cols = _quant_case(fmt)
        gw = gpu.upload_quant(int(fmt), 64, payload, scales, rows, cols)
    x = np.random.default_rng(9).standard_normal((11, gw.cols)).astype(np.float32)
    batch = gpu.matmul(x[:8].copy(), gw)
    longer = gpu.matmul(x, gw)  # a tile of 8 rows, then one of 3
    for r in range(11):
        alone = gpu.matmul(np.ascontiguousarray(x[r:r + 1]), gw)
        assert _bits_equal(alone, longer[r:r + 1])
        if r < 8:
            assert _bits_equal(alone, batch[r:r + 1])
    gpu.free(gw)


def test_matmul_many_is_each_matmul(gpu: CudaDevice) -> None:
    """One upload of x for weights of one width (e8 among them: rotated once) changes no byte."""
    rng = np.random.default_rng(11)
    weights = [gpu.upload_float(rng.standard_normal((70, 512)).astype(np.float32), 0)]
    for fmt in (Fmt.INT4_GROUPED, Fmt.E8_IQ3):
        payload, scales = quantize(fmt, rng.standard_normal((33, 512)).astype(np.float32),
                                   group_size=64, rotate=False)
        weights.append(gpu.upload_quant(int(fmt), 64, np.ascontiguousarray(payload),
                                        np.ascontiguousarray(scales), 33, 512))
    x = rng.standard_normal((4, 512)).astype(np.float32)
    for flags in (0, TWO_ROUNDINGS):
        many = gpu.matmul_many(x, weights, flags)
        for w, y in zip(weights, many, strict=True):
            assert _bits_equal(y, gpu.matmul(x, w, flags))
    for w in weights:
        gpu.free(w)


def test_rms_norm_rope_index_scores_and_expert_sum_are_the_cpu_bits(gpu: CudaDevice) -> None:
    k = Kernels(1)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 1000)).astype(np.float32)
    w = rng.standard_normal(1000).astype(np.float32)
    out = np.empty_like(x)
    gpu.on_device("rms_norm", [x, w, out], None, 4, 1000, None, 1e-6, None)
    assert _bits_equal(out, k.rms_norm(x, w, 1e-6))
    q = rng.standard_normal((3, 4 * 72)).astype(np.float32)
    angles = rng.standard_normal((3, 36)).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    for interleaved in (True, False):
        want = q.copy()
        k.rope(want, 4, 4 * 72, 72, 0, 72, cos, sin, interleaved)
        got = q.copy()
        gpu.on_device("rope", [got, cos, sin], None, 3, 4, 4 * 72, 72, 72, None, None,
                      int(interleaved))
        assert _bits_equal(got, want), interleaved
    iq = rng.standard_normal((4, 64)).astype(np.float32)
    hw = rng.standard_normal(4).astype(np.float32)
    keys = rng.standard_normal((37, 64)).astype(np.float32)
    scores = np.empty(37, np.float32)
    gpu.on_device("index_scores", [iq, hw, keys, scores], None, None, 4, 64, None, 37, 0.125,
                  None, 0)
    assert _bits_equal(scores, k.index_scores(iq, hw, keys, 0.125))
    # The weighted expert sum in model.py's order: slots ascending from 0, the shared row, x.
    m, d, top = 3, 40, 4
    c = expert_sum_case(rng, m, d, top, shared=True)
    got_sum, got_x = np.empty((m, d), np.float32), c.resid.copy()
    gpu.on_device("expert_sum", [c.y, c.weights, c.slot_row, c.extra, got_sum, got_x], None, m,
                  d, top, None, None, None, None, None)
    assert _bits_equal(got_sum, c.summed) and _bits_equal(got_x, c.resid + c.summed)
    k.close()


def test_silu_and_attention_are_within_kind_b(gpu: CudaDevice) -> None:
    rng = np.random.default_rng(4)
    g = (rng.standard_normal(4096) * 4).astype(np.float32)
    u = rng.standard_normal(4096).astype(np.float32)
    got = np.empty_like(g)
    gpu.on_device("silu_mul", [g, u, got], None, None, 4096, None)
    want = (g * (np.float32(1) / (np.float32(1) + np.exp(-g)))) * u
    assert np.max(np.abs(got - want)) <= SAFETY_FACTOR * UNIT_ROUNDOFF * np.max(np.abs(want))
    heads, nope, rope, vdim, kvl, seen = 4, 16, 8, 16, 64, 23
    k = Kernels(1)
    kv_b32 = rng.standard_normal((heads * (nope + vdim), kvl)).astype(np.float32)
    q = rng.standard_normal((1, heads * (nope + rope))).astype(np.float32)
    latent = rng.standard_normal((seen, kvl)).astype(np.float32)
    rope_key = rng.standard_normal((seen, rope)).astype(np.float32)
    want_a = k.mla_attention(q, heads, nope, rope, vdim, kvl, [latent], [rope_key], [seen],
                             [None], Weight(kv_b32, 0), 0.1)
    kv_b = gpu.upload_float(kv_b32, 0)
    got_a = np.empty((1, heads * vdim), np.float32)
    gpu.on_device("mla_attention", [q, latent, rope_key, got_a], None, heads, nope, rope,
                  vdim, kvl, None, None, seen, 0, 0, kv_b.handle, 0.1, None, 0)
    bound = SAFETY_FACTOR * UNIT_ROUNDOFF * np.sqrt(seen * kvl) * np.max(np.abs(want_a))
    assert np.max(np.abs(got_a - want_a)) <= bound
    gpu.free(kv_b)
    k.close()


def _oracle(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture_model_dir(name) / "oracle.json").read_text())
    return data


def _cuda_backend(name: str, all_experts: bool) -> Any:
    import io

    from colibri.engine.registry import BackendOptions, open_backend

    backend: Any = open_backend("accelerated", fixture_model_dir(name),
                                BackendOptions(device="cuda"), io.StringIO())
    if all_experts:
        model = backend.model
        for layer in model.sparse_layers:
            for e in range(model.config.n_routed_experts):
                assert backend.vram_tier.upload(layer, e)
    return backend


@pytest.mark.parametrize("all_experts", [False, True], ids=["dense", "experts-in-vram"])
@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_device_cuda_matches_the_reference(name: str, all_experts: bool) -> None:
    backend = _cuda_backend(name, all_experts)
    model = backend.model
    o = _oracle(name)
    ids = o["full_ids"]
    tol = Tolerance.for_model_dir(fixture_model_dir(name), positions=len(ids)).logit
    got = model.forward(ids)
    want = reference(name).prefill(reference(name).new_state(), ids)
    assert max_excess(got, want, tol) <= 0
    new = len(ids) - len(o["prompt_ids"])
    assert greedy(model, o["prompt_ids"], new) == ids
    if name == "glm5-tiny":
        prompts = [[3, 14, 159, 26, 53, 58], [7, 8, 9], [200, 11, 77, 240, 5, 99, 1, 2]] * 3
        assert_decode_batch_invariant(model, prompts[:8])
    assert backend.devices()[0].used_bytes > 0
    backend.close()


def test_conformance_protocol_passes_on_the_cuda_engine() -> None:
    engine = f"{sys.executable} -m colibri engine --accelerated --device cuda"
    result = subprocess.run(
        [sys.executable, "-m", "colibri", "conformance", "protocol", "--engine-cmd", engine,
         "--model", str(fixture_model_dir("glm5-tiny"))],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
