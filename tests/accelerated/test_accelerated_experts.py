"""Routed experts of a quantized container stay quantized in the accelerated engine, and the
per-layer expert kernel (``col_moe``) keeps sameness kind (c): a row's logits are the same
bytes alone or inside a batch and for 1, 2 or 4 threads (spec/model.md §15)."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
from support.accelerated_support import (
    BUILT,
    NOT_BUILT_REASON,
    QUANT_FIXTURES,
    accelerated,
    assert_decode_batch_invariant,
)

from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)


def _mapped(a: np.ndarray) -> bool:
    base: object = a
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    return isinstance(base, mmap.mmap)


@pytest.mark.parametrize("name", QUANT_FIXTURES)
def test_quantized_experts_are_not_dequantized_at_load_or_use(name: str) -> None:
    from colibri.accelerated.quant_kernels import QuantMatrix

    m = accelerated(name)
    m.forward([1, 2, 3, 4])  # every expert the prompt routes to has been used
    cfg = m.config
    layer = m.sparse_layers[0]
    for e in range(cfg.n_routed_experts):
        ex = m.expert(layer, e)
        for w in (ex.gate, ex.up, ex.down):
            assert isinstance(w, QuantMatrix)
            assert w.payload.dtype == np.uint8
            assert _mapped(w.payload), "the payload must be the container's mapped bytes"
        f32_bytes = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
        assert ex.nbytes < f32_bytes / 2


@pytest.mark.parametrize("name", ["glm5-tiny-e8", "glm5-tiny-int4g64", "glm5-tiny-fp8"])
def test_quantized_logits_are_byte_identical_for_1_2_and_4_threads(name: str) -> None:
    ids = [5, 17, 99, 3, 250, 8, 41]
    outs = [accelerated(name, threads=n).forward(ids) for n in (1, 2, 4)]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


@pytest.mark.parametrize("name", ["glm5-tiny-e8", "glm5-tiny-int4row", "glm5-tiny-fp8",
                                  "glm5-tiny-dsa"])
@pytest.mark.parametrize("threads", [1, 2])
def test_row_is_byte_identical_alone_and_in_a_batch_of_six(name: str, threads: int) -> None:
    m = accelerated(name, threads=threads)
    prompts = [[3, 14, 159, 26, 53], [7, 8, 9], [200, 11, 77, 240, 5, 99, 1, 2], [4],
               [9, 9, 9, 9], [61, 62]]
    assert_decode_batch_invariant(m, prompts)


@pytest.mark.parametrize("name", ["glm5-tiny-int4g64", "glm5-tiny-e8"])
def test_float_and_quantized_experts_mix_in_one_layer_call(name: str) -> None:
    """Odd experts as float32 weights (the dequantized container values), even ones left
    quantized: one col_moe call takes both kinds, and the logits stay within the fixture's
    tolerance of the reference (which dequantizes every expert)."""
    from colibri.accelerated.kernels import Weight
    from colibri.accelerated.model import open_model
    from colibri.accelerated.quant_kernels import QuantMatrix
    from colibri.accelerated.weights import Expert, expert_names, expert_shapes
    from colibri.conformance.sameness import Tolerance, max_excess
    from colibri.reference.quant.container import QuantContainer
    from support.accelerated_support import reference

    path = fixture_model_dir(name)
    m = open_model(path, threads=2)
    container = QuantContainer.open(path)
    quantized = m._read_expert
    kinds: set[type] = set()

    def mixed(layer: int, e: int) -> Expert:
        if e % 2 == 0:
            ex = quantized(layer, e)
        else:
            ex = Expert(*(Weight(np.ascontiguousarray(container.weight(n, s)), 0)
                          for n, s in zip(expert_names(layer, e), expert_shapes(m.config),
                                          strict=True)))
        kinds.add(type(ex.gate))
        return ex

    m._read_expert = mixed
    ids = [5, 17, 99, 3, 250, 8, 41, 77, 2]
    got = m.forward(ids)
    r = reference(name)
    want = r.prefill(r.new_state(), ids)
    assert kinds == {Weight, QuantMatrix}
    tol = Tolerance.for_model_dir(path, positions=len(ids)).logit
    assert max_excess(got, want, tol) <= 0


@pytest.mark.parametrize("k", [1, 31, 32, 100, 1000])
@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_register_blocked_rows_equal_each_row_alone(k: int, dtype: str) -> None:
    """col_matmul takes four activation rows per weight row (col_dot4_f32): every output is
    still the bytes of that row computed alone, for any row count and any tail width."""
    import ml_dtypes
    from colibri.accelerated.kernels import DTYPE_CODES, Kernels, Weight

    rng = np.random.default_rng(k)
    raw = rng.standard_normal((37, k)).astype(np.float32)
    if dtype == "BF16":
        raw = raw.astype(ml_dtypes.bfloat16)
    w = Weight(np.ascontiguousarray(raw), DTYPE_CODES[dtype])
    x = rng.standard_normal((11, k)).astype(np.float32)
    kern = Kernels(2)
    batched = kern.matmul(x, w)
    for r in range(11):
        assert kern.matmul(np.ascontiguousarray(x[r : r + 1]), w)[0].tobytes() == (
            batched[r].tobytes())
    for n in (4, 5, 8):
        assert kern.matmul(np.ascontiguousarray(x[:n]), w).tobytes() == batched[:n].tobytes()


@pytest.mark.parametrize(("experts", "dense"), [("int4g64", "int8"), ("fp8", "int8")])
def test_quantized_dense_weights_stay_quantized_and_match_the_reference(
        tmp_path: object, experts: str, dense: str) -> None:
    """``--dense int8``: attention projections, dense MLPs and shared experts are read by the
    fused kernels in place (kv_b, read inside attention, is dequantized once); logits within
    tolerance of the reference (which dequantizes everything) and the same greedy tokens."""
    from pathlib import Path

    from colibri.accelerated import load_model
    from colibri.accelerated.kernels import QuantWeight
    from colibri.conformance.sameness import Tolerance, logit_scale_of, max_excess
    from colibri.conformance.sameness import reduction_length as length_of
    from colibri.reference import load_model as load_reference
    from colibri.reference.quant.convert import convert

    out = Path(str(tmp_path)) / "container"
    convert(fixture_model_dir("glm5-tiny"), out, experts, dense)
    ids = [5, 17, 99, 3, 250, 8, 41, 77, 2, 13]
    m = load_model(out, threads=2)
    first = m.layers[0]
    assert isinstance(first.attention.q_b, QuantWeight)
    assert first.dense is not None and isinstance(first.dense.gate, QuantWeight)
    sparse = m.layers[m.sparse_layers[0]]
    assert sparse.shared is not None and isinstance(sparse.shared.up, QuantWeight)
    r = load_reference(out)
    want = r.prefill(r.new_state(), ids)
    got = m.forward(ids)
    config = json.loads((out / "config.json").read_text())
    tol = Tolerance(length_of(config, len(ids)), logit_scale_of(want)).logit
    assert max_excess(got, want, tol) <= 0
    assert [int(i) for i in got.argmax(-1)] == [int(i) for i in want.argmax(-1)]
