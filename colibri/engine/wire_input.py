"""The engine's command input: bytes from a source, frames from ``colibri.protocol.FrameParser``.

Only the I/O lives here; how the bytes split into commands is the one frame reader's
(``FrameParser.for_commands``), the same parser the server's client and the conformance suite
feed with engine output. The mux loop must know whether a command is waiting without blocking
(it decodes between commands), so a source offers ``poll(timeout)`` besides ``fill``.
``FdSource`` wraps a real file descriptor (select + os.read, never Python's buffered stdin,
whose buffer select cannot see); ``BytesSource`` serves a fixed script, which makes in-process
engine runs deterministic: every scripted command is there at once and the loop takes one per
iteration.
"""

from __future__ import annotations

import os
import select
from collections import deque
from typing import Protocol

from colibri.protocol import FrameParser, WireFrame

_CHUNK = 1 << 16


class Source(Protocol):
    """Raw command bytes. mypyc compiles the engine's classes as native classes, which
    interpreted code cannot subclass; a protocol lets tests script stdin with their own."""

    def poll(self, timeout: float | None) -> bool:
        """Whether ``fill`` would return without blocking (None waits forever)."""
        ...

    def fill(self) -> bytes:
        """The next bytes; empty at EOF."""
        ...


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


class CommandInput:
    """A source fed to a command parser: whole frames, one at a time. Frames are taken from
    the parser only as the loop asks for them, so a long script is held as bytes, not as
    thousands of frames."""

    def __init__(self, source: Source, parser: FrameParser) -> None:
        self._source = source
        self._parser = parser
        self._frames: deque[WireFrame] = deque()
        self._eof = False  # the source is exhausted
        self._finished = False  # ... and the parser has given its last frames

    def _read(self) -> None:
        chunk = self._source.fill()
        if chunk:
            self._parser.push(chunk)
        else:
            self._eof = True

    def _waiting(self) -> bool:
        """Whether a frame is there, taking the parser's next one if none is held."""
        if not self._frames:
            frame = self._parser.take()
            if frame is not None:
                self._frames.append(frame)
            elif self._eof and not self._finished:
                self._finished = True
                self._frames.extend(self._parser.finish())
        return bool(self._frames)

    def ready(self, timeout: float | None = 0.0) -> bool:
        """True if ``next`` would not block: a whole frame (or EOF) is there. Reads at most
        once, so a command still arriving never holds up the loop's decoding."""
        if self._waiting() or self._finished:
            return True
        if self._source.poll(timeout):
            self._read()
        return self._waiting() or self._finished

    def next(self) -> WireFrame | None:
        """The next frame, blocking until one is whole; None at EOF."""
        while not self._waiting():
            if self._finished:
                return None
            self._read()
        return self._frames.popleft()
