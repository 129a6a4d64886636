"""Splitting an engine's stdout into frames.

The wire is line-oriented except for payload frames (DATA, ECHO, TOOL, GRPP, GRPG), whose
header carries a byte count at field 2 followed by exactly that many raw bytes and one LF.
The reader must know which kinds carry a payload, otherwise a payload containing LF would
desynchronise it; every other kind is one line. Anything before the READY sentinel is the
engine's free-form preamble.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from queue import Empty, Queue
from typing import BinaryIO

READY = b"\x01\x01READY\x01\x01"
LEGACY_END = b"\x01\x01END\x01\x01"

#: Kinds whose header is followed by a byte-counted payload (size in field 2).
PAYLOAD_KINDS: frozenset[str] = frozenset({"DATA", "ECHO", "TOOL", "GRPP", "GRPG"})

#: Kinds whose field 1 is a request id.
TAGGED_KINDS: frozenset[str] = frozenset(
    {"ACCEPT", "DATA", "ECHO", "TOPK", "DONE", "ERROR", "PERF", "TOOL"}
)

#: A payload bigger than this is treated as a framing error rather than read (the gateway
#: refuses DATA sizes above 65536 for the same reason: a garbage count must not hang us).
MAX_PAYLOAD = 1 << 20

#: Lines the legacy protocol prints outside answer text.
LEGACY_STATUS_KINDS: frozenset[str] = frozenset({"STAT", "TIERS", "HWINFO", "EMAP"})

PREAMBLE = "PREAMBLE"
BROKEN = "BROKEN"


@dataclass(frozen=True)
class Frame:
    """One unit read from the engine.

    ``kind`` is the first word of the header (``PREAMBLE`` for lines before READY,
    ``READY`` for the sentinel, ``BROKEN`` when the bytes violate payload framing).
    ``header`` is the header line without its LF; ``payload`` is present for payload kinds.
    """

    index: int
    kind: str
    header: bytes
    payload: bytes | None = None
    problem: str = ""

    @property
    def fields(self) -> list[str]:
        return self.header.decode("utf-8", "replace").split(" ")

    @property
    def request_id(self) -> int | None:
        if self.kind not in TAGGED_KINDS:
            return None
        parts = self.fields
        if len(parts) < 2 or not parts[1].isdigit():
            return None
        return int(parts[1])

    def wire(self) -> bytes:
        """The exact bytes this frame occupied on the wire."""
        if self.payload is None:
            return self.header + b"\n"
        return self.header + b"\n" + self.payload + b"\n"

    def describe(self) -> str:
        text = self.header.decode("utf-8", "backslashreplace")
        if self.payload is not None:
            text += " | " + self.payload.decode("utf-8", "backslashreplace")
        return text[:200]


@dataclass
class FrameSplitter:
    """Incremental parser: feed bytes, take frames. Pure, so it is easy to test."""

    legacy: bool = False
    seen_ready: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _count: int = 0
    _legacy_expect_status: bool = True
    _legacy_after_end: bool = False

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer.extend(data)
        out: list[Frame] = []
        while True:
            frame = self._take()
            if frame is None:
                return out
            out.append(frame)

    def finish(self) -> list[Frame]:
        """Whatever is left at EOF becomes one BROKEN frame (a truncated line or payload)."""
        if not self._buffer:
            return []
        rest = bytes(self._buffer)
        self._buffer.clear()
        return [self._make(BROKEN, rest, None, "stream ended inside a frame")]

    def _make(self, kind: str, header: bytes, payload: bytes | None, problem: str = "") -> Frame:
        frame = Frame(self._count, kind, header, payload, problem)
        self._count += 1
        return frame

    def _take(self) -> Frame | None:
        buf = self._buffer
        if not self.seen_ready:
            # READY may not be at a line start in a sloppy engine; the gateway scans bytes.
            newline = buf.find(b"\n")
            if newline < 0:
                return None
            line = bytes(buf[:newline])
            del buf[: newline + 1]
            if line == READY:
                self.seen_ready = True
                return self._make("READY", line, None)
            if READY in line:
                self.seen_ready = True
                return self._make("READY", line, None, "READY sentinel not alone on its line")
            return self._make(PREAMBLE, line, None)
        if self.legacy:
            return self._take_legacy()
        newline = buf.find(b"\n")
        if newline < 0:
            return None
        line = bytes(buf[:newline])
        kind = line.split(b" ", 1)[0].decode("utf-8", "replace")
        if kind in PAYLOAD_KINDS:
            parts = line.split(b" ")
            if len(parts) < 3 or not parts[2].isdigit() or int(parts[2]) > MAX_PAYLOAD:
                del buf[: newline + 1]
                return self._make(BROKEN, line, None, f"{kind} header without a valid byte count")
            size = int(parts[2])
            end = newline + 1 + size
            if len(buf) < end + 1:
                return None
            payload = bytes(buf[newline + 1 : end])
            terminator = buf[end]
            del buf[: end + 1]
            if terminator != 0x0A:
                return self._make(
                    BROKEN,
                    line,
                    payload,
                    f"{kind} payload not followed by LF (got {terminator:#04x})",
                )
            return self._make(kind, line, payload)
        del buf[: newline + 1]
        return self._make(kind, line, None)

    def _take_legacy(self) -> Frame | None:
        """Legacy replies are raw text up to the END sentinel, then one STAT line.

        Status lines (STAT, TIERS, ...) are only expected right after READY or END; at any
        other point the bytes are answer text, which may itself start with "STAT".
        """
        buf = self._buffer
        if self._legacy_expect_status:
            newline = buf.find(b"\n")
            if newline < 0:
                return None
            line = bytes(buf[:newline])
            kind = line.split(b" ", 1)[0].decode("utf-8", "replace")
            if kind in LEGACY_STATUS_KINDS:
                del buf[: newline + 1]
                if self._legacy_after_end:
                    # A reply ends with exactly one STAT line; text follows it.
                    self._legacy_expect_status = False
                    self._legacy_after_end = False
                return self._make(kind, line, None)
            self._legacy_expect_status = False
        at = buf.find(LEGACY_END)
        if at < 0:
            return None
        text = bytes(buf[:at])
        del buf[: at + len(LEGACY_END)]
        if buf[:1] == b"\n":
            del buf[:1]
        self._legacy_expect_status = True
        self._legacy_after_end = True
        return self._make("TEXT", b"TEXT", text)


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
