"""An OLMoE ``config.json`` (transformers' ``olmoe``) read into the shared ``ModelConfig``.

OLMoE is the shared decoder with standard multi-head attention (q/k RMSNorm over the whole
projection, rotate-half RoPE over the whole head, grouped key/value heads), the softmax top-k
router, no shared experts and an MoE in every layer (families.py). Its experts' width is
``intermediate_size`` (there is no separate ``moe_intermediate_size``), and HF names the
expert count ``num_experts``. Defaults are OlmoeConfig's in transformers 5.24.0 for the keys
that do not size the architecture; sizes have no default (a guess would run the wrong model).

The keys both standard-attention families read alike are checked in mha_config.py.

Spec: spec/model.md §2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from colibri.reference.config import ConfigReader, ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.mha_config import (
    even_head_dim,
    key_value_heads,
    mha_config,
    routed_experts,
)

#: OlmoeConfig's defaults (transformers 5.24.0) for keys that do not size the model.
OLMOE_DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-5, "norm_topk_prob": False}


def olmoe_config(raw: Mapping[str, Any], generation: Mapping[str, Any] | None) -> ModelConfig:
    r = ConfigReader(raw)
    layers = r.positive("num_hidden_layers")
    hidden = r.positive("hidden_size")
    heads = r.positive("num_attention_heads")
    if hidden % heads:
        raise CheckpointError(
            f"config.json: hidden_size={hidden} is not divisible by num_attention_heads={heads}"
        )
    head_dim = hidden // heads
    declared = raw.get("head_dim")
    if declared is not None and declared != head_dim:
        # HF's OLMoE q_norm spans hidden_size, so the heads must tile it exactly.
        raise CheckpointError(
            f"config.json: head_dim={declared!r} differs from hidden_size / "
            f"num_attention_heads = {head_dim} (OLMoE's q_norm spans hidden_size)"
        )
    even_head_dim(head_dim)
    kv_heads = key_value_heads(r, heads, default=heads)  # OlmoeConfig: None means heads
    experts = routed_experts(r)
    clip = raw.get("clip_qkv")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int | float)
                             or clip <= 0):
        raise CheckpointError("config.json: clip_qkv must be a positive number or null")
    inter = r.positive("intermediate_size")
    return mha_config(
        raw, generation, model_type="olmoe", heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        intermediate=inter, moe_intermediate=inter, experts=experts,
        mlp_layer_types=("sparse",) * layers, defaults=OLMOE_DEFAULTS,
        clip_qkv=None if clip is None else float(clip),
    )
