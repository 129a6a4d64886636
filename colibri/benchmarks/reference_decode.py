"""Bench section ``reference-decode``: the numpy reference's decode speed beside HF transformers.

Each engine runs in its own fresh process (HF in ``hf_worker.py``, a standalone script, so any
interpreter with torch can run it: ``--peer-python``) (so one's memory and threads do not colour the
other's numbers) on the same checkpoint and prompt:

* load time, and the process RSS right after opening the model vs the checkpoint size (the
  reference memory-maps weights, so little should be resident);
* greedy decode: tokens/s over ``tokens`` steps after a 12-token prefill and ``warmup``
  untimed steps (the first steps fault in experts never used before; their times are listed
  apart), and achieved GB/s =
  bytes of weights a step touches (every non-expert matrix, one embedding row, and each routed
  expert chosen in that step, counted once) / seconds per step;
* for the reference also ``decode_batch`` with ``batch`` sequences (aggregate tokens/s, GB/s
  counting each expert once per step);
* HF transformers eager float32 (``GlmMoeDsaForCausalLM``) when torch and transformers import,
  and the ratio reference/HF.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode_steps import (
    PREFILL_TOKENS,
    PROMPT,
    Route,
    median,
    prefill_prompt,
    prefill_summary,
    routes_from_json,
    run_worker,
    step_bytes,
    step_routes,
    timed_greedy_decode,
    timed_prefill,
)
from colibri.benchmarks.hf_worker import rss_bytes, rss_summary
from colibri.benchmarks.page_cache import model_files, refresh_for
from colibri.benchmarks.page_mapping import checkpoint_mapping


def checkpoint_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def touched_bytes(model_dir: Path, steps: list[list[Route]]) -> list[int]:
    """Weight bytes each decode step reads: non-expert tensors + embedding rows + its experts."""
    from colibri.reference.safetensors import Checkpoint

    ckpt = Checkpoint(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = ((name, info.end - info.begin, info.shape[0]) for name, info in ckpt.tensors.items())
    return step_bytes(tensors, config["num_hidden_layers"], steps)[0]


# ---------------------------------------------------------------------------------------------
# workers (run in a fresh interpreter)


def _reference_worker(model_dir: Path, tokens: int, batch: int, warmup: int,
                      engine: str = "reference") -> dict[str, Any]:
    import numpy as np

    rss_before = rss_bytes()
    t0 = time.perf_counter()
    if engine == "accelerated":
        from colibri.accelerated import load_model as load_accelerated

        model: Any = load_accelerated(model_dir)
    else:
        from colibri.reference import load_model

        model = load_model(model_dir)
    load_s = time.perf_counter() - t0
    rss_after = rss_bytes()
    mapped = checkpoint_mapping(model_dir)
    state = model.new_state()
    logits = model.prefill(state, PROMPT)[-1]
    ids, times, steps = timed_greedy_decode(model, state, logits, warmup + tokens)
    # The first steps page in experts never used before; report them apart from steady state.
    warm_times, times = times[:warmup], times[warmup:]
    steps = steps[warmup:]
    # Batched decode: `batch` sequences that share the prompt but diverge by their first token.
    states = []
    batch_tokens = []
    for b in range(batch):
        s = model.new_state()
        batch_tokens.append(int(np.argmax(model.prefill(s, PROMPT + [b + 2])[-1])))
        states.append(s)
    batch_steps: list[list[Route]] = []
    batch_times: list[float] = []
    for step in range(warmup + max(1, tokens // 2)):
        t = time.perf_counter()
        out, routes = model.forward_rows(states, batch_tokens, [True] * len(states))
        batch_times.append(time.perf_counter() - t)
        batch_steps.append(step_routes(model, routes))
        batch_tokens = [int(i) for i in np.argmax(out, axis=-1)]
        if step < warmup:
            batch_times.pop()
            batch_steps.pop()
    alone_ms = [1000 * t for t in warm_times]
    ttft_s = timed_prefill(model, PROMPT, 3)
    prefill_s = timed_prefill(model, prefill_prompt(model.config.vocab_size), 2)
    return {
        "ttft_s": ttft_s,
        "prefill_s": prefill_s,
        "load_s": load_s,
        "rss_before_load_bytes": rss_before,
        "rss_after_load_bytes": rss_after,
        "weights_mapped_after_load": mapped,
        "ids": ids,
        "step_s": times,
        "warmup_step_ms": alone_ms,
        "routes": [[[layer, list(e)] for layer, e in s] for s in steps],
        "batch_step_s": batch_times,
        "batch_routes": [[[layer, list(e)] for layer, e in s] for s in batch_steps],
        "threads": os.cpu_count(),
    }


def peer_python(options: BenchOptions) -> str:
    """The interpreter that runs HF transformers: --peer-python, $COLIBRI_PEER_PYTHON, or ours."""
    chosen = options.extra.get("peer_python") or os.environ.get("COLIBRI_PEER_PYTHON")
    return str(chosen) if chosen else sys.executable


def _torch_available(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import torch, transformers"], capture_output=True,
                           check=False)
    return probe.returncode == 0


# ---------------------------------------------------------------------------------------------
# the section


def _decode_summary(
    step_s: list[float], touched: list[int], tokens_per_step: int
) -> dict[str, Any]:
    total = sum(step_s)
    return {
        "steps": len(step_s),
        "tokens_per_s": tokens_per_step * len(step_s) / total,
        "median_step_ms": 1000 * median(step_s),
        "weight_bytes_per_step": int(sum(touched) / len(touched)),
        "achieved_gb_per_s": sum(touched) / total / 1e9,
    }


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    size = checkpoint_bytes(model_dir)
    result: dict[str, Any] = {"model": str(model_dir), "checkpoint_bytes": size,
                              "prompt_tokens": len(PROMPT),
                              "page_cache": refresh_for(options, model_files(model_dir))}
    ref = run_worker([sys.executable, "-m", "colibri.benchmarks.reference_decode",
                      "--model", str(model_dir), "--tokens", str(options.tokens),
                      "--batch", str(options.batch), "--warmup", str(options.warmup)],
                     "reference worker")
    if "error" in ref:
        result["reference"] = ref
        return result

    touched = touched_bytes(model_dir, routes_from_json(ref["routes"]))
    batch_touched = touched_bytes(model_dir, routes_from_json(ref["batch_routes"]))
    result["reference"] = {
        "load_s": ref["load_s"],
        **rss_summary(ref, size),
        "decode": _decode_summary(ref["step_s"], touched, 1),
        "warmup_steps_ms": ref["warmup_step_ms"],
        "decode_batch": {"batch": options.batch,
                         **_decode_summary(ref["batch_step_s"], batch_touched, options.batch)},
        "greedy_ids": ref["ids"],
        "cpu_count": ref["threads"],
        "prefill": prefill_summary(ref["ttft_s"], ref["prefill_s"], PREFILL_TOKENS,
                                   len(PROMPT)),
    }
    python = peer_python(options)
    if options.peers and _torch_available(python):
        hf = run_worker([python, str(Path(__file__).with_name("hf_worker.py")), "--model",
                         str(model_dir), "--tokens", str(options.tokens),
                         "--warmup", str(options.warmup),
                         "--prompt", " ".join(map(str, PROMPT))], "hf worker")
        if "error" in hf:
            result["hf_transformers_eager"] = hf
        else:
            result["hf_transformers_eager"] = {
                "load_s": hf["load_s"],
                **rss_summary(hf, size),
                "decode": _decode_summary(hf["step_s"], touched, 1),
                "greedy_ids": hf["ids"],
                "same_greedy_ids": hf["ids"] == ref["ids"],
                "versions": hf["versions"],
                "torch_threads": hf["torch_threads"],
            }
            ref_tps = result["reference"]["decode"]["tokens_per_s"]
            hf_tps = result["hf_transformers_eager"]["decode"]["tokens_per_s"]
            result["ratio_reference_over_hf_decode"] = ref_tps / hf_tps
    elif options.peers:
        result["hf_transformers_eager"] = {
            "skipped": f"torch/transformers not importable by {python} (see --peer-python)"
        }
    return result


register(Section(
    name="reference-decode",
    engines=("reference",),
    description="numpy reference decode tok/s and GB/s, RSS after load, vs HF transformers eager",
    run=run,
))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the reference bench worker (internal)")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--engine", choices=("reference", "accelerated"), default="reference")
    args = parser.parse_args(argv)
    print(json.dumps(_reference_worker(args.model, args.tokens, args.batch, args.warmup,
                                       args.engine)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
