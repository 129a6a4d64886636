"""A Kimi K2.5 ``config.json`` (transformers' ``kimi_k25``) read into the shared ``ModelConfig``.

transformers 5.24's ``Kimi_K25ForConditionalGeneration`` is a vision tower and projector in
front of an unchanged ``deepseek_v3`` text model (``text_config``; the Hub's older
``kimi_k2`` spelling is that same model), with the lm_head on the wrapper. For text the math
is DeepSeek-V3's, so the family's delta is nil (families.py) and this reader is the whole of
it: the text config is read as DeepSeek-V3's, and two keys come from the wrapper:
``tie_word_embeddings`` (the wrapper's lm_head is the one tied, and Kimi_K25Config defaults it
to true) and the end-of-text ids of ``generation_config.json``. The vision tower's tensors are
not read; checkpoint names are mapped by safetensors.py's wrapper prefixes.

Spec: spec/model.md §2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError

#: The text models a kimi_k25 wrapper may hold: transformers maps ``kimi_k2`` to deepseek_v3.
TEXT_MODEL_TYPES = ("deepseek_v3", "kimi_k2")


def kimi_config(raw: Mapping[str, Any], generation: Mapping[str, Any] | None) -> ModelConfig:
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError("config.json: kimi_k25 needs a `text_config` object (the text "
                              "model's config)")
    text_type = text.get("model_type", "deepseek_v3")
    if text_type not in TEXT_MODEL_TYPES:
        raise CheckpointError(f"config.json: text_config.model_type {text_type!r} is not a "
                              f"kimi_k25 text model ({', '.join(TEXT_MODEL_TYPES)})")
    tied = raw.get("tie_word_embeddings", True)
    if not isinstance(tied, bool):
        raise CheckpointError("config.json: tie_word_embeddings must be a boolean")
    inner = ModelConfig.from_dict({**text, "model_type": "deepseek_v3",
                                   "tie_word_embeddings": tied}, generation)
    return dataclasses.replace(inner, model_type="kimi_k25")
