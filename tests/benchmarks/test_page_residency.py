"""``page_residency.cached_bytes``: the page cache's share of some files, by ``mincore``."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from colibri.benchmarks.page_residency import cached_bytes, mapped_rss_bytes


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


def test_the_pages_a_process_maps_are_counted_for_that_file_only(tmp_path: Path) -> None:
    mapped_file, other = tmp_path / "dense.bin", tmp_path / "other.bin"
    mapped_file.write_bytes(os.urandom(32 * 4096))
    other.write_bytes(os.urandom(8 * 4096))
    assert mapped_rss_bytes([mapped_file, other]) == 0
    with mapped_file.open("rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as view:
        assert sum(view[i * 4096] for i in range(32)) >= 0  # touch every page
        assert mapped_rss_bytes([mapped_file]) == 32 * 4096
        assert mapped_rss_bytes([other]) == 0
