"""Kimi K2.5 (``kimi_k25``) on the reference: its config is a wrapper around a DeepSeek-V3
``text_config``, read as DeepSeek-V3's with the wrapper's ``tie_word_embeddings``
(reference/kimi_config.py), and its checkpoint keeps the text model under a wrapper prefix
(reference/safetensors.py). The oracle itself is in test_reference_oracle.py."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from colibri.reference import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.families import FAMILIES
from colibri.reference.safetensors import Checkpoint, text_model_name

from colibri.resources import fixture_model_dir

KIMI = fixture_model_dir("kimi-tiny")
RAW: dict[str, Any] = json.loads((KIMI / "config.json").read_text())


def test_the_text_model_is_deepseek_v3_unchanged() -> None:
    kimi = ModelConfig.from_dir(KIMI)
    text = ModelConfig.from_dict({**RAW["text_config"], "model_type": "deepseek_v3"},
                                 {"eos_token_id": [385, 386]})
    assert kimi == dataclasses.replace(text, model_type="kimi_k25")
    assert dataclasses.replace(FAMILIES["kimi_k25"], model_type="deepseek_v3") == FAMILIES[
        "deepseek_v3"]
    assert kimi.eos_token_ids == (385, 386) and not kimi.tie_word_embeddings


def test_the_wrappers_tie_flag_decides_and_defaults_to_true() -> None:
    """Kimi_K25Config ties the wrapper's lm_head unless told not to; the text config's own
    flag is not the one transformers reads."""
    untied_text = {**RAW["text_config"], "tie_word_embeddings": False}
    assert ModelConfig.from_dict({"model_type": "kimi_k25",
                                  "text_config": untied_text}).tie_word_embeddings


@pytest.mark.parametrize(("raw", "message"), [
    ({"model_type": "kimi_k25"}, "needs a `text_config` object"),
    ({"model_type": "kimi_k25", "text_config": {"model_type": "qwen3_moe"}},
     "text_config.model_type 'qwen3_moe' is not a kimi_k25 text model"),
    ({"model_type": "kimi_k25", "text_config": RAW["text_config"], "tie_word_embeddings": 1},
     "tie_word_embeddings must be a boolean"),
])
def test_bad_configs_are_refused_by_name(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dict(raw)


def test_wrapper_prefixes_read_as_the_text_models_names() -> None:
    names = Checkpoint(KIMI).tensors
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert names["model.norm.weight"].name == "model.language_model.norm.weight"
    assert text_model_name("language_model.lm_head.weight") == "lm_head.weight"
    assert text_model_name("model.vision_tower.patch_embed.proj.weight") == (
        "model.vision_tower.patch_embed.proj.weight")
