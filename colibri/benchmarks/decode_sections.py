"""Bench sections ``reference-decode`` and ``accelerated-decode``: engines decoding the same
checkpoint and prompt, each alone in a fresh process, one after the other in one run.

For each engine: load time and RSS after load against the checkpoint (colibri maps weights,
so little should be resident); greedy decode tok/s over ``tokens`` steps after the 12-token
prompt and ``warmup`` untimed steps (the first steps fault in experts never used before),
and achieved GB/s; for colibri's engines also ``decode_batch`` with ``batch`` rows (aggregate
tok/s, GB/s counting each expert once per step) and prefill (time to first token on the
prompt, tok/s on a 64-token one).

* ``reference-decode``: the numpy reference, and HF transformers eager float32 when an
  interpreter with torch + transformers is found (``--peer-python``), with the ratio.
* ``accelerated-decode``: the accelerated engine and the reference, whether their greedy ids
  agree and the ratios, against the host's copy bandwidth (the roofline: copy bandwidth /
  weight bytes per step); on the generated bench model the accelerated engine again on its
  container with int4-grouped-64 experts, int8 dense weights and an int8 embedding and
  lm_head (as llama.cpp's q8_0 stores ``output.weight``); with peers, llama.cpp on the f32 and
  q8_0 GGUFs and the ratios f32 / f32 and that container / q8_0. Timed right after load and
  at different moments, these ratios move with a shared host's load: ``accelerated-interleaved``
  takes turns in one process and gives their median.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bandwidth import host_copy_bytes_per_s
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode import (
    checkpoint_bytes,
    decode_summary,
    engine_report,
    measure_alone,
    peer_python,
    prefill_summary,
    rss_summary,
    set_ratio,
    touched_bytes,
)
from colibri.benchmarks.decode_worker import PREFILL_TOKENS, PROMPT
from colibri.benchmarks.llama_cpp_peer import FTYPES, gguf_path, unavailable_reason
from colibri.benchmarks.page_cache import model_files, refresh_for
from colibri.benchmarks.workers import importable

#: The quantized pass (against llama.cpp's q8_0): experts int4-grouped-64, dense weights int8,
#: and the embedding and lm_head int8-row, as llama.cpp's q8_0 GGUF stores ``output.weight``
#: in q8_0 (a float32 lm_head was 32 of the step's 115 MB).
QUANT_EXPERTS, QUANT_DENSE, QUANT_IO = "int4g64", "int8", "int8"
#: The pass's name in the report and its container's (``quant_formats.container_dir``).
QUANT_LABEL = f"{QUANT_EXPERTS}_{QUANT_DENSE}_io_{QUANT_IO}"
TIMING_NOTE = ("timings from one run, each engine in a process of its own at its own moment; "
               "on a machine whose memory bandwidth moves (a shared one) the decode ratios to "
               "llama.cpp move with it: accelerated-interleaved takes turns in one process and "
               "gives their median")


def _colibri(kind: str, model_dir: Path, options: BenchOptions,
             copy_bps: float | None = None) -> dict[str, Any]:
    raw = measure_alone({"kind": kind, "model": str(model_dir)}, options, f"{kind} worker")
    if "error" in raw:
        return raw
    return {"raw": raw, **engine_report(raw, model_dir, options.batch, copy_bps)}


def _hf(options: BenchOptions, model_dir: Path, reference: dict[str, Any]) -> dict[str, Any]:
    python = peer_python(options)
    if not importable(python, "torch", "transformers"):
        return {"skipped": f"torch/transformers not importable by {python} (see --peer-python)"}
    raw = measure_alone({"kind": "hf", "model": str(model_dir)}, options, "hf worker",
                        batch=False, prefill=False, python=python)
    if "error" in raw:
        return raw
    return {
        "load_s": raw["load_s"],
        **rss_summary(raw, checkpoint_bytes(model_dir)),
        # The bytes a step reads are the reference's: the same checkpoint and greedy path.
        "decode": decode_summary(raw["step_s"], touched_bytes(model_dir, reference["routes"])),
        "greedy_ids": raw["ids"],
        "same_greedy_ids": raw["ids"] == reference["ids"],
        "versions": raw["versions"],
        "torch_threads": raw["torch_threads"],
    }


def reference_decode(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    result: dict[str, Any] = {"model": str(model_dir),
                              "checkpoint_bytes": checkpoint_bytes(model_dir),
                              "prompt_tokens": len(PROMPT),
                              "page_cache": refresh_for(options, model_files(model_dir))}
    ref = _colibri("reference", model_dir, options)
    if "error" in ref:
        result["reference"] = ref
        return result
    raw = ref.pop("raw")
    result["reference"] = {**ref, "warmup_steps_ms": [1000 * t for t in raw["warmup_step_s"]],
                           "cpu_count": raw["threads"]}
    if options.peers:
        result["hf_transformers_eager"] = hf = _hf(options, model_dir, raw)
        if "decode" in hf:
            result["ratio_reference_over_hf_decode"] = (
                result["reference"]["decode"]["tokens_per_s"] / hf["decode"]["tokens_per_s"])
    return result


def llama_cpp_alone(options: BenchOptions, gguf: Path, threads: int) -> dict[str, Any]:
    """llama.cpp alone on ``gguf`` (no byte counts of its own), or why it was skipped."""
    python = peer_python(options)
    reason = unavailable_reason(python, gguf)
    if reason is not None:
        return {"skipped": reason}
    ctx = max(256, PREFILL_TOKENS + options.tokens + options.warmup + 8)
    raw = measure_alone({"kind": "llama_cpp", "model": str(gguf), "threads": threads,
                         "ctx": ctx}, options, "llama.cpp worker", batch=False, python=python)
    if "error" in raw:
        return raw
    return {"gguf": str(gguf), "version": raw["version"], "threads": raw["threads"],
            "load_s": raw["load_s"], "decode": decode_summary(raw["step_s"], None),
            "prefill": prefill_summary(raw), "greedy_ids": raw["ids"]}


def accelerated_decode(options: BenchOptions) -> dict[str, Any]:
    # What the accelerated worker's pool uses (COLIBRI_THREADS, else every CPU it may run
    # on), and so what llama.cpp is given.
    from colibri.accelerated.model import default_threads

    model_dir = options.model or ensure_bench_model(options.cache_dir)
    result: dict[str, Any] = {"model": str(model_dir),
                              "checkpoint_bytes": checkpoint_bytes(model_dir),
                              "prompt_tokens": len(PROMPT), "note": TIMING_NOTE,
                              "threads": default_threads()}
    ggufs = [gguf_path(options.cache_dir, model_dir, ftype) for ftype in FTYPES]
    result["page_cache"] = refresh_for(options, [*model_files(model_dir),
                                                 *(ggufs if options.peers else [])])
    copy_bps = host_copy_bytes_per_s()
    result["copy_bandwidth_gb_per_s"] = copy_bps / 1e9
    for engine in ("accelerated", "reference"):
        result[engine] = _colibri(engine, model_dir, options, copy_bps)
        result[engine].pop("raw", None)
    acc, ref = result["accelerated"], result["reference"]
    if "decode" in acc and "decode" in ref:
        result["same_greedy_ids"] = acc["greedy_ids"] == ref["greedy_ids"]
    for phase, key in (("decode", "tokens_per_s"), ("decode_batch", "tokens_per_s"),
                       ("prefill", "prefill_tokens_per_s")):
        set_ratio(result, f"ratio_accelerated_over_reference_{phase}", acc, ref, phase, key)
    quant_key = f"accelerated_{QUANT_LABEL}"
    if options.model is None:
        # Imported here: quant_formats registers its own section, which comes later.
        from colibri.benchmarks.quant_formats import container_for

        quant_dir, _ = container_for(model_dir, QUANT_EXPERTS, options.cache_dir, QUANT_DENSE,
                                     QUANT_IO)
        result[quant_key] = quant = {"model": str(quant_dir),
                                     "page_cache": refresh_for(options, model_files(quant_dir)),
                                     **_colibri("accelerated", quant_dir, options, copy_bps)}
        quant.pop("raw", None)
    else:
        result[quant_key] = {"skipped": "run only on the generated bench model (no --model)"}
    if not options.peers:
        result["llama_cpp"] = {"skipped": "--no-peers"}
        return result
    peers = {ftype: llama_cpp_alone(options, gguf, result["threads"])
             for ftype, gguf in zip(FTYPES, ggufs, strict=True)}
    result["llama_cpp"] = peers
    f32, q8 = peers["f32"], peers["q8_0"]
    if "greedy_ids" in f32 and "greedy_ids" in acc:
        f32["same_greedy_ids_as_accelerated"] = f32["greedy_ids"] == acc["greedy_ids"]
    set_ratio(result, "ratio_accelerated_over_llama_cpp_f32_decode", acc, f32, "decode",
              "tokens_per_s")
    set_ratio(result, "ratio_accelerated_over_llama_cpp_f32_prefill", acc, f32, "prefill",
              "prefill_tokens_per_s")
    set_ratio(result, f"ratio_{quant_key}_over_llama_cpp_q8_0_decode", result[quant_key], q8,
              "decode", "tokens_per_s")
    return result


register(Section(
    name="reference-decode",
    engines=("reference",),
    description="numpy reference decode tok/s and GB/s, RSS after load, vs HF transformers eager",
    run=reference_decode,
))
register(Section(
    name="accelerated-decode",
    engines=("accelerated",),
    description="accelerated (C kernels) decode tok/s and GB/s beside the numpy reference, "
                "as ratios",
    run=accelerated_decode,
))
