"""The engine's command sources: the bytes ``colibri.protocol.FrameReader`` reads commands
from (split by ``FrameParser.for_commands``, the same reader and parser the server's client
and the conformance suite use on engine output).

The mux loop must know whether a command is waiting without blocking (it decodes between
commands), so a source offers ``poll(timeout)`` besides ``fill`` (``colibri.protocol.Source``).
``FdSource`` wraps a real file descriptor (select + os.read, never Python's buffered stdin,
whose buffer select cannot see); ``BytesSource`` serves a fixed script, which makes in-process
engine runs deterministic: every scripted command is there at once and the loop takes one per
iteration.
"""

from __future__ import annotations

import os
import select

from colibri.protocol import Source

__all__ = ["BytesSource", "FdSource", "Source"]

_CHUNK = 1 << 16


class BytesSource:
    """A fixed script of input bytes followed by EOF."""

    def __init__(self, data: bytes) -> None:
        self._pending = data

    def poll(self, timeout: float | None) -> bool:
        return True

    def fill(self) -> bytes:
        data = self._pending
        self._pending = b""
        return data


class FdSource:
    """A pipe or terminal file descriptor (the engine's stdin)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def poll(self, timeout: float | None) -> bool:
        try:
            readable, _, _ = select.select([self._fd], [], [], timeout)
        except InterruptedError:
            return False
        return bool(readable)

    def fill(self) -> bytes:
        while True:
            try:
                return os.read(self._fd, _CHUNK)
            except InterruptedError:
                continue
