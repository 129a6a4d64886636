"""Which experts' stored values were found finite, per version of the files that hold them.

Under a RAM budget an expert is read from disk every time it comes back into the cache, and
the backend checks each read's float projections for NaN/Inf before computing with them (a
checkpoint's bad value named, never a poisoned token). Scanning 10 MB costs about 1.5 ms on
the reading thread, on the step's critical path, every time. The same bytes of an unchanged
file hold the same values, so the verdict is kept per (layer, expert) and the version of its
files (inode, size, modification time): a file replaced or rewritten has another version and
its experts are checked again.

The version is taken when the verdict is recorded, after the read: a file rewritten in the
instant between an expert's read and its check gets the old bytes' verdict. A checkpoint is
not rewritten under a running engine in that way; a truncation is caught by the read itself
(``expert_disk``'s short read).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

Key = tuple[int, int]
#: The files an expert's tensors are stored in (``DiskTier.runs``' files).
ExpertFiles = Callable[[int, int], Sequence[Path]]
Version = tuple[tuple[str, int, int, int], ...]


class CheckedExperts:
    def __init__(self, files: ExpertFiles) -> None:
        self._files = files
        self._verdicts: dict[Key, Version] = {}
        self._lock = threading.Lock()  # reading threads record and ask concurrently

    def _version(self, layer: int, expert: int) -> Version | None:
        out = []
        for path in sorted(set(self._files(layer, expert))):
            try:
                st = os.stat(path)
            except OSError:
                return None
            out.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def known_finite(self, layer: int, expert: int) -> bool:
        """Whether this expert was found finite in the files as they are now."""
        with self._lock:
            recorded = self._verdicts.get((layer, expert))
        return recorded is not None and recorded == self._version(layer, expert)

    def record_finite(self, layer: int, expert: int) -> None:
        version = self._version(layer, expert)
        if version is not None:
            with self._lock:
                self._verdicts[(layer, expert)] = version
