"""Bench section ``engine-slots``: the engine's aggregate decode tok/s with 1, 4 and 8 busy slots.

The reference engine (the same mux loop ``colibri engine`` runs) serves one request per slot
on the benchmark model in a fresh process per slot count. Every slot stays busy for the whole
measurement (stop tokens are disabled, budgets cover it), and only decode steps in which all
N slots contributed a row are timed, after ``warmup`` such steps: aggregate tok/s =
N x steps / seconds inside the batched forwards. Target: 8 busy slots give at least
3x the aggregate tok/s of one, because a batched step reads the shared weights once for every
row; the report says whether this build meets it.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode_worker import PROMPT
from colibri.benchmarks.stats import median
from colibri.benchmarks.workers import call
from colibri.protocol.records import Submit, SubmitRequest

SLOT_COUNTS = (1, 4, 8)
TARGET_RATIO_8_OVER_1 = 3.0


def measure(model_dir: Path | str, slots: int, tokens: int, warmup: int,
            backend: str = "reference", device: str | None = None,
            extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the mux loop in this process with `slots` busy slots; time the full steps (on
    ``backend``/``device``; ``extra_env`` adds engine variables, e.g. CUDA_EXPERT_GB)."""
    from colibri.engine.main import build_runtime
    from colibri.engine.mux import MuxEngine
    from colibri.engine.settings import from_environment
    from colibri.engine.wire_input import BytesSource
    from colibri.engine.wire_output import FrameWriter

    # Plain decode: MTP drafting would change the row count.
    env = {"COLI_PERSIST": "0", "DRAFT": "0", **(extra_env or {})}
    budget = warmup + tokens + slots  # later slots join one step after another
    ctx = len(PROMPT) + budget + 8
    settings = from_environment(env, model_dir=Path(model_dir), kv_slots=slots, ctx=ctx,
                                backend=backend, device=device)
    t0 = time.perf_counter()
    # No request may end early on a stop token: every slot stays busy.
    runtime = build_runtime(settings, env, io.StringIO(), ignore_stops=True)
    load_s = time.perf_counter() - t0
    script = b""
    for slot in range(slots):
        prompt = PROMPT[slot % len(PROMPT) :] + PROMPT[: slot % len(PROMPT)]
        payload = " ".join(str(t) for t in prompt).encode()
        script += Submit(slot + 1, SubmitRequest(slot, payload, budget, 0.0, 1.0, b"",
                                                  {"ids": 1})).encode()
    sink = io.BytesIO()
    engine = MuxEngine(runtime, BytesSource(script), FrameWriter(sink))
    t1 = time.perf_counter()
    engine.run()
    run_s = time.perf_counter() - t1
    full = [seconds for rows, seconds in engine.step_log if rows == slots]
    timed = full[warmup : warmup + tokens]
    if not timed:
        return {"slots": slots, "error": "no decode step had every slot busy"}
    total = sum(timed)
    return {
        "slots": slots,
        "timed_steps": len(timed),
        "aggregate_tokens_per_s": slots * len(timed) / total,
        "per_slot_tokens_per_s": len(timed) / total,
        "median_step_ms": 1000 * median(timed),
        "warmup_step_ms": [1000 * s for s in full[:warmup]],
        "decode_steps": engine.steps,
        "decode_rows": engine.rows,
        "tokens_emitted": sink.getvalue().count(b"\nDATA ") + sink.getvalue().startswith(b"DATA"),
        "run_wall_s": run_s,
        "load_s": load_s,
    }


def _spawn(model_dir: Path, slots: int, tokens: int, warmup: int) -> dict[str, Any]:
    spec = {"model_dir": str(model_dir), "slots": slots, "tokens": tokens, "warmup": warmup}
    return {"slots": slots, **call("engine_slots:measure", spec, "engine-slots worker")}


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    counts = options.extra.get("engine_slots", SLOT_COUNTS)
    result: dict[str, Any] = {
        "model": str(model_dir),
        "engine": "reference (colibri engine, mux loop in-process)",
        "method": "aggregate tok/s over decode steps with every slot busy, after warm-up",
        "slots": {},
    }
    for slots in counts:
        # A fresh process per slot count: one run's memory and caches do not colour the next.
        result["slots"][str(slots)] = _spawn(model_dir, slots, options.tokens, options.warmup)
    one = result["slots"].get("1", {}).get("aggregate_tokens_per_s")
    for slots in counts:
        entry = result["slots"][str(slots)]
        if one and "aggregate_tokens_per_s" in entry:
            entry["ratio_over_1_slot"] = entry["aggregate_tokens_per_s"] / one
    eight = result["slots"].get("8", {}).get("ratio_over_1_slot")
    if eight is not None:
        result["target_ratio_8_over_1"] = TARGET_RATIO_8_OVER_1
        result["meets_target"] = eight >= TARGET_RATIO_8_OVER_1
    return result


register(
    Section(
        name="engine-slots",
        engines=("reference",),
        description="colibri engine aggregate decode tok/s with 1, 4, 8 busy KV slots",
        run=run,
    )
)

