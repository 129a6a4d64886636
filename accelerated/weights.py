"""The accelerated engine's weights: validated, memory-mapped, in their stored dtype.

Every tensor's name, dtype, shape, byte range and finiteness is checked here, before any C
kernel sees its address (a truncated or corrupt checkpoint is a ``CheckpointError`` naming
the tensor, never a crash). 2-D weights stored as F32/BF16/F16 stay memory-mapped views that
the kernels convert per element (exactly, spec §1); other float dtypes (F8, F64) and colibri
-quantized dense weights become float32 once, at load. Routed experts of a quantized container
stay in its bytes (``QuantMatrix``, memory-mapped) for the fused dequantize-and-dot kernels.
1-D tensors (norm weights, biases, router bias) become float32 at load: they are tiny and the
conversion is exact.

The checkpoint's header parsing, dtype table and the quantized formats come from
``colibri.reference`` (shared data); none of its math is called here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from colibri.accelerated.kernels import DTYPE_CODES, F32, QuantWeight, Weight, mat_descriptors
from colibri.accelerated.quant_kernels import QuantMatrix, container_matrix, quant_matrix
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.layout import Tensor, build, layer_layout, load_layer_groups
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.formats import Fmt
from colibri.reference.safetensors import DTYPE_NAMES, Checkpoint
from colibri.reference.weights import TensorLoader

#: Whether a stored weight (its raw array and ``DTYPE_CODES`` code) holds only finite values:
#: ``Kernels.all_finite``, which tests the exponent bits on the pool.
FiniteCheck = Callable[[np.ndarray, int], bool]


class WeightLoader:
    def __init__(self, checkpoint: Checkpoint, all_finite: FiniteCheck) -> None:
        self.checkpoint = checkpoint
        self._all_finite = all_finite
        # The float/quantized converter for what the kernels cannot read in place.
        self._convert = TensorLoader(checkpoint)
        self._container: QuantContainer | None = None

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
        """A 2-D weight the kernels read in place when its dtype allows (a quantized one is
        dequantized to float32 once: see ``product`` for one the fused kernels read)."""
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
        if check_finite and not self._all_finite(raw, code):
            raise CheckpointError(f"tensor {name} contains non-finite values (NaN or Inf)")
        return Weight(raw, code)

    def product(self, name: str, shape: tuple[int, int]) -> Weight | QuantWeight:
        """A weight used only as ``x @ W.T``: a quantized one stays in the container's bytes
        (content checked now, once), a float one as ``matrix``."""
        if name + ".qs" in self.checkpoint:
            if self._container is None:
                from colibri.reference.quant.container import QuantContainer

                self._container = QuantContainer.open(self.checkpoint.model_dir)
            info = self._container.tensor_format(name, shape)
            if info.fmt != Fmt.F32:
                return QuantWeight(container_matrix(self._container, name, shape))
        return self.matrix(name, shape)

    def vector(self, name: str, shape: tuple[int, ...]) -> F32:
        out: F32 = np.ascontiguousarray(self._convert.get(name, shape), dtype=np.float32)
        return out


#: A weight used only as a product: float in place, or left quantized.
Dense = Weight | QuantWeight


@dataclass(frozen=True)
class Indexer:
    wq_b: Dense
    wk: Dense
    k_norm_weight: F32
    k_norm_bias: F32
    weights_proj: Dense


@dataclass(frozen=True)
class Attention:
    q_a: Dense | None
    q_a_norm: F32 | None
    q_b: Dense
    kv_a: Dense
    kv_a_norm: F32
    kv_b: Weight
    o: Dense
    indexer: Indexer | None


@dataclass(frozen=True)
class MhaAttention:
    """Standard multi-head attention (OLMoE, Qwen3-MoE: spec/model.md §5.3): the q, k, v and
    o products and the q/k RMSNorm weights (over the whole projection, or one head's width
    that every head shares: ``config.qk_norm``)."""

    q: Dense
    k: Dense
    v: Dense
    q_norm: F32
    k_norm: F32
    o: Dense


@dataclass(frozen=True)
class Mlp:
    gate: Dense
    up: Dense
    down: Dense
    #: the ``col_moe`` descriptors of the three weights (built once), and their bytes
    desc: np.ndarray = field(init=False, repr=False, compare=False)
    desc_bytes: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        desc = mat_descriptors((self.gate, self.up, self.down))
        object.__setattr__(self, "desc", desc)
        object.__setattr__(self, "desc_bytes", desc.tobytes())

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes


@dataclass(frozen=True)
class Layer:
    index: int
    input_norm: F32
    post_norm: F32
    #: The family's attention (families.py): latent ("mla") or standard ("mha").
    attention: Attention | MhaAttention
    dense: Mlp | None
    router_gate: Dense | None
    router_bias: F32 | None
    shared: Mlp | None


def _load(t: WeightLoader, field: str, tensor: Tensor) -> Any:
    """A layout entry as the kernels read it: 1-D tensors as float32 vectors, ``kv_b`` as a
    float matrix (attention reads it per head, in place), every other weight as a product
    operand (float in place, or left quantized). ``Any`` because the field decides the type;
    the weight dataclasses below state it."""
    name, shape = tensor
    if len(shape) == 1:
        return t.vector(name, shape)
    rows, cols = shape
    if field == "kv_b":
        return t.matrix(name, (rows, cols))
    return t.product(name, (rows, cols))


def load_layer(t: WeightLoader, cfg: ModelConfig, index: int, sparse: bool,
               indexed: bool) -> Layer:
    g = load_layer_groups(layer_layout(cfg, index, sparse, indexed),
                          lambda field, tensor: _load(t, field, tensor))
    router = g.router or {}
    attention = (MhaAttention(**g.attention) if cfg.attention == "mha"
                 else Attention(indexer=build(Indexer, g.indexer), **g.attention))
    return Layer(index=index, attention=attention,
                 dense=build(Mlp, g.dense), router_gate=router.get("gate"),
                 router_bias=router.get("bias"), shared=build(Mlp, g.shared), **g.norms)


def latent_attention(lw: Layer) -> Attention:
    """Layer ``lw``'s MLA attention, for the paths that only run MLA layers (the one-call
    stack, the CUDA placement); a standard-attention layer there is a caller's bug."""
    if not isinstance(lw.attention, Attention):
        raise TypeError(f"layer {lw.index}: standard attention on an MLA-only path")
    return lw.attention


