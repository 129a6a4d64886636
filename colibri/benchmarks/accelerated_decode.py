"""Bench section ``accelerated-decode``: the accelerated engine beside the numpy reference.

Both run in their own fresh process (the reference-decode worker, ``--engine``), one after
the other in the same run, on the same checkpoint, prompt and greedy loop; the report gives
each one's tok/s and achieved GB/s (single sequence and ``decode_batch``), whether their
greedy ids agree, and the ratios accelerated / reference.
"""

from __future__ import annotations

import sys
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode_steps import PROMPT, Route, run_worker
from colibri.benchmarks.reference_decode import _decode_summary, checkpoint_bytes, touched_bytes


def _worker(engine: str, options: BenchOptions, model_dir: Any) -> dict[str, Any]:
    return run_worker([sys.executable, "-m", "colibri.benchmarks.reference_decode",
                       "--model", str(model_dir), "--tokens", str(options.tokens),
                       "--batch", str(options.batch), "--warmup", str(options.warmup),
                       "--engine", engine], f"{engine} worker")


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    size = checkpoint_bytes(model_dir)
    result: dict[str, Any] = {"model": str(model_dir), "checkpoint_bytes": size,
                              "prompt_tokens": len(PROMPT)}

    def routes_of(raw: list[list[list[Any]]]) -> list[list[Route]]:
        return [[(int(layer), tuple(int(e) for e in ids)) for layer, ids in s] for s in raw]

    for engine in ("accelerated", "reference"):
        raw = _worker(engine, options, model_dir)
        if "error" in raw:
            result[engine] = raw
            continue
        touched = touched_bytes(model_dir, routes_of(raw["routes"]))
        batch_touched = touched_bytes(model_dir, routes_of(raw["batch_routes"]))
        result[engine] = {
            "load_s": raw["load_s"],
            "rss_after_load_bytes": raw["rss_after_load_bytes"],
            "rss_after_load_vs_checkpoint": raw["rss_after_load_bytes"] / size,
            "decode": _decode_summary(raw["step_s"], touched, 1),
            "decode_batch": {"batch": options.batch,
                             **_decode_summary(raw["batch_step_s"], batch_touched,
                                               options.batch)},
            "greedy_ids": raw["ids"],
        }
    acc, ref = result.get("accelerated", {}), result.get("reference", {})
    if "decode" in acc and "decode" in ref:
        result["same_greedy_ids"] = acc["greedy_ids"] == ref["greedy_ids"]
        result["ratio_accelerated_over_reference_decode"] = (
            acc["decode"]["tokens_per_s"] / ref["decode"]["tokens_per_s"])
        result["ratio_accelerated_over_reference_decode_batch"] = (
            acc["decode_batch"]["tokens_per_s"] / ref["decode_batch"]["tokens_per_s"])
    return result


register(Section(
    name="accelerated-decode",
    engines=("accelerated",),
    description="accelerated (C kernels) decode tok/s and GB/s beside the numpy reference, "
                "as ratios",
    run=run,
))
