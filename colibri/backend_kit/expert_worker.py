"""An expert worker: one node's share of the routed experts, computed on request.

A worker opens the model directory itself (by path: the experts are read where the worker
runs, never shipped from the engine) through its backend's ``ExpertCompute``, named as
``"module:function"`` so that this module imports neither backend; the function is called as
``function(model_dir, threads)``. Each backend's compute uses the same kernels its engine uses
for the same experts, so the outputs are the bytes the engine would compute itself on the same
machine kind.

The worker loads its whole share when it starts (a restarted worker reloads it the same way)
and refuses work for an expert it does not own: a placement mismatch is an error, not a
silent read of an expert from somewhere else.

This is a plain class: ``ray_cluster.py`` runs it as a Ray actor, tests may call it in process.
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


class ExpertCompute(Protocol):
    """A backend's routed-expert math over its own copy of the model's experts."""

    def load(self, layer: int, expert: int) -> int:
        """Bring the expert in (read, checked, converted as the backend keeps it); its bytes."""
        ...

    def run(self, layer: int, experts: list[int], x: F32, start: I64, rows: I64) -> F32:
        """Expert ``experts[i]`` (loaded) applied to ``x[rows[start[i]:start[i + 1]]]``,
        [start[-1], D] in that order."""
        ...


def open_compute(factory: str, model_dir: str, threads: int) -> ExpertCompute:
    module_name, _, function = factory.partition(":")
    compute: ExpertCompute = getattr(importlib.import_module(module_name), function)(
        model_dir, threads)
    return compute


class ExpertWorker:
    """The experts ``owned`` ((layer, expert) pairs) of the model at ``model_dir``."""

    def __init__(self, model_dir: str, factory: str, owned: list[tuple[int, int]],
                 threads: int = 1) -> None:
        self.compute = open_compute(factory, model_dir, threads)
        self.owned = frozenset(owned)
        self.bytes_held = sum(self.compute.load(layer, e) for layer, e in owned)

    def ready(self) -> tuple[int, int, int]:
        """(process id, experts held, bytes held), once the share is loaded."""
        return os.getpid(), len(self.owned), self.bytes_held

    def run(self, layer: int, experts: list[int], x: F32, start: I64, rows: I64) -> F32:
        missing = [e for e in experts if (layer, e) not in self.owned]
        if missing:
            raise KeyError(f"layer {layer}: experts {missing} are not this worker's")
        return np.ascontiguousarray(self.compute.run(layer, experts, x, start, rows),
                                    np.float32)
