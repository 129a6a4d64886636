"""`colibri doctor`'s CUDA report: the build, the driver (its version or why there is none)
and the devices with their memory, for no driver (this machine's real answer) and for the
fake driver of support/fake_cuda.py (the real ctypes path, canned answers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import fake_cuda

from colibri import doctor
from colibri.engine.cuda_devices import LIBRARY_ENV, probe


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cuda.build_fake_libcuda(tmp_path_factory.mktemp("fakecuda"))


def _by_id(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.id: c for c in checks}


def test_no_driver() -> None:
    found = probe({}, library="libcuda-absent.so.1")
    checks = _by_id(doctor.check_cuda(found))
    assert checks["cuda_driver"] == doctor.Check(
        "cuda_driver", "ok", f"no CUDA driver ({found.reason})")
    assert checks["gpu"] == doctor.Check("gpu", "ok", f"no usable GPU ({found.reason}); CPU only")
    assert "libcuda-absent.so.1 not found" in found.reason


def test_fake_driver_devices(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FAKE_CU_INIT", "FAKE_CU_COUNT", "FAKE_CU_MEMINFO", "FAKE_CU_HANG"):
        monkeypatch.delenv(name, raising=False)
    checks = _by_id(doctor.check_cuda(probe({LIBRARY_ENV: str(fake_lib)})))
    assert checks["cuda_driver"] == doctor.Check(
        "cuda_driver", "ok", f"CUDA driver 13.0 ({fake_lib})")
    gpu = checks["gpu"]
    assert gpu.status == "ok"
    assert gpu.summary == (
        "2 CUDA device(s): 0: Fake H2000, 151.4 GB total, 149.3 GB free, sm_90, 132 SMs; "
        "1: Fake H2001, 152.5 GB total, 148.2 GB free, sm_90, 132 SMs")


def test_missing_requested_device_warns(fake_lib: Path) -> None:
    found = probe({LIBRARY_ENV: str(fake_lib), "COLI_GPUS": "0,3"})
    gpu = doctor.check_gpu(found)
    assert gpu.status == "warn"
    assert gpu.summary.endswith("COLI_GPUS/COLI_GPU asked for missing device(s) 3")


def test_driver_without_device(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CU_INIT", "100")
    found = probe({LIBRARY_ENV: str(fake_lib)})
    assert doctor.check_cuda_driver(found).summary == (
        f"CUDA driver 13.0 ({fake_lib}): cuInit returned 100 (CUDA_ERROR_NO_DEVICE)")


@pytest.mark.parametrize(("built", "compiler", "status", "text"), [
    (True, ("/x/nvcc", "13.0, V13.0.88"), "ok",
     "CUDA kernels: {lib}; nvcc /x/nvcc (13.0, V13.0.88)"),
    (False, ("/x/nvcc", "13.0, V13.0.88"), "warn",
     "CUDA kernels not built: no {lib} (run `make build`); nvcc /x/nvcc (13.0, V13.0.88)"),
    (False, None, "ok", "CUDA kernels not built (no nvcc: CPU-only build)"),
])
def test_cuda_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: bool,
                    compiler: tuple[str, str] | None, status: str, text: str) -> None:
    lib = tmp_path / "libcolibri_cuda.so"
    if built:
        lib.write_bytes(b"")
    monkeypatch.setattr(doctor, "cuda_library_path", lambda: lib)
    monkeypatch.setattr(doctor, "nvcc", lambda: compiler)
    assert doctor.check_cuda_build() == doctor.Check("cuda_build", status, text.format(lib=lib))


def test_json_carries_the_cuda_report(fake_lib: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_CU_", "COLI_"))}
    done = subprocess.run([sys.executable, "-m", "colibri", "doctor", "--json"],
                          capture_output=True, text=True,
                          env={**env, LIBRARY_ENV: str(fake_lib)})
    report = json.loads(done.stdout)
    cuda = report["cuda"]
    assert cuda["kernels_library"].endswith("build/accelerated/cuda/libcolibri_cuda.so")
    assert cuda["library"] == str(fake_lib)
    assert cuda["driver"] == "13.0"
    assert [d["total_bytes"] for d in cuda["devices"]] == [fake_cuda.TOTAL,
                                                          fake_cuda.TOTAL + fake_cuda.GIB]
    assert cuda["devices"][0]["free_bytes"] == fake_cuda.FREE
    assert {c["id"] for c in report["checks"]} >= {"cuda_build", "cuda_driver", "gpu"}
