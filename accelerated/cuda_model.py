"""``--device cuda``: which products the CUDA kernels compute, and the VRAM expert tier.

What runs where (spec/DEVIATIONS.md, "CUDA kernels"): every dense product
(attention projections, indexer projections, router, dense MLPs, shared experts, lm_head,
MTP's eh_proj) whose weight fits the device is uploaded once at load and computed by the CUDA
kernels; a routed expert is computed there while the expert store holds it in tier 2 (VRAM),
through :class:`CudaVramTier` -- ``upload(layer, expert) -> bool`` when the store admits it,
``release(layer, expert)`` when it evicts it; everything else (norms, RoPE, attention over
the latent cache, the indexer's scores, routing, RAM/disk experts) runs on the CPU kernels.
The model takes its per-kernel path (``fused_layers = False``): the one C call of
``decoder_stack`` runs whole layers and could not hand single products to the GPU.

The GPU products use the summation order of the CPU build that runs beside them (fused
multiply-adds under avx2, two roundings under generic), so a product's bits do not depend on
whether its weight sits in VRAM or RAM -- a claim the GPU tests check and that is unverified
until they run on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.accelerated.cuda_native import (
    TWO_ROUNDINGS,
    CudaDevice,
    CudaOutOfMemory,
    GpuWeight,
    open_device,
)
from colibri.accelerated.kernels import F32, Kernels, Products, QuantWeight, Weight
from colibri.accelerated.model import Model, default_threads, open_model
from colibri.accelerated.quant_kernels import QuantMatrix
from colibri.accelerated.weights import latent_attention
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError

I64 = npt.NDArray[np.int64]
Triple = tuple[GpuWeight, GpuWeight, GpuWeight]


def data_address(w: Weight | QuantWeight | QuantMatrix) -> int:
    """Where a weight's bytes are mapped: the key a ``col_mat`` descriptor carries."""
    if isinstance(w, Weight):
        return w.ptr
    m = w.matrix if isinstance(w, QuantWeight) else w
    return int(m.payload.ctypes.data)


class GpuPlacement:
    """The weights uploaded to one device, found by the address of their mapped bytes."""

    def __init__(self, device: CudaDevice, flags: int) -> None:
        self.device = device
        #: TWO_ROUNDINGS when the CPU kernels beside it are the generic build.
        self.flags = flags
        self.dense: dict[int, GpuWeight] = {}
        self.mlps: dict[int, Triple] = {}

    def upload(self, w: Weight | QuantWeight | QuantMatrix) -> GpuWeight:
        m = w.matrix if isinstance(w, QuantWeight) else w
        if isinstance(m, QuantMatrix):
            return self.device.upload_quant(int(m.fmt), m.group_size, m.payload, m.scales,
                                            m.out_features, m.in_features)
        return self.device.upload_float(m.array, m.code)

    def place_dense(self, w: Weight | QuantWeight) -> bool:
        key = data_address(w)
        if key in self.dense:
            return True
        try:
            self.dense[key] = self.upload(w)
        except CudaOutOfMemory:
            return False
        return True

    def place_mlp(self, gate: Any, up: Any, down: Any) -> bool:
        """Upload an MLP's three weights, or none of them (False: the device is full)."""
        key = data_address(gate)
        if key in self.mlps:
            return True
        done: list[GpuWeight] = []
        try:
            for w in (gate, up, down):
                done.append(self.upload(w))
        except CudaOutOfMemory:
            for g in done:
                self.device.free(g)
            return False
        self.mlps[key] = (done[0], done[1], done[2])
        return True

    def release_mlp(self, gate: Any) -> None:
        for g in self.mlps.pop(data_address(gate), ()):
            self.device.free(g)


def dense_weights(model: Any) -> Iterator[Weight | QuantWeight]:
    """Every dense product weight of the model (the MLPs' come from :func:`dense_mlps`)."""
    layers = [*model.layers, *([model.mtp_layer] if model.mtp_layer is not None else [])]
    for lw in layers:
        aw = latent_attention(lw)
        yield from (w for w in (aw.q_a, aw.q_b, aw.kv_a, aw.o, lw.router_gate) if w is not None)
        if aw.indexer is not None:
            yield from (aw.indexer.wq_b, aw.indexer.wk, aw.indexer.weights_proj)
    yield model.lm_head
    if model.mtp_layer is not None:
        yield model.eh_proj


def dense_mlps(model: Any) -> Iterator[Any]:
    layers = [*model.layers, *([model.mtp_layer] if model.mtp_layer is not None else [])]
    for lw in layers:
        yield from (m for m in (lw.dense, lw.shared) if m is not None)


