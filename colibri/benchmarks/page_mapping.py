"""How much of a memory-mapped checkpoint this process maps with 2 MiB page-table entries.

A decode step streams its weights through the checkpoint's memory map, and a map whose pages
are 4 KiB walks the page tables every 4 KiB where 2 MiB entries walk them every 2 MiB (one
Zen 4 host: the accelerated one-row step 1.03-1.07x faster on the same checkpoint mapped the
second way; ``colibri.reference.aligned_write`` says when Linux maps a file so). Bandwidth
figures taken on a checkpoint in either state are not the same measurement, so the roofline
section reports which it was. Read from ``/proc/self/smaps`` (``Rss`` and ``FilePmdMapped``
of every mapping of the given files); ``None`` where that file does not exist.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

SMAPS = Path("/proc/self/smaps")
PAGE = 4096
#: Cached pages ``cached_mapping`` maps at most (4 GiB): a few seconds of soft faults at worst.
TOUCH_PAGES = 1 << 20
_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s+(.*)$")
_KIB_FIELD = re.compile(r"^(\w+):\s+(\d+) kB$")


def mapped_sizes(smaps_text: str, files: Iterable[str]) -> dict[str, int]:
    """Resident bytes and bytes in 2 MiB file mappings (``FilePmdMapped``), summed over the
    mappings of ``files`` in ``smaps_text``."""
    wanted = {str(Path(f).resolve()) for f in files}
    totals = {"resident_bytes": 0, "huge_mapped_bytes": 0}
    current: str | None = None
    for line in smaps_text.splitlines():
        head = _MAPPING.match(line)
        if head:
            current = head.group(1).strip()
            continue
        field = _KIB_FIELD.match(line)
        if field is None or current not in wanted:
            continue
        if field.group(1) == "Rss":
            totals["resident_bytes"] += int(field.group(2)) * 1024
        elif field.group(1) == "FilePmdMapped":
            totals["huge_mapped_bytes"] += int(field.group(2)) * 1024
    return totals


def huge_mapped_fraction(sizes: dict[str, int]) -> float:
    """The share of :func:`mapped_sizes`' resident bytes that sit in 2 MiB entries (0 when
    nothing is resident)."""
    resident = sizes["resident_bytes"]
    return sizes["huge_mapped_bytes"] / resident if resident else 0.0


def touch_pages(view: mmap.mmap, pages: npt.NDArray[np.intp] | None = None) -> None:
    """Load one byte of each 4 KiB page of ``view`` (of the page indices ``pages``; default:
    every page), which faults each one into this process's map."""
    data = np.frombuffer(view, dtype=np.uint8)
    try:
        picked = data[::PAGE] if pages is None else data[pages * PAGE]
        int(picked.sum(dtype=np.uint64))
    finally:
        del data  # the map cannot close while a buffer exports it


def checkpoint_mapping(model_dir: Path, smaps: Path = SMAPS) -> dict[str, Any] | None:
    """This process's mappings of ``model_dir``'s safetensors files: resident bytes, bytes in
    2 MiB entries and their share of the resident ones."""
    try:
        text = smaps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    sizes = mapped_sizes(text, (str(p) for p in sorted(model_dir.glob("*.safetensors"))))
    return {**sizes, "huge_mapped_fraction": huge_mapped_fraction(sizes)}


def _resident_pages(view: mmap.mmap) -> npt.NDArray[np.intp] | None:
    """Indices of the 4 KiB pages of ``view`` that are in the page cache (``mincore``), or
    None where libc has no mincore."""
    try:
        mincore = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    mincore.restype = ctypes.c_int
    pages = np.frombuffer(view, dtype=np.uint8)
    try:
        flags = np.zeros((len(view) + PAGE - 1) // PAGE, dtype=np.uint8)
        if mincore(pages.ctypes.data, len(view), flags.ctypes.data) != 0:
            return None
        return np.flatnonzero(flags & 1)
    finally:
        del pages  # the map cannot close while a buffer exports it


def cached_mapping(files: Iterable[Path], smaps: Path = SMAPS) -> dict[str, Any] | None:
    """How ``files`` sit in the page cache now, without reading anything from disk: their
    size, the bytes cached (``mincore``), and, of the cached pages mapped here (only those
    are touched, the first ``TOUCH_PAGES`` of them), the share the kernel maps with 2 MiB
    entries. None where the platform cannot say (no ``mincore`` or no ``/proc/self/smaps``)."""
    paths = [Path(f).resolve() for f in files]
    views: list[mmap.mmap] = []
    total = cached = touched = 0
    try:
        for path in paths:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                total += size
                if size == 0:
                    continue
                views.append(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
            resident = _resident_pages(views[-1])
            if resident is None:
                return None
            cached += min(size, len(resident) * PAGE)
            resident = resident[:max(0, TOUCH_PAGES - touched)]
            touched += len(resident)
            touch_pages(views[-1], resident)  # cached pages only: no disk read
        text = smaps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    finally:
        for view in views:
            view.close()
    sizes = mapped_sizes(text, (str(p) for p in paths))
    return {"file_bytes": total, "cached_bytes": cached, **sizes,
            "huge_mapped_fraction": huge_mapped_fraction(sizes)}
