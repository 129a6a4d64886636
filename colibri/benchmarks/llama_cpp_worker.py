"""The llama.cpp peer's worker: greedy decode of a GGUF through llama-cpp-python, timed like
colibri's own workers (standalone: any interpreter with ``llama_cpp`` runs it).

Token ids go in directly (no tokenizer: the bench model has none, and ids keep both engines on
the same prompt). Prints one JSON line: load time, the prefill times (time to first token on
the short prompt, throughput on the long one), each timed decode step and the greedy ids.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def run(gguf: str, prompt: list[int], long_prompt: list[int], tokens: int, warmup: int,
        threads: int) -> dict[str, Any]:
    import importlib

    import numpy as np

    # Imported by name so type-checking this file does not depend on llama_cpp being installed.
    llama_cpp: Any = importlib.import_module("llama_cpp")

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=max(256, len(long_prompt) + tokens + warmup + 8),
                          n_batch=max(len(prompt), len(long_prompt)), n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0

    def prefill(ids: list[int]) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - t

    prefill(prompt)  # pages the weights in
    ttft_s = [prefill(prompt) for _ in range(3)]
    prefill_s = [prefill(long_prompt) for _ in range(2)]
    def last_logits() -> Any:
        # llama-cpp-python 0.3.x fills ``llm.scores`` only with logits_all (which would make
        # llama.cpp compute the lm_head for every prompt row); the context's output row of
        # the last evaluated token is what its own sampler reads.
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))

    prefill(prompt)
    ids: list[int] = []
    step_s: list[float] = []
    for step in range(warmup + tokens):
        token = int(np.argmax(last_logits()))
        ids.append(token)
        t = time.perf_counter()
        llm.eval([token])
        if step >= warmup:
            step_s.append(time.perf_counter() - t)
    return {"load_s": load_s, "ttft_s": ttft_s, "prefill_s": prefill_s, "step_s": step_s,
            "ids": ids, "threads": threads, "version": getattr(llama_cpp, "__version__", "?")}


def main() -> int:
    parser = argparse.ArgumentParser(description="llama.cpp bench worker (internal)")
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompt", required=True, help="space-separated token ids")
    parser.add_argument("--long-prompt", required=True, help="space-separated token ids")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    result = run(args.gguf, [int(t) for t in args.prompt.split()],
                 [int(t) for t in args.long_prompt.split()], args.tokens, args.warmup,
                 args.threads)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
