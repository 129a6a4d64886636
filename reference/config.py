"""The model configuration: every config.json key that changes the math, validated.

GLM-5 (``glm_moe_dsa``) and DeepSeek-V3 (``deepseek_v3``) share one architecture: MLA
attention with a latent KV, sigmoid ``noaux_tc`` routing over routed experts plus shared
experts, and a few dense layers first. GLM-5 adds the DSA lightning indexer. Other families
(families.py) are read by their own module into the same record (OLMoE: olmoe_config.py,
Qwen3-MoE: qwen3_moe_config.py; Kimi: kimi_config.py).
Keys that do not change the numbers (dropout, initializer range, ...) are ignored; keys that
would change them in a way the reference does not implement are refused rather than silently
ignored.

Spec: spec/model.md §2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.reference.errors import CheckpointError
from colibri.reference.families import FAMILIES

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)

#: HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm class default eps (1e-6), not
#: config.rms_norm_eps; the oracle therefore uses 1e-6 there, and so do we.
LATENT_NORM_EPS = 1e-6
#: The DSA indexer's key LayerNorm eps is fixed in HF and colibri alike.
INDEXER_NORM_EPS = 1e-6

#: Defaults for keys a config.json may omit, per model family, copied from HF's config classes
#: (GlmMoeDsaConfig / DeepseekV3Config in transformers 5.24.0): the oracle is HF, so a config
#: that omits one of these keys must mean what it means to HF. Architecture sizes (vocab,
#: hidden, heads, ranks, head dims, expert counts) have no default here: HF's defaults are the
#: full-size model's, and silently assuming them for another checkpoint would be a guess.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "glm_moe_dsa": {
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "q_lora_rank": 2048,
        "rms_norm_eps": 1e-5,
    },
    "deepseek_v3": {
        "n_group": 8,
        "topk_group": 4,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "q_lora_rank": 1536,
        "rms_norm_eps": 1e-6,
    },
}


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rms_norm_eps: float
    rope_theta: float
    #: True for the DeepSeek/GLM interleaved pair layout (the only one GLM-5 uses).
    rope_interleave: bool
    tie_word_embeddings: bool
    #: Per layer: "dense" (SwiGLU MLP) or "sparse" (MoE).
    mlp_layer_types: tuple[str, ...]
    #: DSA indexer: None when the model has none (DeepSeek-V3); else per layer "full"/"shared".
    indexer_types: tuple[str, ...] | None
    index_topk: int
    index_n_heads: int
    index_head_dim: int
    #: MTP heads stored after the main layers (0 or 1 are supported).
    num_nextn_predict_layers: int
    eos_token_ids: tuple[int, ...]
    #: The family's attention and router (families.py): "mla"/"mha", "noaux_tc"/"softmax".
    #: An "mha" family's head dimension is qk_rope_head_dim (RoPE turns the whole head) and
    #: v_head_dim; its qk_nope_head_dim and kv_lora_rank are 0 (there is no latent).
    attention: str = "mla"
    router: str = "noaux_tc"
    #: "mha": heads sharing one key/value head come in groups of H / num_key_value_heads.
    num_key_value_heads: int = 0
    #: "mha": queries, keys and values are clamped to [-clip_qkv, clip_qkv] (None: not).
    clip_qkv: float | None = None
    #: "mha": what one q/k RMSNorm spans, "projection" (OLMoE) or "head" (Qwen3-MoE).
    qk_norm: str = "projection"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.qk_head_dim)

    def is_sparse(self, layer: int) -> bool:
        return self.mlp_layer_types[layer] == "sparse"

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        path = model_dir / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{model_dir}: no config.json")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: top level must be an object")
        generation: dict[str, Any] = {}
        gen_path = model_dir / "generation_config.json"
        if gen_path.is_file():
            try:
                loaded = json.loads(gen_path.read_text())
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{gen_path}: not valid JSON ({exc})") from exc
            if isinstance(loaded, dict):
                generation = loaded
        return cls.from_dict(raw, generation)

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        r = ConfigReader(raw)
        model_type = r.get("model_type", str)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"config.json: model_type {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if model_type == "olmoe":
            # Imported here: the family readers build this class.
            from colibri.reference.olmoe_config import olmoe_config

            return olmoe_config(raw, generation)
        if model_type == "qwen3_moe":
            from colibri.reference.qwen3_moe_config import qwen3_moe_config

            return qwen3_moe_config(raw, generation)
        if model_type == "kimi_k25":
            from colibri.reference.kimi_config import kimi_config

            return kimi_config(raw, generation)
        defaults = FAMILY_DEFAULTS[model_type]
        layers = r.positive("num_hidden_layers")
        dense = r.get("first_k_dense_replace", int, 3)
        if not 0 <= dense <= layers:
            raise CheckpointError(
                f"config.json: first_k_dense_replace={dense} is outside 0..{layers}"
            )
        mlp_types = r.optional_list("mlp_layer_types")
        if mlp_types is None:
            mlp_types = ["dense"] * dense + ["sparse"] * (layers - dense)
        if len(mlp_types) != layers or any(t not in ("dense", "sparse") for t in mlp_types):
            raise CheckpointError(
                "config.json: mlp_layer_types must list 'dense'/'sparse' once per layer"
            )

        experts = r.positive("n_routed_experts")
        top_k = r.positive("num_experts_per_tok")
        n_group = r.get("n_group", int, defaults["n_group"]) or 1
        topk_group = r.get("topk_group", int, defaults["topk_group"]) or 1
        if top_k > experts:
            raise CheckpointError(
                f"config.json: num_experts_per_tok={top_k} exceeds n_routed_experts={experts}"
            )
        if experts % n_group:
            raise CheckpointError(
                f"config.json: n_routed_experts={experts} is not divisible by n_group={n_group}"
            )
        if not 1 <= topk_group <= n_group:
            raise CheckpointError(f"config.json: topk_group={topk_group} is outside 1..{n_group}")
        if n_group > 1 and experts // n_group < 2:
            raise CheckpointError("config.json: group-limited routing needs >= 2 experts per group")
        if top_k > topk_group * (experts // n_group):
            raise CheckpointError(
                "config.json: num_experts_per_tok exceeds the experts in topk_group groups"
            )
        scoring = raw.get("scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise CheckpointError(f"config.json: scoring_func {scoring!r} is not supported")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"config.json: hidden_act {act!r} is not supported (silu only)")
        if raw.get("attention_bias"):
            raise CheckpointError("config.json: attention_bias=true is not supported")

        theta = rope_theta(raw)
        interleave = bool(raw.get("rope_interleave", True))
        if model_type == "glm_moe_dsa" and not interleave:
            # HF's GLM attention and indexer always use the interleaved layout and never read
            # this key; honouring false would diverge from the oracle, ignoring it would hide
            # a contradictory config.
            raise CheckpointError(
                "config.json: rope_interleave=false is not supported for glm_moe_dsa "
                "(GLM-5 always uses the interleaved RoPE layout)"
            )

        q_lora = raw.get("q_lora_rank", defaults["q_lora_rank"])
        if q_lora is None and model_type == "glm_moe_dsa":
            raise CheckpointError(
                "config.json: q_lora_rank=null is not supported for glm_moe_dsa "
                "(GLM-5 attention always has a low-rank query projection)"
            )
        if q_lora is not None and (
            isinstance(q_lora, bool) or not isinstance(q_lora, int) or q_lora <= 0
        ):
            raise CheckpointError("config.json: q_lora_rank must be a positive integer or null")

        indexer_types: tuple[str, ...] | None = None
        if model_type == "glm_moe_dsa":
            listed = r.optional_list("indexer_types")
            if listed is None:
                listed = _indexer_types_from_pattern(raw.get("index_topk_pattern"))
            if listed is None:
                freq = max(r.get("index_topk_freq", int, 1), 1)
                offset = r.get("index_skip_topk_offset", int, 2)
                listed = [
                    "full" if (max(i - offset + 1, 0) % freq) == 0 else "shared"
                    for i in range(layers)
                ]
            if len(listed) != layers or any(t not in ("full", "shared") for t in listed):
                raise CheckpointError(
                    "config.json: indexer_types (or index_topk_pattern) must list 'full'/'shared' "
                    "once per layer"
                )
            if listed[0] != "full":
                raise CheckpointError(
                    "config.json: indexer_types[0] must be 'full' (a shared layer reuses the "
                    "previous full layer's selection)"
                )
            indexer_types = tuple(listed)

        rope_dim = r.positive("qk_rope_head_dim")
        if rope_dim % 2:
            raise CheckpointError(f"config.json: qk_rope_head_dim={rope_dim} must be even")
        index_head_dim = r.positive_or("index_head_dim", 128) if indexer_types else 0
        if indexer_types and index_head_dim < rope_dim:
            raise CheckpointError("config.json: index_head_dim must be >= qk_rope_head_dim")
        mtp = r.get("num_nextn_predict_layers", int, 0)
        if mtp not in (0, 1):
            raise CheckpointError(
                f"config.json: num_nextn_predict_layers={mtp} (only 0 or 1 are supported)"
            )
        return cls(
            model_type=model_type,
            vocab_size=r.positive("vocab_size"),
            hidden_size=r.positive("hidden_size"),
            num_hidden_layers=layers,
            num_attention_heads=r.positive("num_attention_heads"),
            intermediate_size=r.positive("intermediate_size"),
            moe_intermediate_size=r.positive("moe_intermediate_size"),
            first_k_dense_replace=dense,
            n_routed_experts=experts,
            num_experts_per_tok=top_k,
            n_shared_experts=r.get("n_shared_experts", int, 1) or 0,
            n_group=n_group,
            topk_group=topk_group,
            norm_topk_prob=bool(raw.get("norm_topk_prob", defaults["norm_topk_prob"])),
            routed_scaling_factor=float(
                r.number("routed_scaling_factor", defaults["routed_scaling_factor"])
            ),
            q_lora_rank=q_lora,
            kv_lora_rank=r.positive("kv_lora_rank"),
            qk_nope_head_dim=r.positive("qk_nope_head_dim"),
            qk_rope_head_dim=rope_dim,
            v_head_dim=r.positive("v_head_dim"),
            rms_norm_eps=float(r.number("rms_norm_eps", defaults["rms_norm_eps"])),
            rope_theta=float(theta),
            rope_interleave=interleave,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            mlp_layer_types=tuple(mlp_types),
            indexer_types=indexer_types,
            index_topk=r.positive_or("index_topk", 2048) if indexer_types else 0,
            index_n_heads=r.positive_or("index_n_heads", 32) if indexer_types else 0,
            index_head_dim=index_head_dim,
            num_nextn_predict_layers=mtp,
            eos_token_ids=eos_union(
                raw.get("eos_token_id"), (generation or {}).get("eos_token_id")
            ),
        )


def rope_theta(raw: Mapping[str, Any]) -> float:
    """The RoPE base of a config whose RoPE is plain (``rope_type`` "default"); any other
    scaling is refused."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise CheckpointError("config.json: rope_parameters must be an object")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(
            f"config.json: rope_parameters.rope_type {rope_type!r} is not supported "
            "(the reference implements plain RoPE only)"
        )
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
        raise CheckpointError("config.json: rope_theta must be a positive number")
    return float(theta)


