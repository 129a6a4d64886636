"""llama.cpp's side of the out-of-core bench: one greedy decode of a GGUF, in its own process.

Run by the peer interpreter (one that imports ``llama_cpp``, not necessarily colibri) through
``workers.call("out_of_core_llama:decode", ...)``, so it imports only the standard library
and numpy. It uses llama.cpp's defaults for a model on disk (the file memory-mapped,
pages faulted in as the layers touch them) and prints one JSON line like the colibri worker's:
the tokens, decode tok/s, the bytes read from storage during the decode (``/proc/self/io``)
and the peak RSS. The prompt is the same random token ids the colibri worker draws.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

import numpy as np

from colibri.benchmarks.process_memory import peak_rss_bytes


def read_bytes() -> int:
    """Bytes this process has caused to be read from storage (not from the page cache)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def decode(gguf: str, tokens: int = 24, prompt_tokens: int = 16,
           prompt_seed: int = 1) -> dict[str, Any]:
    llama_cpp = importlib.import_module("llama_cpp")  # the peer's, not a dependency
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=prompt_tokens + tokens + 8,
                          n_threads=len(os.sched_getaffinity(0)), n_batch=64,
                          logits_all=False, verbose=False)
    vocab = llm.n_vocab()
    ids = [int(t) for t in np.random.default_rng(prompt_seed).integers(2, vocab, prompt_tokens)]
    llm.eval(ids)
    out: list[int] = []
    before = read_bytes()
    started = time.perf_counter()
    for _ in range(tokens):
        # The last output row, what llama.cpp's own sampler reads.
        row = llm._ctx.get_logits_ith(-1)
        token = int(np.argmax(np.ctypeslib.as_array(row, shape=(vocab,))))
        out.append(token)
        llm.eval([token])
    seconds = time.perf_counter() - started
    read = read_bytes() - before
    return {"tokens": out, "decode_s": seconds, "tok_s": tokens / seconds, "read_bytes": read,
            "read_bytes_per_token": read / tokens,
            "peak_rss_bytes": peak_rss_bytes()}
