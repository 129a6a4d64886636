"""``--device cuda`` where no GPU can be used: the build, the binding and the refusals.

These run on every machine. What they can see depends on it, and each test says which case
it needs: without nvcc (the CI machine) the library is absent and the refusal names the
missing build; with nvcc and no NVIDIA driver (the development machine) the library loads and
its init returns the runtime's cudaErrorInsufficientDriver, which the refusal names as a
missing driver. Upload validation runs on the host before any CUDA call, so it is checked
here against the CPU library's own rules.
"""

from __future__ import annotations

import ctypes
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.accelerated import cuda_build, cuda_native
from colibri.accelerated.cuda_model import device_index
from colibri.accelerated.cuda_native import (
    CudaDriverMissing,
    CudaDriverTooOld,
    CudaNoDevice,
    CudaUnavailable,
    driver_present,
    unavailable,
)
from colibri.reference.quant import quantize
from colibri.reference.quant.formats import Fmt
from support.accelerated_support import needs_library
from support.cuda_shim import addr, cpu_variant, runnable_variants

from colibri.engine.registry import BackendOptions, BackendUnavailable, open_backend
from colibri.resources import fixture_model_dir

HAVE_NVCC = cuda_build.nvcc() is not None
LIBRARY_BUILT = cuda_build.library_path().is_file()
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not found")
needs_built = pytest.mark.skipif(not LIBRARY_BUILT,
                                 reason="nvcc not found (the CUDA library is not built)")
no_driver = pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is present here")


def test_device_names() -> None:
    assert device_index(None) is None and device_index("cpu") is None
    assert device_index("cuda") == 0 and device_index("cuda:3") == 3
    for bad in ("gpu", "cuda:", "cuda:x", "cuda:-1", "cpu:0"):
        with pytest.raises(ValueError, match="cpu, cuda or cuda:N"):
            device_index(bad)


