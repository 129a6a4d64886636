"""Bench section ``quant-formats``: the reference on each quantized container of one model.

The benchmark model is converted (``colibri convert``, cached beside it) to every expert format
colibri defines; each container -- and the float32 original -- then runs the same greedy decode
in a fresh process. Reported per format, side by side with f32:

* tokens/s over ``tokens`` steps after a 12-token prefill and ``warmup`` untimed steps, and the
  ratio to f32 (the reference dequantizes an expert on first use and keeps it in a byte-bounded
  LRU, ``COLIBRI_EXPERT_CACHE_MB``; its hit/miss counts are listed);
* bytes per token: container bytes one decode step reads (every non-expert weight, one
  embedding row, and the on-disk bytes of each routed expert chosen in that step), the expert
  share of it, and the ratio to f32 -- what a streaming engine has to move per token;
* accuracy against f32: the prefill's last logits (max-abs and relative L2 difference) and
  greedy agreement (tokens equal to the f32 run, position by position; on the random-weight
  bench model near-ties make greedy paths part quickly), and the container size.

Each run is the decode worker's ``alone`` program on the ``reference`` engine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode import measure_alone, step_bytes
from colibri.benchmarks.decode_worker import PROMPT
from colibri.benchmarks.page_cache import model_files, refresh_for

#: Expert formats in report order (``colibri convert --experts`` names); "f32" is the original.
SCHEMES = ("f32", "int8", "int4", "int4g64", "int4g128", "int3", "int2", "e8", "fp8")


def container_dir(base: Path, scheme: str, cache_dir: Path, dense: str = "f32",
                  io: str = "f32") -> Path:
    """Where ``container_for`` caches a conversion: every non-default choice is in the name,
    so a container cached before a choice existed is never mistaken for one that makes it."""
    name = f"{base.name}-{scheme}" + (f"-{dense}" if dense != "f32" else "")
    return cache_dir / (name + (f"-io-{io}" if io != "f32" else ""))


def container_for(base: Path, scheme: str, cache_dir: Path, dense: str = "f32",
                  io: str = "f32") -> tuple[Path, float | None]:
    """The container of ``base`` with ``scheme`` experts, ``dense`` non-expert weights and
    ``io`` embedding and lm_head (converted once, then reused)."""
    if scheme == "f32" and dense == "f32" and io == "f32":
        return base, None
    from colibri.commands.progress import byte_progress
    from colibri.reference.quant.convert import convert

    target = container_dir(base, scheme, cache_dir, dense, io)
    target.parent.mkdir(parents=True, exist_ok=True)
    done = target / "convert_report.json"
    if done.is_file():
        return target, None
    if target.exists():  # an interrupted conversion: start over
        for path in sorted(target.iterdir()):
            path.unlink()
        target.rmdir()
    t0 = time.perf_counter()
    advance, close = byte_progress(f"convert {scheme}")
    try:
        report = convert(base, target, scheme, dense, io=io, progress=advance)
    finally:
        close()
    seconds = time.perf_counter() - t0
    done.write_text(json.dumps({**report.as_dict(), "convert_s": seconds}, indent=2) + "\n")
    return target, seconds


def _bytes_per_step(model_dir: Path, steps: list[list[list[Any]]]) -> tuple[list[int], list[int]]:
    from colibri.reference.quant.safetensors_file import SafetensorsDir

    files = SafetensorsDir(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    # An expert's bytes are its payload plus its .qs sidecar (both named under the expert).
    tensors = ((name, entry.nbytes, entry.shape[0]) for name, entry in files.tensors.items())
    return step_bytes(tensors, config["num_hidden_layers"], steps)


def _measure(model_dir: Path, options: BenchOptions, logits_path: Path) -> dict[str, Any]:
    return measure_alone({"kind": "reference", "model": str(model_dir)}, options, "worker",
                         batch=False, prefill=False, logits_path=logits_path)


def run(options: BenchOptions) -> dict[str, Any]:
    base = options.model if options.model is not None else ensure_bench_model(options.cache_dir)
    schemes = tuple(options.extra.get("quant_schemes", SCHEMES))
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        raise ValueError(f"unknown quant scheme(s) {unknown}; known: {', '.join(SCHEMES)}")
    formats: dict[str, Any] = {}
    options.cache_dir.mkdir(parents=True, exist_ok=True)  # the prefill logits go there
    for scheme in schemes:
        try:
            model_dir, convert_s = container_for(base, scheme, options.cache_dir)
        except ValueError as exc:  # e.g. e8 on widths that are not multiples of 256
            formats[scheme] = {"error": f"conversion refused: {exc}"}
            continue
        logits_path = options.cache_dir / f"{base.name}-{scheme}.prefill_logits.npy"
        page_cache = refresh_for(options, model_files(model_dir))
        raw = _measure(model_dir, options, logits_path)
        if "error" in raw:
            formats[scheme] = raw
            continue
        totals, experts = _bytes_per_step(model_dir, raw["routes"])
        mean_step = sum(raw["step_s"]) / len(raw["step_s"])
        formats[scheme] = {
            "page_cache": page_cache,
            "tok_s": 1.0 / mean_step,
            "ms_per_token": 1000.0 * mean_step,
            "bytes_per_token": sum(totals) / len(totals),
            "expert_bytes_per_token": sum(experts) / len(experts),
            "container_bytes": sum(p.stat().st_size for p in model_dir.glob("*.safetensors")),
            "load_s": raw["load_s"],
            "convert_s": convert_s,
            "warmup_ms": [1000.0 * t for t in raw["warmup_step_s"]],
            "store": raw["store"],
            "expert_cache": raw["cache"],
            "ids": raw["ids"],
        }
    reference = formats.get("f32", {})
    f32_logits = options.cache_dir / f"{base.name}-f32.prefill_logits.npy"
    for scheme, row in formats.items():
        if "error" in row or "error" in reference or not reference:
            continue
        ours = np.load(options.cache_dir / f"{base.name}-{scheme}.prefill_logits.npy")
        theirs = np.load(f32_logits)
        row["prefill_logits_max_abs_diff_vs_f32"] = float(np.max(np.abs(ours - theirs)))
        row["prefill_logits_rel_l2_vs_f32"] = float(
            np.linalg.norm(ours - theirs) / max(float(np.linalg.norm(theirs)), 1e-30)
        )
        row["tok_s_vs_f32"] = row["tok_s"] / reference["tok_s"]
        row["bytes_per_token_vs_f32"] = row["bytes_per_token"] / reference["bytes_per_token"]
        same = sum(a == b for a, b in zip(row["ids"], reference["ids"], strict=True))
        row["greedy_agreement_vs_f32"] = same / len(reference["ids"])
    return {
        "model": str(base),
        "prompt_tokens": len(PROMPT),
        "tokens": options.tokens,
        "warmup": options.warmup,
        "expert_cache_mb_env": os.environ.get("COLIBRI_EXPERT_CACHE_MB"),
        "formats": formats,
    }


register(Section(
    name="quant-formats",
    engines=("reference-quantized",),
    description="reference decode on every quantized container vs f32 (tok/s, bytes/token)",
    run=run,
))

