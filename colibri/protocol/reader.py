"""The one frame reader: ``FrameParser`` (I/O-free) fed from a byte source.

Every side that reads the wire from a stream uses ``FrameReader``: the engine reads its
commands with it (from its stdin, or from a fixed script), the conformance suite and the
tests read an engine's stdout with it. What differs is only the ``Source`` of the bytes and
the parser's direction:

- a ``Source`` offers ``poll(timeout)`` (would ``fill`` return without blocking?) and
  ``fill()`` (the next bytes, empty at EOF), so a reader can tell whether a frame is waiting
  without blocking (the engine's loop decodes between commands) and wait with a deadline
  (the suite gives up on an engine that withholds an answer);
- ``StreamSource`` is a blocking binary stream (a child's stdout, a ``BytesIO``) drained by a
  thread: the process writing the pipe never stalls on a full pipe while its reader is busy
  writing commands to it, and a reader can wait for it with a timeout.

Frames are taken from the parser only as the reader asks for them, so a long input is held
as bytes, not as thousands of frames.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from queue import Empty, Queue
from typing import IO, Protocol, runtime_checkable

from colibri.protocol.framing import BROKEN, FrameParser, WireFrame
from colibri.protocol.lines import parse_line
from colibri.protocol.spec import ProtocolSpec, ProtocolViolation, load_spec

_CHUNK = 1 << 16


@runtime_checkable
class Source(Protocol):
    """Raw bytes of one direction of the wire. A protocol rather than a base class: mypyc
    compiles the engine's classes as native classes, which interpreted code (a test's
    scripted stdin) cannot subclass."""

    def poll(self, timeout: float | None) -> bool:
        """Whether ``fill`` would return without blocking (None waits forever)."""
        ...

    def fill(self) -> bytes:
        """The next bytes; empty at EOF."""
        ...


class StreamSource:
    """A blocking binary stream, read to EOF by a daemon thread into a queue of chunks."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._chunks: Queue[bytes] = Queue()
        self._held: bytes | None = None
        self._ended = False
        thread = threading.Thread(target=self._pump, name="frame-source", daemon=True)
        thread.start()

    def _pump(self) -> None:
        # read1 returns what the pipe holds instead of waiting to fill the whole chunk.
        read = getattr(self._stream, "read1", self._stream.read)
        try:
            while chunk := read(_CHUNK):
                self._chunks.put(chunk)
        except (OSError, ValueError):
            pass  # the stream was closed under the thread: that is its EOF
        self._chunks.put(b"")

    def poll(self, timeout: float | None) -> bool:
        if self._held is not None or self._ended:
            return True
        try:
            if timeout is not None and timeout <= 0:
                self._held = self._chunks.get_nowait()
            else:
                self._held = self._chunks.get(timeout=timeout)
        except Empty:
            return False
        return True

    def fill(self) -> bytes:
        if self._ended:
            return b""
        self.poll(None)
        data, self._held = self._held or b"", None
        self._ended = not data
        return data


class FrameReader:
    """Frames from a ``Source`` (or a blocking binary stream, read by a ``StreamSource``),
    split by ``parser`` (default: engine output already past READY).

    ``ready(timeout)`` says whether ``next`` would not block; ``next(timeout)`` gives the next
    frame, None at EOF, and raises ``TimeoutError`` when ``timeout`` seconds pass first (None
    waits for ever). For engine output, ``read_preamble()`` consumes everything up to and
    including READY, and ``read_frame()`` gives the next frame with its line parsed by its
    grammar (None at EOF; broken framing or a malformed known line raises
    ``ProtocolViolation``; a kind protocol.json does not define goes to ``on_unknown``).
    """

    def __init__(
        self,
        source: Source | IO[bytes],
        parser: FrameParser | None = None,
        *,
        spec: ProtocolSpec | None = None,
        on_unknown: Callable[[bytes], None] | None = None,
    ) -> None:
        self._source: Source = source if isinstance(source, Source) else StreamSource(source)
        self.spec = spec or (parser.spec if parser is not None else load_spec())
        self._parser = parser or FrameParser(seen_ready=True, spec=self.spec)
        self.on_unknown = on_unknown
        self._frames: deque[WireFrame] = deque()
        self._eof = False  # the source is exhausted
        self._finished = False  # ... and the parser has given its last frames

    @property
    def eof(self) -> bool:
        """Every frame has been read: ``next`` returns None from now on."""
        return self._finished and not self._frames

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
        once, so a command still arriving never holds up the engine's decoding."""
        if self._waiting() or self._finished:
            return True
        if self._source.poll(timeout):
            self._read()
        return self._waiting() or self._finished

    def next(self, timeout: float | None = None) -> WireFrame | None:
        """The next frame, once it is whole; None at EOF; ``TimeoutError`` when ``timeout``
        seconds pass without one."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while not self._waiting():
            if self._finished:
                return None
            if deadline is not None:
                while not self._source.poll(max(deadline - time.monotonic(), 0.0)):
                    if time.monotonic() >= deadline:
                        raise TimeoutError
            self._read()
        return self._frames.popleft()

    def read_preamble(self) -> list[bytes]:
        """Lines before READY (free-form); raises EOFError if READY never comes."""
        lines: list[bytes] = []
        self._parser.seen_ready = False
        while (frame := self.next()) is not None:
            if frame.kind == "READY":
                return lines
            lines.append(frame.line)
        raise EOFError("engine closed stdout before READY")

    def read_frame(self) -> WireFrame | None:
        """The next frame with ``parsed`` set (None for a kind protocol.json does not
        define)."""
        frame = self.next()
        if frame is None:
            return None
        if frame.kind == BROKEN:
            raise ProtocolViolation("?", frame.problem, frame.header.decode("latin-1"))
        parsed = parse_line(frame.header, self.spec)
        if parsed is None:
            if self.on_unknown is not None:
                self.on_unknown(frame.line)
            return frame
        return replace(frame, kind=parsed.kind, parsed=parsed)
