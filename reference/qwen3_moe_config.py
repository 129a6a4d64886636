"""A Qwen3-MoE ``config.json`` (transformers' ``qwen3_moe``) read into the shared ``ModelConfig``.

Qwen3-MoE is OLMoE's shape (standard multi-head attention, softmax top-k router, no shared
experts; mha_config.py) with four differences:

* the q/k RMSNorm normalises each head on its own with one ``[head_dim]`` weight
  (``qk_norm`` "head", spec/model.md §5.3), so the head dimension need not tile
  ``hidden_size``: ``head_dim`` is its own key (Qwen3-30B-A3B: 128 with hidden 2048 and 32
  heads), ``hidden_size / num_attention_heads`` only when it is absent;
* the experts are ``moe_intermediate_size`` wide and a dense layer ``intermediate_size``;
* a layer is dense when it is listed in ``mlp_only_layers`` or ``(layer + 1)`` is not a
  multiple of ``decoder_sparse_step`` (HF's ``Qwen3MoeDecoderLayer`` rule), else MoE;
* there is no ``clip_qkv``; sliding-window attention (``use_sliding_window``) is refused;
  the expert count may be ``num_experts`` or ``num_local_experts`` (HF's alias).

Defaults are Qwen3MoeConfig's in transformers 5.24.0 for the keys that do not size the model;
sizes, ``num_key_value_heads`` included, have no default (HF's are the 30B model's).

Spec: spec/model.md §2.1.
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

#: Qwen3MoeConfig's defaults (transformers 5.24.0) for keys that do not size the model.
QWEN3_MOE_DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "norm_topk_prob": False,
                                      "decoder_sparse_step": 1}


def qwen3_moe_config(raw: Mapping[str, Any], generation: Mapping[str, Any] | None) -> ModelConfig:
    r = ConfigReader(raw)
    layers = r.positive("num_hidden_layers")
    heads = r.positive("num_attention_heads")
    kv_heads = key_value_heads(r, heads, default=None)
    experts = routed_experts(r, _experts_key(raw))
    if raw.get("use_sliding_window"):
        raise CheckpointError("config.json: use_sliding_window=true is not supported "
                              "(the reference attends to every earlier position)")
    return mha_config(
        raw, generation, model_type="qwen3_moe", heads=heads, kv_heads=kv_heads,
        head_dim=even_head_dim(_head_dim(r, heads)),
        intermediate=r.positive("intermediate_size"),
        moe_intermediate=r.positive("moe_intermediate_size"), experts=experts,
        mlp_layer_types=sparse_schedule(r, layers), defaults=QWEN3_MOE_DEFAULTS, clip_qkv=None,
    )


def _experts_key(raw: Mapping[str, Any]) -> str:
    """Where the expert count is: Qwen3MoeConfig maps ``num_experts`` onto
    ``num_local_experts`` (its ``attribute_map``), so Hub checkpoints write the first and
    transformers 5.24 saves the second; a config with both must agree."""
    both = raw.get("num_experts"), raw.get("num_local_experts")
    if None not in both and both[0] != both[1]:
        raise CheckpointError(f"config.json: num_experts={both[0]!r} and "
                              f"num_local_experts={both[1]!r} disagree")
    return "num_experts" if both[1] is None else "num_local_experts"


def _head_dim(r: ConfigReader, heads: int) -> int:
    if r.raw.get("head_dim") is not None:
        return r.positive("head_dim")
    hidden = r.positive("hidden_size")
    if hidden % heads:
        # HF would floor the division and build projections narrower than hidden_size; a
        # checkpoint like that declares its head_dim.
        raise CheckpointError(
            f"config.json: no head_dim, and hidden_size={hidden} is not divisible by "
            f"num_attention_heads={heads}"
        )
    return hidden // heads


def sparse_schedule(r: ConfigReader, layers: int) -> tuple[str, ...]:
    """Each layer "sparse" or "dense" by ``mlp_only_layers`` and ``decoder_sparse_step``."""
    step = r.positive_or("decoder_sparse_step", QWEN3_MOE_DEFAULTS["decoder_sparse_step"])
    listed = r.raw.get("mlp_only_layers") or []
    if not isinstance(listed, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in listed
    ):
        raise CheckpointError(
            f"config.json: mlp_only_layers must list layer indices in 0..{layers - 1}"
        )
    dense = set(listed)
    return tuple("dense" if i in dense or (i + 1) % step else "sparse" for i in range(layers))