class CudaKernels(Kernels):
    """The CPU kernels, with the products of uploaded weights computed on the device."""

    def __init__(self, threads: int, placement: GpuPlacement) -> None:
        super().__init__(threads)
        self.placement = placement

    def matmul(self, x: F32, w: Weight | QuantWeight, out: F32 | None = None) -> F32:
        gw = self.placement.dense.get(data_address(w))
        if gw is None:
            return super().matmul(x, w, out)
        y = self.placement.device.matmul(np.ascontiguousarray(x, np.float32), gw,
                                         self.placement.flags)
        if out is None:
            return y
        out[...] = y
        return out

    def matmul_many(self, x: F32, products: Products) -> list[F32]:
        on_gpu = [self.placement.dense.get(data_address(w)) for w in products.weights]
        if all(g is None for g in on_gpu):
            return super().matmul_many(x, products)
        placed = [g for g in on_gpu if g is not None]
        if len(placed) < len(on_gpu):  # some did not fit: each where its weight is
            return [self.matmul(x, w) for w in products.weights]
        return self.placement.device.matmul_many(np.ascontiguousarray(x, np.float32), placed,
                                                 self.placement.flags)

    def moe(self, x: F32, descriptors: np.ndarray, start: I64, rows: I64) -> F32:
        """Experts resident on the device there, the rest in one CPU call; each output row
        depends only on its input row and its expert, so the split changes no value."""
        n_exp = start.shape[0] - 1
        on_gpu = [self.placement.mlps.get(int(descriptors[3 * e]["data"])) for e in range(n_exp)]
        if all(t is None for t in on_gpu):
            return super().moe(x, descriptors, start, rows)
        out = np.empty((int(start[-1]), x.shape[1]), np.float32)
        cpu = [e for e in range(n_exp) if on_gpu[e] is None]
        if cpu:
            pick = np.array([3 * e + j for e in cpu for j in range(3)], np.int64)
            counts = np.array([start[e + 1] - start[e] for e in cpu], np.int64)
            sub_start = np.zeros(len(cpu) + 1, np.int64)
            np.cumsum(counts, out=sub_start[1:])
            sub_rows = np.concatenate([rows[start[e]:start[e + 1]] for e in cpu])
            y = super().moe(x, np.ascontiguousarray(descriptors[pick]), sub_start,
                            np.ascontiguousarray(sub_rows, np.int64))
            for i, e in enumerate(cpu):
                out[start[e]:start[e + 1]] = y[sub_start[i]:sub_start[i + 1]]
        for e, triple in enumerate(on_gpu):
            if triple is not None and start[e + 1] > start[e]:
                xs = np.ascontiguousarray(x[rows[start[e]:start[e + 1]]], np.float32)
                out[start[e]:start[e + 1]] = self.placement.device.expert_mlp(
                    *triple, xs, self.placement.flags)
        return out


class CudaVramTier:
    """Tier 2 of the expert store: ``upload`` when the store admits an expert to VRAM (False
    when the byte budget or the device refuses), ``release`` when it evicts one."""

    def __init__(self, placement: GpuPlacement, read_expert: Callable[[int, int], Any],
                 budget_bytes: int | None = None) -> None:
        self.placement = placement
        self.read_expert = read_expert
        self.budget_bytes = budget_bytes
        self._held: dict[tuple[int, int], Any] = {}

    @property
    def experts(self) -> int:
        return len(self._held)

    @property
    def bytes(self) -> int:
        return sum(int(ex.nbytes) for ex in self._held.values())

    def upload(self, layer: int, expert: int) -> bool:
        if (layer, expert) in self._held:
            return True
        ex = self.read_expert(layer, expert)
        if self.budget_bytes is not None and self.bytes + int(ex.nbytes) > self.budget_bytes:
            return False
        if not self.placement.place_mlp(ex.gate, ex.up, ex.down):
            return False
        self._held[(layer, expert)] = ex
        return True

    def release(self, layer: int, expert: int) -> None:
        ex = self._held.pop((layer, expert), None)
        if ex is not None:
            self.placement.release_mlp(ex.gate)


def place_model(model: Any, placement: GpuPlacement) -> tuple[int, int]:
    """Upload the dense weights that fit; (placed, total)."""
    placed = total = 0
    for w in dense_weights(model):
        total += 1
        placed += placement.place_dense(w)
    for mlp in dense_mlps(model):
        total += 1
        placed += placement.place_mlp(mlp.gate, mlp.up, mlp.down)
    return placed, total


def flags_for(isa: str) -> int:
    """Match the CPU build that runs beside the device: FMA bits under avx2, else two
    roundings."""
    return 0 if isa.startswith("avx2") else TWO_ROUNDINGS


def device_index(device: str | None) -> int | None:
    """``--device``: None or "cpu" (the CPU kernels), "cuda" (device 0) or "cuda:N"."""
    if device in (None, "cpu"):
        return None
    assert device is not None
    name, sep, number = device.partition(":")
    if name == "cuda" and (number.isdigit() if sep else True):
        return int(number or 0)
    raise ValueError(f"the accelerated backend runs on cpu, cuda or cuda:N, not {device!r}")


def open_cuda_model(model_dir: Path, index: int, threads: int | None = None
                    ) -> tuple[Model, GpuPlacement]:
    """The accelerated model with its dense weights on device ``index`` (what fits), its
    per-kernel path, and the placement the VRAM tier uploads experts through. A device that
    cannot be opened raises ``CudaUnavailable`` naming the cause; a standard-attention family
    (OLMoE, Qwen3-MoE), whose placement is not verified on a device, a ``CheckpointError``
    naming the CPU engine that runs it."""
    config = ModelConfig.from_dir(model_dir)
    if config.attention != "mla":
        raise CheckpointError(f"{config.model_type}: --device cuda runs MLA families "
                              "(glm_moe_dsa, deepseek_v3); run it with --device cpu")
    device = open_device(index)
    placement = GpuPlacement(device, 0)
    try:
        kernels = CudaKernels(threads or default_threads(), placement)
        placement.flags = flags_for(kernels.isa)
        model = open_model(model_dir, kernels=kernels)
    except BaseException:
        device.close()
        raise
    model.fused_layers = False
    place_model(model, placement)
    return model, placement
