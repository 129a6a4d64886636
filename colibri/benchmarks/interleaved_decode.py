"""Bench section ``accelerated-interleaved``: the accelerated engine and llama.cpp taking turns.

``accelerated-decode`` runs each engine in its own process one after the other; on a machine
shared with other jobs the load moves between those runs (by 2x within a minute on the
2-core bench machine), and so do the ratios. Here one worker process holds both engines and
alternates: a round times ``tokens`` greedy decode steps of one, then of the other, for
``rounds`` rounds, so both see the same load within seconds; each round gives one ratio and
the report gives their median and range. Two pairs on the generated bench model: the f32
checkpoint against llama.cpp's f32 GGUF, and the container with int4g64 experts, int8 dense
weights and an int8 embedding and lm_head (``accelerated_decode.QUANT_*``) against the q8_0
GGUF. Both engines get the same thread count (``COLIBRI_THREADS``, else
every CPU the process may use).

llama.cpp must be importable by *this* interpreter (the worker loads both) and the GGUFs made
by ``tools/llama_cpp_gguf.py``; otherwise the section says why it was skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bench_model import bench_model_dir
from colibri.benchmarks.decode_steps import PROMPT, median, run_worker
from colibri.benchmarks.llama_cpp_peer import gguf_path, unavailable_reason
from colibri.benchmarks.page_cache import model_files, refresh_for

ROUNDS = 7


def _worker(model_dir: str, gguf: str, tokens: int, rounds: int, threads: int
            ) -> dict[str, Any]:
    import importlib

    import numpy as np

    from colibri.accelerated import load_model

    llama_cpp: Any = importlib.import_module("llama_cpp")
    ours = load_model(model_dir, threads=threads)
    peer = llama_cpp.Llama(model_path=gguf, n_ctx=PROMPT_CTX, n_batch=len(PROMPT),
                           n_threads=threads, n_threads_batch=threads, verbose=False)
    state = ours.new_state()
    logits = ours.prefill(state, PROMPT)[-1]
    peer.eval(PROMPT)

    def peer_logits() -> Any:  # see llama_cpp_worker.py: scores need logits_all in 0.3.x
        return np.ctypeslib.as_array(peer._ctx.get_logits_ith(-1), shape=(peer.n_vocab(),))

    def ours_steps(n: int) -> float:
        nonlocal logits
        t = time.perf_counter()
        for _ in range(n):
            logits = ours.decode(state, int(np.argmax(logits)))
        return time.perf_counter() - t

    def peer_steps(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            peer.eval([int(np.argmax(peer_logits()))])
        return time.perf_counter() - t

    ours_steps(2)  # fault in what the first steps touch
    peer_steps(2)
    ours_s, peer_s = [], []
    for _ in range(rounds):
        ours_s.append(ours_steps(tokens))
        peer_s.append(peer_steps(tokens))
    return {"ours_s": ours_s, "peer_s": peer_s, "tokens": tokens, "threads": threads}


#: Context for the peer: the prompt, warm-up and every timed step.
PROMPT_CTX = 512


def _pair(options: BenchOptions, model_dir: Path, gguf: Path, rounds: int, threads: int
          ) -> dict[str, Any]:
    tokens = options.tokens
    reason = unavailable_reason(sys.executable, gguf)
    if reason is not None:
        return {"skipped": reason}
    if len(PROMPT) + (rounds + 1) * tokens * 2 > PROMPT_CTX:
        return {"skipped": f"{rounds} rounds of {tokens} tokens do not fit {PROMPT_CTX}"}
    page_cache = refresh_for(options, [*model_files(model_dir), gguf])
    raw = run_worker([sys.executable, "-m", "colibri.benchmarks.interleaved_decode",
                      "--model", str(model_dir), "--gguf", str(gguf), "--tokens", str(tokens),
                      "--rounds", str(rounds), "--threads", str(threads)],
                     "interleaved worker")
    if "error" in raw:
        return raw
    ratios = [p / o for o, p in zip(raw["ours_s"], raw["peer_s"], strict=True)]
    n = raw["tokens"]
    return {
        "model": str(model_dir), "gguf": str(gguf), "threads": raw["threads"],
        "page_cache": page_cache,
        "rounds": len(ratios), "tokens_per_round": n,
        "accelerated_tokens_per_s": [n / s for s in raw["ours_s"]],
        "llama_cpp_tokens_per_s": [n / s for s in raw["peer_s"]],
        "ratio_accelerated_over_llama_cpp_median": median(ratios),
        "ratio_accelerated_over_llama_cpp_range": [min(ratios), max(ratios)],
    }


def run(options: BenchOptions) -> dict[str, Any]:
    if not options.peers:
        return {"skipped": "--no-peers"}
    if options.model is not None:
        return {"skipped": "run only on the generated bench model (no --model)"}
    from colibri.accelerated.model import default_threads
    from colibri.benchmarks.accelerated_decode import (
        QUANT_DENSE,
        QUANT_EXPERTS,
        QUANT_IO,
        QUANT_LABEL,
    )
    from colibri.benchmarks.quant_formats import container_dir

    threads = default_threads()
    base = bench_model_dir(options.cache_dir)
    f32_gguf, q8_gguf = (gguf_path(options.cache_dir, base, f) for f in ("f32", "q8_0"))
    result: dict[str, Any] = {"f32": _pair(options, base, f32_gguf, ROUNDS, threads)}
    quant = container_dir(base, QUANT_EXPERTS, options.cache_dir, QUANT_DENSE, QUANT_IO)
    if (quant / "convert_report.json").is_file():
        result[f"{QUANT_LABEL}_vs_q8_0"] = _pair(options, quant, q8_gguf, ROUNDS, threads)
    else:
        result[f"{QUANT_LABEL}_vs_q8_0"] = {
            "skipped": f"no {quant.name} container yet (section accelerated-decode makes it)"}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="interleaved bench worker (internal)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(_worker(args.model, args.gguf, args.tokens, args.rounds, args.threads)))
    return 0


register(Section(
    name="accelerated-interleaved",
    engines=("accelerated",),
    description="accelerated vs llama.cpp decode, alternating in one process (ratios robust "
                "to a shared machine's changing load)",
    run=run,
))

if __name__ == "__main__":
    sys.exit(main())
