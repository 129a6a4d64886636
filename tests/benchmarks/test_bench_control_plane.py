"""``colibri bench --section control-plane``: the per-step samples and their summary (no timing
is asserted: only what the numbers are made of)."""

from __future__ import annotations

import pytest

from colibri.benchmarks.control_plane_overhead import REPEATS, measure, summarize
from colibri.benchmarks.stats import percentile


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert percentile([7.0], 0.9) == 7.0


def test_one_sample_per_decode_step_between_backend_calls() -> None:
    got = measure(slots=2, steps=12, warmup=1)
    # Each run: one step per token after the prefill; the first two steps (prefill) are left
    # out, and n steps give n - 1 gaps.
    assert got["decode_steps"] >= REPEATS * 12
    assert len(got["gaps_us"]) >= REPEATS * 8
    assert all(g >= 0 for g in got["gaps_us"])
    summary = summarize([got, got, {"error": "worker failed"}])
    assert summary["samples"] == 2 * len(got["gaps_us"])
    assert summary["processes"] == 2 and summary["failed_processes"] == ["worker failed"]
    low, mid, high = (summary[f"overhead_us_per_step_{q}"] for q in ("p10", "median", "p90"))
    assert low <= mid <= high
    assert summary["overhead_us_per_row_median"] == pytest.approx(mid / 2)
