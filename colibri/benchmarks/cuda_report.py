"""The ``cuda-decode`` report from its phases' raw results: every number is a measurement of
this run, every ratio between two phases of this run; a phase that failed or timed out is
reported as such, and the ratios that need it are left out (never guessed).

``assemble(model_dir, results, tokens, warmup)`` is pure given the model's tensor table, so
it is unit-tested with canned phase results; ``tools/gpu_check.py`` calls it after every
phase, so a later hang still leaves a report of what ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colibri.benchmarks.decode import TensorTable, decode_summary, step_bytes, tensor_table

TARGET_FRACTION_OF_COPY = 0.5


def phase_summary(raw: dict[str, Any], table: TensorTable, n_layers: int) -> dict[str, Any]:
    """tok/s and achieved GB/s of one decode phase (bytes a step reads / its seconds)."""
    per_step, expert_part = step_bytes(table, n_layers, raw["routes"])
    return {
        **decode_summary(raw["step_s"], per_step),
        "weight_bytes_per_step": sum(per_step) / len(per_step),
        "expert_bytes_per_step": sum(expert_part) / len(expert_part),
        "tiers": raw.get("tiers"),
        "devices": raw.get("devices"),
        "build": raw.get("build"),
    }


def _ok(raw: dict[str, Any] | None) -> bool:
    return raw is not None and "error" not in raw


def assemble(model_dir: Path, results: dict[str, dict[str, Any]], tokens: int,
             warmup: int) -> dict[str, Any]:
    table, n_layers = tensor_table(model_dir)
    total_experts_bytes = sum(b for name, b, _ in table if ".mlp.experts." in name)
    report: dict[str, Any] = {
        "model": str(model_dir),
        "checkpoint_bytes": sum(b for _, b, _ in table),
        "expert_bytes": total_experts_bytes,
        "tokens": tokens, "warmup": warmup,
        "note": "timings from one run; ratios are between phases of this run",
        "phases": {name: ("ok" if _ok(raw) else raw.get("error", "failed"))
                   for name, raw in results.items()},
        "errors": {name: raw for name, raw in results.items() if not _ok(raw)},
    }
    copy = results.get("copy")
    copy_bps = None
    if _ok(copy):
        assert copy is not None
        copy_bps = float(copy["copy_bandwidth_gb_per_s"]) * 1e9
        report["copy_bandwidth_gb_per_s"] = copy["copy_bandwidth_gb_per_s"]
        report["copy"] = {k: copy[k] for k in ("bytes", "repeats", "best_ms", "method")}
    decodes: dict[str, dict[str, Any]] = {}
    for name in ("decode_cuda", "decode_cpu"):
        raw = results.get(name)
        if _ok(raw):
            assert raw is not None
            decodes[name] = phase_summary(raw, table, n_layers)
            if copy_bps is not None and name == "decode_cuda":
                fraction = decodes[name]["achieved_gb_per_s"] * 1e9 / copy_bps
                decodes[name]["achieved_over_copy_bandwidth"] = fraction
                decodes[name]["target"] = TARGET_FRACTION_OF_COPY
                decodes[name]["meets_target"] = fraction >= TARGET_FRACTION_OF_COPY
            report[name] = decodes[name]
    cuda, cpu = results.get("decode_cuda"), results.get("decode_cpu")
    if _ok(cuda) and _ok(cpu):
        assert cuda is not None and cpu is not None
        report["same_greedy_ids_cuda_cpu"] = cuda["ids"] == cpu["ids"]
        report["ratio_cuda_over_cpu_decode"] = (decodes["decode_cuda"]["tokens_per_s"]
                                                / decodes["decode_cpu"]["tokens_per_s"])
    slots: dict[str, Any] = {}
    for name, raw in results.items():
        if name.startswith("slots_cuda_") and _ok(raw) and "aggregate_tokens_per_s" in raw:
            slots[name.removeprefix("slots_cuda_")] = {
                k: raw[k] for k in ("aggregate_tokens_per_s", "per_slot_tokens_per_s",
                                    "median_step_ms", "timed_steps")}
    one = slots.get("1", {}).get("aggregate_tokens_per_s")
    for entry in slots.values():
        if one:
            entry["ratio_over_1_slot"] = entry["aggregate_tokens_per_s"] / one
    if slots:
        report["slots_cuda"] = slots
    tiered: list[dict[str, Any]] = []
    for name, raw in results.items():
        if name.startswith("tiered_") and _ok(raw):
            summary = phase_summary(raw, table, n_layers)
            tiers = raw["tiers"]
            entry = {"requested_share": float(name.removeprefix("tiered_")),
                     "vram_experts": tiers["vram"], "ram_experts": tiers["ram"],
                     "vram_share_of_expert_bytes": tiers["vram_bytes"] / total_experts_bytes,
                     "tokens_per_s": summary["tokens_per_s"],
                     "achieved_gb_per_s": summary["achieved_gb_per_s"]}
            if "decode_cuda" in decodes:
                full = decodes["decode_cuda"]
                entry["ratio_over_full_vram"] = summary["tokens_per_s"] / full["tokens_per_s"]
            if "decode_cpu" in decodes:
                entry["ratio_over_cpu"] = (summary["tokens_per_s"]
                                           / decodes["decode_cpu"]["tokens_per_s"])
            if _ok(cuda):
                assert cuda is not None
                entry["same_greedy_ids_as_full_vram"] = raw["ids"] == cuda["ids"]
            tiered.append(entry)
    if tiered:
        report["tiered"] = sorted(tiered, key=lambda e: e["requested_share"])
    return report
