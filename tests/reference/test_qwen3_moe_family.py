"""Qwen3-MoE as a family delta over OLMoE's shape: its config reader (head_dim, the dense-layer
schedule, the expert-count alias), the per-head q/k RMSNorm and the renormalised softmax router
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
from colibri.reference.norms import rms_norm
from colibri.reference.rope import cos_sin
from colibri.reference.softmax_router import select_experts_softmax
from colibri.reference.tensors import dense_matmul
from colibri.reference.weights import MhaWeights
from support.reference_support import model, oracle, oracle_logits

from colibri.resources import fixture_model_dir

NAME = "qwen3moe-tiny"
RAW: dict[str, Any] = json.loads((fixture_model_dir(NAME) / "config.json").read_text())


def test_the_fixture_reads_as_the_qwen3_moe_delta() -> None:
    m = model(NAME)
    cfg, family = m.config, FAMILIES["qwen3_moe"]
    assert (cfg.attention, cfg.router, cfg.qk_norm) == (family.attention, family.router,
                                                         family.qk_norm) == ("mha", "softmax",
                                                                             "head")
    assert cfg.mlp_layer_types == ("sparse", "dense", "sparse") and cfg.n_shared_experts == 0
    # head_dim is declared and does not tile hidden_size (64 / 4 = 16), as in Qwen3-30B-A3B.
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.qk_head_dim) == (4, 2, 24)
    assert (cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank, cfg.clip_qkv) == (
        24, 24, 0, None)
    assert (cfg.intermediate_size, cfg.moe_intermediate_size) == (32, 16)
    assert cfg.norm_topk_prob and not cfg.rope_interleave and cfg.indexer_types is None
    assert cfg.eos_token_ids == (386, 384)  # <|im_end|>, then generation_config's <|endoftext|>
    dense, sparse = m.layers[1], m.layers[2]
    assert dense.router is None and dense.dense is not None and dense.dense.gate.shape == (32, 64)
    assert sparse.dense is None and sparse.router is not None and sparse.router.bias is None
    aw = sparse.attention
    assert isinstance(aw, MhaWeights)
    assert (aw.q.shape, aw.q_norm.shape, aw.k_norm.shape, aw.o.shape) == (
        (96, 64), (24,), (24,), (64, 96))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
        ({"num_key_value_heads": None}, "missing required key 'num_key_value_heads'"),
        ({"head_dim": 7}, "head dimension 7 must be even"),
        ({"head_dim": None, "num_attention_heads": 6}, "no head_dim, and hidden_size=64 is not"),
        ({"num_local_experts": None}, "missing required key 'num_experts'"),
        ({"num_experts": 4}, "num_experts=4 and num_local_experts=8 disagree"),
        ({"num_experts_per_tok": 9}, "exceeds num_local_experts=8"),
        ({"moe_intermediate_size": None}, "missing required key 'moe_intermediate_size'"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step must be positive"),
        ({"mlp_only_layers": [3]}, r"mlp_only_layers must list layer indices in 0\.\.2"),
        ({"mlp_only_layers": "1"}, "mlp_only_layers must list"),
        ({"use_sliding_window": True}, "use_sliding_window=true"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type 'yarn'"),
    ],
)
def test_qwen3_moe_configs_the_reference_cannot_run_are_refused(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dict({**RAW, **change})


def test_qwen3_5_moe_is_not_read_as_qwen3_moe() -> None:
    """colibri's Qwen3.6 is transformers' qwen3_5_moe (Gated DeltaNet layers): other math, so
    it is refused by its model_type rather than run as this family (spec/DEVIATIONS.md)."""
    with pytest.raises(CheckpointError, match="model_type 'qwen3_5_moe' is not supported"):
        ModelConfig.from_dict({**RAW, "model_type": "qwen3_5_moe"})


def test_defaults_are_qwen3_moe_configs_and_hub_names_read_alike() -> None:
    """Without the keys, Qwen3MoeConfig's defaults; a Hub config's ``num_experts`` is the
    ``num_local_experts`` transformers saves; without head_dim it is hidden / heads."""
    dropped = ("norm_topk_prob", "rms_norm_eps", "decoder_sparse_step", "mlp_only_layers",
               "num_local_experts", "head_dim", "use_sliding_window", "sliding_window")
    hub = {**{k: v for k, v in RAW.items() if k not in dropped}, "num_experts": 8}
    cfg = ModelConfig.from_dict(hub)
    assert (cfg.norm_topk_prob, cfg.rms_norm_eps, cfg.n_routed_experts) == (False, 1e-6, 8)
    assert cfg.mlp_layer_types == ("sparse",) * 3 and cfg.qk_head_dim == 16


@pytest.mark.parametrize(
    ("step", "listed", "expected"),
    [
        (1, [], "SSSS"),
        (2, [], "DSDS"),  # HF: MoE where (layer + 1) % step == 0
        (2, [3], "DSDD"),
        (1, [0, 2], "DSDS"),
        (5, [], "DDDD"),
    ],
)
def test_dense_layers_follow_hfs_schedule(step: int, listed: list[int], expected: str) -> None:
    cfg = ModelConfig.from_dict({**RAW, "num_hidden_layers": 4, "decoder_sparse_step": step,
                                 "mlp_only_layers": listed})
    assert "".join(t[0].upper() for t in cfg.mlp_layer_types) == expected


def _cfg(**changes: Any) -> ModelConfig:
    return dataclasses.replace(model(NAME).config, **changes)


def _unit_norms(aw: MhaWeights) -> MhaWeights:
    return dataclasses.replace(aw, q_norm=np.ones_like(aw.q_norm),
                               k_norm=np.ones_like(aw.k_norm))


def test_each_query_and_key_head_is_normalised_on_its_own() -> None:
    """With unit norm weights every head of q and k has RMS 1 before RoPE, and RoPE (a
    rotation of pairs) keeps it: one norm over the whole projection (OLMoE) would leave the
    heads' RMS unequal."""
    m = model(NAME)
    aw = m.layers[0].attention
    assert isinstance(aw, MhaWeights)
    x = np.random.default_rng(0).standard_normal((3, m.config.hidden_size)).astype(np.float32)
    cos, sin = cos_sin(np.arange(3), m.config.qk_head_dim, m.config.rope_theta)
    q, k, _ = project(x, _unit_norms(aw), m.config, cos, sin, dense_matmul)
    for heads in (q, k):
        rms = np.sqrt(np.mean(heads.astype(np.float64) ** 2, axis=-1))
        np.testing.assert_allclose(rms, 1.0, rtol=1e-5)
    whole = dataclasses.replace(_unit_norms(aw), q_norm=np.ones(96, np.float32),
                                k_norm=np.ones(48, np.float32))
    q_whole, _, _ = project(x, whole, _cfg(qk_norm="projection"), cos, sin, dense_matmul)
    assert np.ptp(np.sqrt(np.mean(q_whole.astype(np.float64) ** 2, axis=-1))) > 1e-2
    # The weight scales every head alike: head h is rms_norm(q_proj_h x) * q_norm, then RoPE.
    q_w, _, _ = project(x, aw, m.config, cos, sin, dense_matmul)
    raw = dense_matmul(x, aw.q).reshape(3, 4, 24)
    np.testing.assert_allclose(np.sqrt(np.mean(q_w.astype(np.float64) ** 2, axis=-1)),
                               np.sqrt(np.mean(rms_norm(raw, aw.q_norm, 1e-6).astype(
                                   np.float64) ** 2, axis=-1)), rtol=1e-5)


