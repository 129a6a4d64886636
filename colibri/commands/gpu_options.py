"""``--gpu`` and ``--vram-gb`` for ``colibri engine`` and ``colibri serve``: colibri's
launcher flags, applied as colibri applies them, to the environment the engine reads
(COLI_CUDA, COLI_GPUS, CUDA_EXPERT_GB, CUDA_DENSE; notes: colibri-tools §2.2), so a served
engine inherits them and an explicit variable means the same as the flag."""

from __future__ import annotations

import argparse
from collections.abc import MutableMapping


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None, metavar="auto|none|0,1",
                        help="CUDA devices: auto (all), none (CPU only), or a list of ordinals "
                             "(COLI_CUDA, COLI_GPUS)")
    parser.add_argument("--vram-gb", default=None, metavar="GB|auto",
                        help="VRAM budget of the expert tier in GB, or auto (CUDA_EXPERT_GB; "
                             "CUDA_RESERVE_GB, default 2, stays free)")


def gpu_error(gpu: str | None, vram_gb: str | None) -> str | None:
    """Why the flags are malformed, or None."""
    if gpu is not None and gpu not in ("auto", "none"):
        parts = gpu.split(",")
        if not all(p.strip().isdigit() for p in parts):
            return f"--gpu must be auto, none or a list of device ordinals, got {gpu!r}"
    if vram_gb is not None and vram_gb != "auto":
        try:
            value = float(vram_gb)
        except ValueError:
            return f"--vram-gb must be a number of GB or auto, got {vram_gb!r}"
        if not value >= 0:
            return f"--vram-gb must be >= 0, got {vram_gb}"
    return None


def apply_gpu_arguments(gpu: str | None, vram_gb: str | None,
                        env: MutableMapping[str, str]) -> None:
    """colibri's mapping: ``--gpu none`` sets COLI_CUDA=0 and clears CUDA_EXPERT_GB and
    CUDA_DENSE; any other value sets COLI_CUDA=1, COLI_GPUS=<list> unless auto, and defaults
    CUDA_DENSE=1. ``--vram-gb`` sets CUDA_EXPERT_GB (``--gpu none`` wins over it)."""
    if vram_gb is not None:
        env["CUDA_EXPERT_GB"] = vram_gb
    if gpu is None:
        return
    if gpu == "none":
        env["COLI_CUDA"] = "0"
        env.pop("CUDA_EXPERT_GB", None)
        env.pop("CUDA_DENSE", None)
        return
    env["COLI_CUDA"] = "1"
    if gpu != "auto":
        env["COLI_GPUS"] = ",".join(p.strip() for p in gpu.split(","))
    env.setdefault("CUDA_DENSE", "1")
