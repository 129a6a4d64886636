"""CUDA discovery (colibri.engine.cuda_devices): the no-driver answer for real, and the
driver's answers parsed through the real ctypes path against a fake libcuda built with cc."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest
from support import fake_cuda

from colibri.engine import cuda_devices
from colibri.engine.cuda_devices import probe, probe_from_json, probe_isolated


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cuda.build_fake_libcuda(tmp_path_factory.mktemp("fakecuda"))


@pytest.fixture
def fake_env(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    # The fake reads its answers with getenv at call time: set them in the real environment.
    for name in ("FAKE_CU_INIT", "FAKE_CU_COUNT", "FAKE_CU_MEMINFO", "FAKE_CU_HANG"):
        monkeypatch.delenv(name, raising=False)
    return {cuda_devices.LIBRARY_ENV: str(fake_lib)}


def test_missing_library_names_it() -> None:
    result = probe({}, library="libcuda-definitely-absent.so.1")
    assert not result.usable
    assert result.devices == ()
    assert result.driver_version is None
    assert result.reason.startswith("no NVIDIA driver: libcuda-definitely-absent.so.1 not found")


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="this machine has an NVIDIA driver")
def test_this_machine_without_a_driver() -> None:
    result = probe({})
    assert result.reason.startswith("no NVIDIA driver: libcuda.so.1 not found")
    assert probe_isolated({}).reason == result.reason


def test_coli_cuda_zero_turns_cuda_off(fake_env: dict[str, str]) -> None:
    result = probe({**fake_env, "COLI_CUDA": "0"})
    assert not result.usable
    assert result.reason == "CUDA is off (COLI_CUDA=0)"


def test_devices_from_the_driver(fake_env: dict[str, str]) -> None:
    result = probe(fake_env)
    assert result.reason == ""
    assert result.driver_version == fake_cuda.DRIVER_VERSION
    assert result.driver_text == "13.0"
    assert [d.index for d in result.devices] == [0, 1]
    first, second = result.devices
    assert first.name == fake_cuda.NAME + "0"
    assert second.name == fake_cuda.NAME + "1"
    assert first.total_bytes == fake_cuda.TOTAL
    assert second.total_bytes == fake_cuda.TOTAL + fake_cuda.GIB
    # free memory is read under each device's own context (the fake refuses without one)
    assert first.free_bytes == fake_cuda.FREE
    assert second.free_bytes == fake_cuda.FREE - fake_cuda.GIB
    assert first.compute_capability == fake_cuda.CC
    assert first.multiprocessors == fake_cuda.SMS
    assert first.memory_bus_bits == fake_cuda.BUS_BITS
    assert first.memory_clock_khz == fake_cuda.MEM_CLOCK_KHZ
    assert first.peak_bandwidth_bytes_s == pytest.approx(
        2 * fake_cuda.MEM_CLOCK_KHZ * 1e3 * fake_cuda.BUS_BITS / 8)


def test_without_free_memory_no_context_is_made(fake_env: dict[str, str]) -> None:
    assert [d.free_bytes for d in probe(fake_env, with_free=False).devices] == [-1, -1]


def test_meminfo_failure_keeps_the_device(fake_env: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CU_MEMINFO", "2")
    result = probe(fake_env)
    assert result.usable
    assert [d.free_bytes for d in result.devices] == [-1, -1]


@pytest.mark.parametrize(("code", "name"), [
    ("100", "CUDA_ERROR_NO_DEVICE"),  # the driver's own cuGetErrorName
    ("34", "CUDA_ERROR_STUB_LIBRARY"),  # cuGetErrorName refuses: the probe's table
    ("12345", "unknown CUresult"),
])
def test_cuinit_failure_names_the_code(fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                       code: str, name: str) -> None:
    monkeypatch.setenv("FAKE_CU_INIT", code)
    result = probe(fake_env)
    assert not result.usable
    assert result.reason == f"cuInit returned {code} ({name})"
    assert result.driver_version == fake_cuda.DRIVER_VERSION


def test_zero_devices(fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CU_COUNT", "0")
    assert probe(fake_env).reason == "the NVIDIA driver sees no CUDA device"


@pytest.mark.parametrize(("variable", "value", "kept", "missing"), [
    ("COLI_GPUS", "1", [1], []),
    ("COLI_GPUS", "1,0,1", [0, 1], []),
    ("COLI_GPU", "0", [0], []),
    ("COLI_GPUS", "0,5", [0], [5]),
    ("COLI_GPUS", "auto", [0, 1], []),
])
def test_device_selection(fake_env: dict[str, str], variable: str, value: str,
                          kept: list[int], missing: list[int]) -> None:
    result = probe({**fake_env, variable: value})
    assert [d.index for d in result.devices] == kept
    assert list(result.missing) == missing


@pytest.mark.parametrize("value", ["7", "x,y"])
def test_a_selection_of_no_device_says_so(fake_env: dict[str, str], value: str) -> None:
    result = probe({**fake_env, "COLI_GPUS": value})
    assert not result.usable
    assert result.reason == (f"COLI_GPUS/COLI_GPU={value!r} names no device the driver sees "
                             "(2 device(s): ordinals 0..1)")


def test_isolated_probe_round_trips(fake_env: dict[str, str]) -> None:
    inline = probe(fake_env)
    assert probe_isolated(fake_env) == inline
    assert probe_from_json(inline.to_json()) == inline


def test_a_hanging_driver_costs_the_deadline_not_a_hang(fake_env: dict[str, str]) -> None:
    import os

    result = probe_isolated({**os.environ, **fake_env, "FAKE_CU_HANG": "1"}, timeout_s=2)
    assert not result.usable
    assert result.reason == "the CUDA driver did not answer within 2 s"


@pytest.mark.gpu
def test_the_gpu_marker_runs_where_the_probe_finds_a_device() -> None:
    # Skipped with the probe's reason where no device is usable (tests/conftest.py); where it
    # runs (a GPU machine, or the fake driver in tests/repo/test_gpu_marker.py) the probe and
    # the marker agree.
    result = probe()
    assert result.usable, result.reason
    assert all(d.total_bytes > 0 for d in result.devices)
