"""Rates of right answers with their Wilson 95 % intervals (the default model's measurements)."""

from __future__ import annotations

import math
from typing import Any

#: Two-sided 95 % normal quantile.
Z95 = 1.959963984540054


def wilson(right: int, total: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial rate (None without trials): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or n successes."""
    if total == 0:
        return None
    p = right / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(right: int, total: int) -> dict[str, Any]:
    interval = wilson(right, total)
    return {"right": right, "examples": total, "rate": right / total if total else None,
            "ci95": list(interval) if interval else None}
