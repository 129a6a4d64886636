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
               device: str | None = None) -> Model:
    """Open a model directory for the accelerated engine (weights memory-mapped).

    ``threads`` is the size of the kernel thread pool (default: ``COLIBRI_THREADS`` or the
    CPUs this process may run on). A missing C library raises ``LibraryNotBuilt``.
    ``device`` "cuda" or "cuda:N" puts the dense products on that GPU
    (``colibri.accelerated.cuda_model``); no usable device raises ``CudaUnavailable``
    naming the cause."""
    if device not in (None, "cpu"):
        from colibri.accelerated.cuda_model import device_index, open_cuda_model

        index = device_index(device)
        assert index is not None
        return open_cuda_model(Path(model_dir), index, threads)[0]
    from colibri.accelerated.model import open_model

    return open_model(model_dir, threads)


__all__ = ["load_model"]
