"""colibri.accelerated: the compiled engine (C kernels through ctypes, the accelerated backend).

It must match ``colibri.reference`` token for token (spec/model.md §15: kinds (a) and (b)).
``load_model(dir, threads=None)`` returns a model with the reference model's API; the C
library is built by ``make build`` (``colibri.accelerated.native_build``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colibri.accelerated.model import Model


def load_model(model_dir: str | Path, threads: int | None = None,
               device: str | None = None, ram_gb: float | None = None) -> Model:
    """Open a model directory for the accelerated engine (weights memory-mapped).

    ``threads`` is the size of the kernel thread pool (default: ``COLIBRI_THREADS`` or the
    CPUs this process may run on). A missing C library raises ``LibraryNotBuilt``.
    ``device`` "cuda" or "cuda:N" puts the dense products on that GPU
    (``colibri.accelerated.cuda_model``); no usable device raises ``CudaUnavailable``
    naming the cause. ``ram_gb`` bounds everything the process holds for the model, as the
    engine's ``RAM_GB`` (one sequence of up to 4096 positions): experts that do not fit are
    read from disk; ``BudgetTooSmall`` names the minimum when the budget cannot hold the
    rest."""
    if ram_gb is not None:
        if device not in (None, "cpu"):
            raise ValueError("ram_gb bounds a CPU model; on a device the VRAM tier does")
        if ram_gb <= 0:
            raise ValueError(f"ram_gb must be > 0, got {ram_gb}")
        import io

        from colibri.accelerated.backend import open_budgeted

        from colibri.engine.registry import BackendOptions

        options = BackendOptions(ram_budget_bytes=round(ram_gb * 1e9))
        return open_budgeted(Path(model_dir), options, io.StringIO(), threads).model
    if device not in (None, "cpu"):
        from colibri.accelerated.cuda_model import device_index, open_cuda_model

        index = device_index(device)
        assert index is not None
        return open_cuda_model(Path(model_dir), index, threads)[0]
    from colibri.accelerated.model import open_model

    return open_model(model_dir, threads)


__all__ = ["load_model"]
