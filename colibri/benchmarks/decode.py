"""The decode comparison, parent side: what the decode worker measured, as a report.

:func:`measure_alone` runs ``decode_worker.alone`` for one engine in a fresh process (so one
engine's memory and threads do not colour another's numbers); :func:`engine_report` turns its
timings and routes into tok/s, achieved GB/s (the weight bytes each step had to read /
seconds), RSS against the checkpoint and the prefill figures. The decode sections choose the
engines and rows (``decode_sections``, ``turn_sections``, ``quant_formats``, ``cuda_decode``)
and put the ratios side by side.

A step's weight bytes (:func:`step_bytes`): every non-expert tensor, one embedding row, and
each routed expert the step chose, counted once per step however many rows chose it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions
from colibri.benchmarks.decode_worker import PREFILL_TOKENS, PROMPT
from colibri.benchmarks.stats import median
from colibri.benchmarks.workers import call

#: (name, bytes, rows) of each stored tensor of a checkpoint.
TensorTable = list[tuple[str, int, int]]


def tensor_table(model_dir: Path) -> tuple[TensorTable, int]:
    """The checkpoint's tensors and its decoder layer count (the MTP layers come after)."""
    from colibri.reference.safetensors import Checkpoint

    ckpt = Checkpoint(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    table = [(name, info.end - info.begin, info.shape[0]) for name, info in ckpt.tensors.items()]
    return table, int(config["num_hidden_layers"])


def step_bytes(
    tensors: Iterable[tuple[str, int, int]], n_layers: int, steps: Iterable[Iterable[Any]]
) -> tuple[list[int], list[int]]:
    """Weight bytes each decode step reads, and the routed experts' share of them.

    ``tensors`` gives each stored tensor as (name, bytes, rows); ``steps`` each step's routes as
    (layer, expert ids) pairs. A step reads every non-expert tensor, one embedding row and each
    routed expert it chose (counted once per step); the MTP layers do not run in plain decode.
    """
    fixed = embed_row = 0
    expert: dict[tuple[int, int], int] = {}
    for name, nbytes, rows in tensors:
        parts = name.split(".")
        if name == "model.embed_tokens.weight":
            embed_row = nbytes // rows
            continue
        if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= n_layers:
            continue
        if ".mlp.experts." in name:
            key = (int(parts[2]), int(parts[5]))
            expert[key] = expert.get(key, 0) + nbytes
            continue
        fixed += nbytes
    totals, experts = [], []
    for routes in steps:
        chosen = {(int(layer), int(e)) for layer, ids in routes for e in ids}
        moved = sum(expert[k] for k in chosen)
        experts.append(moved)
        totals.append(fixed + embed_row + moved)
    return totals, experts


def touched_bytes(model_dir: Path, steps: Iterable[Iterable[Any]]) -> list[int]:
    """Weight bytes each decode step of ``steps`` (its routes) read from ``model_dir``."""
    table, n_layers = tensor_table(model_dir)
    return step_bytes(table, n_layers, steps)[0]


def checkpoint_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def decode_summary(step_s: list[float], touched: list[int] | None,
                   tokens_per_step: int = 1) -> dict[str, Any]:
    """tok/s and median step; with the bytes each step read (``touched``), achieved GB/s."""
    total = sum(step_s)
    out: dict[str, Any] = {"steps": len(step_s),
                           "tokens_per_s": tokens_per_step * len(step_s) / total,
                           "median_step_ms": 1000 * median(step_s)}
    if touched is not None:
        out["weight_bytes_per_step"] = int(sum(touched) / len(touched))
        out["achieved_gb_per_s"] = sum(touched) / total / 1e9
    return out


def roofline(summary: dict[str, Any], copy_bps: float, tokens_per_step: int) -> None:
    """Add the copy-bandwidth bound of a decode summary's steps and its fraction of it."""
    bound = tokens_per_step * copy_bps / summary["weight_bytes_per_step"]
    summary["bandwidth_bound_tokens_per_s"] = bound
    summary["fraction_of_bound"] = summary["tokens_per_s"] / bound
    summary["achieved_over_copy_bandwidth"] = summary["achieved_gb_per_s"] * 1e9 / copy_bps


def prefill_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Time to first token (the short prompt's prefill) and prefill throughput (the long
    prompt's), medians over the repeats."""
    return {
        "prompt_tokens": len(PROMPT),
        "time_to_first_token_ms": 1000 * median(raw["ttft_s"]),
        "prefill_tokens": PREFILL_TOKENS,
        "prefill_median_s": median(raw["prefill_s"]),
        "prefill_tokens_per_s": PREFILL_TOKENS / median(raw["prefill_s"]),
    }


def rss_summary(raw: dict[str, Any], checkpoint_size: int) -> dict[str, Any]:
    """A worker's RSS after load, absolute and grown over the interpreter it loaded in, each
    against the checkpoint's size. The growth is what the weights cost: the absolute figure
    also holds the interpreter and its libraries (100-200 MB), which dominate it for a small
    container, so a lazily mapped one can read "0.85 of the checkpoint" absolute while the
    load itself added a few percent.

    Where the worker also says how much of the checkpoint's own map is resident then
    (``weights_mapped_after_load``), the growth is split into those page-cache pages, which the
    kernel shares and can drop, and the rest, which the engine allocated. A checkpoint cached
    in 2 MiB folios maps a whole folio wherever a load touches a small tensor, so its share of
    the growth is mostly bytes never read."""
    after = raw["rss_after_load_bytes"]
    out: dict[str, Any] = {"rss_after_load_bytes": after,
                           "rss_after_load_vs_checkpoint": after / checkpoint_size}
    grown = after - raw["rss_before_load_bytes"]
    out["rss_growth_at_load_bytes"] = grown
    out["rss_growth_at_load_vs_checkpoint"] = grown / checkpoint_size
    mapped = raw.get("weights_mapped_after_load")
    if mapped is not None:
        out["rss_growth_in_weight_maps_bytes"] = mapped["resident_bytes"]
        out["weight_maps_in_2mib_entries_fraction"] = mapped["huge_mapped_fraction"]
        out["rss_growth_outside_weight_maps_bytes"] = grown - mapped["resident_bytes"]
    return out


def peer_python(options: BenchOptions) -> str:
    """The interpreter that runs a peer engine: --peer-python, $COLIBRI_PEER_PYTHON, or ours."""
    chosen = options.extra.get("peer_python") or os.environ.get("COLIBRI_PEER_PYTHON")
    return str(chosen) if chosen else sys.executable


def measure_alone(engine: dict[str, Any], options: BenchOptions, what: str, *,
                  batch: bool = True, prefill: bool = True, python: str | None = None,
                  logits_path: Path | None = None) -> dict[str, Any]:
    """``decode_worker.alone`` for ``engine`` (a spec: ``kind``, ``model``, ...) in a fresh
    ``python``, with the run's tokens, warm-up and (with ``batch``) rows."""
    spec = {"engine": engine, "tokens": options.tokens, "warmup": options.warmup,
            "batch": options.batch if batch else 0, "prefill": prefill,
            "logits_path": None if logits_path is None else str(logits_path)}
    return call("decode_worker:alone", spec, what, python=python)


def engine_report(raw: dict[str, Any], model_dir: Path, batch: int,
                  copy_bps: float | None = None) -> dict[str, Any]:
    """One colibri engine's worker result on ``model_dir``: load, RSS, decode alone and
    batched, greedy ids, prefill; with ``copy_bps``, each decode against its roofline."""
    size = checkpoint_bytes(model_dir)
    out: dict[str, Any] = {
        "load_s": raw["load_s"],
        **rss_summary(raw, size),
        "decode": decode_summary(raw["step_s"], touched_bytes(model_dir, raw["routes"])),
    }
    if "batch_step_s" in raw:
        out["decode_batch"] = {"batch": batch, **decode_summary(
            raw["batch_step_s"], touched_bytes(model_dir, raw["batch_routes"]), batch)}
    out["greedy_ids"] = raw["ids"]
    if "ttft_s" in raw:
        out["prefill"] = prefill_summary(raw)
    if copy_bps is not None:
        roofline(out["decode"], copy_bps, 1)
        roofline(out["decode_batch"], copy_bps, batch)
        out["ratio_batch_over_single"] = (out["decode_batch"]["tokens_per_s"]
                                          / out["decode"]["tokens_per_s"])
    return out


def set_ratio(result: dict[str, Any], name: str, ours: dict[str, Any], peer: dict[str, Any],
              phase: str, key: str) -> None:
    """``result[name]`` = ours / peer of ``phase.key`` where both measured that phase."""
    if phase in ours and phase in peer:
        result[name] = ours[phase][key] / peer[phase][key]
