"""The out-of-core bench: its models' routing, the memory cgroup it runs engines in, the plan's
prediction, and the section end to end on a small model (every field the targets name)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.accelerated_support import needs_library

from colibri import resources
from colibri.benchmarks import memory_cgroup
from colibri.benchmarks.out_of_core import (
    CONVERSATIONS,
    MEASURED_PROMPT,
    USAGE_PROMPT,
    USAGE_PROMPTS,
    Setup,
    run_section,
    summarize,
)
from colibri.benchmarks.out_of_core_model import SKEW, skewed_bias
from colibri.benchmarks.out_of_core_worker import conversation_seeds
from colibri.plan import predict_decode, usage_hit_rate

TINY = resources.fixture_model_dir("glm5-tiny")


def test_the_skewed_router_bias_falls_with_log_rank() -> None:
    bias = skewed_bias(np.random.default_rng(0), 96)
    rank = np.random.default_rng(0).permutation(96)  # the ranking skewed_bias drew
    # bias = noise - SKEW * ln(1 + rank): the slope over ln(1 + rank) is -SKEW.
    slope = np.polyfit(np.log1p(rank), bias, 1)[0]
    assert slope == pytest.approx(-SKEW, abs=0.01)
    top, rest = np.sort(bias)[::-1][:8], np.sort(bias)[::-1][8:]
    assert top.min() > rest.mean()


def test_the_prediction_is_the_slower_of_the_reads_and_the_step() -> None:
    reads = predict_decode(hit_rate=0.25, bytes_per_token=400_000_000, read_gb_s=1.5,
                           step_s=0.02)
    assert reads["read_bytes_per_token"] == pytest.approx(300_000_000)
    assert reads["tok_s"] == pytest.approx(1.5e9 / 3e8)  # 0.2 s of reads > 0.02 s of step
    compute = predict_decode(hit_rate=0.99, bytes_per_token=400_000_000, read_gb_s=1.5,
                             step_s=0.02)
    assert compute["tok_s"] == pytest.approx(50.0)
    ranked = [(3, 0, 60), (3, 1, 30), (4, 0, 10)]
    assert usage_hit_rate(ranked, 1) == pytest.approx(0.6)
    assert usage_hit_rate(ranked, 2) == pytest.approx(0.9)


def test_the_summary_names_the_targets_figures() -> None:
    runs: list[dict[str, Any]] = [
        {"routing": "uniform", "engine": "accelerated", "policy": "lru", "cap_fraction": 0.25,
         "tok_s": 6.0, "ratio_to_bound": 0.93, "hit_rate": 0.25, "same_tokens_as_in_ram": True,
         "peak_within_cap": True, "oom_kills": 0},
        {"routing": "uniform", "engine": "llama_cpp", "policy": "mmap", "cap_fraction": 0.25,
         "tok_s": 1.5},
        {"routing": "skewed", "engine": "accelerated", "policy": "lru", "cap_fraction": 0.25,
         "tok_s": 20.0, "hit_rate": 0.70, "same_tokens_as_in_ram": True},
        {"routing": "skewed", "engine": "accelerated", "policy": "pinned", "cap_fraction": 0.25,
         "tok_s": 24.0, "hit_rate": 0.85, "same_tokens_as_in_ram": False},
        {"routing": "skewed", "engine": "accelerated", "policy": "lru", "cap_fraction": 0.25,
         "conversations": 4, "tok_s": 30.0, "hit_rate": 0.50, "same_tokens_as_in_ram": True},
        {"routing": "skewed", "engine": "accelerated", "policy": "pinned", "cap_fraction": 0.25,
         "conversations": 4, "tok_s": 40.0, "hit_rate": 0.72, "same_tokens_as_in_ram": True},
    ]
    summary = summarize(runs)
    assert summary["uniform"]["speed_over_llama_cpp_at_quarter"] == pytest.approx(4.0)
    assert summary["uniform"]["ratio_to_bound_at_quarter"] == 0.93
    assert summary["skewed"]["pin_hit_gain_points_at_quarter"] == pytest.approx(15.0)
    # The conversations decoded together are their own figure, not the one conversation's.
    assert summary["skewed"]["conversations_together"] == 4
    assert summary["skewed"]["pin_hit_gain_points_at_quarter_conversations_together"] == \
        pytest.approx(22.0)
    assert summary["all_same_tokens"] is False  # one run differs: the summary says so
    assert summary["all_within_cap"] is True


def _cgroup_or_skip() -> None:
    version, why = memory_cgroup.available()
    if version is None:
        pytest.skip(f"no writable memory cgroup here: {why}")


def test_a_process_in_a_memory_cgroup_cannot_exceed_its_limit() -> None:
    _cgroup_or_skip()
    limit = 150 << 20
    group = memory_cgroup.MemoryCgroup("colibri-test", limit)
    try:
        grab = "import numpy as np; a = np.ones(400 << 20, np.uint8); print(a.sum())"
        done = subprocess.run(group.command([sys.executable, "-c", grab]), check=False,
                              capture_output=True)
        assert done.returncode != 0  # killed: 400 MiB do not fit 150 MiB
        assert group.oom_kills() >= 1
        assert group.peak_bytes() <= limit
    finally:
        group.close()
    assert not group.path.exists()


@needs_library
def test_the_section_end_to_end_on_a_small_model(tmp_path: Path) -> None:
    """Both routings (the same small model twice), the accelerated engine, one cap: every
    number the section reports is there, the capped run decodes the in-RAM tokens, and its
    peak stays within the cap."""
    models = {}
    for routing in ("uniform", "skewed"):
        models[routing] = tmp_path / routing
        shutil.copytree(TINY, models[routing])
    doc = run_section(Setup(models, tmp_path, engines=("accelerated",), caps=(0.25,),
                            tokens={"accelerated": 4}, allowance=400_000_000))
    assert doc["section"] == "out-of-core" and not doc["summary"]["errors"], doc["summary"]
    capped = [r for r in doc["runs"] if r.get("cap_fraction") == 0.25]
    cgroup = memory_cgroup.available()[0] is not None
    alone = {(routing, "ram_gb_only") for routing in models} if cgroup else set()
    assert {(r["routing"], r["policy"], r.get("conversations", 1)) for r in capped} == {
        ("uniform", "lru", 1), ("skewed", "lru", 1), ("skewed", "pinned", 1),
        ("uniform", "read_ahead", 1), ("skewed", "read_ahead", 1),
        ("skewed", "lru", CONVERSATIONS), ("skewed", "pinned", CONVERSATIONS),
        *((routing, policy, 1) for routing, policy in alone)}
    for row in capped:
        assert row["same_tokens_as_in_ram"] is True
        assert row["tok_s"] > 0 and 0.0 <= row["hit_rate"] <= 1.0
        assert "read_bytes_per_token" in row
        if row["hit_rate"] < 1.0:  # something was read: how busy the disk was, and how fast
            assert 0.0 < row["reads_in_flight_share"] <= 1.0
            assert row["read_gb_s_while_in_flight"] > 0
        if doc["read_bandwidth_gb_s"]:
            assert row["bound_tok_s"] > 0 and "tok_s" in row["predicted"]
        if row["policy"] == "ram_gb_only":  # no cgroup: resident + page cache vs the budget
            assert row["rss_plus_page_cache_bytes"] == row["peak_rss_bytes"] + max(
                0, row["page_cache_bytes"] - row["mapped_model_rss_bytes"])
            assert row["rss_plus_page_cache_within_budget"] is True
        elif cgroup and os.geteuid() == 0:
            assert row["peak_within_cap"] is True and row["oom_kills"] == 0
    pinned = [r for r in capped if r["policy"] == "pinned"]
    assert all(r["pinned"] > 0 for r in pinned)
    assert "pin_hit_gain_points_at_quarter_conversations_together" in doc["summary"]["skewed"]
    assert doc["summary"]["all_same_tokens"] is True


def test_the_measured_conversations_share_no_prompt_with_the_usage_history() -> None:
    """Pins are ranked on other prompts than the ones they are measured on: the measured
    conversations' seeds and the usage history's are disjoint sets."""
    measured = set(conversation_seeds(MEASURED_PROMPT, CONVERSATIONS))
    history = set(range(USAGE_PROMPT, USAGE_PROMPT + USAGE_PROMPTS))
    assert len(measured) == CONVERSATIONS and len(history) == USAGE_PROMPTS
    assert measured.isdisjoint(history)
