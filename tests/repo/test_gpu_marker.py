"""The `gpu` marker (tests/conftest.py): skipped with the CUDA probe's precise reason where no
device is usable, run where one is (here: the fake driver of support/fake_cuda.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _missing_gpu
from support import fake_cuda

ROOT = Path(__file__).resolve().parents[2]
MARKED = ("tests/engine/test_cuda_devices.py::"
          "test_the_gpu_marker_runs_where_the_probe_finds_a_device")


def test_the_reason_is_the_probe_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLIBRI_LIBCUDA", "libcuda-absent-for-this-test.so.1")
    assert _missing_gpu() == ("needs a usable CUDA GPU: no NVIDIA driver: "
                              "libcuda-absent-for-this-test.so.1 not found (No such file or "
                              "directory)")
    monkeypatch.setenv("COLI_CUDA", "0")
    assert _missing_gpu() == "needs a usable CUDA GPU: CUDA is off (COLI_CUDA=0)"


def test_marked_tests_run_where_a_device_is_usable(tmp_path: Path) -> None:
    lib = fake_cuda.build_fake_libcuda(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_CU_", "COLI_"))}
    done = subprocess.run([sys.executable, "-m", "pytest", MARKED, "-rs", "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT,
                          env={**env, "COLIBRI_LIBCUDA": str(lib)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
