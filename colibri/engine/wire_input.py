"""Reading the server's commands from a byte stream: lines with a length cap, exact payloads.

The mux loop must know whether a command is waiting without blocking (it decodes between
commands), so a source offers ``ready(timeout)`` besides the reads. ``FdSource`` wraps a real
file descriptor (select + os.read, never Python's buffered stdin, whose buffer select cannot
see); ``BytesSource`` serves a fixed script, which makes in-process engine runs deterministic:
every scripted command is "available" at once and the loop reads one per iteration.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass
from typing import Literal, Protocol

_CHUNK = 1 << 16


@dataclass(frozen=True)
class LineRead:
    """One command line without its LF. ``too_long``: it exceeded the cap and was drained."""

    status: Literal["line", "too_long", "eof"]
    data: bytes = b""


class ByteSource:
    """A buffered byte source; subclasses supply ``_fill`` (and ``_poll`` if they can block)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False

    def _fill(self) -> bool:
        """Append more bytes to the buffer; False at EOF."""
        raise NotImplementedError

    def _poll(self, timeout: float | None) -> bool:
        """Whether _fill would return without blocking."""
        return True

    def ready(self, timeout: float | None = 0.0) -> bool:
        """True if a read would not block (data or EOF is there); None waits forever."""
        if self._buf or self._eof:
            return True
        return self._poll(timeout)

    def _more(self) -> bool:
        if self._eof:
            return False
        if not self._fill():
            self._eof = True
            return False
        return True

    def read_line(self, limit: int) -> LineRead:
        """The next line (LF removed). A partial last line before EOF counts as a line."""
        start = 0
        while True:
            newline = self._buf.find(b"\n", start)
            if newline >= 0:
                if newline > limit:
                    del self._buf[: newline + 1]
                    return LineRead("too_long")
                line = bytes(self._buf[:newline])
                del self._buf[: newline + 1]
                return LineRead("line", line)
            if len(self._buf) > limit:
                return self._drain_long_line()
            start = len(self._buf)
            if not self._more():
                if not self._buf:
                    return LineRead("eof")
                line = bytes(self._buf)
                self._buf.clear()
                return LineRead("line", line)

    def _drain_long_line(self) -> LineRead:
        while True:
            newline = self._buf.find(b"\n")
            if newline >= 0:
                del self._buf[: newline + 1]
                return LineRead("too_long")
            self._buf.clear()
            if not self._more():
                return LineRead("too_long")

    def unread(self, data: bytes) -> None:
        """Put bytes back in front of the stream (the legacy PROMPT's lenient terminator)."""
        self._buf[:0] = data

    def read_exact(self, n: int) -> bytes:
        """Exactly n bytes, or fewer if EOF comes first."""
        while len(self._buf) < n and self._more():
            pass
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


class BytesSource(ByteSource):
    """A fixed script of input bytes followed by EOF."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._pending: bytes | None = data

    def _fill(self) -> bool:
        if not self._pending:
            self._pending = None
            return False
        self._buf += self._pending
        self._pending = None
        return True


class Feed(Protocol):
    """Raw input for a :class:`FeedSource`: how a caller outside the engine supplies bytes.

    mypyc compiles ``ByteSource`` as a native class, which interpreted code cannot subclass;
    a feed is the seam instead (tests script their stdin with one)."""

    def poll(self, timeout: float | None) -> bool:
        """Whether ``fill`` would return without blocking."""
        ...

    def fill(self) -> bytes:
        """The next bytes; empty at EOF."""
        ...


class FeedSource(ByteSource):
    """A source whose bytes come from a :class:`Feed`."""

    def __init__(self, feed: Feed) -> None:
        super().__init__()
        self._feed = feed

    def _poll(self, timeout: float | None) -> bool:
        return self._feed.poll(timeout)

    def _fill(self) -> bool:
        chunk = self._feed.fill()
        if not chunk:
            return False
        self._buf += chunk
        return True


class FdSource(ByteSource):
    """A pipe or terminal file descriptor (the engine's stdin)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def _poll(self, timeout: float | None) -> bool:
        try:
            readable, _, _ = select.select([self._fd], [], [], timeout)
        except InterruptedError:
            return False
        return bool(readable)

    def _fill(self) -> bool:
        while True:
            try:
                chunk = os.read(self._fd, _CHUNK)
            except InterruptedError:
                continue
            if not chunk:
                return False
            self._buf += chunk
            return True
