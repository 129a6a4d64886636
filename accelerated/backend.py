"""The accelerated backend: the C-kernel model behind the engine seam (colibri.engine.backend).

Like the reference backend it owns the KV states (``KVState``, shared with the reference so
the COLIKV1 codec and ``.coli_kv`` files are the same) and its expert tiers: the reference's
``TieredExpertStore`` bookkeeping (disk = not yet brought in, a byte-bounded RAM LRU, a
pinned hot set, REPIN) over this engine's expert weights (memory-mapped views in their stored
dtype, or a quantized container's mapped bytes), so TIERS/EMAP/health report what the
reference reports for the same traffic.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
from colibri.accelerated.kernels import F32, MAT_DTYPE, KernelError, Kernels
from colibri.accelerated.model import Model, open_model
from colibri.accelerated.native import LibraryNotBuilt
from colibri.accelerated.weights import (
    Expert,
    WeightLoader,
    mapped_experts,
    quantized_experts,
    stored_expert,
)
from colibri.reference.config import ModelConfig
from colibri.reference.experts import stored_expert_bytes
from colibri.reference.indexer_presence import log_indexer
from colibri.reference.quant.container import QuantContainer
from colibri.reference.safetensors import Checkpoint

from colibri.backend_kit.checked_experts import CheckedExperts
from colibri.backend_kit.expert_disk import DiskTier, StoredTensors, checkpoint_extents
from colibri.backend_kit.expert_tiers import ExpertMemory, Tiers, dense_bytes, open_tiers
from colibri.backend_kit.kv_state_backend import KVStateBackend
from colibri.backend_kit.memory_budget import BudgetTooSmall, runtime_bytes
from colibri.backend_kit.model_fingerprint import model_fingerprint
from colibri.backend_kit.remote_experts import I64, RemoteExperts, expert_layers
from colibri.backend_kit.tiered_expert_store import TieredExpertStore
from colibri.engine.backend import Device
from colibri.engine.registry import BackendOptions, BackendUnavailable

if TYPE_CHECKING:  # the CUDA modules load only for --device cuda (engine start-up cost)
    from colibri.accelerated.cuda_model import GpuPlacement


class AcceleratedBackend(KVStateBackend):
    name = "accelerated"

    def __init__(self, model: Model, store: TieredExpertStore, model_tag: int,
                 gpu: GpuPlacement | None = None, vram_budget_bytes: int = 0,
                 vram_reserve_bytes: int = 0) -> None:
        super().__init__(model, store, model_tag)
        self.model = model
        model.store = store
        #: Under RAM_GB, the disk tier the store reads experts through (None: mapped).
        self.disk: DiskTier | None = None
        #: ``--device cuda``: the device's weights, and the expert store's tier 2 over it.
        self.gpu = gpu
        self.vram_tier = None
        if gpu is not None:
            from colibri.accelerated.cuda_model import CudaVramTier

            from colibri.engine.registry import vram_budget

            self.vram_tier = CudaVramTier(gpu, model.read_expert)
            if vram_budget_bytes:
                # CUDA_EXPERT_GB (or auto), capped at what the device has free once the dense
                # weights are up, less CUDA_RESERVE_GB; the store places experts within it.
                free, _ = gpu.device.mem_info()
                store.attach_vram(self.vram_tier,
                                  vram_budget(vram_budget_bytes, free, vram_reserve_bytes),
                                  gpu.device.index)

    @property
    def build(self) -> str:
        """The kernel variant decides a step's bytes (``.coli_kv`` resumes only under it)."""
        from colibri import __version__

        isa = self.model.kernels.isa
        if self.gpu is not None:
            isa += f" + cuda {self.gpu.device.info().name}"
        return f"colibri {__version__}; kernels {isa}; numpy {np.__version__}; {platform.machine()}"

    def devices(self) -> list[Device]:
        if self.gpu is None:
            return super().devices()
        info = self.gpu.device.info()
        experts = 0 if self.vram_tier is None else self.vram_tier.experts
        return [Device(info.index, info.name, info.total_bytes, self.gpu.device.used_bytes,
                       experts)]

    def close(self) -> None:
        if self.model.remote_experts is not None:
            self.model.remote_experts.close()
            self.model.remote_experts = None
        if self.disk is not None:
            self.disk.close()
        self.model.close()
        if self.gpu is not None:
            self.gpu.device.close()


