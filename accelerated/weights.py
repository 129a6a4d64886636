"""The accelerated engine's weights: validated, memory-mapped, in their stored dtype.

Every tensor's name, dtype, shape, byte range and finiteness is checked here, before any C
kernel sees its address (a truncated or corrupt checkpoint is a ``CheckpointError`` naming
the tensor, never a crash). 2-D weights stored as F32/BF16/F16 stay memory-mapped views that
the kernels convert per element (exactly, spec §1); other float dtypes (F8, F64) and colibri
-quantized dense weights become float32 once, at load. 1-D tensors (norm weights, biases,
router bias) become float32 at load: they are tiny and the conversion is exact.

The checkpoint's header parsing, dtype table and the quantized formats come from
``colibri.reference`` (shared data); none of its math is called here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from colibri.accelerated.kernels import DTYPE_CODES, F32, Weight
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.safetensors import Checkpoint
from colibri.reference.weights import TensorLoader


class WeightLoader:
    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        # The float/quantized converter for what the kernels cannot read in place.
        self._convert = TensorLoader(checkpoint)

    def has(self, name: str) -> bool:
        return name in self.checkpoint

    def _info(self, name: str, shape: tuple[int, ...]) -> None:
        info = self.checkpoint.info(name)
        if info.shape != shape:
            raise CheckpointError(
                f"tensor {name} has shape {list(info.shape)}, expected {list(shape)}"
            )
        count = int(np.prod(shape, dtype=np.int64))
        size = info.file.stat().st_size
        itemsize = self.checkpoint.raw(name).dtype.itemsize
        if info.end > size or info.end - info.begin != count * itemsize:
            raise CheckpointError(f"tensor {name}: its bytes run past the end of {info.file}")

    def matrix(self, name: str, shape: tuple[int, int], check_finite: bool = True) -> Weight:
        """A 2-D weight the kernels read in place when its dtype allows."""
        if name + ".qs" in self.checkpoint:
            return Weight(np.ascontiguousarray(self._convert.get(name, shape)), 0)
        self._info(name, shape)
        info = self.checkpoint.info(name)
        code = DTYPE_CODES.get(info.dtype)
        if code is None:
            return Weight(np.ascontiguousarray(self._convert.get(name, shape)), 0)
        raw = self.checkpoint.raw(name)
        if not raw.flags.aligned or not raw.flags.c_contiguous:
            raw = np.ascontiguousarray(raw).copy()
        if check_finite:
            finite_check(name, raw)
        return Weight(raw, code)

    def vector(self, name: str, shape: tuple[int, ...]) -> F32:
        out: F32 = np.ascontiguousarray(self._convert.get(name, shape), dtype=np.float32)
        return out


def finite_check(name: str, raw: np.ndarray) -> None:
    # bf16 (ml_dtypes) and f16 both support isfinite; a view per 1M values bounds the temporary.
    flat = raw.reshape(-1)
    for start in range(0, flat.shape[0], 1 << 20):
        if not np.isfinite(flat[start : start + (1 << 20)]).all():
            raise CheckpointError(f"tensor {name} contains non-finite values (NaN or Inf)")


@dataclass(frozen=True)
class Indexer:
    wq_b: Weight
    wk: Weight
    k_norm_weight: F32
    k_norm_bias: F32
    weights_proj: Weight


@dataclass(frozen=True)
class Attention:
    q_a: Weight | None
    q_a_norm: F32 | None
    q_b: Weight
    kv_a: Weight
    kv_a_norm: F32
    kv_b: Weight
    o: Weight
    indexer: Indexer | None


@dataclass(frozen=True)
class Mlp:
    gate: Weight
    up: Weight
    down: Weight

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes


@dataclass(frozen=True)
class Layer:
    index: int
    input_norm: F32
    post_norm: F32
    attention: Attention
    dense: Mlp | None
    router_gate: Weight | None
    router_bias: F32 | None
    shared: Mlp | None


def load_attention(t: WeightLoader, cfg: ModelConfig, prefix: str, indexed: bool) -> Attention:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    a = prefix + "self_attn."
    q_a = q_a_norm = None
    if cfg.q_lora_rank is not None:
        q_a = t.matrix(a + "q_a_proj.weight", (cfg.q_lora_rank, d))
        q_a_norm = t.vector(a + "q_a_layernorm.weight", (cfg.q_lora_rank,))
        q_b = t.matrix(a + "q_b_proj.weight", (h * cfg.qk_head_dim, cfg.q_lora_rank))
    else:
        q_b = t.matrix(a + "q_proj.weight", (h * cfg.qk_head_dim, d))
    indexer = None
    if indexed:
        if cfg.q_lora_rank is None:
            raise CheckpointError("config.json: the DSA indexer needs q_lora_rank")
        i = a + "indexer."
        hd, nh = cfg.index_head_dim, cfg.index_n_heads
        indexer = Indexer(
            wq_b=t.matrix(i + "wq_b.weight", (nh * hd, cfg.q_lora_rank)),
            wk=t.matrix(i + "wk.weight", (hd, d)),
            k_norm_weight=t.vector(i + "k_norm.weight", (hd,)),
            k_norm_bias=t.vector(i + "k_norm.bias", (hd,)),
            weights_proj=t.matrix(i + "weights_proj.weight", (nh, d)),
        )
    return Attention(
        q_a=q_a,
        q_a_norm=q_a_norm,
        q_b=q_b,
        kv_a=t.matrix(a + "kv_a_proj_with_mqa.weight",
                      (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d)),
        kv_a_norm=t.vector(a + "kv_a_layernorm.weight", (cfg.kv_lora_rank,)),
        kv_b=t.matrix(a + "kv_b_proj.weight",
                      (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)),
        o=t.matrix(a + "o_proj.weight", (d, h * cfg.v_head_dim)),
        indexer=indexer,
    )


def load_mlp(t: WeightLoader, prefix: str, d: int, inter: int) -> Mlp:
    return Mlp(
        gate=t.matrix(prefix + "gate_proj.weight", (inter, d)),
        up=t.matrix(prefix + "up_proj.weight", (inter, d)),
        down=t.matrix(prefix + "down_proj.weight", (d, inter)),
    )


def load_layer(t: WeightLoader, cfg: ModelConfig, index: int, sparse: bool,
               indexed: bool) -> Layer:
    d = cfg.hidden_size
    p = f"model.layers.{index}."
    dense = shared = gate = None
    bias = None
    if sparse:
        gate = t.matrix(p + "mlp.gate.weight", (cfg.n_routed_experts, d))
        bias = t.vector(p + "mlp.gate.e_score_correction_bias", (cfg.n_routed_experts,))
        if cfg.n_shared_experts:
            shared = load_mlp(t, p + "mlp.shared_experts.", d,
                              cfg.moe_intermediate_size * cfg.n_shared_experts)
    else:
        dense = load_mlp(t, p + "mlp.", d, cfg.intermediate_size)
    return Layer(
        index=index,
        input_norm=t.vector(p + "input_layernorm.weight", (d,)),
        post_norm=t.vector(p + "post_attention_layernorm.weight", (d,)),
        attention=load_attention(t, cfg, p, indexed),
        dense=dense,
        router_gate=gate,
        router_bias=bias,
        shared=shared,
    )


#: Where routed experts come from: (layer, expert) -> Mlp of three weights.
ExpertSource = Callable[[int, int], Mlp]


def expert_names(layer: int, expert: int) -> tuple[str, str, str]:
    p = f"model.layers.{layer}.mlp.experts.{expert}."
    return (p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight")


def mapped_experts(t: WeightLoader, cfg: ModelConfig, layers: list[int]) -> ExpertSource:
    """Float checkpoints: experts are memory-mapped in their stored dtype. Every expert's
    header (shape, byte range) is checked now; its values (finiteness) on first use."""
    d, inter = cfg.hidden_size, cfg.moe_intermediate_size
    shapes = ((inter, d), (inter, d), (d, inter))
    for layer in layers:
        for e in range(cfg.n_routed_experts):
            for name, shape in zip(expert_names(layer, e), shapes, strict=True):
                t._info(name, shape)

    def read(layer: int, expert: int) -> Mlp:
        g, u, dn = (t.matrix(n, s) for n, s in zip(expert_names(layer, expert), shapes,
                                                    strict=True))
        return Mlp(g, u, dn)

    return read


def dequantized_experts(model_dir: object, cfg: ModelConfig) -> ExpertSource | None:
    """Quantized containers (.qs sidecars): experts dequantized to float32 by
    ``colibri.reference.quant`` (correct, slower, more memory).

    THIS is where the fused dequantize-dot kernels plug in: replace it with a source whose
    Weights keep the quantized payload and a matmul that reads it directly."""
    from pathlib import Path

    from colibri.reference.quant.loading import quantized_expert_store

    store = quantized_expert_store(Path(str(model_dir)), cfg, budget_bytes=0)
    if store is None:
        return None

    def read(layer: int, expert: int) -> Mlp:
        w = store.expert(layer, expert)
        return Mlp(*(Weight(np.ascontiguousarray(a, dtype=np.float32), 0)
                     for a in (w.gate, w.up, w.down)))

    return read
