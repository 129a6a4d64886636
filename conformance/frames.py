"""Splitting an engine's stdout into frames: ``colibri.protocol.FrameParser`` (the one frame
reader, I/O-free) fed from a pipe by a thread, so callers can wait with a deadline.

The names the suite uses are the protocol module's: ``Frame`` is ``WireFrame``,
``FrameSplitter`` is ``FrameParser``; kinds, sentinels and limits come from spec/protocol.json.
"""

from __future__ import annotations

import threading
from queue import Empty, Queue
from typing import BinaryIO

from colibri.protocol import BROKEN, END, LIMITS, PREAMBLE, READY, SPEC
from colibri.protocol import FrameParser as FrameSplitter
from colibri.protocol import WireFrame as Frame

LEGACY_END = END

#: Kinds whose header is followed by a byte-counted payload (size in field 2).
PAYLOAD_KINDS: frozenset[str] = SPEC.framed_kinds

#: Kinds whose field 1 is a request id.
TAGGED_KINDS: frozenset[str] = SPEC.tagged_kinds

#: A payload bigger than the spec's frame limit is a framing error rather than read: a
#: garbage count must not hang the reader.
MAX_PAYLOAD = LIMITS["max_frame_payload_bytes"]

#: Lines the legacy protocol prints outside answer text.
LEGACY_STATUS_KINDS: frozenset[str] = frozenset(SPEC.legacy["status_kinds"])

__all__ = [
    "BROKEN", "LEGACY_END", "LEGACY_STATUS_KINDS", "MAX_PAYLOAD", "PAYLOAD_KINDS", "PREAMBLE",
    "READY", "TAGGED_KINDS", "Frame", "FrameReader", "FrameSplitter",
]


class FrameReader:
    """A thread that splits a pipe into frames so callers can wait with a deadline."""

    def __init__(self, stream: BinaryIO, legacy: bool = False) -> None:
        self._stream = stream
        self._splitter = FrameSplitter(legacy=legacy)
        self._queue: Queue[Frame | None] = Queue()
        self.eof = False
        self._thread = threading.Thread(target=self._pump, name="frame-reader", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        read = getattr(self._stream, "read1", self._stream.read)
        try:
            while True:
                chunk = read(65536)
                if not chunk:
                    break
                for frame in self._splitter.feed(chunk):
                    self._queue.put(frame)
        except (OSError, ValueError):
            pass
        for frame in self._splitter.finish():
            self._queue.put(frame)
        self._queue.put(None)

    def next(self, timeout: float) -> Frame | None:
        """The next frame; None at EOF. Raises TimeoutError when nothing came in time."""
        if self.eof:
            return None
        try:
            item = self._queue.get(timeout=max(timeout, 0.0))
        except Empty as exc:
            raise TimeoutError from exc
        if item is None:
            self.eof = True
        return item