def open_backend(model_dir: Path, options: BackendOptions, log: TextIO) -> AcceleratedBackend:
    """The C-kernel model over a checkpoint or container (threads: COLIBRI_THREADS or all
    CPUs this process may use). A missing build is ``BackendUnavailable`` naming `make build`;
    ``--device cuda[:N]`` without a usable device one naming the cause (no nvcc at build
    time, no driver, no device); a RAM budget that cannot hold the model one naming the
    minimum."""
    try:
        return open_budgeted(model_dir, options, log)
    except BudgetTooSmall as exc:
        raise BackendUnavailable(str(exc)) from None


def open_budgeted(model_dir: Path, options: BackendOptions, log: TextIO,
                  threads: int | None = None) -> AcceleratedBackend:
    """``open_backend`` with ``threads`` kernel threads, raising ``BudgetTooSmall`` as it is
    (``load_model(ram_gb=...)``)."""
    gpu: GpuPlacement | None = None
    try:
        if options.device in (None, "cpu"):
            model = open_model(model_dir, threads)
        else:
            model, gpu = _open_on_device(model_dir, options.device)
    except LibraryNotBuilt as exc:
        raise BackendUnavailable(f"--backend accelerated is not available in this build: {exc}"
                                 ) from None
    except KernelError as exc:
        raise BackendUnavailable(f"--backend accelerated cannot start: {exc}") from None
    print(f"== accelerated kernels: {model.kernels.isa}, {model.kernels.threads} threads ==",
          file=log)
    log_indexer(model.indexer, log)
    if gpu is not None:
        info = gpu.device.info()
        print(f"== cuda device {info.index}: {info.name}, {len(gpu.dense) + len(gpu.mlps)} "
              f"dense weights in VRAM ({gpu.device.used_bytes / 1e9:.2f} GB) ==", file=log)
    try:
        tiers = _expert_tiers(model, model_dir, options, log)
    except BudgetTooSmall:
        model.close()
        raise
    backend = AcceleratedBackend(model, tiers.store, model_fingerprint(model_dir), gpu,
                                 options.vram_budget_bytes, options.vram_reserve_bytes)
    model.max_step_rows = tiers.max_step_rows
    model.read_ahead_depth = options.read_ahead
    backend.rss_guard_bytes = tiers.rss_guard_bytes
    backend.disk = tiers.disk
    if options.cluster is not None:
        if gpu is not None:
            backend.close()
            raise BackendUnavailable("--cluster computes the routed experts on CPU workers; "
                                     "it does not combine with --device cuda")
        try:
            model.remote_experts = _open_cluster(model_dir, options, model, log)
        except BackendUnavailable:
            backend.close()
            raise
    return backend


def _open_cluster(model_dir: Path, options: BackendOptions, model: Model,
                  log: TextIO) -> RemoteExperts:
    from colibri.backend_kit.ray_cluster import ClusterSpec, ClusterStartError, open_ray_experts

    try:
        spec = ClusterSpec.parse(options.cluster or "ray", options.cluster_workers,
                                 placement=options.cluster_placement)
        return open_ray_experts(spec, str(model_dir),
                                "colibri.accelerated.backend:expert_compute",
                                expert_layers(model.checkpoint, model.config),
                                model.config.n_routed_experts, log)
    except (ValueError, ClusterStartError) as exc:
        raise BackendUnavailable(str(exc)) from None


