"""What the standard-attention families (OLMoE, Qwen3-MoE) read alike from ``config.json``.

Both are the shared decoder with grouped-query attention ("mha"), the softmax top-k router and
no shared experts, latent or indexer (families.py). They differ in where the head dimension
comes from, how wide the experts are, which layers are dense, what a q/k norm spans and
``clip_qkv`` -- each family's module (olmoe_config.py, qwen3_moe_config.py) reads that delta
and hands it here, where the keys they share are checked and the record is built with the
MLA-only fields zeroed.

Spec: spec/model.md §2.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from colibri.reference.config import ConfigReader, ModelConfig, eos_union, rope_theta
from colibri.reference.errors import CheckpointError
from colibri.reference.families import FAMILIES


def even_head_dim(head_dim: int) -> int:
    """The head dimension, which RoPE's rotate-half layout splits in two halves."""
    if head_dim % 2:
        raise CheckpointError(f"config.json: head dimension {head_dim} must be even (RoPE)")
    return head_dim


def key_value_heads(r: ConfigReader, heads: int, default: int | None) -> int:
    """``num_key_value_heads`` (``default`` when absent; None: required); it must divide the
    query heads, each key/value head serving a group of them."""
    kv_heads = r.positive("num_key_value_heads") if default is None else r.positive_or(
        "num_key_value_heads", default)
    if heads % kv_heads:
        raise CheckpointError(
            f"config.json: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    return kv_heads


def routed_experts(r: ConfigReader, key: str = "num_experts") -> tuple[int, int]:
    """(experts, ``num_experts_per_tok``), the experts under ``key``."""
    experts = r.positive(key)
    top_k = r.positive("num_experts_per_tok")
    if top_k > experts:
        raise CheckpointError(
            f"config.json: num_experts_per_tok={top_k} exceeds {key}={experts}"
        )
    return experts, top_k


def mha_config(
    raw: Mapping[str, Any],
    generation: Mapping[str, Any] | None,
    *,
    model_type: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    moe_intermediate: int,
    experts: tuple[int, int],
    mlp_layer_types: tuple[str, ...],
    defaults: Mapping[str, Any],
    clip_qkv: float | None,
) -> ModelConfig:
    """The record of a standard-attention family, from its delta and the keys both share.

    ``defaults`` are the family's HF config defaults for ``norm_topk_prob`` and
    ``rms_norm_eps``; the head dimension fills both RoPE's and the value's slot (RoPE turns the
    whole head and there is no latent)."""
    r = ConfigReader(raw)
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported (silu only)")
    if raw.get("attention_bias"):
        raise CheckpointError("config.json: attention_bias=true is not supported")
    family = FAMILIES[model_type]
    assert family.qk_norm is not None, f"{model_type} is not a standard-attention family"
    return ModelConfig(
        model_type=model_type,
        vocab_size=r.positive("vocab_size"),
        hidden_size=r.positive("hidden_size"),
        num_hidden_layers=len(mlp_layer_types),
        num_attention_heads=heads,
        intermediate_size=intermediate,
        moe_intermediate_size=moe_intermediate,
        first_k_dense_replace=0,
        n_routed_experts=experts[0],
        num_experts_per_tok=experts[1],
        n_shared_experts=0,
        n_group=1,
        topk_group=1,
        norm_topk_prob=bool(raw.get("norm_topk_prob", defaults["norm_topk_prob"])),
        routed_scaling_factor=1.0,
        q_lora_rank=None,
        kv_lora_rank=0,
        qk_nope_head_dim=0,
        qk_rope_head_dim=head_dim,
        v_head_dim=head_dim,
        rms_norm_eps=r.number("rms_norm_eps", defaults["rms_norm_eps"]),
        rope_theta=rope_theta(raw),
        rope_interleave=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        mlp_layer_types=mlp_layer_types,
        indexer_types=None,
        index_topk=0,
        index_n_heads=0,
        index_head_dim=0,
        num_nextn_predict_layers=0,
        eos_token_ids=eos_union(raw.get("eos_token_id"), (generation or {}).get("eos_token_id")),
        attention=family.attention,
        router=family.router,
        num_key_value_heads=kv_heads,
        clip_qkv=clip_qkv,
        qk_norm=family.qk_norm,
    )
