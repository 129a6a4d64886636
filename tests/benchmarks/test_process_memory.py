"""``process_memory``: VmRSS and VmHWM read from the status file, in bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from colibri.benchmarks.process_memory import peak_rss_bytes, rss_bytes, status_bytes


def test_the_peak_covers_what_was_resident_and_fields_read_in_bytes(tmp_path: Path) -> None:
    block = np.ones(64 << 20, np.uint8)  # 64 MiB touched: resident now
    assert rss_bytes() >= 64 << 20
    del block
    assert peak_rss_bytes() >= 64 << 20 and peak_rss_bytes() >= rss_bytes()
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    assert status_bytes("VmHWM", status) == 2 * 1024 * 1024
    assert status_bytes("VmRSS", status) == 1024 * 1024
    assert status_bytes("VmSwap", status) == 0
    assert status_bytes("VmRSS", tmp_path / "absent") == 0
