"""Per-request token choice (spec/protocol.md 2.7): colibri's sampler (colibri.engine.sampling)
driven by the request's own xorshift64 stream, so a request's tokens never depend on what
other slots draw."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from colibri.engine import sampling
from colibri.engine.rng import Rng
from colibri.protocol.records import Logprobs


def request_rng(seed: int | None, process_seed: int | None) -> Rng:
    """seed= wins; else SEED (the stream restarts per request); else colibri's initial state
    without the clock mixing, so an engine is reproducible by default."""
    if seed is not None:
        return Rng.from_seed(seed)
    if process_seed is not None:
        return Rng.from_seed(process_seed)
    return Rng()


def greedy(row: npt.NDArray[np.float32]) -> int:
    return sampling.argmax(row)


def pick(row: npt.NDArray[np.float32], temperature: float, top_p: float, rng: Rng) -> int:
    return sampling.sample(row, temperature, top_p, rng)


def row_log_normalizer(row: npt.NDArray[np.float32]) -> float:
    """The row's logZ, to share between its DATA tail and its TOPK line."""
    return sampling.log_normalizer(row)


def logprob_record(
    row: npt.NDArray[np.float32], token: int, k: int, log_z: float | None = None
) -> Logprobs:
    """The DATA/ECHO logprobs of `token` chosen from `row`, with the top-k table."""
    entry = sampling.logprob_entry(row, token, k, log_z)
    return Logprobs(entry.logprob, entry.top)


def top_candidates(
    row: npt.NDArray[np.float32], count: int, log_z: float | None = None
) -> list[tuple[int, float]]:
    """TOPK: the `count` largest logits as (id, logprob), descending, ties by ascending id."""
    entry = sampling.logprob_entry(row, 0, count, log_z)
    return sampling.sorted_by_logprob(entry.top)
