"""Where a decoder layer's weights live in a GLM-5 (or other family's) checkpoint: tensor names
and the shapes the config implies.

Both engines load the same tensors and differ only in what they turn them into (float32 arrays
for the reference, in-place or quantized kernel operands for the accelerated engine), so the
names and shapes are written once, here, as plain data: each group maps a weight dataclass's
field name to its ``(tensor name, shape)``. Routed experts are not listed: they go through an
expert store (experts.py) keyed by (layer, expert).

Spec: spec/model.md §2, §3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError

#: One stored tensor: its name in the checkpoint and the shape the config implies.
Tensor = tuple[str, tuple[int, ...]]
#: A weight dataclass's fields, each with the tensor that fills it.
Group = dict[str, Tensor]
#: A group loaded: field -> what the engine made of the tensor (its weight dataclass says
#: the type; ``Any`` because one loader call serves fields of different types).
Loaded = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class LayerLayout:
    #: The family's attention (families.py): "mla" or "mha".
    attention_kind: str
    norms: Group  # input_norm, post_norm
    #: "mla": q_a, q_a_norm (with q_lora_rank), q_b, kv_a, kv_a_norm, kv_b, o;
    #: "mha": q, k, v, q_norm, k_norm, o
    attention: Group
    indexer: Group | None  # DSA layers that compute their own top-k
    dense: Group | None  # dense layers: gate, up, down
    #: sparse layers: gate, and bias (e_score_correction_bias) for the noaux_tc router
    router: Group | None
    shared: Group | None  # sparse layers with shared experts: gate, up, down


def attention_group(cfg: ModelConfig, prefix: str) -> Group:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    a = prefix + "self_attn."
    group: Group = {}
    if cfg.q_lora_rank is not None:
        group["q_a"] = (a + "q_a_proj.weight", (cfg.q_lora_rank, d))
        group["q_a_norm"] = (a + "q_a_layernorm.weight", (cfg.q_lora_rank,))
        group["q_b"] = (a + "q_b_proj.weight", (h * cfg.qk_head_dim, cfg.q_lora_rank))
    else:  # no query compression: one q_proj, filling the q_b slot
        group["q_b"] = (a + "q_proj.weight", (h * cfg.qk_head_dim, d))
    group["kv_a"] = (a + "kv_a_proj_with_mqa.weight",
                     (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d))
    group["kv_a_norm"] = (a + "kv_a_layernorm.weight", (cfg.kv_lora_rank,))
    group["kv_b"] = (a + "kv_b_proj.weight",
                     (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank))
    group["o"] = (a + "o_proj.weight", (d, h * cfg.v_head_dim))
    return group


def mha_attention_group(cfg: ModelConfig, prefix: str) -> Group:
    """Standard multi-head attention; its q/k norms span the whole projections (OLMoE) or one
    head (Qwen3-MoE: one weight every head shares)."""
    d, hd = cfg.hidden_size, cfg.qk_head_dim
    q_width, kv_width = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    per_head = cfg.qk_norm == "head"
    a = prefix + "self_attn."
    return {
        "q": (a + "q_proj.weight", (q_width, d)),
        "k": (a + "k_proj.weight", (kv_width, d)),
        "v": (a + "v_proj.weight", (kv_width, d)),
        "q_norm": (a + "q_norm.weight", (hd if per_head else q_width,)),
        "k_norm": (a + "k_norm.weight", (hd if per_head else kv_width,)),
        "o": (a + "o_proj.weight", (d, q_width)),
    }


def router_group(cfg: ModelConfig, prefix: str) -> Group:
    """The router's gate, and the correction bias the noaux_tc router selects with."""
    e, d = cfg.n_routed_experts, cfg.hidden_size
    group: Group = {"gate": (prefix + "mlp.gate.weight", (e, d))}
    if cfg.router == "noaux_tc":
        group["bias"] = (prefix + "mlp.gate.e_score_correction_bias", (e,))
    return group


def indexer_group(cfg: ModelConfig, prefix: str) -> Group:
    if cfg.q_lora_rank is None:
        raise CheckpointError("config.json: the DSA indexer needs q_lora_rank")
    i = prefix + "self_attn.indexer."
    d, hd, nh = cfg.hidden_size, cfg.index_head_dim, cfg.index_n_heads
    return {
        "wq_b": (i + "wq_b.weight", (nh * hd, cfg.q_lora_rank)),
        "wk": (i + "wk.weight", (hd, d)),
        "k_norm_weight": (i + "k_norm.weight", (hd,)),
        "k_norm_bias": (i + "k_norm.bias", (hd,)),
        "weights_proj": (i + "weights_proj.weight", (nh, d)),
    }


def mlp_group(prefix: str, d: int, inter: int) -> Group:
    return {
        "gate": (prefix + "gate_proj.weight", (inter, d)),
        "up": (prefix + "up_proj.weight", (inter, d)),
        "down": (prefix + "down_proj.weight", (d, inter)),
    }


def layer_layout(cfg: ModelConfig, index: int, sparse: bool, indexed: bool) -> LayerLayout:
    """Layer ``index`` (an MTP layer too: its index follows the decoder's); ``sparse`` for an
    MoE layer, ``indexed`` for a DSA layer that scores its own keys."""
    d = cfg.hidden_size
    p = f"model.layers.{index}."
    shared = None
    if sparse and cfg.n_shared_experts:
        shared = mlp_group(p + "mlp.shared_experts.", d,
                           cfg.moe_intermediate_size * cfg.n_shared_experts)
    mha = cfg.attention == "mha"
    return LayerLayout(
        attention_kind=cfg.attention,
        norms={"input_norm": (p + "input_layernorm.weight", (d,)),
               "post_norm": (p + "post_attention_layernorm.weight", (d,))},
        attention=mha_attention_group(cfg, p) if mha else attention_group(cfg, p),
        indexer=indexer_group(cfg, p) if indexed else None,
        dense=None if sparse else mlp_group(p + "mlp.", d, cfg.intermediate_size),
        router=router_group(cfg, p) if sparse else None,
        shared=shared,
    )


@dataclass(frozen=True)
class LoadedLayer:
    norms: Loaded
    attention: Loaded  # MLA's q_a and q_a_norm are None without q_lora_rank
    indexer: Loaded | None
    dense: Loaded | None
    router: Loaded | None
    shared: Loaded | None


def load_layer_groups(layout: LayerLayout, load: Callable[[str, Tensor], Any]) -> LoadedLayer:
    """Every tensor of ``layout`` through ``load(field, tensor)``: routing and MLP tensors
    first, then norms, attention and indexer (the order a corrupt checkpoint is reported in)."""

    def group(g: Group | None) -> Loaded | None:
        return None if g is None else {field: load(field, t) for field, t in g.items()}

    router, shared, dense = group(layout.router), group(layout.shared), group(layout.dense)
    norms = group(layout.norms)
    absent = {"q_a": None, "q_a_norm": None} if layout.attention_kind == "mla" else {}
    attention = {**absent, **(group(layout.attention) or {})}
    assert norms is not None
    return LoadedLayer(norms, attention, group(layout.indexer), dense, router, shared)


def build(cls: Callable[..., T], loaded: Loaded | None) -> T | None:
    """``cls(**loaded)``, or None for a group the layer does not have."""
    return None if loaded is None else cls(**loaded)
