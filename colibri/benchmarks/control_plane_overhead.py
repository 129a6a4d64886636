"""Bench section ``control-plane``: the engine's own time per decode step, interpreted vs
mypyc-compiled, side by side in one run.

The mux loop (what ``colibri engine`` runs) drives a zero-cost backend
(``colibri.benchmarks.zero_backend``: fixed logits over the bench checkpoint's 8192-token
vocabulary) with 1 and 8 busy slots, greedy, stop tokens off. The overhead of a decode step is
measured directly: the time from one ``step`` returning to the next ``step`` being called
(reading commands, batching, sampling, telemetry, writing frames), one sample per step,
thousands of steps pooled over ``REPEATS`` runs in each of ``ROUNDS`` interleaved processes
per mode. The report gives the median with the 10th/90th percentiles, and compiled /
interpreted as a ratio of medians: a median over thousands of single steps is not moved by a
few steps another job on a shared machine interrupted, where a mean or a best total was.
Each process runs with ``COLIBRI_CONTROL_PLANE=interpreted`` or ``=compiled``; the compiled
column is absent, with the reason, where ``make build`` has not compiled the control plane.
"""

from __future__ import annotations

import io
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.stats import percentile
from colibri.benchmarks.workers import call
from colibri.protocol.records import Submit, SubmitRequest

SLOT_COUNTS = (1, 8)
MODES = ("interpreted", "compiled")
REPEATS = 5
ROUNDS = 3


def measure(slots: int, steps: int, warmup: int) -> dict[str, Any]:
    """In this process (control plane already chosen): the loop's time between backend steps,
    one sample per decode step."""
    from pathlib import Path

    from colibri import control_plane
    from colibri.benchmarks.zero_backend import ZeroBackend
    from colibri.engine.main import build_runtime
    from colibri.engine.mux import MuxEngine
    from colibri.engine.settings import from_environment
    from colibri.engine.wire_input import BytesSource
    from colibri.engine.wire_output import FrameWriter

    env = {"COLI_PERSIST": "0", "DRAFT": "0"}
    budget = warmup + steps

    def one_run(tokens: int) -> tuple[ZeroBackend, MuxEngine]:
        backend = ZeroBackend(max_rows=max(slots, 1))
        settings = from_environment(env, model_dir=Path("zero-model"), kv_slots=slots,
                                    ctx=tokens + 64)
        runtime = build_runtime(settings, env, io.StringIO(), backend=backend,
                                ignore_stops=True)
        script = b"".join(
            Submit(slot + 1, SubmitRequest(slot, b"3 4 5", tokens, 0.0, 1.0, b"", {"ids": 1}))
            .encode()
            for slot in range(slots)
        )
        engine = MuxEngine(runtime, BytesSource(script), FrameWriter(io.BytesIO()))
        engine.run()
        return backend, engine

    one_run(warmup)  # imports, caches and allocations out of the timed run
    gaps: list[float] = []
    steps = rows = 0
    for _ in range(REPEATS):
        backend, engine = one_run(budget)
        gaps.extend(backend.gaps())
        steps += engine.steps
        rows += engine.rows
    return {
        "repeats": REPEATS,
        "slots": slots,
        "decode_steps": steps,
        "decode_rows": rows,
        "gaps_us": [round(1e6 * g, 3) for g in gaps],
        "compiled_modules": len(control_plane.compiled_modules()),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool the per-step samples of one mode's processes into median and spread."""
    errors = [r["error"] for r in runs if "error" in r]
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": errors[0] if errors else "no run"}
    gaps = [g for r in good for g in r["gaps_us"]]
    slots = good[0]["slots"]
    return {
        "processes": len(good),
        "samples": len(gaps),
        "overhead_us_per_step_median": percentile(gaps, 0.5),
        "overhead_us_per_step_p10": percentile(gaps, 0.1),
        "overhead_us_per_step_p90": percentile(gaps, 0.9),
        "overhead_us_per_row_median": percentile(gaps, 0.5) / slots,
        "compiled_modules": good[0]["compiled_modules"],
        **({"failed_processes": errors} if errors else {}),
    }


def measure_in_mode(slots: int, steps: int, warmup: int) -> dict[str, Any]:
    """:func:`measure` in a worker whose ``COLIBRI_CONTROL_PLANE`` chose the mode: the choice
    is made before ``colibri.engine`` is first imported."""
    from colibri import control_plane

    control_plane.select([])
    return measure(slots, steps, warmup)


def _spawn(mode: str, slots: int, steps: int, warmup: int) -> dict[str, Any]:
    return call("control_plane_overhead:measure_in_mode",
                {"slots": slots, "steps": steps, "warmup": warmup}, f"{mode} worker",
                env={"COLIBRI_CONTROL_PLANE": mode})


def run(options: BenchOptions) -> dict[str, Any]:
    steps = max(options.tokens, 1) * 32  # each step is short: more of them for a stable mean
    result: dict[str, Any] = {
        "method": "mux loop on a zero-cost backend: time from one backend.step returning to "
                  "the next call, per step; median and p10/p90 over every step of every "
                  "process; compiled/interpreted is the ratio of medians",
        "steps": steps,
        "slots": {},
    }
    for slots in SLOT_COUNTS:
        # Interleaved rounds: a burst of load on a shared machine then hits both modes alike
        # instead of one whole column.
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for _ in range(ROUNDS):
            for mode in MODES:
                runs[mode].append(_spawn(mode, slots, steps, options.warmup))
        entry: dict[str, Any] = {mode: summarize(runs[mode]) for mode in MODES}
        a = entry["interpreted"].get("overhead_us_per_step_median")
        b = entry["compiled"].get("overhead_us_per_step_median")
        if a and b:
            entry["compiled_over_interpreted"] = b / a
            entry["speedup"] = a / b
        result["slots"][str(slots)] = entry
    return result


register(
    Section(
        name="control-plane",
        engines=("reference", "accelerated"),
        description="engine overhead per decode step outside the backend, interpreted vs mypyc",
        run=run,
    )
)

