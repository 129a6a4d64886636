"""Bench section ``cuda-decode``: the CUDA backend on the GPU bench model, beside the same
model on the CPU, as ratios in one run (the GPU performance report).

Phases, each a fresh process with its own deadline (a hang costs its deadline and leaves the
other phases' results):

* ``copy``: the device's copy bandwidth (``cuda_copy``: a 1 GiB device-to-device copy, best
  of 10);
* ``decode_cuda``: greedy decode at batch 1 on ``--device cuda`` with every expert the VRAM
  budget holds on the device (``CUDA_EXPERT_GB=auto``): tok/s, achieved GB/s (the weight bytes
  a step reads / seconds per step) and that ÷ the copy bandwidth (target >= 0.5);
* ``slots_cuda_<n>``: the engine's aggregate tok/s with 1, 4 and 8 busy slots (the mux loop,
  ``engine_slots.measure``);
* ``decode_cpu``: the same decode on the accelerated CPU backend, and whether the greedy ids
  agree with the GPU's (sameness kind (a));
* ``tiered_<share>``: decode with a VRAM budget of that share of the expert bytes, the rest
  served from RAM by the CPU kernels (colibri's case): tok/s against VRAM share.

Without a usable CUDA device the section refuses with the driver probe's reason.
``tools/gpu_check.py`` runs the same phases one by one and writes its report after each.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register

#: VRAM shares of the expert bytes for the tiered runs (1.0 is decode_cuda's auto budget).
TIER_SHARES = (0.25, 0.5)
SLOT_COUNTS = (1, 4, 8)
#: Each phase kind's deadline in seconds (tools/gpu_check caps them by its budget left).
PHASE_DEADLINES: dict[str, float] = {"copy": 60, "decode_cuda": 150, "slots": 90,
                                     "decode_cpu": 150, "tiered": 120}
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]


def decode(model_dir: Path, backend: str, device: str | None, vram_budget_bytes: int,
           tokens: int, warmup: int) -> dict[str, Any]:
    """Greedy decode at batch 1 through the engine seam (``Backend.step``), in this process:
    the experts placed first (with a VRAM tier, the budget's worth, in id order), then the
    prompt, ``warmup`` untimed steps and ``tokens`` timed ones."""
    import numpy as np

    from colibri.engine.backend import StepRow, sparse_layers, usage_rows
    from colibri.engine.registry import BackendOptions, open_backend

    log = io.StringIO()
    t0 = time.perf_counter()
    be = open_backend(backend, model_dir, BackendOptions(device=device,
                                                         vram_budget_bytes=vram_budget_bytes),
                      log)
    try:
        load_s = time.perf_counter() - t0
        # The VRAM share spread evenly over the layers (expert e of every layer before expert
        # e + 1 of any), so every step mixes device and host experts as a partial tier does.
        spread = [(layer, e) for e in range(be.shape.n_routed_experts)
                  for layer in usage_rows(be.shape)]
        placed = be.tiers.pin(spread, 0) if vram_budget_bytes else 0
        state = be.new_state()
        logits = be.step([StepRow(state, t, i == len(PROMPT) - 1)
                          for i, t in enumerate(PROMPT)]).logits[0]
        layers = sparse_layers(be.shape)
        ids: list[int] = []
        times: list[float] = []
        routes: list[list[tuple[int, list[int]]]] = []
        for i in range(warmup + tokens):
            token = int(np.argmax(logits))
            ids.append(token)
            t = time.perf_counter()
            step = be.step([StepRow(state, token, True)])
            if i >= warmup:
                times.append(time.perf_counter() - t)
                routes.append([(layer, [int(e) for e in step.routes[0, j]])
                               for j, layer in enumerate(layers)])
            logits = step.logits[0]
        rows = usage_rows(be.shape)
        counts = be.tiers.tier_counts(rows, be.shape.n_routed_experts)
        devices = [{"index": d.index, "name": d.name, "memory_bytes": d.memory_bytes,
                    "used_bytes": d.used_bytes, "experts": d.experts} for d in be.devices()]
        return {"backend": be.name, "device": device or "cpu", "build": be.build,
                "load_s": load_s, "placed_experts": placed, "greedy_ids": ids,
                "step_s": times, "routes": routes,
                "tiers": {"vram": counts.vram, "ram": counts.ram, "disk": counts.disk,
                          "vram_bytes": counts.vram_bytes, "ram_bytes": counts.ram_bytes},
                "devices": devices, "log_tail": log.getvalue().splitlines()[-5:]}
    finally:
        be.close()


def run_phase(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """A phase's worker process: its last stdout line is its JSON; a failure or a hang is an
    ``error`` entry with the cause and the end of its stderr."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raw = exc.stderr or b""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        return {"error": f"timed out after {timeout_s:g} s", "timed_out": True,
                "stderr_tail": text.strip().splitlines()[-5:]}
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except ValueError:
        result = {}
    if proc.returncode != 0 or not result:
        lines = proc.stderr.strip().splitlines()[-8:]
        last = f": {lines[-1]}" if lines else ""
        return {"error": result.get("error") or f"exit {proc.returncode}{last}",
                "stderr_tail": lines, "wall_s": wall}
    result["wall_s"] = wall
    return result


