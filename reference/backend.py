"""The numpy backend: the reference model behind the engine seam (colibri.engine.backend).

``ReferenceModel`` is the reference math (``model.Model``) driven by the backend kit's row
driver: it is the model ``colibri.reference.load_model`` returns, with the incremental API
(``prefill``, ``decode``, ``decode_batch``, ``forward_rows``, ``mtp_draft``). The backend owns
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
from colibri.reference.experts import ExpertStore, stored_expert_bytes
from colibri.reference.indexer_presence import log_indexer
from colibri.reference.model import Model
from colibri.reference.safetensors import Checkpoint
from colibri.reference.weights import TensorLoader

from colibri.backend_kit.kv_state_backend import KVStateBackend
from colibri.backend_kit.model_fingerprint import model_fingerprint
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.backend_kit.row_driver import RowModel
from colibri.backend_kit.tiered_expert_store import TieredExpertStore, mapped_reader
from colibri.engine.registry import BackendOptions


class ReferenceModel(Model, RowModel):
    """The reference math with the kit's row driver: ``forward`` and the incremental API."""

    def __init__(
        self,
        config: ModelConfig,
        checkpoint: Checkpoint,
        expert_store: ExpertStore | None = None,
        loader: TensorLoader | None = None,
    ) -> None:
        clock = PhaseClock()
        super().__init__(config, checkpoint, clock, expert_store, loader)
        #: Seconds of attention, expert products and lm_head since the last reset.
        self.clock = clock


def load_model(
    model_dir: str | Path,
    expert_store: ExpertStore | None = None,
    loader: TensorLoader | None = None,
) -> ReferenceModel:
    """Open a model directory (config.json + safetensors). Weights are memory-mapped.

    ``expert_store`` replaces where routed experts come from (quantised, tiered...);
    ``loader`` replaces how the other tensors become float32 (it must wrap this directory's
    checkpoint, e.g. ``MyLoader(Checkpoint(model_dir))``).
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
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
        pass


def open_backend(model_dir: Path, options: BackendOptions, log: TextIO) -> ReferenceBackend:
    """The reference model with a tiered expert store over its checkpoint or container."""
    if options.device not in (None, "cpu"):
        raise ValueError(f"the reference backend runs on the CPU, not {options.device!r}")
    from colibri.engine.backend import usage_rows

    config = ModelConfig.from_dir(model_dir)
    checkpoint = Checkpoint(model_dir)
    read = mapped_reader(TensorLoader(checkpoint), config)
    if any(name.endswith(".qs") for name in checkpoint.tensors):
        # A colibri container: experts are dequantized when read (the quant store with no
        # cache of its own; the tiers are the tiered store's).
        from colibri.reference.quant.loading import quantized_expert_store

        quantized = quantized_expert_store(model_dir, config, budget_bytes=0)
        if quantized is not None:
            read = quantized.expert
    store = TieredExpertStore(read, config, usage_rows(config), options.ram_budget_bytes,
                              stored_expert_bytes(checkpoint))
    model = ReferenceModel(config, checkpoint, store)
    log_indexer(model.indexer, log)
    return ReferenceBackend(model, store, model_fingerprint(model_dir))
