"""``page_residency.cached_bytes``: the page cache's share of some files, by ``mincore``."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from colibri.benchmarks.page_residency import cached_bytes


def test_written_pages_are_counted_and_holes_are_not(tmp_path: Path) -> None:
    """A sparse file whose first quarter was written: the written pages are in the page cache
    on any file system, the holes never were."""
    page = mmap.PAGESIZE
    path = tmp_path / "weights.bin"
    with path.open("wb") as fh:
        fh.truncate(64 * page)
        fh.write(os.urandom(16 * page))
    assert cached_bytes([path]) == 16 * page
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert cached_bytes([empty, path]) == 16 * page
