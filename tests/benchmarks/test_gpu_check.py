"""The prepared device check (tools/gpu_check.py, behind tools/gpu_check.sh), run
here end to end: with no driver it stops at the probe, the first GPU step, with the reason and
a report; with the fake driver (support/fake_cuda.py) it goes on through the marked tests and
every bench phase, the CUDA ones failing with the backend's own refusal, the CPU ones
measured, and the report written after each step."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support import fake_cuda

from colibri import resources

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_check.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


gpu_check = load_tool()
Run, pytest_summary = gpu_check.Run, gpu_check.pytest_summary
TINY = resources.fixture_model_dir("glm5-tiny")
MARKED = ("tests/engine/test_cuda_devices.py::"
          "test_the_gpu_marker_runs_where_the_probe_finds_a_device")


def _check(out: Path, env: dict[str, str], *extra: str) -> tuple[int, dict[str, Any]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_CU_", "COLI_"))}
    done = subprocess.run([sys.executable, str(TOOL), "--out",
                           str(out), "--skip-build", *extra], cwd=ROOT,
                          env={**clean, **env}, capture_output=True, text=True, timeout=300)
    return done.returncode, json.loads((out / "gpu_report.json").read_text())


def test_without_a_driver_it_stops_at_the_probe(tmp_path: Path) -> None:
    rc, report = _check(tmp_path, {"COLIBRI_LIBCUDA": "libcuda-absent.so.1"})
    assert rc == 3
    assert report["status"] == "stopped" and report["stopped_at"] == "probe"
    assert report["reason"] == ("no usable CUDA device: no NVIDIA driver: libcuda-absent.so.1 "
                                "not found (No such file or directory)")
    assert list(report["steps"]) == ["environment", "build", "doctor", "probe"]
    assert report["steps"]["build"]["status"] == "skipped"
    assert "missing_modules" in report["environment"]
    assert report["doctor"]["cuda"]["library"] == "libcuda-absent.so.1"


@pytest.mark.slow  # about 20 s: each phase is a fresh process, as on the GPU
def test_with_a_device_the_phases_run_and_report(tmp_path: Path) -> None:
    lib = fake_cuda.build_fake_libcuda(tmp_path)
    out = tmp_path / "out"
    phases = ["copy", "decode_cuda", "slots_cuda_1", "decode_cpu", "tiered_0.25"]
    rc, report = _check(out, {"COLIBRI_LIBCUDA": str(lib)}, "--model", str(TINY), "--tests",
                        MARKED, "--tokens", "2", "--warmup", "1", "--copy-gib", "0.01",
                        "--only", *phases)
    assert rc == 1  # the CUDA phases fail: the fake driver satisfies the probe, not a backend
    assert report["status"] == "partial"
    steps = report["steps"]
    assert steps["probe"]["status"] == "ok"
    assert steps["pytest_gpu"]["status"] == "ok" and report["pytest_gpu"].startswith("1 passed")
    assert (out / "pytest_gpu.xml").is_file()
    assert [s for s in steps if s not in ("environment", "doctor", "build", "probe",
                                          "pytest_gpu", "bench_model")] == phases
    assert steps["copy"]["status"] == "ok" and steps["decode_cpu"]["status"] == "ok"
    for name in ("decode_cuda", "tiered_0.25"):
        assert steps[name]["status"] == "failed"
        assert "cuda" in steps[name]["error"].lower()
    bench = report["bench"]
    assert bench["copy_bandwidth_gb_per_s"] > 0
    assert bench["decode_cpu"]["tokens_per_s"] > 0
    assert "decode_cuda" not in bench and "ratio_cuda_over_cpu_decode" not in bench
    assert set(report["failed_steps"]) == {"decode_cuda", "slots_cuda_1", "tiered_0.25"}


def test_budget_skips_what_no_longer_fits(tmp_path: Path) -> None:
    run = Run(tmp_path, budget_s=5.0)
    run.started -= 100  # the budget is spent
    assert run.deadline("copy") < 0
    run.record("copy", "skipped", 0.0, reason="out of the run's time budget")
    run.finish()
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["status"] == "complete" and report["steps"]["copy"]["status"] == "skipped"


@pytest.mark.parametrize(("output", "summary"), [
    ("..\n==== 2 passed, 1 skipped in 3.2s ====\n", "2 passed, 1 skipped in 3.2s"),
    ("", ""),
])
def test_pytest_summary(output: str, summary: str) -> None:
    assert pytest_summary(output) == summary


def test_a_crash_of_the_check_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(run: Any, args: object) -> int:
        run.record("environment", "ok", 0.0)
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(gpu_check, "_check", broken)
    assert gpu_check.main(["--out", str(tmp_path)]) == 5
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["status"] == "stopped" and report["stopped_at"] == "after environment"
    assert report["reason"] == "the check itself crashed: RuntimeError: the disk is full"
    assert report["traceback"][-1] == "RuntimeError: the disk is full"
