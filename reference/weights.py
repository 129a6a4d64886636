"""Named, shape-checked float32 views of a checkpoint's tensors, grouped per layer.

``TensorLoader`` is the only place that turns a stored tensor into the float32 array the math
uses: it checks the name exists, the shape is what the config implies, the values are finite,
and says which tensor is wrong when one is not. Float32 tensors stay memory-mapped views; other
float dtypes are converted once, on first use.

Routed experts are not loaded here: they go through an ``ExpertStore`` (experts.py), so that
quantised or tiered storage can replace the plain memory-mapped one.

Spec: spec/model.md §2, §3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.layout import build, layer_layout, load_layer_groups
from colibri.reference.safetensors import Checkpoint
from colibri.reference.tensors import F32

if TYPE_CHECKING:
    from colibri.reference.quant.container import QuantContainer


class TensorLoader:
    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self._container: QuantContainer | None = None

    def has(self, name: str) -> bool:
        return name in self.checkpoint

    def get(self, name: str, shape: tuple[int, ...]) -> F32:
        if name + ".qs" in self.checkpoint:
            return self._dequantized(name, shape)
        info = self.checkpoint.info(name)
        if info.shape != shape:
            raise CheckpointError(
                f"tensor {name} has shape {list(info.shape)}, expected {list(shape)}"
            )
        array = self.checkpoint.float32(name)
        if not np.isfinite(array).all():
            raise CheckpointError(f"tensor {name} contains non-finite values (NaN or Inf)")
        return array

    def _dequantized(self, name: str, shape: tuple[int, ...]) -> F32:
        """A colibri-quantized weight (U8 payload + ``.qs``), dequantized once at load."""
        if len(shape) != 2:
            raise CheckpointError(f"tensor {name}: only 2-D weights can be quantized")
        if self._container is None:
            from colibri.reference.quant.container import QuantContainer

            self._container = QuantContainer.open(self.checkpoint.model_dir)
        return self._container.weight(name, (shape[0], shape[1]))


@dataclass(frozen=True)
class IndexerWeights:
    wq_b: F32  # [n_heads * head_dim, q_lora]
    wk: F32  # [head_dim, D]
    k_norm_weight: F32  # [head_dim]
    k_norm_bias: F32  # [head_dim]
    weights_proj: F32  # [n_heads, D]


@dataclass(frozen=True)
class AttentionWeights:
    q_a: F32 | None  # [q_lora, D]  (None when q_lora_rank is null: q_proj instead)
    q_a_norm: F32 | None  # [q_lora]
    q_b: F32  # [H * qk_head, q_lora]  or q_proj [H * qk_head, D]
    kv_a: F32  # [kv_lora + rope, D]
    kv_a_norm: F32  # [kv_lora]
    kv_b: F32  # [H * (nope + v), kv_lora]
    o: F32  # [D, H * v]
    indexer: IndexerWeights | None

    def kv_b_heads(self, cfg: ModelConfig) -> tuple[F32, F32]:
        """kv_b split per head: the key part [H, nope, kv_lora] and value part [H, v, kv_lora]."""
        heads = self.kv_b.reshape(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim,
                                  cfg.kv_lora_rank)
        return heads[:, : cfg.qk_nope_head_dim], heads[:, cfg.qk_nope_head_dim :]


@dataclass(frozen=True)
class MhaWeights:
    """Standard multi-head attention (the "mha" families: OLMoE, Qwen3-MoE), hd the head
    dimension."""

    q: F32  # [H * hd, D]
    k: F32  # [KV * hd, D]
    v: F32  # [KV * hd, D]
    q_norm: F32  # [H * hd] over the whole query projection (OLMoE); [hd] per head (Qwen3-MoE)
    k_norm: F32  # [KV * hd]; [hd]
    o: F32  # [D, H * hd]


@dataclass(frozen=True)
class MlpWeights:
    gate: F32  # [I, D]
    up: F32  # [I, D]
    down: F32  # [D, I]


@dataclass(frozen=True)
class RouterWeights:
    gate: F32  # [E, D]
    #: [E] e_score_correction_bias (noaux_tc); the softmax router has none
    bias: F32 | None = None


@dataclass(frozen=True)
class LayerWeights:
    index: int
    input_norm: F32
    post_norm: F32
    attention: AttentionWeights | MhaWeights
    dense: MlpWeights | None  # dense layers
    router: RouterWeights | None  # sparse layers
    shared: MlpWeights | None  # sparse layers with shared experts


def load_layer(
    t: TensorLoader, cfg: ModelConfig, index: int, sparse: bool, indexed: bool
) -> LayerWeights:
    g = load_layer_groups(layer_layout(cfg, index, sparse, indexed),
                          lambda _field, tensor: t.get(*tensor))
    attention: AttentionWeights | MhaWeights
    if cfg.attention == "mha":
        attention = MhaWeights(**g.attention)
    else:
        attention = AttentionWeights(indexer=build(IndexerWeights, g.indexer), **g.attention)
    return LayerWeights(
        index=index,
        attention=attention,
        dense=build(MlpWeights, g.dense),
        router=build(RouterWeights, g.router),
        shared=build(MlpWeights, g.shared),
        **g.norms,
    )
