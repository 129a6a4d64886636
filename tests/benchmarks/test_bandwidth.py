"""The bandwidth probe's device copy (colibri.benchmarks.bandwidth.device_copy): its driver-API
path run for real against the fake driver (host memory, clock-stamped events), and its answer
where there is no driver; and the host probes' units."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import fake_cuda

from colibri.benchmarks import bandwidth
from colibri.engine.cuda_devices import LIBRARY_ENV, open_driver


def test_no_driver_is_an_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIBRARY_ENV, "libcuda-absent.so.1")
    assert bandwidth.device_copy() == {"error": "no NVIDIA driver: libcuda-absent.so.1 not found"}


def test_copy_through_the_fake_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = fake_cuda.build_fake_libcuda(tmp_path)
    for name in ("FAKE_CU_INIT", "FAKE_CU_HANG"):
        monkeypatch.delenv(name, raising=False)
    drv = open_driver({}, library=str(lib))
    assert not isinstance(drv, str)
    size = 8 << 20
    result = bandwidth.device_copy_with(drv, 0, size, repeats=3)
    assert result["bytes"] == size and len(result["times_ms"]) == 3
    assert result["best_ms"] == min(result["times_ms"]) > 0
    assert result["copy_bandwidth_gb_per_s"] == pytest.approx(
        2 * size / (result["best_ms"] / 1e3) / 1e9)


def test_a_failed_call_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = fake_cuda.build_fake_libcuda(tmp_path)
    drv = open_driver({}, library=str(lib))
    assert not isinstance(drv, str)
    with pytest.raises(bandwidth.CopyError, match=r"cuDeviceGet returned 101 \("):
        bandwidth.device_copy_with(drv, 7, 1 << 20, repeats=1)


def test_host_probes_count_bytes_per_second() -> None:
    from support.accelerated_support import BUILT

    copy = bandwidth.host_copy_bytes_per_s(mib=4, repeats=2)
    assert copy > 1e8  # read plus written, far above any disk
    if BUILT:
        from colibri.accelerated.kernels import Kernels

        kernels = Kernels(1)
        try:
            assert bandwidth.read_stream_bytes_per_s(kernels, bandwidth.stream_weight(4), 2) > 1e8
        finally:
            kernels.close()