def expert_bytes(model_dir: Path) -> int:
    from colibri.reference.safetensors import Checkpoint

    ckpt = Checkpoint(model_dir)
    return sum(info.end - info.begin for name, info in ckpt.tensors.items()
               if ".mlp.experts." in name)


Phase = tuple[str, Callable[[], dict[str, Any]]]


def phases(model_dir: Path, tokens: int, warmup: int,
           deadline: Callable[[str], float] = PHASE_DEADLINES.__getitem__,
           copy_gib: float = 1.0) -> list[Phase]:
    """The section's phases in order, each a thunk running one worker process under
    ``deadline(kind)`` seconds, asked when the phase starts."""
    py = sys.executable

    def decode_cmd(backend: str, device: str, vram: int) -> list[str]:
        return [py, "-m", "colibri.benchmarks.cuda_decode", "--model", str(model_dir),
                "--backend", backend, "--device", device, "--vram-bytes", str(vram),
                "--tokens", str(tokens), "--warmup", str(warmup)]

    def slots_cmd(n: int) -> list[str]:
        return [py, "-m", "colibri.benchmarks.engine_slots", "--model", str(model_dir),
                "--slots", str(n), "--tokens", str(tokens), "--warmup", str(warmup),
                "--backend", "accelerated", "--device", "cuda", "--env", "CUDA_EXPERT_GB=auto"]

    timeout = deadline
    out: list[Phase] = [
        ("copy", lambda: run_phase([py, "-m", "colibri.benchmarks.cuda_copy", "--gib",
                                    str(copy_gib)], timeout("copy"))),
        ("decode_cuda", lambda: run_phase(decode_cmd("accelerated", "cuda", -1),
                                          timeout("decode_cuda"))),
    ]
    for n in SLOT_COUNTS:
        out.append((f"slots_cuda_{n}",
                    lambda n=n: run_phase(slots_cmd(n), timeout("slots"))))  # type: ignore[misc]
    out.append(("decode_cpu", lambda: run_phase(decode_cmd("accelerated", "cpu", 0),
                                                timeout("decode_cpu"))))
    total = expert_bytes(model_dir)
    for share in TIER_SHARES:
        vram = max(1, int(share * total))
        out.append((f"tiered_{share:g}",
                    lambda vram=vram: run_phase(decode_cmd("accelerated", "cuda", vram),  # type: ignore[misc]
                                                timeout("tiered"))))
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
    from colibri.benchmarks.gpu_report import assemble

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one cuda-decode decode measurement (JSON)")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--backend", default="accelerated")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vram-bytes", type=int, default=-1,
                        help="the VRAM expert budget (-1: auto, 0: none)")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    args = parser.parse_args(argv)
    device = None if args.device == "cpu" else args.device
    try:
        result = decode(args.model, args.backend, device, args.vram_bytes, args.tokens,
                        args.warmup)
    except Exception as exc:  # noqa: BLE001 - the phase reports any refusal as its result
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
