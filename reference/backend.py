"""The numpy backend: the reference model behind the engine seam (colibri.engine.backend).

``ReferenceModel`` is the reference math (``model.Model``) driven by the backend kit's row
driver and step wrapper, which runs the math's steps and times the phases around them: it is
the model ``colibri.reference.load_model`` returns, with the incremental API (``prefill``,
``decode``, ``decode_batch``, ``forward_rows``, ``mtp_draft``). The backend owns
the KV states (``KVState``), the tiered expert store (disk, byte-bounded RAM LRU, pinned hot
set) and the COLIKV1 codec, all from the kit; ``step`` is one ``forward_rows`` call.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TextIO

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.experts import ExpertStore, ExpertWeights
from colibri.reference.indexer_presence import log_indexer
from colibri.reference.mlp import swiglu
from colibri.reference.model import Model
from colibri.reference.safetensors import Checkpoint
from colibri.reference.stored_experts import expert_from_stored
from colibri.reference.tensors import F32, row_matmul
from colibri.reference.weights import TensorLoader

from colibri.backend_kit.expert_disk import StoredTensors
from colibri.backend_kit.expert_tiers import ExpertMemory, dense_bytes, open_tiers
from colibri.backend_kit.kv_state_backend import KVStateBackend
from colibri.backend_kit.layer_steps import SteppedRowModel
from colibri.backend_kit.memory_budget import BudgetTooSmall, runtime_bytes
from colibri.backend_kit.model_fingerprint import model_fingerprint
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.backend_kit.remote_experts import I64, RemoteExperts, expert_layers
from colibri.backend_kit.tiered_expert_store import TieredExpertStore, mapped_reader
from colibri.engine.registry import BackendOptions


class ReferenceModel(Model, SteppedRowModel):
    """The reference math with the kit's row driver: ``forward`` and the incremental API."""

    def __init__(
        self,
        config: ModelConfig,
        checkpoint: Checkpoint,
        expert_store: ExpertStore | None = None,
        loader: TensorLoader | None = None,
    ) -> None:
        super().__init__(config, checkpoint, expert_store, loader)
        #: Seconds of attention, expert products and lm_head since the last reset.
        self.clock = PhaseClock()


