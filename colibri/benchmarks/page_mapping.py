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

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SMAPS = Path("/proc/self/smaps")
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


def checkpoint_mapping(model_dir: Path, smaps: Path = SMAPS) -> dict[str, Any] | None:
    """This process's mappings of ``model_dir``'s safetensors files: resident bytes, bytes in
    2 MiB entries and their share of the resident ones."""
    try:
        text = smaps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    sizes = mapped_sizes(text, (str(p) for p in sorted(model_dir.glob("*.safetensors"))))
    resident = sizes["resident_bytes"]
    return {**sizes,
            "huge_mapped_fraction": sizes["huge_mapped_bytes"] / resident if resident else 0.0}
