"""HWINFO and GPUS from devices the driver reports (the fake driver's two devices through the
probe), and CPU backends' lines unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import fake_cuda

from colibri.engine.backend import Device
from colibri.engine.cuda_devices import LIBRARY_ENV, probe
from colibri.engine.host_info import gpus_line, hwinfo_line


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cuda.build_fake_libcuda(tmp_path_factory.mktemp("fakecuda"))


def test_hwinfo_and_gpus_from_the_driver(fake_lib: Path) -> None:
    found = probe({LIBRARY_ENV: str(fake_lib)}, with_free=False)
    # what a CUDA backend's devices() reports: the driver's devices, its own use of them
    devices = [Device(d.index, d.name, d.total_bytes, 3 * 10**9 * (d.index + 1), 40 + d.index)
               for d in found.devices]
    fields = hwinfo_line(devices).split("|")[0].split()
    total = (2 * fake_cuda.TOTAL + fake_cuda.GIB) / 1e9
    assert fields[4:6] == ["2", f"{total:.1f}"]
    assert hwinfo_line(devices).endswith("|Fake H2000")
    assert gpus_line(devices) == (
        f"GPUS 2 3.000 {fake_cuda.TOTAL / 1e9:.3f} 40 "
        f"6.000 {(fake_cuda.TOTAL + fake_cuda.GIB) / 1e9:.3f} 41")


def test_cpu_lines_unchanged() -> None:
    assert gpus_line([]) == "GPUS 0"
    line = hwinfo_line([])
    assert line.split("|")[0].split()[4:6] == ["0", "0.0"]
    assert line.endswith("|")