def load_model(
    model_dir: str | Path,
    expert_store: ExpertStore | None = None,
    loader: TensorLoader | None = None,
    ram_gb: float | None = None,
) -> ReferenceModel:
    """Open a model directory (config.json + safetensors). Weights are memory-mapped.

    ``expert_store`` replaces where routed experts come from (quantised, tiered...);
    ``loader`` replaces how the other tensors become float32 (it must wrap this directory's
    checkpoint, e.g. ``MyLoader(Checkpoint(model_dir))``). ``ram_gb`` bounds everything the
    process holds for the model, as the engine's ``RAM_GB`` (one sequence of up to 4096
    positions): experts that do not fit are read from disk; ``BudgetTooSmall`` names the
    minimum when the budget cannot hold the rest.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    if ram_gb is not None:
        if expert_store is not None or loader is not None:
            raise ValueError("ram_gb brings its own expert store and loader")
        if ram_gb <= 0:
            raise ValueError(f"ram_gb must be > 0, got {ram_gb}")
        import io

        from colibri.engine.registry import BackendOptions

        return _open(path, BackendOptions(ram_budget_bytes=round(ram_gb * 1e9)),
                     io.StringIO()).model
    config = ModelConfig.from_dir(path)
    checkpoint = loader.checkpoint if loader is not None else Checkpoint(path)
    if expert_store is None and any(name.endswith(".qs") for name in checkpoint.tensors):
        # A colibri container (quantized weights: U8 payload + .qs scales) gets the
        # dequantizing expert store.
        from colibri.reference.quant.loading import quantized_expert_store

        expert_store = quantized_expert_store(path, config)
    return ReferenceModel(config, checkpoint, expert_store, loader)


def reference_build() -> str:
    """numpy and its BLAS decide the bytes of the reference's products; the machine decides
    which BLAS kernels run."""
    from colibri import __version__

    return f"colibri {__version__}; numpy {np.__version__}; {platform.machine()}"


class ReferenceBackend(KVStateBackend):
    name = "reference"
    build = reference_build()

    def __init__(self, model: ReferenceModel, store: TieredExpertStore,
                 model_tag: int) -> None:
        super().__init__(model, store, model_tag)
        self.model = model

    def close(self) -> None:
        if self.model.remote_experts is not None:
            self.model.remote_experts.close()
            self.model.remote_experts = None


def open_backend(model_dir: Path, options: BackendOptions, log: TextIO) -> ReferenceBackend:
    """The reference model with a tiered expert store over its checkpoint or container: mapped
    experts, or under RAM_GB the disk tier's reads dequantized to float32. A budget that
    cannot hold the model is ``BackendUnavailable`` naming the minimum."""
    from colibri.engine.registry import BackendUnavailable

    try:
        return _open(model_dir, options, log)
    except BudgetTooSmall as exc:
        raise BackendUnavailable(str(exc)) from None


def _open(model_dir: Path, options: BackendOptions, log: TextIO) -> ReferenceBackend:
    if options.device not in (None, "cpu"):
        raise ValueError(f"the reference backend runs on the CPU, not {options.device!r}")
    from colibri.engine.backend import usage_rows

    config = ModelConfig.from_dir(model_dir)
    checkpoint = Checkpoint(model_dir)
    read = mapped_reader(TensorLoader(checkpoint), config)
    container = None
    quantized = None
    if any(name.endswith(".qs") for name in checkpoint.tensors):
        # A colibri container: experts are dequantized when read (the quant store with no
        # cache of its own, which checks every expert's format now; the tiers are the
        # tiered store's).
        from colibri.reference.quant.container import QuantContainer
        from colibri.reference.quant.loading import quantized_expert_store

        quantized = quantized_expert_store(model_dir, config, budget_bytes=0)
        if quantized is not None:
            read = quantized.expert
            container = QuantContainer.open(model_dir)
    model = ReferenceModel(config, checkpoint, quantized)
    log_indexer(model.indexer, log)
    if options.cluster is not None:
        model.remote_experts = _open_cluster(model_dir, options, checkpoint, config, log)
    cfg, rows = model.config, usage_rows(model.config)

    def build(stored: StoredTensors, layer: int, expert: int) -> ExpertWeights:
        return expert_from_stored(stored, layer, expert, cfg, container)

    float32_bytes = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
    # Float32 experts (the math reads them one at a time).
    dense = dense_bytes(checkpoint, cfg, rows)
    memory = ExpertMemory(dense=dense,
                          kv_floats_per_position=model.new_state().floats_per_position,
                          runtime=runtime_bytes(dense), held_bytes=lambda _l, _e: float32_bytes)
    tiers = open_tiers(checkpoint, cfg, rows, read, build, memory,
                       ram_budget_bytes=options.ram_budget_bytes, kv_slots=options.kv_slots,
                       ctx=options.ctx, log=log, rss_guard_bytes=options.rss_guard_bytes)
    # The model opened over its mapped or quantized experts (which checked every expert's
    # header); the tiers replace them as its data source.
    model.experts = tiers.store
    backend = ReferenceBackend(model, tiers.store, model_fingerprint(model_dir))
    model.max_step_rows = tiers.max_step_rows
    backend.rss_guard_bytes = tiers.rss_guard_bytes
    return backend


def _open_cluster(model_dir: Path, options: BackendOptions, checkpoint: Checkpoint,
                  config: ModelConfig, log: TextIO) -> RemoteExperts:
    from colibri.backend_kit.ray_cluster import ClusterSpec, ClusterStartError, open_ray_experts
    from colibri.engine.registry import BackendUnavailable

    try:
        spec = ClusterSpec.parse(options.cluster or "ray", options.cluster_workers,
                                 placement=options.cluster_placement)
        return open_ray_experts(spec, str(model_dir), "colibri.reference.backend:expert_compute",
                                expert_layers(checkpoint, config), config.n_routed_experts, log)
    except (ValueError, ClusterStartError) as exc:
        raise BackendUnavailable(str(exc)) from None


class ReferenceExpertCompute:
    """An expert worker's math: the reference's SwiGLU (row by row, float32) over the experts
    as ``open_backend`` reads them (copied out of the checkpoint, or dequantized from a
    container), so a worker's outputs are the engine's own bytes."""

    def __init__(self, model_dir: str) -> None:
        path = Path(model_dir)
        config = ModelConfig.from_dir(path)
        self.read = mapped_reader(TensorLoader(Checkpoint(path)), config)
        from colibri.reference.quant.loading import quantized_expert_store

        quantized = quantized_expert_store(path, config, budget_bytes=0)
        if quantized is not None:
            self.read = quantized.expert
        self.held: dict[tuple[int, int], ExpertWeights] = {}

    def load(self, layer: int, expert: int) -> int:
        ew = self.held[(layer, expert)] = self.read(layer, expert)
        return ew.nbytes

    def run(self, layer: int, experts: list[int], x: F32, start: I64, rows: I64) -> F32:
        out = np.empty((int(start[-1]), x.shape[1]), np.float32)
        for i, e in enumerate(experts):
            ew = self.held[(layer, e)]
            block = slice(int(start[i]), int(start[i + 1]))
            out[block] = swiglu(x[rows[block]], ew.gate, ew.up, ew.down, row_matmul)
        return out


def expert_compute(model_dir: str, threads: int) -> ReferenceExpertCompute:
    """An expert worker's compute (``colibri.backend_kit.expert_worker``); the reference's
    products are single-threaded row by row, so ``threads`` does not apply."""
    del threads
    return ReferenceExpertCompute(model_dir)
