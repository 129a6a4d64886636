"""Framing: bytes of either direction into frames (``WireFrame``), I/O-free
(``FrameParser``); ``colibri.protocol.reader`` feeds it from a stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from colibri.protocol.command_headers import CommandHeader, HeaderFraming
from colibri.protocol.lines import ParsedLine
from colibri.protocol.records import Record, decode
from colibri.protocol.spec import SPEC, ProtocolSpec

# --- frames from a byte stream ------------------------------------------------------------

PREAMBLE = "PREAMBLE"
BROKEN = "BROKEN"
#: A header line longer than this is a framing error, not something to buffer forever.
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class WireFrame:
    """One frame of either direction, as ``FrameParser`` splits it.

    ``kind`` is the first word of the header (``PREAMBLE`` for lines before READY, ``READY``
    for the sentinel, ``TEXT`` for a legacy answer, ``BROKEN`` when the bytes violate the
    framing, with ``problem`` saying how). ``header`` is the header line without its LF;
    ``payload`` is present for payload-framed kinds (and legacy text).
    """

    index: int
    kind: str
    header: bytes
    payload: bytes | None = None
    problem: str = ""
    #: Commands only: the header's framing (None for a header without a payload).
    framed: CommandHeader | None = None
    #: The header parsed by its grammar, where a reader parsed it (``FrameReader.read_frame``);
    #: None for a kind protocol.json does not define.
    parsed: ParsedLine | None = None

    @property
    def line(self) -> bytes:
        """The header line with its LF."""
        return self.header + b"\n"

    def record(self, direction: str = "engine", *, strict: bool = True) -> Record | None:
        """The frame as its codec record (``colibri.protocol.records.decode``): None for a
        kind protocol.json does not define, ``ProtocolViolation`` for a malformed one."""
        return decode(self.header, self.payload, direction, strict=strict)

    @property
    def fields(self) -> list[str]:
        return self.header.decode("utf-8", "replace").split(" ")

    @property
    def request_id(self) -> int | None:
        if self.kind not in SPEC.tagged_kinds:
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


#: Command-direction kinds (what an engine reads; spec/protocol.md 2.3): a line that names no
#: request kind (legacy chat text, garbage), a line over the limit (drained to its LF), and
#: EOF inside a payload or before its strict terminator.
LINE = "LINE"
OVERLONG = "OVERLONG"
TRUNCATED = "TRUNCATED"

@dataclass
class FrameParser:
    """The one frame reader of the wire: incremental and I/O-free. ``feed`` bytes as they
    arrive (any split), take the frames they complete; ``finish`` at EOF.

    Engine output (the default): before READY every line is PREAMBLE. In mux mode a line is
    one frame, except the payload-framed kinds (``framed_kinds``: byte count at field 2, that
    many raw bytes, LF); a count that is not a number or exceeds
    ``limits.max_frame_payload_bytes``, or a payload not followed by LF, is BROKEN. In legacy
    mode an answer is the raw text up to END (``TEXT``), status lines are read only right
    after READY or END.

    Commands (:meth:`for_commands`, what an engine reads): a line of at most ``line_limit``
    bytes is one frame, its kind the request kind it names (``LINE`` if none); a longer one is
    OVERLONG and drained to its LF. Where the spec frames the header (``HeaderFraming``), its
    ``payload_bytes`` and the kind's terminator follow, and the frame carries the framing: a
    wrong terminator is BROKEN (a lenient one, the legacy PROMPT's, is left as the next
    line's first byte); EOF before them is TRUNCATED. A last line without LF still counts
    as a line.
    """

    legacy: bool = False
    seen_ready: bool = False
    spec: ProtocolSpec = field(default_factory=lambda: SPEC)
    _buffer: bytearray = field(default_factory=bytearray)
    _count: int = 0
    _legacy_expect_status: bool = True
    _legacy_after_end: bool = False
    framing: HeaderFraming | None = None
    line_limit: int = MAX_LINE_BYTES
    # Command direction: where the LF search resumes, whether an overlong line is being
    # drained, and a header whose payload is still arriving (header, kind, size, lenient).
    _scanned: int = 0
    _draining: bool = False
    _pending: tuple[bytes, str, CommandHeader, bool] | None = None

    def __post_init__(self) -> None:
        self._framed = self.spec.framed_kinds
        self._max_payload = self.spec.limits["max_frame_payload_bytes"]
        self._status = frozenset(self.spec.legacy.get("status_kinds", ("STAT", "TIERS")))
        self._ready = self.spec.sentinel("READY")
        self._end = self.spec.sentinel("END")
        # Commands: the request kinds by their first word, and those whose terminator is lenient.
        self._request_kinds = {k.encode("ascii"): k for k in self.spec.request_lines}
        self._lenient = frozenset(
            k for k, line in self.spec.request_lines.items()
            if line.payload is not None and line.payload.lenient_terminator
        )

    @classmethod
    def for_commands(
        cls, protocol: str, line_limit: int, kv_slots: int, spec: ProtocolSpec | None = None
    ) -> FrameParser:
        """A parser of the server-to-engine direction of ``protocol`` (``mux`` or
        ``legacy``) for an engine with ``kv_slots`` slots (commands have no READY)."""
        spec = spec or SPEC
        framing = HeaderFraming(spec, protocol, kv_slots)
        return cls(seen_ready=True, spec=spec, framing=framing, line_limit=line_limit)

    def feed(self, data: bytes) -> list[WireFrame]:
        """``push`` the bytes, then every frame they complete."""
        self.push(data)
        out: list[WireFrame] = []
        while (frame := self.take()) is not None:
            out.append(frame)
        return out

    def push(self, data: bytes) -> None:
        """Add bytes without taking frames: a reader that handles one frame at a time then
        ``take``s them as it goes, so a long stream is not held as frames all at once."""
        self._buffer.extend(data)

    def take(self) -> WireFrame | None:
        """The next frame the pushed bytes complete, or None until more bytes come."""
        return self._take() if self.framing is None else self._take_command()

    def finish(self) -> list[WireFrame]:
        """Whatever is left at EOF: in engine output one BROKEN frame (a truncated line or
        payload); in commands the last line without its LF, or TRUNCATED."""
        if self.framing is not None:
            return self._finish_commands()
        if not self._buffer:
            return []
        rest = bytes(self._buffer)
        self._buffer.clear()
        return [self._make(BROKEN, rest, None, "stream ended inside a frame")]

    def _make(
        self,
        kind: str,
        header: bytes,
        payload: bytes | None,
        problem: str = "",
        framed: CommandHeader | None = None,
    ) -> WireFrame:
        frame = WireFrame(self._count, kind, header, payload, problem, framed)
        self._count += 1
        return frame

    def _peek(self) -> tuple[int, bytes, str] | None:
        """(where its LF is, the next whole line, its kind) without taking it; None until
        a whole line is there."""
        newline = self._buffer.find(b"\n")
        if newline < 0:
            return None
        line = bytes(self._buffer[:newline])
        return newline, line, line.split(b" ", 1)[0].decode("utf-8", "replace")

    def _line(self) -> bytes | None:
        """The next whole line (LF removed), taken; None until one is there."""
        peeked = self._peek()
        if peeked is None:
            return None
        del self._buffer[: peeked[0] + 1]
        return peeked[1]

    def _take(self) -> WireFrame | None:
        buf = self._buffer
        if buf.find(b"\n", 0, MAX_LINE_BYTES + 1) < 0 and len(buf) > MAX_LINE_BYTES:
            if not (self.legacy and self.seen_ready and not self._legacy_expect_status):
                head = bytes(buf[:64])
                buf.clear()
                return self._make(BROKEN, head, None, f"line longer than {MAX_LINE_BYTES} bytes")
        if not self.seen_ready:
            # READY may not be at a line start in a sloppy engine; the gateway scans bytes.
            line = self._line()
            if line is None:
                return None
            if line == self._ready:
                self.seen_ready = True
                return self._make("READY", line, None)
            if self._ready in line:
                self.seen_ready = True
                return self._make("READY", line, None, "READY sentinel not alone on its line")
            return self._make(PREAMBLE, line, None)
        if self.legacy:
            return self._take_legacy()
        peeked = self._peek()
        if peeked is None:
            return None
        newline, line, kind = peeked
        if kind in self._framed:
            parts = line.split(b" ")
            if len(parts) < 3 or not parts[2].isdigit() or int(parts[2]) > self._max_payload:
                del buf[: newline + 1]
                return self._make(BROKEN, line, None, f"{kind} header without a valid byte count")
            end = newline + 1 + int(parts[2])
            if len(buf) < end + 1:
                return None
            payload = bytes(buf[newline + 1 : end])
            terminator = buf[end]
            del buf[: end + 1]
            if terminator != 0x0A:
                problem = f"{kind} payload not followed by LF (got {terminator:#04x})"
                return self._make(BROKEN, line, payload, problem)
            return self._make(kind, line, payload)
        del buf[: newline + 1]
        return self._make(kind, line, None)

    # --- the command direction ---------------------------------------------------------

    def _take_command(self) -> WireFrame | None:
        buf = self._buffer
        if self._pending is not None:
            return self._take_payload(at_eof=False)
        if self._draining:
            newline = buf.find(b"\n")
            if newline < 0:
                buf.clear()
                return None
            del buf[: newline + 1]
            self._draining = False
        newline = buf.find(b"\n", self._scanned)
        if newline < 0:
            if len(buf) <= self.line_limit:
                self._scanned = len(buf)  # a long line arriving in pieces is scanned once
                return None
            head = bytes(buf[:64])
            buf.clear()
            self._scanned = 0
            self._draining = True
            return self._make(OVERLONG, head, None, f"line longer than {self.line_limit} bytes")
        self._scanned = 0
        if newline > self.line_limit:
            head = bytes(buf[:64])
            del buf[: newline + 1]
            return self._make(OVERLONG, head, None, f"line longer than {self.line_limit} bytes")
        header = bytes(buf[:newline])
        del buf[: newline + 1]
        return self._command(header)

    def _command(self, header: bytes) -> WireFrame | None:
        """The frame of a complete header line, or None while its payload is still due."""
        space = header.find(b" ")
        word = (header if space < 0 else header[:space]).removeprefix(b"\x02")
        kind = self._request_kinds.get(word, LINE)
        assert self.framing is not None
        framed = self.framing.frame(kind, header)
        if framed is None:
            return self._make(kind, header, None)
        self._pending = (header, kind, framed, kind in self._lenient)
        return self._take_payload(at_eof=False)

    def _take_payload(self, *, at_eof: bool) -> WireFrame | None:
        assert self._pending is not None
        header, kind, framed, lenient = self._pending
        size = framed.payload_bytes
        buf = self._buffer
        if len(buf) <= size:
            if not at_eof:
                return None  # even a lenient terminator is looked at before the frame is done
            self._pending = None
            if lenient and len(buf) == size:
                payload = bytes(buf)
                buf.clear()
                return self._make(kind, header, payload, framed=framed)
            buf.clear()
            return self._make(TRUNCATED, header, None, "stream ended inside a payload", framed)
        self._pending = None
        payload = bytes(buf[:size])
        terminator = buf[size]
        if terminator == 0x0A:
            del buf[: size + 1]
            return self._make(kind, header, payload, framed=framed)
        if lenient:
            del buf[:size]
            return self._make(kind, header, payload, framed=framed)
        del buf[: size + 1]
        problem = f"{kind} payload not followed by LF (got {terminator:#04x})"
        return self._make(BROKEN, header, payload, problem, framed)

    def _finish_commands(self) -> list[WireFrame]:
        buf = self._buffer
        out: list[WireFrame] = []
        if self._draining:
            buf.clear()
            self._draining = False
        elif self._pending is None and buf:
            header = bytes(buf)
            buf.clear()
            self._scanned = 0
            frame = self._command(header)
            if frame is not None:
                out.append(frame)
        if self._pending is not None:
            last = self._take_payload(at_eof=True)
            assert last is not None
            out.append(last)
        return out

    def _take_legacy(self) -> WireFrame | None:
        buf = self._buffer
        if self._legacy_expect_status:
            peeked = self._peek()
            if peeked is None:
                return None
            newline, line, kind = peeked
            if kind in self._status:
                del buf[: newline + 1]
                if self._legacy_after_end:
                    # A reply ends with exactly one STAT line; text follows it.
                    self._legacy_expect_status = False
                    self._legacy_after_end = False
                return self._make(kind, line, None)
            self._legacy_expect_status = False
        at = buf.find(self._end)
        if at < 0:
            return None
        text = bytes(buf[:at])
        del buf[: at + len(self._end)]
        if buf[:1] == b"\n":
            del buf[:1]
        self._legacy_expect_status = True
        self._legacy_after_end = True
        return self._make("TEXT", b"TEXT", text)
