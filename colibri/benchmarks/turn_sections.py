"""Bench sections ``accelerated-interleaved`` and ``accelerated-roofline``: what is compared
takes turns in one process (``decode_worker.turns``), ``ROUNDS`` rounds, one ratio a round,
and the report gives their median and range.

Why turns: on a machine shared with other jobs the load, and the memory bandwidth itself, move
by tens of percent from one second to the next (2x within a minute on the 2-core bench
machine), so two engines timed in processes of their own at different moments, or a decode
held against a copy bandwidth measured half a minute earlier, compare the machine's moments
rather than the engines. In turns, both sides of each ratio see the same load within seconds.

* ``accelerated-interleaved``: the accelerated engine and llama.cpp, ``tokens`` greedy steps
  each per round, on the same thread count (``COLIBRI_THREADS``, else every CPU the process
  may use). Two pairs on the generated bench model: the f32 checkpoint against llama.cpp's f32
  GGUF, and the int4g64 + int8 dense + int8 io container (``decode_sections.QUANT_*``) against
  the q8_0 GGUF. llama.cpp must be importable by *this* interpreter (one process holds both)
  and the GGUFs made by ``tools/llama_cpp_gguf.py``; otherwise the section says why it skipped.
* ``accelerated-roofline``: per round the bandwidth probes (``bandwidth``: the host copy, the
  engine's read stream on its threads and on one), ``tokens`` one-row steps and ``tokens // 2``
  steps of ``batch`` rows. One row: achieved GB/s (the weight bytes each step reads, from its
  routes) over that round's copy bandwidth, the "fraction of the roofline" the targets name,
  and over the read stream (a host whose reads are slower than its copies shows a low copy
  fraction beside a high read-stream one; a slow step shows low in both); the read stream's
  threads over one thread say whether a second thread adds bandwidth at all (two usable CPUs
  that are SMT siblings of one core add little; the report's ``machine.host`` says which they
  are). The batch: achieved GB/s (shared weights + the union of the rows' experts, once per
  step) over the copy bandwidth, i.e. its tok/s as a fraction of its own bound, with the bound
  as a multiple of one row's tok/s. ``one_thread``: the same steps on one kernel thread (a
  second model over the same mapped weights) and the threads' tok/s over one thread's: near 1
  where the threads share one core's multiply-add pipes, near the thread count where they do
  not. The weights are paged in and mapped by one untimed round of steps first, so the rounds
  measure steady-state decoding, as a running server does; ``checkpoint_mapping`` says how
  much of the checkpoint was then mapped with 2 MiB page-table entries (``page_mapping.py``:
  the same file in 4 KiB pages streams slower, so figures from the two states differ).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import bench_model_dir, ensure_bench_model
from colibri.benchmarks.decode import touched_bytes
from colibri.benchmarks.decode_worker import PROMPT
from colibri.benchmarks.llama_cpp_peer import gguf_path, unavailable_reason
from colibri.benchmarks.page_cache import model_files, refresh_for
from colibri.benchmarks.stats import median, spread
from colibri.benchmarks.workers import call

ROUNDS = 7
#: Context for the llama.cpp peer: the prompt, warm-up and every timed step.
PROMPT_CTX = 512
#: Untimed steps of each engine before the interleaved rounds (fault in what they touch).
INTERLEAVED_WARMUP_STEPS = 2
#: Raw keys of the one-thread decode rounds (see summarize's ``one_thread``).
ONE_THREAD = "one_thread_"


def _turns(spec: dict[str, Any], what: str) -> dict[str, Any]:
    return call("decode_worker:turns", spec, what)


# ---------------------------------------------------------------------------------------------
# accelerated-interleaved


def _pair(options: BenchOptions, model_dir: Path, gguf: Path, threads: int) -> dict[str, Any]:
    import sys

    tokens = options.tokens
    reason = unavailable_reason(sys.executable, gguf)
    if reason is not None:
        return {"skipped": reason}
    if len(PROMPT) + (ROUNDS + 1) * tokens * 2 > PROMPT_CTX:
        return {"skipped": f"{ROUNDS} rounds of {tokens} tokens do not fit {PROMPT_CTX}"}
    page_cache = refresh_for(options, [*model_files(model_dir), gguf])
    raw = _turns({
        "engines": {"ours": {"kind": "accelerated", "model": str(model_dir), "threads": threads},
                    "peer": {"kind": "llama_cpp", "model": str(gguf), "threads": threads,
                             "ctx": PROMPT_CTX}},
        "lanes": [{"engine": "ours", "rows": 1, "steps": tokens},
                  {"engine": "peer", "rows": 1, "steps": tokens}],
        "rounds": ROUNDS, "warmup_steps": INTERLEAVED_WARMUP_STEPS}, "interleaved worker")
    if "error" in raw:
        return raw
    ours_s, peer_s = raw["lane_s"]
    ratios = [p / o for o, p in zip(ours_s, peer_s, strict=True)]
    return {
        "model": str(model_dir), "gguf": str(gguf), "threads": threads,
        "page_cache": page_cache,
        "rounds": len(ratios), "tokens_per_round": tokens,
        "accelerated_tokens_per_s": [tokens / s for s in ours_s],
        "llama_cpp_tokens_per_s": [tokens / s for s in peer_s],
        "ratio_accelerated_over_llama_cpp_median": median(ratios),
        "ratio_accelerated_over_llama_cpp_range": [min(ratios), max(ratios)],
    }


def interleaved(options: BenchOptions) -> dict[str, Any]:
    if not options.peers:
        return {"skipped": "--no-peers"}
    if options.model is not None:
        return {"skipped": "run only on the generated bench model (no --model)"}
    from colibri.accelerated.model import default_threads
    from colibri.benchmarks.decode_sections import (
        QUANT_DENSE,
        QUANT_EXPERTS,
        QUANT_IO,
        QUANT_LABEL,
    )
    from colibri.benchmarks.quant_formats import container_dir

    threads = default_threads()
    base = bench_model_dir(options.cache_dir)
    f32_gguf, q8_gguf = (gguf_path(options.cache_dir, base, f) for f in ("f32", "q8_0"))
    result: dict[str, Any] = {"f32": _pair(options, base, f32_gguf, threads)}
    quant = container_dir(base, QUANT_EXPERTS, options.cache_dir, QUANT_DENSE, QUANT_IO)
    if (quant / "convert_report.json").is_file():
        result[f"{QUANT_LABEL}_vs_q8_0"] = _pair(options, quant, q8_gguf, threads)
    else:
        result[f"{QUANT_LABEL}_vs_q8_0"] = {
            "skipped": f"no {quant.name} container yet (section accelerated-decode makes it)"}
    return result


# ---------------------------------------------------------------------------------------------
# accelerated-roofline


def roofline_raw(model_dir: Path, tokens: int, batch: int, rounds: int = ROUNDS
                 ) -> dict[str, Any]:
    """The roofline's rounds in a worker, as :func:`summarize` reads them: ``copy_bps``,
    ``read_bps``, ``read_one_thread_bps`` and per decoder prefix (``""``, ``one_thread_``)
    ``single_s``/``single_routes``/``batch_s``/``batch_routes``, one entry a round."""
    from colibri.accelerated.model import default_threads

    engines: dict[str, dict[str, Any]] = {"": {"kind": "accelerated", "model": str(model_dir)}}
    if default_threads() > 1:
        # The same decode on one kernel thread (the same mapped weights): whether a second
        # thread adds arithmetic as well as bandwidth, which a host's topology may not say.
        engines[ONE_THREAD] = {"kind": "accelerated", "model": str(model_dir), "threads": 1}
    lanes = [{"engine": name, "rows": rows, "steps": steps} for name in engines
             for rows, steps in ((1, tokens), (batch, max(1, tokens // 2)))]
    one = ONE_THREAD if ONE_THREAD in engines else ""
    raw = _turns({"engines": engines, "lanes": lanes, "rounds": rounds,
                  "probes": ["copy", "read:", f"read:{one}"], "mapping_of": ""},
                 "roofline worker")
    if "error" in raw:
        return raw
    probes = raw["probes"]
    out: dict[str, Any] = {"copy_bps": probes["copy"], "read_bps": probes["read:"],
                           "read_one_thread_bps": probes[f"read:{one}"],
                           "threads": raw["reports"][""]["kernel_threads"],
                           "checkpoint_mapping": raw["checkpoint_mapping"]}
    for lane, seconds, routes in zip(lanes, raw["lane_s"], raw["lane_routes"], strict=True):
        kind = "single" if lane["rows"] == 1 else "batch"
        out[f"{lane['engine']}{kind}_s"] = seconds
        out[f"{lane['engine']}{kind}_routes"] = routes
    return out


def _decode_rates(raw: dict[str, Any], model_dir: Path, batch: int, prefix: str
                  ) -> list[dict[str, float]]:
    """Per round: one row's and the batch's weight bytes a second and tokens a second, and the
    batch's bound as a multiple of one row's tok/s, from the ``prefix`` decoder's timings."""
    rates = []
    for s_s, s_routes, b_s, b_routes in zip(
            raw[f"{prefix}single_s"], raw[f"{prefix}single_routes"], raw[f"{prefix}batch_s"],
            raw[f"{prefix}batch_routes"], strict=True):
        one_bytes = touched_bytes(model_dir, s_routes)
        many_bytes = touched_bytes(model_dir, b_routes)
        rates.append({
            "single_bps": sum(one_bytes) / s_s, "batch_bps": sum(many_bytes) / b_s,
            "single_tps": len(s_routes) / s_s, "batch_tps": batch * len(b_routes) / b_s,
            # The batch's bound as a multiple of one row's (both at the same bandwidth): rows
            # per step x bytes of a one-row step / bytes of a batched step.
            "bound_x": batch * (sum(one_bytes) / len(one_bytes))
            / (sum(many_bytes) / len(many_bytes)),
        })
    return rates


