"""Bench section ``cuda-decode``: the CUDA backend on the GPU bench model, beside the same
model on the CPU, as ratios in one run (the GPU performance report).

Phases, each a worker process with its own deadline (a hang costs its deadline and leaves the
other phases' results):

* ``copy``: the device's copy bandwidth (``bandwidth.device_copy``: 1 GiB, best of 10);
* ``decode_cuda``: greedy decode at batch 1 on ``--device cuda`` through the engine seam (the
  decode worker's ``backend`` engine) with every expert the VRAM budget holds on the device
  (``CUDA_EXPERT_GB=auto``): tok/s, achieved GB/s (the weight bytes a step reads / seconds per
  step) and that ÷ the copy bandwidth (target >= 0.5);
* ``slots_cuda_<n>``: the engine's aggregate tok/s with 1, 4 and 8 busy slots (the mux loop,
  ``engine_slots.measure``);
* ``decode_cpu``: the same decode on the accelerated CPU backend, and whether the greedy ids
  agree with the GPU's (sameness kind (a));
* ``tiered_<share>``: decode with a VRAM budget of that share of the expert bytes, the rest
  served from RAM by the CPU kernels (colibri's case): tok/s against VRAM share.

``cuda_report.assemble`` turns the phases' results into the report. Without a usable CUDA
device the section refuses with the driver probe's reason. ``tools/gpu_check.py`` runs the
same phases one by one and writes its report after each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.workers import call

#: VRAM shares of the expert bytes for the tiered runs (1.0 is decode_cuda's auto budget).
TIER_SHARES = (0.25, 0.5)
SLOT_COUNTS = (1, 4, 8)
#: Each phase kind's deadline in seconds (tools/gpu_check caps them by its budget left).
PHASE_DEADLINES: dict[str, float] = {"copy": 60, "decode_cuda": 150, "slots": 90,
                                     "decode_cpu": 150, "tiered": 120}


def backend_engine(model_dir: Path, backend: str, device: str | None,
                   vram_bytes: int) -> dict[str, Any]:
    """The decode worker's engine spec for ``backend`` on ``device`` (None: the CPU) with a
    VRAM expert budget (-1: auto, 0: none)."""
    return {"kind": "backend", "backend": backend, "model": str(model_dir), "device": device,
            "vram_bytes": vram_bytes}


def run_phase(function: str, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One phase's worker under its deadline, with its wall time."""
    t0 = time.perf_counter()
    result = call(function, spec, function, timeout_s=timeout_s)
    if not result.get("timed_out"):
        result["wall_s"] = time.perf_counter() - t0
    return result


def expert_bytes(model_dir: Path) -> int:
    from colibri.benchmarks.decode import tensor_table

    table, _ = tensor_table(model_dir)
    return sum(nbytes for name, nbytes, _ in table if ".mlp.experts." in name)


Phase = tuple[str, Callable[[], dict[str, Any]]]


def phases(model_dir: Path, tokens: int, warmup: int,
           deadline: Callable[[str], float] = PHASE_DEADLINES.__getitem__,
           copy_gib: float = 1.0) -> list[Phase]:
    """The section's phases in order, each a thunk running one worker process under
    ``deadline(kind)`` seconds, asked when the phase starts."""

    def decode(kind: str, device: str | None, vram: int) -> Callable[[], dict[str, Any]]:
        spec = {"engine": backend_engine(model_dir, "accelerated", device, vram),
                "tokens": tokens, "warmup": warmup}
        return lambda: run_phase("decode_worker:alone", spec, deadline(kind))

    def slots(n: int) -> Phase:
        spec = {"model_dir": str(model_dir), "slots": n, "tokens": tokens, "warmup": warmup,
                "backend": "accelerated", "device": "cuda",
                "extra_env": {"CUDA_EXPERT_GB": "auto"}}
        return f"slots_cuda_{n}", lambda: run_phase("engine_slots:measure", spec,
                                                     deadline("slots"))

    out: list[Phase] = [
        ("copy", lambda: run_phase("bandwidth:device_copy", {"gib": copy_gib},
                                   deadline("copy"))),
        ("decode_cuda", decode("decode_cuda", "cuda", -1)),
        *(slots(n) for n in SLOT_COUNTS),
        ("decode_cpu", decode("decode_cpu", None, 0)),
    ]
    total = expert_bytes(model_dir)
    for share in TIER_SHARES:
        out.append((f"tiered_{share:g}", decode("tiered", "cuda", max(1, int(share * total)))))
    return out


def run_phases(model_dir: Path, tokens: int,
               warmup: int) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, thunk in phases(model_dir, tokens, warmup):
        yield name, thunk()


def refusal() -> str | None:
    """Why this section cannot run here (the driver probe's reason), or None."""
    from colibri.engine.cuda_devices import probe

    found = probe(with_free=False)
    return None if found.usable else f"no usable CUDA device: {found.reason}"


def run(options: BenchOptions) -> dict[str, Any]:
    from colibri.benchmarks.bench_model import ensure_bench_model
    from colibri.benchmarks.cuda_report import assemble

    why = refusal()
    if why is not None:
        return {"refused": why}
    model_dir = options.model or ensure_bench_model(options.cache_dir, gpu=True)
    results = dict(run_phases(model_dir, options.tokens, options.warmup))
    return assemble(model_dir, results, options.tokens, options.warmup)


register(Section(
    name="cuda-decode",
    engines=("cuda",),
    description="CUDA backend decode tok/s, GB/s ÷ device copy bandwidth, 1/4/8 slots, the "
                "CPU backend and VRAM shares, as ratios (refuses without a CUDA device)",
    run=run,
))