@pytest.mark.parametrize("field", ["q_norm", "k_norm"])
def test_the_oracle_sees_the_per_head_norms(field: str) -> None:
    """A reference that skipped Qwen3-MoE's q/k RMSNorm weights would fail the oracle."""
    m = model(NAME)
    layers = []
    for lw in m.layers:
        aw = lw.attention
        assert isinstance(aw, MhaWeights)
        ones = np.ones_like(getattr(aw, field))
        layers.append(dataclasses.replace(lw, attention=dataclasses.replace(aw, **{field: ones})))
    changed = ReferenceModel(m.config, m.checkpoint)
    changed.layers = layers
    logits = changed.forward(oracle(NAME)["full_ids"])
    assert max_excess(logits, oracle_logits(NAME), 1e-4) > 0


def test_the_router_renormalises_the_chosen_probabilities() -> None:
    """Qwen3-30B-A3B's norm_topk_prob=true: the chosen weights sum to one, in the ratio of
    their softmax probabilities."""
    m = model(NAME)
    router = m.layers[0].router
    assert router is not None
    x = np.random.default_rng(1).standard_normal(m.config.hidden_size).astype(np.float32)
    logits = (router.gate @ x).astype(np.float32)
    chosen, weights = select_experts_softmax(logits, m.config)
    assert len(chosen) == 2 and np.sum(weights, dtype=np.float64) == pytest.approx(1, abs=1e-6)
    p = np.exp(logits - logits.max())
    assert weights[0] / weights[1] == pytest.approx(p[chosen[0]] / p[chosen[1]], rel=1e-5)
