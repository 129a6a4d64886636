"""Log-probabilities for the logprob tail, ECHO and TOPK frames (spec/protocol.md 2.5).

All values come from the raw logit row (before temperature and top-p), in float64 as colibri
computes them, so the same row always prints the same strings. Tables are ordered by
descending logit with ties by ascending id.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def log_softmax(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    values = row.astype(np.float64)
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    shifted = values - top
    result: npt.NDArray[np.float64] = shifted - np.log(np.sum(np.exp(shifted)))
    return result


def top_tokens(row: npt.NDArray[np.float32], k: int) -> list[int]:
    """The k ids with the largest logits, descending, ties by ascending id (NaN last)."""
    k = min(k, row.shape[0])
    if k <= 0:
        return []
    keyed = np.where(np.isnan(row), -np.inf, row.astype(np.float64))
    if k < keyed.shape[0]:
        threshold = np.partition(keyed, keyed.shape[0] - k)[keyed.shape[0] - k]
        candidates = np.nonzero(keyed >= threshold)[0]
    else:
        candidates = np.arange(keyed.shape[0])
    order = np.lexsort((candidates, -keyed[candidates]))
    return [int(i) for i in candidates[order][:k]]


def table(
    logprobs: npt.NDArray[np.float64], row: npt.NDArray[np.float32], k: int
) -> list[tuple[int, float]]:
    return [(token, float(logprobs[token])) for token in top_tokens(row, k)]