def test_a_missing_library_names_the_missing_build(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(cuda_build, "DEFAULT_OUT", tmp_path / "nothing")
    cuda_native.load_library.cache_clear()
    try:
        with pytest.raises(BackendUnavailable) as caught:
            open_backend("accelerated", fixture_model_dir("glm5-tiny"),
                         BackendOptions(device="cuda"), io.StringIO())
    finally:
        cuda_native.load_library.cache_clear()
    assert ("--device cuda is not available: built without nvcc: run make build on a machine "
            "with the CUDA toolkit") in str(caught.value)


class _Lib:
    """The two calls ``unavailable`` makes, answering as the runtime would."""

    def ccu_error_name(self, code: int) -> bytes:
        return {35: b"cudaErrorInsufficientDriver", 100: b"cudaErrorNoDevice"}.get(code, b"?")

    def ccu_last_error(self) -> bytes:
        return b"cudaSetDevice: all CUDA-capable devices are busy (cudaErrorDevicesUnavailable)"


def test_each_init_code_names_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    lib: Any = _Lib()
    monkeypatch.setattr(cuda_native, "driver_present", lambda: False)
    missing = unavailable(lib, 35)
    assert isinstance(missing, CudaDriverMissing)
    assert str(missing) == "no NVIDIA driver (libcuda.so.1 not found)"
    monkeypatch.setattr(cuda_native, "driver_present", lambda: True)
    assert isinstance(unavailable(lib, 35), CudaDriverTooOld)
    none = unavailable(lib, 100)
    assert isinstance(none, CudaNoDevice) and str(none).startswith("no CUDA device")
    busy = unavailable(lib, 46)
    assert type(busy) is CudaUnavailable and "busy" in str(busy)


def test_the_build_is_skipped_with_a_note_without_nvcc(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    assert cuda_build.main([]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA build skipped: nvcc not found" in err


@needs_nvcc
@needs_built
def test_a_second_build_is_a_no_op_and_a_source_change_rebuilds(tmp_path: Path) -> None:
    compiler = cuda_build.nvcc()
    assert compiler is not None
    target = cuda_build.library_path()
    assert target.with_suffix(".stamp").read_text() == cuda_build.stamp(compiler)
    assert cuda_build.build(compiler) == (target, False)


@needs_built
def test_the_prototype_table_binds_and_the_runtime_is_static() -> None:
    lib = cuda_native.load_library()
    assert lib.ccu_version() == b"colibri-cuda 1"
    needed = subprocess.run(["ldd", str(cuda_build.library_path())], capture_output=True,
                            text=True, check=False).stdout
    assert "libcudart" not in needed  # linked statically: loads without the toolkit


@needs_built
@no_driver
def test_without_a_driver_init_returns_the_runtimes_code() -> None:
    lib = cuda_native.load_library()
    assert lib.ccu_init(0) == cuda_native.CUDA_ERROR_INSUFFICIENT_DRIVER
    assert lib.ccu_error_name(35) == b"cudaErrorInsufficientDriver"
    assert b"cudaGetDeviceCount" in lib.ccu_last_error()
    count = ctypes.c_int(-1)
    assert lib.ccu_device_count(ctypes.byref(count)) == 35 and count.value == 0
    with pytest.raises(CudaDriverMissing, match=r"no NVIDIA driver \(libcuda.so.1 not found\)"):
        cuda_native.open_device()


def _startup_reason() -> str | None:
    """What `--device cuda` must say on this machine (None: a device may open here)."""
    if not LIBRARY_BUILT:
        return "built without nvcc: run make build on a machine with the CUDA toolkit"
    if not driver_present():
        return "no NVIDIA driver (libcuda.so.1 not found)"
    return None


def test_the_engine_refuses_with_a_startup_error_naming_the_cause() -> None:
    reason = _startup_reason()
    if reason is None:
        pytest.skip("an NVIDIA driver is present: the GPU tests cover --device cuda here")
    result = subprocess.run(
        [sys.executable, "-m", "colibri", "engine", "--accelerated", "--device", "cuda",
         "--model", str(fixture_model_dir("glm5-tiny"))],
        input=b"", capture_output=True, timeout=120, check=False)
    assert result.returncode == 2
    assert result.stdout == b""
    err = result.stderr.decode()
    assert "cannot start: --device cuda is not available: " + reason in err
    assert "Traceback" not in err


def test_load_model_refuses_the_same_way() -> None:
    reason = _startup_reason()
    if reason is None:
        pytest.skip("an NVIDIA driver is present: the GPU tests cover --device cuda here")
    from colibri.accelerated import load_model

    with pytest.raises(CudaUnavailable, match=reason.replace("(", r"\(").replace(")", r"\)")):
        load_model(fixture_model_dir("glm5-tiny"), device="cuda")


def _upload_quant(fmt: Fmt, payload: np.ndarray, scales: np.ndarray, rows: int, cols: int,
                  gs: int) -> int:
    lib = cuda_native.load_library()
    handle = ctypes.c_void_p()
    return int(lib.ccu_upload_quant(int(fmt), gs, addr(payload), payload.size,
                                    addr(scales) if scales.size else 0, scales.size, rows, cols,
                                    ctypes.byref(handle)))


@needs_built
@needs_library
@no_driver
@pytest.mark.parametrize("fmt", [Fmt.INT8_ROW, Fmt.INT4_GROUPED, Fmt.INT3_G64, Fmt.E8_IQ3,
                                 Fmt.FP8_E4M3_B128], ids=lambda f: f.name)
def test_uploads_are_validated_on_the_host_before_any_cuda_call(fmt: Fmt) -> None:
    """A refused weight is the CPU library's code (+100) with no device involved; a valid
    one passes validation and is then refused for want of an opened device (no driver
    here)."""
    rows, cols, gs = 3, 256, 64
    w = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    payload, scales = (np.ascontiguousarray(a) for a in quantize(fmt, w, group_size=gs))
    cpu = cpu_variant(runnable_variants()[0])
    cases = [(payload[:-1].copy(), scales), (payload, np.full_like(scales, np.inf))]
    if fmt == Fmt.FP8_E4M3_B128:
        bad = payload.copy()
        bad[2] = 0x7F
        cases.append((bad, scales))
    for p, s in cases:
        want = cpu.coli_q_check(int(fmt), gs, addr(p), p.size, addr(s), s.size, rows, cols)
        assert want != 0
        assert _upload_quant(fmt, p, s, rows, cols, gs) == cuda_native.EQUANT_BASE + want
    # Valid: past validation, refused where it needs the device (none was opened).
    assert _upload_quant(fmt, payload, scales, rows, cols, gs) == 1
    assert b"no device opened" in cuda_native.load_library().ccu_last_error()
