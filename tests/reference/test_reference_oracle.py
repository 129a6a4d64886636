"""The reference engine against the HF transformers oracle fixtures (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, max_excess
from support.reference_support import ORACLE_FIXTURES, greedy, model, oracle, oracle_logits

from colibri.resources import fixture_model_dir


def tolerance(name: str) -> Tolerance:
    """The fixture's kind-(b) rule (spec/model.md §15) over the positions its oracle compares."""
    return Tolerance.for_model_dir(fixture_model_dir(name), positions=len(oracle(name)["full_ids"]))


@pytest.mark.parametrize("name", ORACLE_FIXTURES)
def test_teacher_forced_logits_match_transformers(name: str) -> None:
    logits = model(name).forward(oracle(name)["full_ids"])
    expected = oracle_logits(name)
    assert logits.dtype == np.float32
    assert logits.shape == expected.shape
    assert max_excess(logits, expected, tolerance(name).logit) <= 0


@pytest.mark.parametrize("name", ORACLE_FIXTURES)
def test_teacher_forced_argmax_matches_every_position(name: str) -> None:
    logits = model(name).forward(oracle(name)["full_ids"])
    assert [int(i) for i in np.argmax(logits, axis=-1)] == oracle(name)["tf_pred"]


@pytest.mark.parametrize("name", ORACLE_FIXTURES)
def test_greedy_generation_with_the_cache_matches(name: str) -> None:
    o = oracle(name)
    new = len(o["full_ids"]) - len(o["prompt_ids"])
    assert greedy(model(name), o["prompt_ids"], new) == o["full_ids"]


@pytest.mark.parametrize("name", ORACLE_FIXTURES)
def test_incremental_decode_equals_full_forward(name: str) -> None:
    m = model(name)
    ids = oracle(name)["full_ids"]
    full = m.forward(ids)
    state = m.new_state()
    split = len(ids) // 3
    incremental = np.concatenate(
        [m.prefill(state, ids[:split])] + [m.decode(state, t)[None] for t in ids[split:]]
    )
    # Two summation orders of the same math (gemm vs per-row gemv, naive vs absorbed MLA):
    # reordering error, so kind (b) by the same rule (spec/model.md §10, §15).
    assert max_excess(incremental, full, tolerance(name).logit) <= 0


def test_oracle_files_record_versions_and_margins() -> None:
    for name in ORACLE_FIXTURES:
        o = oracle(name)
        assert o["transformers_version"] == "5.24.0"
        assert o["min_margin"] >= 1e-3
        assert o["full_ids"][: len(o["prompt_ids"])] == o["prompt_ids"]
        # Teacher forcing predicts each generated token from its prefix.
        p = len(o["prompt_ids"])
        assert o["tf_pred"][p - 1 : -1] == o["full_ids"][p:]


def test_glm5_tiny_uses_colibri_geometry() -> None:
    cfg = model("glm5-tiny").config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (256, 128, 5)
    assert (cfg.first_k_dense_replace, cfg.num_attention_heads) == (3, 4)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (8, 2, 1)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank) == (64, 32)
    assert (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim) == (24, 8, 32)
    assert (cfg.intermediate_size, cfg.moe_intermediate_size, cfg.index_topk) == (64, 32, 4096)
    assert cfg.routed_scaling_factor == 2.5 and cfg.norm_topk_prob
    assert oracle("glm5-tiny")["prompt_ids"] == [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
    assert len(oracle("glm5-tiny")["full_ids"]) == 32


def test_deepseek3_tiny_is_group_limited_bf16() -> None:
    m = model("deepseek3-tiny")
    assert m.config.n_group > 1 and m.config.topk_group > 1
    assert m.config.first_k_dense_replace == 1
    dtypes = {info.dtype for info in m.checkpoint.tensors.values()}
    assert "BF16" in dtypes
    bias = m.checkpoint.info("model.layers.1.mlp.gate.e_score_correction_bias")
    assert bias.dtype == "F32"


def test_checkpoints_store_unfused_expert_names() -> None:
    names = set(model("glm5-tiny").checkpoint.tensors)
    for e in range(8):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.3.mlp.experts.{e}.{proj}.weight" in names
    assert not any("gate_up_proj" in n for n in names)


def test_correction_bias_is_randomised() -> None:
    bias = model("glm5-tiny").layers[3].router
    assert bias is not None
    assert len(set(bias.bias.tolist())) == bias.bias.shape[0]