class AcceleratedExpertCompute:
    """An expert worker's math: ``col_moe`` over the experts as the engine maps them (stored
    dtype, or a container's quantized bytes), so a worker's outputs are the engine's bytes on
    the same machine kind (a row's result does not depend on the rows or experts beside it)."""

    def __init__(self, model_dir: str, threads: int) -> None:
        path = Path(model_dir)
        checkpoint = Checkpoint(path)
        config = ModelConfig.from_dir(path)
        self.kernels = Kernels(max(1, threads))
        t = WeightLoader(checkpoint, self.kernels.all_finite)
        layers = expert_layers(checkpoint, config)
        quantized = (quantized_experts(path, config, t, layers)
                     if any(n.endswith(".qs") for n in checkpoint.tensors) else None)
        self.read = quantized or mapped_experts(t, config, layers)
        self.held: dict[tuple[int, int], Expert] = {}

    def load(self, layer: int, expert: int) -> int:
        ex = self.held[(layer, expert)] = self.read(layer, expert)
        return ex.nbytes

    def run(self, layer: int, experts: list[int], x: F32, start: I64, rows: I64) -> F32:
        descs = b"".join(self.held[(layer, e)].desc_bytes for e in experts)
        return self.kernels.moe(np.ascontiguousarray(x, np.float32),
                                np.frombuffer(descs, MAT_DTYPE),
                                np.ascontiguousarray(start, np.int64),
                                np.ascontiguousarray(rows, np.int64))


def expert_compute(model_dir: str, threads: int) -> AcceleratedExpertCompute:
    """An expert worker's compute (``colibri.backend_kit.expert_worker``)."""
    return AcceleratedExpertCompute(model_dir, threads)


def _already_checked(_raw: np.ndarray, _code: int) -> bool:
    """The check of an expert already found finite in these files."""
    return True


def _expert_tiers(model: Model, model_dir: Path, options: BackendOptions, log: TextIO) -> Tiers:
    """The store over mapped experts, or under RAM_GB the disk tier's reads into owned
    buffers, computed in their stored bytes (so an expert holds its stored size)."""
    from colibri.engine.backend import usage_rows

    cfg, checkpoint = model.config, model.checkpoint
    rows = usage_rows(cfg)
    container = (QuantContainer.open(model_dir)
                 if any(n.endswith(".qs") for n in checkpoint.tensors) else None)

    def finite(raw: np.ndarray, code: int) -> bool:
        return model.kernels.all_finite(raw, code, inline=True)  # on a reading thread

    # An expert read again from unchanged files is not scanned again (checked_experts).
    extents = checkpoint_extents(checkpoint)
    checked = CheckedExperts(lambda layer, e: [info.file for info in extents(layer, e)])

    def build(stored: StoredTensors, layer: int, expert: int) -> Expert:
        known = checked.known_finite(layer, expert)
        built = stored_expert(stored, layer, expert, cfg, _already_checked if known else finite,
                              container)
        if not known:
            checked.record_finite(layer, expert)  # stored_expert raised on a bad value
        return built

    read: Any = model.read_expert  # Expert has the nbytes the store's LRU budgets by
    dense = dense_bytes(checkpoint, cfg, rows)
    memory = ExpertMemory(
        dense=dense,
        kv_floats_per_position=model.new_state().floats_per_position,
        runtime=runtime_bytes(dense), held_bytes=stored_expert_bytes(checkpoint))
    return open_tiers(checkpoint, cfg, rows, read, build, memory,
                      ram_budget_bytes=options.ram_budget_bytes, kv_slots=options.kv_slots,
                      ctx=options.ctx, log=log,
                           rss_guard_bytes=options.rss_guard_bytes)


def _open_on_device(model_dir: Path, device: str | None) -> tuple[Model, GpuPlacement]:
    """``--device cuda[:N]``: the model with its dense weights on that device; a device that
    cannot be opened is ``BackendUnavailable`` naming the cause."""
    from colibri.accelerated.cuda_model import device_index, open_cuda_model
    from colibri.accelerated.cuda_native import CudaError, CudaUnavailable

    index = device_index(device)
    assert index is not None
    try:
        return open_cuda_model(model_dir, index)
    except CudaUnavailable as exc:
        raise BackendUnavailable(f"--device {device} is not available: {exc}") from None
    except CudaError as exc:
        raise BackendUnavailable(f"--backend accelerated cannot start: {exc}") from None
