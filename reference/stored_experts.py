"""A routed expert from its stored tensors: the bytes the disk tier read, in their stored dtype
(a float checkpoint's gate/up/down, or a container's U8 payloads and ``.qs`` scales), turned
into the float32 matrices the math uses, with the checks ``TensorLoader`` makes on a mapped
tensor (shape, finiteness) and the container's format rules.

Spec: spec/model.md §7.2, §14.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.experts import ExpertWeights, expert_tensor_names
from colibri.reference.tensors import F32

if TYPE_CHECKING:  # the quant modules load only for a container (engine start-up cost)
    from colibri.reference.quant.container import QuantContainer

#: A quantized tensor's scale sidecar (``quant.container.SCALE_SUFFIX``).
SCALE_SUFFIX = ".qs"


def expert_shapes(cfg: ModelConfig) -> tuple[tuple[int, int], ...]:
    """gate [M, D], up [M, D], down [D, M], in ``expert_tensor_names`` order."""
    d, inter = cfg.hidden_size, cfg.moe_intermediate_size
    return ((inter, d), (inter, d), (d, inter))


def expert_from_stored(stored: Mapping[str, np.ndarray], layer: int, expert: int,
                       cfg: ModelConfig, container: QuantContainer | None) -> ExpertWeights:
    """The expert's float32 weights from its stored tensors (``container``: the directory's
    container when it holds quantized tensors, which resolves their formats)."""
    gate, up, down = (
        _matrix(stored, name, shape, container)
        for name, shape in zip(expert_tensor_names(layer, expert), expert_shapes(cfg),
                               strict=True))
    return ExpertWeights(gate, up, down)


def _matrix(stored: Mapping[str, np.ndarray], name: str, shape: tuple[int, int],
            container: QuantContainer | None) -> F32:
    if name + SCALE_SUFFIX in stored:
        if container is None:
            raise CheckpointError(f"tensor {name}: quantized, but the directory is no container")
        from colibri.reference.quant.codec import dequantize

        info = container.tensor_format(name, shape)
        return dequantize(info.fmt, stored[name], stored[name + SCALE_SUFFIX], shape,
                          group_size=info.group_size or None, name=name)
    raw = stored[name]
    if raw.shape != shape:
        raise CheckpointError(f"tensor {name} has shape {list(raw.shape)}, expected {list(shape)}")
    weights: F32 = raw if raw.dtype == np.float32 else raw.astype(np.float32)
    if not np.isfinite(weights).all():
        raise CheckpointError(f"tensor {name} contains non-finite values (NaN or Inf)")
    return weights