def _indexer_types_from_pattern(pattern: Any) -> list[str] | None:
    """HF's ``index_topk_pattern`` rule: a string maps ``F`` -> full and ``S`` -> shared per
    layer; a list is taken as it is. None when the key is absent (the freq/offset rule applies)."""
    if pattern is None:
        return None
    if isinstance(pattern, str):
        letters = {"F": "full", "S": "shared"}
        bad = sorted({c for c in pattern if c not in letters})
        if bad:
            raise CheckpointError(
                f"config.json: index_topk_pattern may hold only 'F' and 'S', got {bad}"
            )
        return [letters[c] for c in pattern]
    if isinstance(pattern, list) and all(isinstance(v, str) for v in pattern):
        return list(pattern)
    raise CheckpointError(
        "config.json: index_topk_pattern must be a string of 'F'/'S' or a list of strings"
    )


def eos_union(*values: Any) -> tuple[int, ...]:
    """config.json and generation_config.json eos ids, unioned in first-seen order (colibri)."""
    out: list[int] = []
    for value in values:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, int) and not isinstance(item, bool) and item not in out:
                out.append(item)
    return tuple(out)


class ConfigReader:
    """Typed access to config keys with errors that name the key."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        if key not in self.raw or self.raw[key] is None:
            if default is None:
                raise CheckpointError(f"config.json: missing required key {key!r}")
            return default
        value = self.raw[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise CheckpointError(f"config.json: {key} must be an integer, got {value!r}")
        if kind is str and not isinstance(value, str):
            raise CheckpointError(f"config.json: {key} must be a string, got {value!r}")
        return value

    def positive(self, key: str) -> int:
        value: int = self.get(key, int)
        if value <= 0:
            raise CheckpointError(f"config.json: {key} must be positive, got {value}")
        return value

    def positive_or(self, key: str, default: int) -> int:
        value: int = self.get(key, int, default)
        if value <= 0:
            raise CheckpointError(f"config.json: {key} must be positive, got {value}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CheckpointError(f"config.json: {key} must be a number, got {value!r}")
        return float(value)

    def optional_list(self, key: str) -> list[str] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise CheckpointError(f"config.json: {key} must be a list of strings")
        return list(value)
