"""Bench section ``accelerated-decode``: the accelerated engine beside the numpy reference.

Both run in their own fresh process (the reference-decode worker, ``--engine``), one after
the other in the same run, on the same checkpoint, prompt and greedy loop; the report gives
each one's tok/s and achieved GB/s (single sequence and ``decode_batch``), whether their
greedy ids agree, and the ratios accelerated / reference. Beside them: the machine's copy
bandwidth (bytes read plus written per second by a 256 MiB numpy copy, best of 8), the
roofline it implies (copy bandwidth / weight bytes per step) and each engine's fraction of it,
and the batched step against its own bound (shared weights + the union of the rows' experts).
Both engines also report prefill: time to first token on the 12-token prompt and tokens/s on
a 64-token one (medians, weights already paged in).

On the generated bench model, the accelerated engine runs a second time on its container
with int4-grouped-64 experts, int8 dense weights and an int8 embedding and lm_head
(``colibri convert --experts int4g64 --dense int8 --io int8``, cached beside it). With
peers on, llama.cpp (``llama_cpp_peer``) runs the f32 and q8_0 GGUFs of the model when they
exist, or the report says why it was skipped; the ratios accelerated f32 / llama.cpp f32 and
that container / llama.cpp q8_0 follow.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode_steps import (
    PREFILL_TOKENS,
    PROMPT,
    median,
    prefill_summary,
    routes_from_json,
    run_worker,
)
from colibri.benchmarks.hf_worker import rss_summary
from colibri.benchmarks.llama_cpp_peer import FTYPES, gguf_path, run_peer
from colibri.benchmarks.page_cache import model_files, refresh_for
from colibri.benchmarks.quant_formats import container_for
from colibri.benchmarks.reference_decode import (
    _decode_summary,
    checkpoint_bytes,
    peer_python,
    touched_bytes,
)


def _worker(engine: str, options: BenchOptions, model_dir: Any) -> dict[str, Any]:
    return run_worker([sys.executable, "-m", "colibri.benchmarks.reference_decode",
                       "--model", str(model_dir), "--tokens", str(options.tokens),
                       "--batch", str(options.batch), "--warmup", str(options.warmup),
                       "--engine", engine], f"{engine} worker")


def copy_bandwidth_bytes_per_s(mib: int = 256, repeats: int = 8) -> float:
    """Bytes read plus written per second by a numpy copy of ``mib`` MiB, best of ``repeats``."""
    import time

    import numpy as np

    src = np.ones(mib << 18, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best


def _roofline(summary: dict[str, Any], copy_bps: float, tokens_per_step: int) -> None:
    bound = tokens_per_step * copy_bps / summary["weight_bytes_per_step"]
    summary["bandwidth_bound_tokens_per_s"] = bound
    summary["fraction_of_bound"] = summary["tokens_per_s"] / bound
    summary["achieved_over_copy_bandwidth"] = summary["achieved_gb_per_s"] * 1e9 / copy_bps


#: The quantized pass (against llama.cpp's q8_0): experts int4-grouped-64, dense weights int8,
#: and the embedding and lm_head int8-row, as llama.cpp's q8_0 GGUF stores ``output.weight``
#: in q8_0 (a float32 lm_head was 32 of the step's 115 MB).
QUANT_EXPERTS, QUANT_DENSE, QUANT_IO = "int4g64", "int8", "int8"
#: The pass's name in the report and its container's (``quant_formats.container_dir``).
QUANT_LABEL = f"{QUANT_EXPERTS}_{QUANT_DENSE}_io_{QUANT_IO}"


def _engine_result(engine: str, model_dir: Path, options: BenchOptions,
                   copy_bps: float) -> dict[str, Any]:
    """One engine's worker on ``model_dir``: decode alone and batched against the roofline,
    prefill, RSS."""
    raw = _worker(engine, options, model_dir)
    if "error" in raw:
        return raw
    size = checkpoint_bytes(model_dir)
    touched = touched_bytes(model_dir, routes_from_json(raw["routes"]))
    batch_touched = touched_bytes(model_dir, routes_from_json(raw["batch_routes"]))
    out: dict[str, Any] = {
        "load_s": raw["load_s"],
        **rss_summary(raw, size),
        "decode": _decode_summary(raw["step_s"], touched, 1),
        "decode_batch": {"batch": options.batch,
                         **_decode_summary(raw["batch_step_s"], batch_touched, options.batch)},
        "greedy_ids": raw["ids"],
        "prefill": prefill_summary(raw["ttft_s"], raw["prefill_s"], PREFILL_TOKENS,
                                   len(PROMPT)),
    }
    _roofline(out["decode"], copy_bps, 1)
    _roofline(out["decode_batch"], copy_bps, options.batch)
    out["ratio_batch_over_single"] = (out["decode_batch"]["tokens_per_s"]
                                      / out["decode"]["tokens_per_s"])
    return out


def _peer_decode(step_s: list[float]) -> dict[str, Any]:
    return {"steps": len(step_s), "tokens_per_s": len(step_s) / sum(step_s),
            "median_step_ms": 1000 * median(step_s)}


def _ratio(result: dict[str, Any], name: str, ours: dict[str, Any], peer: dict[str, Any],
           phase: str, key: str) -> None:
    if phase in ours and phase in peer:
        result[name] = ours[phase][key] / peer[phase][key]


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    result: dict[str, Any] = {"model": str(model_dir),
                              "checkpoint_bytes": checkpoint_bytes(model_dir),
                              "prompt_tokens": len(PROMPT),
                              "note": "timings from one run, each engine in a process of "
                                      "its own at its own moment; on a machine whose memory "
                                      "bandwidth moves (a shared one) the decode ratios to "
                                      "llama.cpp move with it: accelerated-interleaved takes "
                                      "turns in one process and gives their median"}
    # What the accelerated worker's pool uses (COLIBRI_THREADS, else every CPU it may run
    # on), and so what llama.cpp is given.
    from colibri.accelerated.model import default_threads

    result["threads"] = default_threads()
    ggufs = [gguf_path(options.cache_dir, model_dir, ftype) for ftype in FTYPES]
    result["page_cache"] = refresh_for(options, [*model_files(model_dir),
                                                 *(ggufs if options.peers else [])])
    copy_bps = copy_bandwidth_bytes_per_s()
    result["copy_bandwidth_gb_per_s"] = copy_bps / 1e9
    for engine in ("accelerated", "reference"):
        result[engine] = _engine_result(engine, model_dir, options, copy_bps)
    acc, ref = result["accelerated"], result["reference"]
    if "decode" in acc and "decode" in ref:
        result["same_greedy_ids"] = acc["greedy_ids"] == ref["greedy_ids"]
    _ratio(result, "ratio_accelerated_over_reference_decode", acc, ref, "decode", "tokens_per_s")
    _ratio(result, "ratio_accelerated_over_reference_decode_batch", acc, ref, "decode_batch",
           "tokens_per_s")
    _ratio(result, "ratio_accelerated_over_reference_prefill", acc, ref, "prefill",
           "prefill_tokens_per_s")
    quant_key = f"accelerated_{QUANT_LABEL}"
    if options.model is None:
        quant_dir, _ = container_for(model_dir, QUANT_EXPERTS, options.cache_dir, QUANT_DENSE,
                                     QUANT_IO)
        result[quant_key] = {"model": str(quant_dir),
                             "page_cache": refresh_for(options, model_files(quant_dir)),
                             **_engine_result("accelerated", quant_dir, options, copy_bps)}
    else:
        result[quant_key] = {"skipped": "run only on the generated bench model (no --model)"}
    if not options.peers:
        result["llama_cpp"] = {"skipped": "--no-peers"}
        return result
    import json

    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    threads = result["threads"]
    peers = {ftype: run_peer(peer_python(options), gguf, vocab, options.tokens, options.warmup,
                             threads, _peer_decode)
             for ftype, gguf in zip(FTYPES, ggufs, strict=True)}
    result["llama_cpp"] = peers
    f32, q8 = peers["f32"], peers["q8_0"]
    if "greedy_ids" in f32 and "greedy_ids" in acc:
        f32["same_greedy_ids_as_accelerated"] = f32["greedy_ids"] == acc["greedy_ids"]
    _ratio(result, "ratio_accelerated_over_llama_cpp_f32_decode", acc, f32, "decode",
           "tokens_per_s")
    _ratio(result, "ratio_accelerated_over_llama_cpp_f32_prefill", acc, f32, "prefill",
           "prefill_tokens_per_s")
    _ratio(result, f"ratio_{quant_key}_over_llama_cpp_q8_0_decode", result[quant_key], q8,
           "decode", "tokens_per_s")
    return result


register(Section(
    name="accelerated-decode",
    engines=("accelerated",),
    description="accelerated (C kernels) decode tok/s and GB/s beside the numpy reference, "
                "as ratios",
    run=run,
))
