"""One out-of-core decode, in its own process (the bench runs ``decode`` through
``workers.call``, inside a memory cgroup).

``decode`` opens the backend under ``RAM_GB`` (0: all in RAM), prefills a prompt of random
token ids (``conversations`` prompts, each its own sequence), decodes greedily (the
conversations together, one row each per step) and returns the tokens, the decode's wall
time, the bytes the process read from storage during the decode (``/proc/self/io``
``read_bytes``), the expert store's lookups and hits during the decode, the experts read
ahead and used (``read_ahead``: ``READ_AHEAD``), the process's peak RSS and how much of the
model's files the page cache holds after the decode (``mincore``). ``pin`` pins the experts
a usage file ranks hottest (``PIN``/``PIN_GB``); ``record_usage`` writes the expert
selections of this prompt and ``record_prompts - 1`` more as a ``.coli_usage`` file (pins
for a later run, recorded on other prompts).
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from colibri.benchmarks.out_of_core_llama import read_bytes
from colibri.benchmarks.page_mapping import SMAPS, mapped_sizes
from colibri.benchmarks.page_residency import cached_bytes
from colibri.benchmarks.process_memory import peak_rss_bytes
from colibri.engine import usage_file
from colibri.engine.backend import Backend, StepRow, usage_rows
from colibri.engine.registry import BackendOptions, open_backend


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(2, vocab, n)]


def conversation_seeds(first: int, conversations: int) -> range:
    """The prompt seeds of ``conversations`` measured together (a usage history recorded
    from seed ``first + conversations`` on shares none of them)."""
    return range(first, first + conversations)


def _pin(backend: Backend, path: Path, budget_bytes: int) -> int:
    shape = backend.shape
    rows = usage_rows(shape)
    counts = usage_file.parse(path.read_bytes(), shape.num_hidden_layers,
                              shape.n_routed_experts, set(rows))
    ranked = sorted(((int(counts[layer, e]), layer, e) for layer in rows
                     for e in range(shape.n_routed_experts) if counts[layer, e] > 0),
                    key=lambda item: (-item[0], item[1], item[2]))
    return backend.tiers.pin([(layer, e) for _, layer, e in ranked], budget_bytes)


def decode(model: str, backend: str = "accelerated", ram_gb: float = 0.0, prompt_seed: int = 1,
           prompt_tokens: int = 16, tokens: int = 24, pin: str | None = None,
           pin_gb: float = 0.0, record_usage: str | None = None,
           read_ahead: int = 0, record_prompts: int = 1,
           conversations: int = 1) -> dict[str, Any]:
    log = io.StringIO()
    opened = open_backend(backend, Path(model),
                          BackendOptions(ram_budget_bytes=round(ram_gb * 1e9),
                                         kv_slots=conversations,
                                         ctx=prompt_tokens + tokens + 8,
                                         read_ahead=read_ahead), log)
    pinned = _pin(opened, Path(pin), round(pin_gb * 1e9)) if pin else 0
    shape = opened.shape
    rows = usage_rows(shape)
    counts = np.zeros((shape.num_hidden_layers + 1, shape.n_routed_experts), np.uint64)
    # ``conversations`` prompts (seeds from ``prompt_seed`` on), each prefilled on its own,
    # then decoded together: one step of one row per conversation per token, as a server
    # with that many users decodes them.
    states = [opened.new_state() for _ in range(conversations)]
    last: list[np.ndarray] = []
    for state, seed in zip(states, conversation_seeds(prompt_seed, conversations), strict=True):
        ids = prompt(seed, prompt_tokens, shape.vocab_size)
        step = opened.step([StepRow(state, t, i == len(ids) - 1) for i, t in enumerate(ids)])
        _count(counts, rows, step.routes)
        last.append(step.logits[-1])
    out: list[list[int]] = [[] for _ in states]
    before = opened.tiers.counters()
    read_before = read_bytes()
    started = time.perf_counter()
    for _ in range(tokens):
        chosen = [int(np.argmax(logits)) for logits in last]
        for seq, token in zip(out, chosen, strict=True):
            seq.append(token)
        step = opened.step([StepRow(state, token, True)
                            for state, token in zip(states, chosen, strict=True)])
        _count(counts, rows, step.routes)
        last = list(step.logits)
    seconds = time.perf_counter() - started
    read = read_bytes() - read_before
    after = opened.tiers.counters()
    files = sorted(Path(model).glob("*.safetensors"))
    page_cache = cached_bytes(files)
    mapped = mapped_sizes(SMAPS.read_text(), [str(f) for f in files])["resident_bytes"]
    if record_usage:
        for seed in range(prompt_seed + conversations, prompt_seed + record_prompts):
            _record(opened, counts, rows, prompt(seed, prompt_tokens, shape.vocab_size), tokens)
        usage_file.save(Path(record_usage), counts)
    opened.close()
    lookups = after.lookups - before.lookups
    return {
        "tokens": out[0] if conversations == 1 else out, "conversations": conversations,
        "decode_s": seconds, "tok_s": conversations * tokens / seconds,
        "step_s": seconds / tokens,
        "read_bytes": read, "read_bytes_per_token": read / (conversations * tokens),
        "hit_rate": (after.hits - before.hits) / lookups if lookups else None,
        "disk_s": after.disk_seconds - before.disk_seconds,
        "disk_bytes": after.disk_bytes - before.disk_bytes, "pinned": pinned,
        "read_ahead": read_ahead, "prefetched": after.prefetched - before.prefetched,
        "prefetch_used": after.prefetch_used - before.prefetch_used,
        "peak_rss_bytes": peak_rss_bytes(),
        "page_cache_bytes": page_cache,
        "mapped_model_rss_bytes": mapped,
        "log": log.getvalue().strip().splitlines(),
    }


def _record(opened: Backend, counts: np.ndarray, rows: list[int], ids: list[int],
            tokens: int) -> None:
    """Another prompt's greedy decode, its expert selections added to ``counts``."""
    state = opened.new_state()
    step = opened.step([StepRow(state, t, i == len(ids) - 1) for i, t in enumerate(ids)])
    _count(counts, rows, step.routes)
    for _ in range(tokens):
        step = opened.step([StepRow(state, int(np.argmax(step.logits[-1])), True)])
        _count(counts, rows, step.routes)


def _count(counts: np.ndarray, rows: list[int], routes: np.ndarray) -> None:
    for r, layer in enumerate(rows[: routes.shape[1]]):
        np.add.at(counts[layer], routes[:, r].reshape(-1), 1)
