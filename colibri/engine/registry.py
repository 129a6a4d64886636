"""Backends by name, imported only when asked for (the engine imports none statically).

A backend module exposes ``open_backend(model_dir, options, log) -> Backend``. A name whose
module is not part of this build is reported as such, not as an import traceback.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # the CLI reads BACKENDS while parsing: keep this module free of numpy
    from colibri.engine.backend import Backend

#: name -> the module that opens it.
BACKENDS: dict[str, str] = {
    "reference": "colibri.reference.backend",
    "accelerated": "colibri.accelerated.backend",
}
DEFAULT_BACKEND = "reference"


class BackendUnavailable(Exception):
    """The named backend is unknown or not built."""


@dataclass(frozen=True)
class BackendOptions:
    #: Byte budget of everything the process holds (RAM_GB); 0 is unbounded, experts mapped.
    ram_budget_bytes: int = 0
    #: colibri's RSS guard (RSS_GUARD_GB): resident memory above it makes the expert LRU
    #: smaller, checked every 16 steps; 0 is the RAM budget itself.
    rss_guard_bytes: int = 0
    #: KV slots and the context each holds: what a RAM budget must keep for the KV caches.
    kv_slots: int = 1
    ctx: int = 4096
    #: READ_AHEAD: under a RAM budget, how many routed layers ahead the backend reads the
    #: experts their routers would choose from the residual it has (0: none).
    read_ahead: int = 0
    #: The backend's device choice (``--device``); None is its default.
    device: str | None = None
    #: The VRAM expert tier's requested budget (``--vram-gb``, CUDA_EXPERT_GB): 0 none, -1
    #: auto (all the device's free memory but the reserve); see ``vram_budget``.
    vram_budget_bytes: int = 0
    #: Device memory left free for everything but experts (CUDA_RESERVE_GB, default 2).
    vram_reserve_bytes: int = 2_000_000_000
    #: ``--cluster``: ``ray`` or ``ray:ADDRESS``, the routed experts on expert workers; None
    #: computes them in this process.
    cluster: str | None = None
    #: ``--cluster-workers``: how many expert workers (0: one per node of the cluster).
    cluster_workers: int = 0
    #: ``--cluster-placement``: a placement file (``colibri plan --nodes``); None stripes.
    cluster_placement: str | None = None


def vram_budget(requested_bytes: int, free_bytes: int, reserve_bytes: int) -> int:
    """The VRAM expert tier's byte budget on one device: the request (CUDA_EXPERT_GB; -1 is
    ``auto``) capped by what the device has free minus the reserve (CUDA_RESERVE_GB), as
    colibri's planner does; an unknown free size (-1) leaves the request as it is (the
    device's own refusals then bound it)."""
    if requested_bytes == 0:
        return 0
    if free_bytes < 0:
        return max(0, requested_bytes)
    usable = max(0, free_bytes - reserve_bytes)
    return usable if requested_bytes < 0 else min(requested_bytes, usable)


def _module(name: str) -> ModuleType:
    module_name = BACKENDS.get(name)
    if module_name is None:
        known = ", ".join(sorted(BACKENDS))
        raise BackendUnavailable(f"unknown backend {name!r} (known: {known})")
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        raise BackendUnavailable(f"--backend {name} is not available in this build") from None


def check_available(name: str) -> None:
    """Raise BackendUnavailable unless ``name`` is a backend this build can open."""
    _module(name)


def open_backend(name: str, model_dir: Path, options: BackendOptions, log: TextIO) -> Backend:
    backend: Backend = _module(name).open_backend(model_dir, options, log)
    return backend
