"""Hypothesis over freshly generated small random models: the accelerated engine's logits are
within the kind-(b) tolerance of the reference's (spec/model.md §15), and its greedy choice
equals the reference's wherever the reference's top-2 margin exceeds twice that tolerance.

Models vary layers, the dense/sparse mix, experts, top-k, group routing, the DSA top-k
(smaller than the prompt, so the indexer selects), widths that are not powers of two, and the
routed experts' stored format (float or a quantized container from ``colibri convert``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.accelerated_support import BUILT, NOT_BUILT_REASON

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)

FORMATS = ("f32", "int8", "int4", "int4g64", "fp8", "int2", "int3")


@st.composite
def models(draw: Any) -> dict[str, Any]:
    from colibri.benchmarks.bench_model import BENCH_CONFIG

    layers = draw(st.integers(1, 3))
    experts = draw(st.sampled_from([4, 6, 8]))
    groups = draw(st.sampled_from([g for g in (1, 2) if experts % g == 0]))
    topk_group = draw(st.integers(1, groups))
    cfg = dict(BENCH_CONFIG)
    cfg.update({
        "vocab_size": 96,
        "hidden_size": draw(st.sampled_from([64, 128, 192])),
        "intermediate_size": draw(st.sampled_from([64, 96])),
        "moe_intermediate_size": draw(st.sampled_from([64, 128])),
        "num_hidden_layers": layers,
        "first_k_dense_replace": draw(st.integers(0, layers)),
        "num_attention_heads": draw(st.sampled_from([2, 3])),
        "num_key_value_heads": 2,
        "n_routed_experts": experts,
        "num_experts_per_tok": draw(st.integers(1, min(4, topk_group * experts // groups))),
        "n_shared_experts": draw(st.sampled_from([0, 1])),
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "index_topk": draw(st.sampled_from([3, 5, 64])),
        "index_head_dim": 16,
        "index_n_heads": 2,
        "n_group": groups,
        "topk_group": topk_group,
    })
    cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    return {"config": cfg, "seed": draw(st.integers(0, 2**16)),
            "experts": draw(st.sampled_from(FORMATS)),
            "prompt": draw(st.lists(st.integers(2, 95), min_size=4, max_size=9))}


def write_model(spec: dict[str, Any], root: Path) -> Path:
    from colibri.reference.quant.convert import ConvertError, convert
    from colibri.reference.safetensors import write_safetensors

    from colibri.benchmarks.bench_model import build_tensors

    cfg = spec["config"]
    src = root / "f32"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(cfg))
    tensors = build_tensors(cfg, spec["seed"])
    for name, value in tensors.items():  # larger weights than the bench's: real logit gaps
        if value.ndim == 2:
            tensors[name] = (value * np.float32(8.0)).astype(np.float32)
    write_safetensors(src / "model.safetensors", tensors, {"format": "pt"})
    if spec["experts"] == "f32":
        return src
    out = root / "container"
    try:
        convert(src, out, spec["experts"])
    except ConvertError as exc:  # a width this format cannot store
        assume(False, f"{exc}")
    return out


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=models())
def test_random_models_match_the_reference(spec: dict[str, Any], tmp_path_factory: Any) -> None:
    from colibri.accelerated import load_model
    from colibri.conformance.sameness import Tolerance, logit_scale_of, max_excess
    from colibri.conformance.sameness import reduction_length as length_of
    from colibri.reference import load_model as load_reference

    path = write_model(spec, tmp_path_factory.mktemp("random"))
    ids = spec["prompt"]
    r = load_reference(path)
    want = r.prefill(r.new_state(), ids)
    a = load_model(path, threads=2)
    try:
        got = a.forward(ids)
    finally:
        a.close()
    tol = Tolerance(length_of(spec["config"], len(ids)), logit_scale_of(want)).logit
    assert max_excess(got, want, tol) <= 0
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * tol
    assert np.array_equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