#: One projection of a routed expert: a float weight read in place, or quantized bytes.
ExpertMatrix = Weight | QuantMatrix


class Expert:
    """A routed expert's gate [M, D], up [M, D] and down [D, M], each float or quantized, with
    the descriptors ``col_moe`` reads (``kernels.MAT_DTYPE``); the arrays stay referenced here
    while the descriptors point into them."""

    __slots__ = ("gate", "up", "down", "desc", "desc_bytes")

    def __init__(self, gate: ExpertMatrix, up: ExpertMatrix, down: ExpertMatrix) -> None:
        self.gate, self.up, self.down = gate, up, down
        self.desc = mat_descriptors((gate, up, down))
        #: Joining bytes builds a layer's descriptor table about 50x faster than
        #: np.concatenate of structured arrays (which promotes their fields every call).
        self.desc_bytes = self.desc.tobytes()

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes

    @property
    def quantized(self) -> bool:
        return any(isinstance(w, QuantMatrix) for w in (self.gate, self.up, self.down))


#: Where routed experts come from: (layer, expert) -> its three projections.
ExpertSource = Callable[[int, int], Expert]


def expert_names(layer: int, expert: int) -> tuple[str, str, str]:
    p = f"model.layers.{layer}.mlp.experts.{expert}."
    return (p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight")


def expert_shapes(cfg: ModelConfig) -> tuple[tuple[int, int], ...]:
    d, inter = cfg.hidden_size, cfg.moe_intermediate_size
    return ((inter, d), (inter, d), (d, inter))


def mapped_experts(t: WeightLoader, cfg: ModelConfig, layers: list[int]) -> ExpertSource:
    """Float checkpoints: experts are memory-mapped in their stored dtype. Every expert's
    header (shape, byte range) is checked now; its values (finiteness) on first use."""
    shapes = expert_shapes(cfg)
    for layer in layers:
        for e in range(cfg.n_routed_experts):
            for name, shape in zip(expert_names(layer, e), shapes, strict=True):
                t._info(name, shape)

    def read(layer: int, expert: int) -> Expert:
        g, u, dn = (t.matrix(n, s) for n, s in zip(expert_names(layer, expert), shapes,
                                                    strict=True))
        return Expert(g, u, dn)

    return read


def stored_expert(stored: Mapping[str, np.ndarray], layer: int, expert: int, cfg: ModelConfig,
                  all_finite: FiniteCheck, container: QuantContainer | None) -> Expert:
    """An expert over its stored tensors as the disk tier read them (owned buffers, not the
    file's pages), with the checks a mapped expert gets on first use: finiteness for float
    projections (converted to float32 where the kernels cannot read the dtype in place), the
    content scan for quantized ones."""
    mats: list[ExpertMatrix] = []
    for name, shape in zip(expert_names(layer, expert), expert_shapes(cfg), strict=True):
        scales = stored.get(name + ".qs")
        if scales is not None:
            if container is None:
                raise CheckpointError(f"tensor {name}: quantized, but the directory is no "
                                      "container")
            info = container.tensor_format(name, shape)
            mats.append(quant_matrix(info.fmt, stored[name], scales, shape,
                                     group_size=info.group_size or None, name=name))
            continue
        raw = stored[name]
        if raw.shape != shape:
            raise CheckpointError(f"tensor {name} has shape {list(raw.shape)}, expected "
                                  f"{list(shape)}")
        code = DTYPE_CODES.get(DTYPE_NAMES[raw.dtype])
        if code is None:
            raw, code = raw.astype(np.float32), 0
        if not all_finite(raw, code):
            raise CheckpointError(f"tensor {name} contains non-finite values (NaN or Inf)")
        mats.append(Weight(raw, code))
    return Expert(*mats)


def quantized_experts(model_dir: Path, cfg: ModelConfig, t: WeightLoader,
                      layers: list[int]) -> ExpertSource | None:
    """Quantized containers (.qs sidecars): routed experts stay in the container's bytes
    (memory-mapped, never dequantized) and are read by the fused dequantize-and-dot kernels
    (``csrc/quant/``, through ``col_moe``). Every expert's format is resolved now (headers:
    sizes, the e8 all-or-none rule), so a bad container is refused at load; each tensor's
    content (finite scales, fp8 NaN bytes, the e8 tag) is scanned on the expert's first use.
    A projection the container stores as a float tensor is read in place like a float
    checkpoint's."""
    from colibri.reference.quant.container import QuantContainer
    from colibri.reference.quant.expert_store import QuantizedExpertStore

    container = QuantContainer.open(model_dir)
    if not container.has_quantized_tensors():
        return None
    formats = QuantizedExpertStore(container, cfg.hidden_size, cfg.moe_intermediate_size, 0)
    formats.check_present(layers, cfg.n_routed_experts)
    shapes = expert_shapes(cfg)

    def one(name: str, shape: tuple[int, int]) -> ExpertMatrix:
        if container.tensor_format(name, shape).fmt == Fmt.F32:
            return t.matrix(name, shape)
        return container_matrix(container, name, shape)

    def read(layer: int, expert: int) -> Expert:
        g, u, dn = (one(n, s) for n, s in zip(expert_names(layer, expert), shapes, strict=True))
        return Expert(g, u, dn)

    return read
