"""Bench section ``accelerated-roofline``: decode GB/s against copy bandwidth measured beside it.

``accelerated-decode`` measures the copy bandwidth once, then runs each engine in its own
process; on a machine shared with other jobs the memory bandwidth itself moves by tens of
percent from one second to the next, so a decode measured half a minute after the copy is
held against a bandwidth the machine no longer has (or did not have then). Here one worker
process alternates, for ``rounds`` rounds: the copy probe (``copy_bandwidth_bytes_per_s``, the
same 256 MiB numpy copy, best of ``COPY_REPEATS`` = 8), the read-stream probe
(:func:`read_stream_bytes_per_s`), ``tokens`` one-row greedy decode steps, and ``tokens // 2``
steps of ``batch`` rows. Each round gives

* one row: achieved GB/s (the weight bytes each step reads, from its routes) ÷ that round's
  copy bandwidth, the "fraction of the roofline" the targets name; and ÷ the read stream, the
  share of what the engine's own one-row product reaches on this machine when nothing else runs (a
  host whose reads are slower than its copies — one Zen 3 host's were — shows there as a
  low copy fraction beside a high read-stream one, where a slow step shows low in both); the
  same probe on one thread, and the engine's threads over it, say whether a second thread
  adds bandwidth at all (two usable CPUs that are SMT siblings of one core add little; the
  bench's ``machine.host`` says which they are);
* ``batch`` rows: achieved GB/s (shared weights + the union of the rows' experts, counted once
  per step) ÷ the copy bandwidth, i.e. the batch's tok/s as a fraction of its own bandwidth
  bound, with the bound as a multiple of one row's tok/s;
* ``one_thread``: the same one-row and batched steps on one kernel thread (a second model
  over the same mapped weights), their fractions, and the engine's threads' tok/s over one
  thread's: near 1 for the batch where the threads share one core's multiply-add pipes (two
  SMT siblings, whatever the guest's topology says), near the thread count where they do not;

and the report gives the median and range over the rounds. The weights are paged in and
mapped before the first round (one untimed pass of single and batched steps), so the rounds
measure steady-state decoding, as a running server does; ``accelerated-decode`` reports the
first steps apart. ``checkpoint_mapping`` says how much of the checkpoint was then mapped
with 2 MiB page-table entries (``page_mapping.py``: the same file in 4 KiB pages streams
slower, so figures from the two states are different measurements).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.decode_steps import (
    PROMPT,
    Route,
    best_seconds,
    median,
    routes_from_json,
    run_worker,
    step_routes,
)
from colibri.benchmarks.page_cache import model_files, refresh_for
from colibri.benchmarks.page_mapping import checkpoint_mapping

ROUNDS = 7
#: Copies per probe: best of 8, as the targets define the copy bandwidth (about 0.15 s a round).
COPY_REPEATS = 8
#: The read-stream probe: float32 weights of this many MiB, rows of READ_STREAM_COLS, best of
#: READ_STREAM_REPEATS passes (about 0.05 s a round at 25 GB/s).
READ_STREAM_MIB = 256
READ_STREAM_COLS = 1024
READ_STREAM_REPEATS = 4


def read_stream_bytes_per_s(kernels: Any, weights: Any) -> float:
    """Weight bytes per second of ``kernels``' one-row float product over ``weights`` (a
    ``Weight`` of READ_STREAM_MIB MiB, larger than any cache), on its threads, best of
    READ_STREAM_REPEATS: the rate at which a one-row decode step's products alone stream."""
    import numpy as np

    x = np.ones((1, weights.cols), np.float32)
    out = np.empty((1, weights.rows), np.float32)
    best = best_seconds(lambda: kernels.matmul(x, weights, out), READ_STREAM_REPEATS)
    return float(weights.rows * weights.cols * 4) / best


def _steps(model: Any, states: list[Any], tokens: list[int], n: int
           ) -> tuple[float, list[list[Route]], list[int]]:
    """``n`` greedy steps of every row together: seconds, each step's routes, next tokens."""
    import numpy as np

    routes: list[list[Route]] = []
    seconds = 0.0
    for _ in range(n):
        t = time.perf_counter()
        out, chosen = model.forward_rows(states, tokens, [True] * len(states))
        seconds += time.perf_counter() - t
        routes.append(step_routes(model, chosen))
        tokens = [int(i) for i in np.argmax(out, axis=-1)]
    return seconds, routes, tokens


