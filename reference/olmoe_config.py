"""An OLMoE ``config.json`` (transformers' ``olmoe``) read into the shared ``ModelConfig``.

OLMoE is the shared decoder with standard multi-head attention (q/k RMSNorm over the whole
projection, rotate-half RoPE over the whole head, grouped key/value heads), the softmax top-k
router, no shared experts and an MoE in every layer (families.py). Its experts' width is
``intermediate_size`` (there is no separate ``moe_intermediate_size``), and HF names the
expert count ``num_experts``. Defaults are OlmoeConfig's in transformers 5.24.0 for the keys
that do not size the architecture; sizes have no default (a guess would run the wrong model).

Spec: spec/model.md §2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from colibri.reference.config import ConfigReader, ModelConfig, eos_union, rope_theta
from colibri.reference.errors import CheckpointError

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
    if head_dim % 2:
        raise CheckpointError(f"config.json: head dimension {head_dim} must be even (RoPE)")
    kv_heads = r.positive_or("num_key_value_heads", heads)
    if heads % kv_heads:
        raise CheckpointError(
            f"config.json: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    experts = r.positive("num_experts")
    top_k = r.positive("num_experts_per_tok")
    if top_k > experts:
        raise CheckpointError(
            f"config.json: num_experts_per_tok={top_k} exceeds num_experts={experts}"
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported (silu only)")
    if raw.get("attention_bias"):
        raise CheckpointError("config.json: attention_bias=true is not supported")
    clip = raw.get("clip_qkv")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int | float)
                             or clip <= 0):
        raise CheckpointError("config.json: clip_qkv must be a positive number or null")
    inter = r.positive("intermediate_size")
    return ModelConfig(
        model_type="olmoe",
        vocab_size=r.positive("vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        moe_intermediate_size=inter,
        first_k_dense_replace=0,
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        n_shared_experts=0,
        n_group=1,
        topk_group=1,
        norm_topk_prob=bool(raw.get("norm_topk_prob", OLMOE_DEFAULTS["norm_topk_prob"])),
        routed_scaling_factor=1.0,
        q_lora_rank=None,
        kv_lora_rank=0,
        qk_nope_head_dim=0,
        qk_rope_head_dim=head_dim,
        v_head_dim=head_dim,
        rms_norm_eps=r.number("rms_norm_eps", OLMOE_DEFAULTS["rms_norm_eps"]),
        rope_theta=rope_theta(raw),
        rope_interleave=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        mlp_layer_types=("sparse",) * layers,
        indexer_types=None,
        index_topk=0,
        index_n_heads=0,
        index_head_dim=0,
        num_nextn_predict_layers=0,
        eos_token_ids=eos_union(raw.get("eos_token_id"), (generation or {}).get("eos_token_id")),
        attention="mha",
        router="softmax",
        num_key_value_heads=kv_heads,
        clip_qkv=None if clip is None else float(clip),
    )
