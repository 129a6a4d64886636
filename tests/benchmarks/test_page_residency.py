"""``page_residency.cached_bytes``: the page cache's share of some files, by ``mincore``."""

from __future__ import annotations

import os
from pathlib import Path

from colibri.benchmarks.page_residency import cached_bytes


def test_a_file_read_through_the_cache_is_counted_and_a_dropped_one_is_not(
        tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(64 * 4096))
    with path.open("rb") as fh:
        fh.read()
        assert cached_bytes([path]) == 64 * 4096  # just written and read: all cached
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    dropped = cached_bytes([path])
    assert dropped is not None and dropped < 64 * 4096
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert cached_bytes([empty]) == 0
