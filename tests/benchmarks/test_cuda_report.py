"""The GPU bench's decode (the decode worker's ``backend`` engine, through the engine seam, run
here on the CPU backends) and the report assembled from its phases: achieved GB/s from the
bytes the routed steps read, the ratio to the copy bandwidth, slots, tiers; failed phases
reported, their ratios left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.accelerated_support import needs_library

from colibri import resources
from colibri.benchmarks import decode_worker
from colibri.benchmarks.cuda_decode import backend_engine
from colibri.benchmarks.cuda_report import assemble
from colibri.benchmarks.decode import step_bytes, tensor_table
from colibri.benchmarks.workers import call, run_worker

TINY = resources.fixture_model_dir("glm5-tiny")


@pytest.fixture(scope="module")
def reference_decode() -> dict[str, Any]:
    return decode_worker.alone(backend_engine(TINY, "reference", None, 0), tokens=3, warmup=1)


def test_decode_worker_on_the_cpu(reference_decode: dict[str, Any]) -> None:
    raw = reference_decode
    assert raw["backend"] == "reference" and raw["device"] == "cpu"
    assert len(raw["step_s"]) == 3 and len(raw["routes"]) == 3
    assert len(raw["ids"]) == 4  # warm-up ids included
    assert [layer for layer, _ in raw["routes"][0]] == [3, 4]
    assert all(len(ids) == 2 for _, ids in raw["routes"][0])
    assert raw["tiers"]["vram"] == 0 and raw["devices"] == []


@needs_library
def test_decode_worker_accelerated_agrees_on_tokens(reference_decode: dict[str, Any]) -> None:
    acc = decode_worker.alone(backend_engine(TINY, "accelerated", None, 0), tokens=3, warmup=1)
    assert acc["ids"] == reference_decode["ids"]
    assert acc["routes"] == reference_decode["routes"]


def test_cuda_device_is_refused_by_the_phase_worker() -> None:
    spec = {"engine": backend_engine(TINY, "reference", "cuda", -1), "tokens": 1, "warmup": 0}
    result = call("decode_worker:alone", spec, "decode", timeout_s=120)
    assert result["error"] == ("ValueError: the reference backend runs on the CPU, not 'cuda'")


def test_a_hung_phase_costs_its_deadline() -> None:
    import sys

    result = run_worker([sys.executable, "-c", "import time; time.sleep(30)"], "sleep",
                        timeout_s=1)
    assert result["timed_out"] is True and result["error"] == "timed out after 1 s"


def _with_times(raw: dict[str, Any], step_s: list[float], **extra: Any) -> dict[str, Any]:
    return {**raw, "step_s": step_s, **extra}


def test_report_numbers(reference_decode: dict[str, Any]) -> None:
    raw = reference_decode
    table, n_layers = tensor_table(TINY)
    per_step, _ = step_bytes(table, n_layers, raw["routes"])
    expert_total = sum(b for name, b, _ in table if ".mlp.experts." in name)
    results = {
        "copy": {"copy_bandwidth_gb_per_s": 100.0, "bytes": 1 << 30, "repeats": 10,
                 "best_ms": 21.47, "method": "m"},
        "decode_cuda": _with_times(raw, [0.001, 0.001, 0.002]),
        "slots_cuda_1": {"aggregate_tokens_per_s": 50.0, "per_slot_tokens_per_s": 50.0,
                         "median_step_ms": 20.0, "timed_steps": 16},
        "slots_cuda_8": {"aggregate_tokens_per_s": 200.0, "per_slot_tokens_per_s": 25.0,
                         "median_step_ms": 40.0, "timed_steps": 16},
        "slots_cuda_4": {"error": "timed out after 90 s", "timed_out": True},
        "decode_cpu": _with_times(raw, [0.01, 0.01, 0.01]),
        "tiered_0.25": _with_times(raw, [0.004, 0.004, 0.004],
                                   tiers={**raw["tiers"], "vram": 4,
                                          "vram_bytes": expert_total // 4}),
    }
    report = assemble(TINY, results, tokens=3, warmup=1)
    cuda = report["decode_cuda"]
    assert cuda["tokens_per_s"] == pytest.approx(3 / 0.004)
    assert cuda["achieved_gb_per_s"] == pytest.approx(sum(per_step) / 0.004 / 1e9)
    assert cuda["achieved_over_copy_bandwidth"] == pytest.approx(
        cuda["achieved_gb_per_s"] / 100.0)
    assert cuda["meets_target"] is (cuda["achieved_over_copy_bandwidth"] >= 0.5)
    assert report["ratio_cuda_over_cpu_decode"] == pytest.approx((3 / 0.004) / (3 / 0.03))
    assert report["same_greedy_ids_cuda_cpu"] is True
    assert report["slots_cuda"]["8"]["ratio_over_1_slot"] == pytest.approx(4.0)
    assert "4" not in report["slots_cuda"]
    assert report["phases"]["slots_cuda_4"] == "timed out after 90 s"
    assert report["errors"]["slots_cuda_4"]["timed_out"] is True
    (tier,) = report["tiered"]
    assert tier["requested_share"] == 0.25 and tier["vram_experts"] == 4
    assert tier["vram_share_of_expert_bytes"] == pytest.approx(0.25, abs=1e-3)
    assert tier["ratio_over_full_vram"] == pytest.approx((3 / 0.012) / (3 / 0.004))
    assert tier["ratio_over_cpu"] == pytest.approx((3 / 0.012) / (3 / 0.03))


def test_a_report_of_failures_keeps_no_ratio(tmp_path: Path) -> None:
    results = {"copy": {"error": "no NVIDIA driver: libcuda.so.1 not found"},
               "decode_cuda": {"error": "BackendUnavailable: no CUDA device"}}
    report = assemble(TINY, results, tokens=3, warmup=1)
    assert report["phases"] == {"copy": "no NVIDIA driver: libcuda.so.1 not found",
                                "decode_cuda": "BackendUnavailable: no CUDA device"}
    for key in ("copy_bandwidth_gb_per_s", "decode_cuda", "ratio_cuda_over_cpu_decode",
                "slots_cuda", "tiered"):
        assert key not in report
