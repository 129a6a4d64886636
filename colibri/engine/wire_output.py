"""Writing engine frames: one write and one flush per frame.

Every frame is a record of the wire codec (``colibri.protocol.records``), which alone spells
keywords and numbers (spec/protocol.md section 1.1); this module only writes its bytes.
"""

from __future__ import annotations

from typing import BinaryIO

from colibri.protocol import END_LINE, READY_LINE
from colibri.protocol.records import Record

READY = READY_LINE
END = END_LINE


class FrameWriter:
    """Writes frames to the engine's stdout (a binary stream), flushing after each."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out

    def raw(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()

    def line(self, text: str) -> None:
        self.raw(text.encode("utf-8") + b"\n")

    def frame(self, record: Record) -> None:
        """One frame of the codec, in one write (a payload frame's header, bytes and LF)."""
        self.raw(record.encode())
