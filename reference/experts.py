"""Routed-expert storage: where the three matrices of expert e in layer l come from.

The forward pass asks an ``ExpertStore`` for ``expert(layer, e)`` and never touches checkpoint
tensors itself, so storage can change without touching the math: the plain store below maps
the float weights from the checkpoint and checks each expert the first time it is used;
quantised stores (dequantise on first use) and tiered stores plug in behind the same protocol.
``is_resident`` lets telemetry report which experts have been brought in.

Spec: spec/model.md §7.2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from colibri.reference.config import ModelConfig
from colibri.reference.safetensors import Checkpoint
from colibri.reference.tensors import F32
from colibri.reference.weights import TensorLoader


@dataclass(frozen=True)
class ExpertWeights:
    gate: F32  # [I, D]
    up: F32  # [I, D]
    down: F32  # [D, I]

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes


class ExpertStore(Protocol):
    def expert(self, layer: int, expert: int) -> ExpertWeights:
        """The float32 matrices of routed expert ``expert`` of layer ``layer``."""
        ...

    def is_resident(self, layer: int, expert: int) -> bool:
        """True once the expert has been brought in (checked, mapped, dequantised...)."""
        ...


def expert_tensor_names(layer: int, expert: int) -> tuple[str, str, str]:
    p = f"model.layers.{layer}.mlp.experts.{expert}."
    return (p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight")


def stored_expert_bytes(checkpoint: Checkpoint) -> Callable[[int, int], int]:
    """Bytes an expert takes in the checkpoint or container: its three tensors in their stored
    dtype, plus the ``.qs`` scales of quantized ones (colibri's "probed bytes per expert").

    Telemetry counts these, not what a backend holds in memory (the reference dequantizes to
    float32, the accelerated engine keeps the stored bytes), so TIERS and the disk counters
    are the same numbers whichever backend runs (spec/DEVIATIONS.md, "Tier bytes")."""

    def size(layer: int, expert: int) -> int:
        total = 0
        for name in expert_tensor_names(layer, expert):
            for stored in (name, name + ".qs"):
                if stored in checkpoint:
                    info = checkpoint.info(stored)
                    total += info.end - info.begin
        return total

    return size


class MappedExpertStore:
    """Experts as memory-mapped float tensors, validated (shape, finiteness) on first use.

    Nothing is read when the model is opened; an expert's pages come in when it is first
    routed to. Per-expert names (``mlp.experts.E.{gate,up,down}_proj.weight``, as real GLM-5
    checkpoints store them) are required; their existence and shapes are checked up front by
    ``check_present`` so a truncated checkpoint is refused at load time.
    """

    def __init__(self, loader: TensorLoader, cfg: ModelConfig, layers: list[int]) -> None:
        self.loader = loader
        self.cfg = cfg
        self.layers = set(layers)
        self._cache: dict[tuple[int, int], ExpertWeights] = {}

    def check_present(self) -> None:
        """Every expert tensor exists with the right shape (header only; no data is read)."""
        from colibri.reference.errors import CheckpointError

        d, inter = self.cfg.hidden_size, self.cfg.moe_intermediate_size
        for layer in sorted(self.layers):
            for e in range(self.cfg.n_routed_experts):
                for name, shape in zip(
                    expert_tensor_names(layer, e), ((inter, d), (inter, d), (d, inter)), strict=True
                ):
                    info = self.loader.checkpoint.info(name)
                    if info.shape != shape:
                        raise CheckpointError(
                            f"tensor {name} has shape {list(info.shape)}, expected {list(shape)}"
                        )

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        key = (layer, expert)
        found = self._cache.get(key)
        if found is None:
            d, inter = self.cfg.hidden_size, self.cfg.moe_intermediate_size
            gate, up, down = expert_tensor_names(layer, expert)
            found = ExpertWeights(
                gate=self.loader.get(gate, (inter, d)),
                up=self.loader.get(up, (inter, d)),
                down=self.loader.get(down, (d, inter)),
            )
            self._cache[key] = found
        return found

    def is_resident(self, layer: int, expert: int) -> bool:
        return (layer, expert) in self._cache