def _over(rates: list[dict[str, float]], key: str, by: list[float]) -> dict[str, Any]:
    return spread([r[key] / b for r, b in zip(rates, by, strict=True)])


def summarize(raw: dict[str, Any], model_dir: Path, batch: int) -> dict[str, Any]:
    """Per-round ratios from the worker's timings and routes, with their medians and ranges."""
    copy, read, read_one = raw["copy_bps"], raw["read_bps"], raw["read_one_thread_bps"]
    rates = _decode_rates(raw, model_dir, batch, "")
    one_thread: dict[str, Any] | None = None
    if f"{ONE_THREAD}single_s" in raw:
        alone = _decode_rates(raw, model_dir, batch, ONE_THREAD)
        one_thread = {
            "single_over_copy_bandwidth": _over(alone, "single_bps", copy),
            "batch_fraction_of_its_bound": _over(alone, "batch_bps", copy),
            # the engine's threads' tok/s over one thread's, per round
            "single_threads_over_one": _over(rates, "single_tps",
                                             [a["single_tps"] for a in alone]),
            "batch_threads_over_one": _over(rates, "batch_tps", [a["batch_tps"] for a in alone]),
        }
    return {
        "model": str(model_dir), "threads": raw["threads"], "batch": batch,
        "rounds": len(copy),
        "copy_bandwidth_gb_per_s": spread([c / 1e9 for c in copy]),
        "single_achieved_gb_per_s": spread([r["single_bps"] / 1e9 for r in rates]),
        "single_over_copy_bandwidth": _over(rates, "single_bps", copy),
        "read_stream_gb_per_s": spread([r / 1e9 for r in read]),
        "single_over_read_stream": _over(rates, "single_bps", read),
        "read_stream_one_thread_gb_per_s": spread([r / 1e9 for r in read_one]),
        "read_stream_threads_over_one": spread(
            [r / r1 for r, r1 in zip(read, read_one, strict=True)]),
        "batch_achieved_gb_per_s": spread([r["batch_bps"] / 1e9 for r in rates]),
        "batch_fraction_of_its_bound": _over(rates, "batch_bps", copy),
        "batch_over_single_tokens_per_s": spread(
            [r["batch_tps"] / r["single_tps"] for r in rates]),
        "batch_bound_over_single": spread([r["bound_x"] for r in rates]),
        # the same decode on one kernel thread, in the same rounds (None with one thread)
        "one_thread": one_thread,
        # how the checkpoint's pages were mapped while the rounds ran (page_mapping.py)
        "checkpoint_mapping": raw.get("checkpoint_mapping"),
    }


def roofline(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    page_cache = refresh_for(options, model_files(model_dir))
    raw = roofline_raw(model_dir, options.tokens, options.batch)
    if "error" in raw:
        return raw
    return {**summarize(raw, model_dir, options.batch), "page_cache": page_cache}


register(Section(
    name="accelerated-interleaved",
    engines=("accelerated",),
    description="accelerated vs llama.cpp decode, alternating in one process (ratios robust "
                "to a shared machine's changing load)",
    run=interleaved,
))
register(Section(
    name="accelerated-roofline",
    engines=("accelerated",),
    description="accelerated decode GB/s (one row and a batch) against the copy bandwidth "
                "measured in alternation with it, in one process",
    run=roofline,
))
