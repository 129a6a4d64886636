"""Summary statistics of timings: the least disturbed run, medians, percentiles, spreads.

A shared machine's load moves within seconds, so the sections report robust figures: the
fastest of repeated runs for a kernel, medians (with their range) over rounds for a ratio.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between order statistics."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def spread(values: list[float]) -> dict[str, Any]:
    """Per-round values with their median and range, as the turn-taking sections report them."""
    return {"median": median(values), "range": [min(values), max(values)], "rounds": values}
