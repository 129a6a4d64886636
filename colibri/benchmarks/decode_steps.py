"""What the reference-decode sections share: the prompt, the timed greedy loop, the per-step
weight bytes and the worker-process call.

The workers run the loop in a fresh interpreter; the parent turns the routes each step chose
into the bytes of weights that step had to read.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from colibri.backend_kit.kv_state import KVState
    from colibri.reference import ReferenceModel

PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
#: Tokens of the longer prompt that prefill throughput is measured on.
PREFILL_TOKENS = 64


def prefill_prompt(vocab_size: int) -> list[int]:
    """PREFILL_TOKENS deterministic ids inside the vocabulary (ids 0 and 1 left out)."""
    return [(37 * i + 11) % (vocab_size - 2) + 2 for i in range(PREFILL_TOKENS)]

#: One sparse layer's choice in one decode step: (layer, expert ids).
Route = tuple[int, tuple[int, ...]]


def routes_from_json(raw: list[list[list[Any]]]) -> list[list[Route]]:
    """Steps of routes as a worker's JSON carries them ([[layer, [ids]], ...] per step) back as
    (layer, expert ids) tuples."""
    return [[(int(layer), tuple(int(e) for e in ids)) for layer, ids in s] for s in raw]


def step_routes(model: ReferenceModel, routes: Any) -> list[Route]:
    """A step's routes array ([rows, sparse layers, k]) as (layer, expert ids) pairs, row by row."""
    cfg = model.config
    layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
    return [
        (layer, tuple(int(e) for e in row[j])) for row in routes for j, layer in enumerate(layers)
    ]


def timed_greedy_decode(
    model: ReferenceModel, state: KVState, logits: Any, steps: int
) -> tuple[list[int], list[float], list[list[Route]]]:
    """``steps`` greedy decode steps from ``logits``: the tokens, each step's seconds and the
    routes each step chose."""
    import numpy as np

    ids: list[int] = []
    times: list[float] = []
    chosen: list[list[Route]] = []
    for _ in range(steps):
        token = int(np.argmax(logits))
        ids.append(token)
        t = time.perf_counter()
        out, routes = model.forward_rows([state], [token], [True])
        times.append(time.perf_counter() - t)
        logits = out[0]
        chosen.append(step_routes(model, routes))
    return ids, times, chosen


def timed_prefill(model: ReferenceModel, prompt: list[int], repeats: int) -> list[float]:
    """Seconds to prefill ``prompt`` into a fresh state and get its last logits, ``repeats``
    times (weights already paged in: the caller decoded first)."""
    times: list[float] = []
    for _ in range(repeats):
        state = model.new_state()
        t = time.perf_counter()
        model.prefill(state, prompt)
        times.append(time.perf_counter() - t)
    return times


def prefill_summary(ttft_s: list[float], prefill_s: list[float], prefill_tokens: int,
                    prompt_tokens: int) -> dict[str, Any]:
    """Time to first token (the short prompt's prefill) and prefill throughput (the long
    prompt's), medians over the repeats."""
    return {
        "prompt_tokens": prompt_tokens,
        "time_to_first_token_ms": 1000 * median(ttft_s),
        "prefill_tokens": prefill_tokens,
        "prefill_median_s": median(prefill_s),
        "prefill_tokens_per_s": prefill_tokens / median(prefill_s),
    }


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (a benchmark's least disturbed run)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def step_bytes(
    tensors: Iterable[tuple[str, int, int]], n_layers: int, steps: Iterable[Iterable[Any]]
) -> tuple[list[int], list[int]]:
    """Weight bytes each decode step reads, and the routed experts' share of them.

    ``tensors`` gives each stored tensor as (name, bytes, rows); ``steps`` each step's routes as
    (layer, expert ids) pairs. A step reads every non-expert tensor, one embedding row and each
    routed expert it chose (counted once per step); the MTP layers do not run in plain decode.
    """
    fixed = embed_row = 0
    expert: dict[tuple[int, int], int] = {}
    for name, nbytes, rows in tensors:
        parts = name.split(".")
        if name == "model.embed_tokens.weight":
            embed_row = nbytes // rows
            continue
        if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= n_layers:
            continue  # the MTP head does not run in plain decode
        if ".mlp.experts." in name:
            key = (int(parts[2]), int(parts[5]))
            expert[key] = expert.get(key, 0) + nbytes
            continue
        fixed += nbytes
    totals, experts = [], []
    for routes in steps:
        chosen = {(int(layer), int(e)) for layer, ids in routes for e in ids}
        moved = sum(expert[k] for k in chosen)
        experts.append(moved)
        totals.append(fixed + embed_row + moved)
    return totals, experts


def run_worker(cmd: list[str], what: str) -> dict[str, Any]:
    """Run a worker command; its last stdout line is its JSON result. A failed worker gives
    ``{"error": "<what> failed (exit N)", "stderr_tail": [...]}`` instead."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        return {"error": f"{what} failed (exit {proc.returncode})", "stderr_tail": tail}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
