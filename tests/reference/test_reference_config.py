"""config.json parsing: HF's per-family defaults, index_topk_pattern, positive indexer sizes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError

from colibri.resources import fixture_model_dir

#: Keys that change HF's defaults' meaning; removed to see what a config without them means.
_DEFAULTED = ("n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "q_lora_rank",
              "rope_interleave", "indexer_types", "index_topk", "index_n_heads", "index_head_dim")


def _raw(name: str, **edits: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((fixture_model_dir(name) / "config.json").read_text())
    for key in _DEFAULTED:
        raw.pop(key, None)
    raw.update(edits)
    return raw


@pytest.mark.parametrize(("name", "expected"), [
    # GlmMoeDsaConfig / DeepseekV3Config class defaults in transformers 5.24.0.
    ("glm5-tiny", (1, 1, True, 2.5, 2048, True)),
    ("deepseek3-tiny", (8, 4, True, 2.5, 1536, True)),
])
def test_missing_keys_take_hf_family_defaults(name: str, expected: tuple[Any, ...]) -> None:
    raw = _raw(name, n_routed_experts=16, num_experts_per_tok=2)
    cfg = ModelConfig.from_dict(raw)
    got = (cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor,
           cfg.q_lora_rank, cfg.rope_interleave)
    assert got == expected


def test_glm_missing_indexer_sizes_take_hf_defaults() -> None:
    cfg = ModelConfig.from_dict(_raw("glm5-tiny"))
    assert (cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim) == (2048, 32, 128)


def test_glm_rope_interleave_false_is_refused() -> None:
    # HF's GLM attention always interleaves; a config saying otherwise is contradictory.
    with pytest.raises(CheckpointError, match="rope_interleave"):
        ModelConfig.from_dict(_raw("glm5-tiny", rope_interleave=False))


def test_deepseek_rope_interleave_false_is_honoured() -> None:
    assert not ModelConfig.from_dict(
        _raw("deepseek3-tiny", n_group=4, topk_group=2, rope_interleave=False)
    ).rope_interleave


def test_glm_null_q_lora_rank_is_refused_but_deepseek_allows_it() -> None:
    with pytest.raises(CheckpointError, match="q_lora_rank"):
        ModelConfig.from_dict(_raw("glm5-tiny", q_lora_rank=None))
    assert ModelConfig.from_dict(
        _raw("deepseek3-tiny", n_group=4, topk_group=2, q_lora_rank=None)
    ).q_lora_rank is None


def test_index_topk_pattern_string_builds_indexer_types() -> None:
    raw = _raw("glm5-tiny", index_topk_pattern="FSSFS", index_topk_freq=1)
    assert raw["num_hidden_layers"] == 5
    cfg = ModelConfig.from_dict(raw)
    assert cfg.indexer_types == ("full", "shared", "shared", "full", "shared")


def test_index_topk_pattern_list_is_taken_as_is() -> None:
    pattern = ["full", "full", "shared", "full", "shared"]
    cfg = ModelConfig.from_dict(_raw("glm5-tiny", index_topk_pattern=pattern))
    assert cfg.indexer_types == tuple(pattern)


def test_indexer_types_wins_over_pattern() -> None:
    listed = ["full"] * 5
    cfg = ModelConfig.from_dict(_raw("glm5-tiny", indexer_types=listed, index_topk_pattern="FSSSS"))
    assert cfg.indexer_types == tuple(listed)


@pytest.mark.parametrize(("pattern", "match"), [
    ("FSX", "index_topk_pattern may hold only"),
    ("FSS", "once per layer"),
    ("SFFFF", r"indexer_types\[0\] must be 'full'"),
    (7, "index_topk_pattern must be"),
])
def test_bad_index_topk_pattern_is_refused(pattern: Any, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        ModelConfig.from_dict(_raw("glm5-tiny", index_topk_pattern=pattern))


@pytest.mark.parametrize("key", ["index_topk", "index_n_heads", "index_head_dim"])
@pytest.mark.parametrize("value", [0, -4])
def test_indexer_sizes_must_be_positive(key: str, value: int) -> None:
    with pytest.raises(CheckpointError, match=f"{key} must be positive"):
        ModelConfig.from_dict(_raw("glm5-tiny", **{key: value}))