class _Decoder:
    """One model's one-row and ``batch``-row greedy decodes, stepped a round at a time."""

    def __init__(self, model: Any, batch: int) -> None:
        import numpy as np

        self.model = model
        self.single = [model.new_state()]
        self.single_tokens = [int(np.argmax(model.prefill(self.single[0], PROMPT)[-1]))]
        self.rows, self.row_tokens = [], []
        for b in range(batch):  # rows that share the prompt and diverge by one token
            s = model.new_state()
            self.row_tokens.append(int(np.argmax(model.prefill(s, [*PROMPT, b + 2])[-1])))
            self.rows.append(s)

    def round(self, tokens: int, out: dict[str, list[Any]], prefix: str) -> None:
        """``tokens`` one-row steps and ``tokens // 2`` batched ones, into ``out``."""
        seconds, routes, self.single_tokens = _steps(self.model, self.single,
                                                     self.single_tokens, tokens)
        out[f"{prefix}single_s"].append(seconds)
        out[f"{prefix}single_routes"].append(routes)
        seconds, routes, self.row_tokens = _steps(self.model, self.rows, self.row_tokens,
                                                  max(1, tokens // 2))
        out[f"{prefix}batch_s"].append(seconds)
        out[f"{prefix}batch_routes"].append(routes)


#: Raw keys of the one-thread decode rounds (see summarize's ``one_thread``).
ONE_THREAD = "one_thread_"


def _worker(model_dir: str, tokens: int, batch: int, rounds: int) -> dict[str, Any]:
    import numpy as np

    from colibri.accelerated import load_model
    from colibri.accelerated.kernels import Weight
    from colibri.benchmarks.accelerated_decode import copy_bandwidth_bytes_per_s

    model = load_model(model_dir)
    stream = Weight(np.ones(((READ_STREAM_MIB << 20) // (4 * READ_STREAM_COLS),
                             READ_STREAM_COLS), np.float32), 0)
    decoders = {"": _Decoder(model, batch)}
    one_thread = model
    if model.kernels.threads > 1:
        # The same decode on one kernel thread (the same mapped weights): whether a second
        # thread adds arithmetic as well as bandwidth, which a host's topology may not say.
        one_thread = load_model(model_dir, threads=1)
        decoders[ONE_THREAD] = _Decoder(one_thread, batch)
    out: dict[str, list[Any]] = {
        "copy_bps": [], "read_bps": [], "read_one_thread_bps": [],
        **{f"{p}{k}": [] for p in decoders
           for k in ("single_s", "single_routes", "batch_s", "batch_routes")}}
    # Page in and map what the rounds will read (the experts the first steps choose), through
    # each model's own map: the one-thread model's faults would otherwise land in its first round.
    for decoder in decoders.values():
        decoder.round(tokens, {k: [] for k in out}, "")
    mapping = checkpoint_mapping(Path(model_dir))
    for _ in range(rounds):
        out["copy_bps"].append(copy_bandwidth_bytes_per_s(repeats=COPY_REPEATS))
        out["read_bps"].append(read_stream_bytes_per_s(model.kernels, stream))
        out["read_one_thread_bps"].append(read_stream_bytes_per_s(one_thread.kernels, stream))
        for prefix, decoder in decoders.items():
            decoder.round(tokens, out, prefix)
    return {**out, "threads": model.kernels.threads, "checkpoint_mapping": mapping}


def _decode_rates(raw: dict[str, Any], model_dir: Path, batch: int, prefix: str
                  ) -> list[dict[str, float]]:
    """Per round: one row's and the batch's weight bytes a second and tokens a second, and the
    batch's bound as a multiple of one row's tok/s, from the ``prefix`` decoder's timings."""
    from colibri.benchmarks.reference_decode import touched_bytes

    rates = []
    for s_s, s_routes, b_s, b_routes in zip(
            raw[f"{prefix}single_s"], raw[f"{prefix}single_routes"], raw[f"{prefix}batch_s"],
            raw[f"{prefix}batch_routes"], strict=True):
        one_bytes = touched_bytes(model_dir, routes_from_json(s_routes))
        many_bytes = touched_bytes(model_dir, routes_from_json(b_routes))
        rates.append({
            "single_bps": sum(one_bytes) / s_s, "batch_bps": sum(many_bytes) / b_s,
            "single_tps": len(s_routes) / s_s, "batch_tps": batch * len(b_routes) / b_s,
            # The batch's bound as a multiple of one row's (both at the same bandwidth): rows
            # per step x bytes of a one-row step / bytes of a batched step.
            "bound_x": batch * (sum(one_bytes) / len(one_bytes))
            / (sum(many_bytes) / len(many_bytes)),
        })
    return rates


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": median(values), "range": [min(values), max(values)], "rounds": values}


def summarize(raw: dict[str, Any], model_dir: Path, batch: int) -> dict[str, Any]:
    """Per-round ratios from the worker's timings and routes, with their medians and ranges."""
    copy, read, read_one = raw["copy_bps"], raw["read_bps"], raw["read_one_thread_bps"]
    rates = _decode_rates(raw, model_dir, batch, "")
    one_thread: dict[str, Any] | None = None
    if f"{ONE_THREAD}single_s" in raw:
        alone = _decode_rates(raw, model_dir, batch, ONE_THREAD)
        one_thread = {
            "single_over_copy_bandwidth": _spread(
                [r["single_bps"] / c for r, c in zip(alone, copy, strict=True)]),
            "batch_fraction_of_its_bound": _spread(
                [r["batch_bps"] / c for r, c in zip(alone, copy, strict=True)]),
            # the engine's threads' tok/s over one thread's, per round
            "single_threads_over_one": _spread(
                [r["single_tps"] / a["single_tps"] for r, a in zip(rates, alone, strict=True)]),
            "batch_threads_over_one": _spread(
                [r["batch_tps"] / a["batch_tps"] for r, a in zip(rates, alone, strict=True)]),
        }
    return {
        "model": str(model_dir), "threads": raw["threads"], "batch": batch,
        "rounds": len(copy),
        "copy_bandwidth_gb_per_s": _spread([c / 1e9 for c in copy]),
        "single_achieved_gb_per_s": _spread([r["single_bps"] / 1e9 for r in rates]),
        "single_over_copy_bandwidth": _spread(
            [r["single_bps"] / c for r, c in zip(rates, copy, strict=True)]),
        "read_stream_gb_per_s": _spread([r / 1e9 for r in read]),
        "single_over_read_stream": _spread(
            [r["single_bps"] / b for r, b in zip(rates, read, strict=True)]),
        "read_stream_one_thread_gb_per_s": _spread([r / 1e9 for r in read_one]),
        "read_stream_threads_over_one": _spread(
            [r / r1 for r, r1 in zip(read, read_one, strict=True)]),
        "batch_achieved_gb_per_s": _spread([r["batch_bps"] / 1e9 for r in rates]),
        "batch_fraction_of_its_bound": _spread(
            [r["batch_bps"] / c for r, c in zip(rates, copy, strict=True)]),
        "batch_over_single_tokens_per_s": _spread(
            [r["batch_tps"] / r["single_tps"] for r in rates]),
        "batch_bound_over_single": _spread([r["bound_x"] for r in rates]),
        # the same decode on one kernel thread, in the same rounds (None with one thread)
        "one_thread": one_thread,
        # how the checkpoint's pages were mapped while the rounds ran (page_mapping.py)
        "checkpoint_mapping": raw.get("checkpoint_mapping"),
    }


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or ensure_bench_model(options.cache_dir)
    page_cache = refresh_for(options, model_files(model_dir))
    raw = run_worker([sys.executable, "-m", "colibri.benchmarks.interleaved_roofline",
                      "--model", str(model_dir), "--tokens", str(options.tokens),
                      "--batch", str(options.batch), "--rounds", str(ROUNDS)],
                     "roofline worker")
    if "error" in raw:
        return raw
    return {**summarize(raw, model_dir, options.batch), "page_cache": page_cache}


def main() -> int:
    parser = argparse.ArgumentParser(description="roofline bench worker (internal)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    print(json.dumps(_worker(args.model, args.tokens, args.batch, args.rounds)))
    return 0


register(Section(
    name="accelerated-roofline",
    engines=("accelerated",),
    description="accelerated decode GB/s (one row and a batch) against the copy bandwidth "
                "measured in alternation with it, in one process",
    run=run,
))

if __name__ == "__main__":
    sys.exit(main())
