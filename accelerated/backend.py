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
from typing import Any, TextIO

import numpy as np
from colibri.accelerated.kernels import KernelError
from colibri.accelerated.model import Model, open_model
from colibri.accelerated.native import LibraryNotBuilt
from colibri.reference.backend import KVStateBackend, model_fingerprint
from colibri.reference.expert_store import TieredExpertStore
from colibri.reference.experts import stored_expert_bytes

from colibri.engine.registry import BackendOptions, BackendUnavailable


class AcceleratedBackend(KVStateBackend):
    name = "accelerated"

    def __init__(self, model: Model, store: TieredExpertStore, model_tag: int) -> None:
        super().__init__(model, store, model_tag)
        self.model = model
        model.store = store

    @property
    def build(self) -> str:
        """The kernel variant decides a step's bytes (``.coli_kv`` resumes only under it)."""
        from colibri import __version__

        isa = self.model.kernels.isa
        return f"colibri {__version__}; kernels {isa}; numpy {np.__version__}; {platform.machine()}"

    def close(self) -> None:
        self.model.close()


def open_backend(model_dir: Path, options: BackendOptions, log: TextIO) -> AcceleratedBackend:
    """The C-kernel model over a checkpoint or container (threads: COLIBRI_THREADS or all
    CPUs this process may use). A missing build is ``BackendUnavailable`` naming `make build`."""
    if options.device not in (None, "cpu"):
        raise ValueError(f"the accelerated backend runs on the CPU, not {options.device!r}")
    try:
        model = open_model(model_dir)
    except LibraryNotBuilt as exc:
        raise BackendUnavailable(f"--backend accelerated is not available in this build: {exc}"
                                 ) from None
    except KernelError as exc:
        raise BackendUnavailable(f"--backend accelerated cannot start: {exc}") from None
    print(f"== accelerated kernels: {model.kernels.isa}, {model.kernels.threads} threads ==",
          file=log)
    from colibri.engine.backend import usage_rows

    read: Any = model.read_expert  # Mlp has the nbytes the store's LRU budgets by
    store = TieredExpertStore(read, model.config, usage_rows(model.config),
                              options.ram_budget_bytes, stored_expert_bytes(model.checkpoint))
    return AcceleratedBackend(model, store, model_fingerprint(model_dir))
