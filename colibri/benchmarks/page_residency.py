"""How much of some files the page cache holds now: ``mincore`` over a read-only map.

An engine bounded by ``RAM_GB`` alone (no memory cgroup) owns its resident memory, but the
pages of its model files that the kernel caches count against the machine too. The bench's
footprint is the process's peak resident memory plus the page cache's share of the model's
files that the process does not map (``page_mapping.mapped_sizes``: a mapped page is in both
counts once).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

MAP_FAILED = ctypes.c_void_p(-1).value


def cached_bytes(paths: list[Path]) -> int | None:
    """Bytes of ``paths`` in the page cache now; None where ``mincore`` is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc_mmap, libc_munmap, mincore = libc.mmap, libc.munmap, libc.mincore
    except (OSError, AttributeError):
        return None
    libc_mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc_mmap.restype = ctypes.c_void_p
    libc_munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
    mincore.restype = ctypes.c_int
    page = mmap.PAGESIZE
    total = 0
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc_mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        if address in (None, MAP_FAILED):
            return None
        try:
            flags = (ctypes.c_ubyte * (-(-size // page)))()
            if mincore(address, size, flags) != 0:
                return None
            total += sum(flag & 1 for flag in bytes(flags)) * page
        finally:
            libc_munmap(address, size)
    return total

