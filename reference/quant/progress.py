"""A small progress bar for long conversions (stderr; redrawn in place on a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``update(done_bytes)`` redraws ``label [#####.....] n/N tensors, x/y MB``."""

    def __init__(
        self, label: str, total_items: int, total_bytes: int, stream: TextIO | None = None
    ) -> None:
        self.label = label
        self.total_items = max(total_items, 1)
        self.total_bytes = total_bytes
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.items = 0
        self.bytes = 0
        self._last_line = -1.0
        self._start = time.monotonic()

    def advance(self, nbytes: int) -> None:
        self.items += 1
        self.bytes += nbytes
        now = time.monotonic()
        # A pipe or log gets at most one line every few seconds (and the last one).
        if self.tty or self.items == self.total_items or now - self._last_line >= 5.0:
            self._last_line = now
            self._draw()

    def _draw(self) -> None:
        width = 30
        filled = width * self.items // self.total_items
        bar = "#" * filled + "." * (width - filled)
        mb, total_mb = self.bytes / 1e6, self.total_bytes / 1e6
        line = (
            f"{self.label} [{bar}] {self.items}/{self.total_items} tensors, "
            f"{mb:.1f}/{total_mb:.1f} MB, {time.monotonic() - self._start:.1f} s"
        )
        if self.tty:
            self.stream.write("\r" + line)
            if self.items == self.total_items:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
