"""OLMoE as a family delta: its config reader, the softmax router and standard attention
(the oracle comparison itself is in test_reference_oracle.py, over every fixture)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from colibri.conformance.sameness import max_excess
from colibri.reference import ModelConfig, ReferenceModel
from colibri.reference.errors import CheckpointError
from colibri.reference.families import FAMILIES
from colibri.reference.mha import project
from colibri.reference.rope import cos_sin
from colibri.reference.softmax_router import select_experts_softmax
from colibri.reference.tensors import dense_matmul
from colibri.reference.weights import MhaWeights
from support.reference_support import model, oracle, oracle_logits

from colibri.resources import fixture_model_dir

RAW: dict[str, Any] = json.loads((fixture_model_dir("olmoe-tiny") / "config.json").read_text())


def test_the_fixture_reads_as_the_olmoe_delta() -> None:
    cfg = model("olmoe-tiny").config
    family = FAMILIES["olmoe"]
    assert (cfg.attention, cfg.router) == (family.attention, family.router) == ("mha", "softmax")
    assert cfg.mlp_layer_types == ("sparse", "sparse") and cfg.n_shared_experts == 0
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.qk_head_dim) == (4, 2, 16)
    assert (cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank) == (16, 16, 0)
    assert cfg.moe_intermediate_size == RAW["intermediate_size"] == 16
    assert not cfg.rope_interleave and not cfg.norm_topk_prob and cfg.indexer_types is None
    assert model("olmoe-tiny").layers[0].router is not None
    assert model("olmoe-tiny").layers[0].router.bias is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
        ({"head_dim": 8}, "head_dim=8 differs"),
        ({"num_attention_heads": 5}, "not divisible by num_attention_heads=5"),
        ({"num_experts": None}, "missing required key 'num_experts'"),
        ({"num_experts_per_tok": 9}, "exceeds num_experts=8"),
        ({"clip_qkv": -1}, "clip_qkv must be a positive number"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type 'yarn'"),
    ],
)
def test_olmoe_configs_the_reference_cannot_run_are_refused(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dict({**RAW, **change})


def test_defaults_are_olmoe_configs() -> None:
    bare = {k: v for k, v in RAW.items()
            if k not in ("norm_topk_prob", "rms_norm_eps", "num_key_value_heads")}
    cfg = ModelConfig.from_dict(bare)
    assert (cfg.norm_topk_prob, cfg.rms_norm_eps, cfg.num_key_value_heads) == (False, 1e-5, 4)


def _cfg(**changes: Any) -> ModelConfig:
    return dataclasses.replace(model("olmoe-tiny").config, **changes)


def test_softmax_router_weighs_with_the_probabilities_of_all_experts() -> None:
    logits = np.array([0.5, 2.0, -1.0, 2.0, 0.0, 1.0, -3.0, 0.25], np.float32)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    chosen, weights = select_experts_softmax(logits, _cfg(norm_topk_prob=False))
    # Experts 1 and 3 tie: both are chosen, and a third-place tie would go to the lower id.
    assert chosen.tolist() == [1, 3]
    np.testing.assert_allclose(weights, probs[[1, 3]], rtol=1e-6)
    assert weights.sum() < 1
    chosen, weights = select_experts_softmax(logits, _cfg(norm_topk_prob=True))
    np.testing.assert_allclose(weights, [0.5, 0.5], rtol=1e-6)
    three, _ = select_experts_softmax(np.array([1, 0, 1, 1, 0, 0, 0, 0], np.float32),
                                      _cfg(num_experts_per_tok=2))
    assert three.tolist() == [0, 2]


def test_clip_qkv_clamps_queries_keys_and_values() -> None:
    m = model("olmoe-tiny")
    aw = m.layers[0].attention
    assert isinstance(aw, MhaWeights)
    x = np.random.default_rng(0).standard_normal((3, m.config.hidden_size)).astype(np.float32)
    cos, sin = cos_sin(np.arange(3), m.config.qk_head_dim, m.config.rope_theta)
    free = project(x, aw, m.config, cos, sin, dense_matmul)
    clipped = project(x, aw, _cfg(clip_qkv=0.1), cos, sin, dense_matmul)
    assert max(float(np.abs(a).max()) for a in free) > 0.1
    assert float(np.abs(clipped[2]).max()) <= np.float32(0.1)  # values are not rotated
    assert not np.array_equal(free[0], clipped[0])


@pytest.mark.parametrize("field", ["q_norm", "k_norm"])
def test_the_oracle_sees_the_query_and_key_norms(field: str) -> None:
    """A reference that skipped OLMoE's q/k RMSNorm weights would fail the oracle."""
    m = model("olmoe-tiny")
    layers = []
    for lw in m.layers:
        aw = lw.attention
        assert isinstance(aw, MhaWeights)
        ones = np.ones_like(getattr(aw, field))
        layers.append(dataclasses.replace(lw, attention=dataclasses.replace(aw, **{field: ones})))
    changed = ReferenceModel(m.config, m.checkpoint)
    changed.layers = layers
    logits = changed.forward(oracle("olmoe-tiny")["full_ids"])
    assert max_excess(logits, oracle_logits("olmoe-tiny"), 1e-4) > 0
