"""Plugging a quantized container into the reference engine's ``load_model``.

A directory holding any ``.qs`` sidecar is a colibri container: its routed experts come from a
:class:`QuantizedExpertStore` (dequantized on first use, kept in a byte-bounded LRU) and every
expert's format is resolved at load time, so a bad container is refused before the first token.
Quantized dense weights are dequantized once by the engine's ``TensorLoader``.

Spec: spec/model.md §14 "Engine use and fixtures".
"""

from __future__ import annotations

import os
from pathlib import Path

from colibri.reference.config import ModelConfig
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.expert_store import DEFAULT_BUDGET_BYTES, QuantizedExpertStore

#: Overrides the expert cache budget (MiB of float32 weights).
CACHE_ENV = "COLIBRI_EXPERT_CACHE_MB"


def cache_budget_bytes() -> int:
    raw = os.environ.get(CACHE_ENV)
    if not raw:
        return DEFAULT_BUDGET_BYTES
    try:
        mib = int(raw)
    except ValueError:
        raise ValueError(f"{CACHE_ENV} must be a whole number of MiB, got {raw!r}") from None
    if mib < 0:
        raise ValueError(f"{CACHE_ENV} must be >= 0, got {mib}")
    return mib << 20


def quantized_expert_store(
    model_dir: str | Path, config: ModelConfig, budget_bytes: int | None = None
) -> QuantizedExpertStore | None:
    """The store for a container, or None when the directory holds no quantized tensor."""
    container = QuantContainer.open(model_dir)
    if not container.has_quantized_tensors():
        return None
    store = QuantizedExpertStore(
        container,
        config.hidden_size,
        config.moe_intermediate_size,
        cache_budget_bytes() if budget_bytes is None else budget_bytes,
    )
    layers = [i for i in range(config.num_hidden_layers) if config.is_sparse(i)]
    if f"model.layers.{config.num_hidden_layers}.eh_proj.weight" in container:
        layers.append(config.num_hidden_layers)  # the MTP head's experts
    store.check_present(layers, config.n_routed_experts)
    return store
