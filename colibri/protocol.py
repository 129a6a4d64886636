"""The one reader of spec/protocol.json, the grammar of the engine wire protocols.

The engine, the server's engine client and the conformance suite all take the wire from this
module: ``load_spec()`` gives every line kind with its compiled regex and field grammar, the
limits, payload kinds, error codes, extensions and capability keys; ``parse_line()`` turns
one line into typed values (or raises ``ProtocolViolation`` naming the field);
``FrameParser`` is the one frame reader, an I/O-free parser (bytes in, frames out) that each
of them feeds from its own I/O (``FrameReader`` here does so from a blocking stream).
spec/protocol.md is the prose behind every rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import IO, Any, Protocol

from colibri import resources

#: A parsed field value: numbers, text, or the entries of a repeated group.
Value = int | float | str | list[dict[str, Any]] | None


_INT_TYPES = frozenset({"u64", "uint", "int", "flag", "req_uint"})
_FLOAT_TYPES = frozenset({"fixed1", "fixed2", "fixed3", "fixed6", "logprob", "req_float"})


class ProtocolViolation(ValueError):
    """A line of a known kind that does not match its grammar in spec/protocol.json."""

    def __init__(self, kind: str, message: str, line: str) -> None:
        super().__init__(f"{kind}: {message}: {line!r}")
        self.kind = kind
        self.line = line


@dataclass(frozen=True)
class PayloadSpec:
    """How many raw bytes follow a header line, and what must come after them."""

    length_field: str
    extra_length_field: str | None
    terminator: bytes
    lenient_terminator: bool


@dataclass(frozen=True)
class LineSpec:
    """One line kind of protocol.json."""

    kind: str
    direction: str  # "engine" (engine -> server) or "server" (server -> engine)
    protocols: tuple[str, ...]
    category: str
    tagged: bool
    source: str
    pattern: str
    fields: tuple[Mapping[str, Any], ...]
    payload: PayloadSpec | None
    exact: str | None
    description: str

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """The line regex, compiled on first use: every engine process loads the spec, and
        compiling all of its regexes was ~20 ms of each start-up for the few it matches."""
        return re.compile(self.pattern)


@dataclass(frozen=True)
class ErrorSpec:
    code: str
    args: tuple[str, ...]
    effect: str
    meaning: str


@dataclass(frozen=True)
class ExtensionSpec:
    key: str
    min: int
    max: int
    meaning: str


@dataclass(frozen=True)
class ProtocolSpec:
    """Everything in protocol.json, typed."""

    revision: int
    types: Mapping[str, Mapping[str, Any]]
    limits: Mapping[str, int]
    engine_lines: Mapping[str, LineSpec]
    request_lines: Mapping[str, LineSpec]
    errors: Mapping[str, ErrorSpec]
    extensions: Mapping[str, ExtensionSpec]
    capabilities: tuple[str, ...]
    validation_order: tuple[Mapping[str, Any], ...]
    mux: Mapping[str, Any]
    legacy: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False)

    def line(self, kind: str, direction: str = "engine") -> LineSpec:
        table = self.engine_lines if direction == "engine" else self.request_lines
        return table[kind]

    @property
    def payload_kinds(self) -> frozenset[str]:
        """Kinds followed by a byte-counted payload (DATA, ECHO)."""
        return frozenset(self.mux["payload_kinds"])

    @property
    def foreign_payload_kinds(self) -> frozenset[str]:
        """Payload kinds of colibri's other model families: consumed, then ignored."""
        return frozenset(self.mux.get("foreign_payload_kinds", ()))

    @property
    def framed_kinds(self) -> frozenset[str]:
        """Every kind a reader must read a payload for to stay in step."""
        return self.payload_kinds | self.foreign_payload_kinds

    @property
    def tagged_kinds(self) -> frozenset[str]:
        """Engine kinds whose first field is a request id (the foreign TOOL included)."""
        own = {k for k, line in self.engine_lines.items() if line.tagged}
        return frozenset(own) | frozenset(self.mux.get("foreign_tagged_kinds", ()))

    def request_pattern(self, kind: str) -> re.Pattern[bytes]:
        """A server-to-engine line's regex over bytes (match a line without its LF)."""
        return re.compile(self.request_lines[kind].regex.pattern.encode("ascii"))

    def sentinel(self, kind: str) -> bytes:
        """An exact engine line (READY, END) without its LF."""
        exact = self.engine_lines[kind].exact
        assert exact is not None, kind
        return exact.encode("latin-1")


@dataclass(frozen=True)
class ParsedLine:
    """A line that matched its kind's grammar."""

    kind: str
    values: Mapping[str, Value]
    spec: LineSpec

    @property
    def payload_length(self) -> int:
        """Bytes that follow the header line (0 for kinds without payload)."""
        if self.spec.payload is None:
            return 0
        total = self.values[self.spec.payload.length_field]
        extra_name = self.spec.payload.extra_length_field
        extra = self.values.get(extra_name) if extra_name else None
        assert isinstance(total, int)
        return total + (extra if isinstance(extra, int) else 0)

    def get_int(self, name: str) -> int:
        value = self.values[name]
        if not isinstance(value, int):
            raise TypeError(f"{self.kind}.{name} is not an integer: {value!r}")
        return value

    def get_float(self, name: str) -> float:
        value = self.values[name]
        if not isinstance(value, int | float):
            raise TypeError(f"{self.kind}.{name} is not a number: {value!r}")
        return float(value)


def _payload(entry: Mapping[str, Any]) -> PayloadSpec | None:
    raw = entry.get("payload")
    if raw is None:
        return None
    return PayloadSpec(
        length_field=str(raw["length_field"]),
        extra_length_field=raw.get("extra_length_field"),
        terminator=str(raw["terminator"]).encode("ascii"),
        lenient_terminator=bool(raw.get("lenient_terminator", False)),
    )


def _line_spec(entry: Mapping[str, Any]) -> LineSpec:
    return LineSpec(
        kind=str(entry["kind"]),
        direction=str(entry["direction"]),
        protocols=tuple(entry["protocols"]),
        category=str(entry["category"]),
        tagged=bool(entry["tagged"]),
        source=str(entry["source"]),
        pattern=str(entry["regex"]),
        fields=tuple(entry["fields"]),
        payload=_payload(entry),
        exact=entry.get("exact"),
        description=str(entry["description"]),
    )


def spec_from_dict(raw: Mapping[str, Any]) -> ProtocolSpec:
    """Build the typed view of an already-decoded protocol.json document."""
    engine: dict[str, LineSpec] = {}
    requests: dict[str, LineSpec] = {}
    for entry in raw["lines"]:
        spec = _line_spec(entry)
        (engine if spec.direction == "engine" else requests)[spec.kind] = spec
    return ProtocolSpec(
        revision=int(raw["revision"]),
        types=raw["types"],
        limits={k: int(v) for k, v in raw["limits"].items()},
        engine_lines=engine,
        request_lines=requests,
        errors={
            e["code"]: ErrorSpec(e["code"], tuple(e["args"]), e["effect"], e["meaning"])
            for e in raw["errors"]
        },
        extensions={
            e["key"]: ExtensionSpec(e["key"], int(e["min"]), int(e["max"]), e["meaning"])
            for e in raw["extensions"]
        },
        capabilities=tuple(c["key"] for c in raw["capabilities"]),
        validation_order=tuple(raw["validation_order"]),
        mux=raw["mux"],
        legacy=raw["legacy"],
        raw=raw,
    )


@lru_cache(maxsize=4)
def load_spec(path: Path | None = None) -> ProtocolSpec:
    """protocol.json from the installed spec data (or an explicit path)."""
    source = path if path is not None else resources.spec_path("protocol.json")
    return spec_from_dict(json.loads(source.read_text(encoding="utf-8")))


SPEC = load_spec()
#: The sentinels, with and without their LF (spec/protocol.json ``READY``/``END``).
READY = SPEC.sentinel("READY")
END = SPEC.sentinel("END")
READY_LINE = READY + b"\n"
END_LINE = END + b"\n"
#: The numbers of ``limits`` the readers and writers of the wire obey.
LIMITS: Mapping[str, int] = SPEC.limits


# --- the field-grammar walker -------------------------------------------------------------


def _eval_expr(expr: str, env: Mapping[str, Value]) -> int:
    """Evaluate the tiny integer expressions protocol.json uses ('rows*cols', '(a+7)/8')."""
    tokens = re.findall(r"[A-Za-z_]+|\d+|[()+\-*/]", expr)
    pos = 0

    def atom() -> int:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            value = sum_()
            pos += 1  # ")"
            return value
        if tok.isdigit():
            return int(tok)
        bound = env[tok]
        if not isinstance(bound, int):
            raise TypeError(f"{tok} is not an integer field")
        return bound

    def product() -> int:
        nonlocal pos
        value = atom()
        while pos < len(tokens) and tokens[pos] in "*/":
            op = tokens[pos]
            pos += 1
            rhs = atom()
            value = value * rhs if op == "*" else value // rhs
        return value

    def sum_() -> int:
        nonlocal pos
        value = product()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            rhs = product()
            value = value + rhs if op == "+" else value - rhs
        return value

    return sum_()


class _Walker:
    def __init__(self, spec: ProtocolSpec, line: LineSpec, text: str, tokens: list[str]) -> None:
        self.spec = spec
        self.line = line
        self.text = text
        self.tokens = tokens
        self.pos = 0
        self._patterns: dict[str, re.Pattern[str]] = {}

    def fail(self, message: str) -> ProtocolViolation:
        return ProtocolViolation(self.line.kind, message, self.text)

    def pattern(self, type_name: str) -> re.Pattern[str]:
        if type_name not in self._patterns:
            self._patterns[type_name] = re.compile(f"(?:{self.spec.types[type_name]['regex']})\\Z")
        return self._patterns[type_name]

    def matches(self, item: Mapping[str, Any]) -> bool:
        if self.pos >= len(self.tokens):
            return False
        if "literal" in item:
            return bool(self.tokens[self.pos] == item["literal"])
        if "type" in item:
            return self.pattern(item["type"]).match(self.tokens[self.pos]) is not None
        first = (item.get("optional") or item["fields"])[0]
        return self.matches(first)

    def scalar(self, item: Mapping[str, Any], env: dict[str, Value]) -> Value:
        name, type_name = str(item["name"]), str(item["type"])
        if type_name == "text":
            rest = " ".join(self.tokens[self.pos :])
            self.pos = len(self.tokens)
            return rest
        if self.pos >= len(self.tokens):
            raise self.fail(f"missing field {name}")
        token = self.tokens[self.pos]
        if not self.pattern(type_name).match(token):
            raise self.fail(f"field {name}={token!r} is not a {type_name}")
        self.pos += 1
        value: Value
        if type_name in _INT_TYPES:
            value = int(token)
        elif type_name in _FLOAT_TYPES:
            value = float(token)
        else:
            value = token
        if isinstance(value, int):
            low, high = (
                item.get("min", self.spec.types[type_name].get("min")),
                item.get("max", self.spec.types[type_name].get("max")),
            )
            if isinstance(low, int) and value < low:
                raise self.fail(f"field {name}={value} is below {low}")
            if isinstance(high, int) and value > high:
                raise self.fail(f"field {name}={value} is above {high}")
        hex_bytes = item.get("hex_bytes")
        if hex_bytes is not None and isinstance(value, str):
            want = _eval_expr(str(hex_bytes), env)
            if len(value) != 2 * want:
                raise self.fail(f"field {name} has {len(value) // 2} bytes, expected {want}")
        return value

    def items(self, items: Sequence[Mapping[str, Any]], env: dict[str, Value]) -> None:
        for item in items:
            if "literal" in item:
                if not self.matches(item):
                    raise self.fail(f"expected {item['literal']!r}")
                self.pos += 1
            elif "type" in item:
                env[str(item["name"])] = self.scalar(item, env)
            elif "optional" in item:
                if self.matches(item):
                    self.items(item["optional"], env)
            else:
                env[str(item["name"])] = self.repeat(item, env)

    def repeat(self, item: Mapping[str, Any], env: dict[str, Value]) -> Value:
        count_spec = item["repeat"]
        count: int | None
        if isinstance(count_spec, str):
            count = _eval_expr(count_spec, env)
        else:
            count = count_spec
        entries: list[dict[str, Any]] = []
        while self.matches(item) if count is None else len(entries) < count:
            sub: dict[str, Value] = {}
            self.items(item["fields"], sub)
            entries.append(sub)
        return entries


def parse_line(
    text: str | bytes,
    spec: ProtocolSpec | None = None,
    direction: str = "engine",
) -> ParsedLine | None:
    """Parse one line (without its LF). None for a kind protocol.json does not define.

    A known kind that violates its grammar raises ProtocolViolation: that is the protocol's
    forward-compatibility rule (unknown kinds are ignored, malformed known kinds are errors).
    """
    spec = spec or load_spec()
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="surrogateescape")
    text = text.removesuffix("\n")
    table = spec.engine_lines if direction == "engine" else spec.request_lines
    for line in table.values():
        if line.exact is not None and text == line.exact:
            return ParsedLine(line.kind, {}, line)
    head = text.split(" ", 1)[0]
    if head.startswith("\x02"):
        head = head[1:]
    entry = table.get(head)
    if entry is None or entry.exact is not None:
        return None
    if not entry.regex.match(text):
        raise ProtocolViolation(entry.kind, "does not match the line regex", text)
    tokens = text.split(" ")[1:]
    walker = _Walker(spec, entry, text, tokens)
    values: dict[str, Value] = {}
    walker.items(entry.fields, values)
    if walker.pos != len(tokens):
        raise walker.fail(f"{len(tokens) - walker.pos} unexpected trailing field(s)")
    return ParsedLine(entry.kind, values, entry)


# --- frames from a byte stream ------------------------------------------------------------

PREAMBLE = "PREAMBLE"
BROKEN = "BROKEN"
#: A header line longer than this is a framing error, not something to buffer forever.
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class WireFrame:
    """One unit of engine output, as ``FrameParser`` splits it.

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
    #: Commands only: the framing rule's parse of the header (None without a payload).
    framed: Framed | None = None

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

class Framed(Protocol):
    """What a command parser's framing rule made of a header that carries a payload: the
    engine's own parse of it (a SUBMIT's fields, a PROMPT's), handed back with the frame."""

    @property
    def payload_bytes(self) -> int:
        """Bytes after the header line, before the terminator."""
        ...


#: The engine's framing rule: a header line that carries a payload -> its parse, else None.
#: The engine decides, since only it knows every check that comes before draining (its slot
#: count, the byte limits).
Framing = Callable[[bytes], Framed | None]


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
    OVERLONG and drained to its LF. Where ``framing`` parses the header, its
    ``payload_bytes`` and the kind's terminator follow, and the frame carries the parse: a
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
    framing: Framing | None = None
    line_limit: int = MAX_LINE_BYTES
    # Command direction: where the LF search resumes, whether an overlong line is being
    # drained, and a header whose payload is still arriving (header, kind, size, lenient).
    _scanned: int = 0
    _draining: bool = False
    _pending: tuple[bytes, str, Framed, bool] | None = None

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
        cls, framing: Framing, line_limit: int, spec: ProtocolSpec | None = None
    ) -> FrameParser:
        """A parser of the server-to-engine direction (commands have no READY)."""
        return cls(seen_ready=True, spec=spec or SPEC, framing=framing, line_limit=line_limit)

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
        framed: Framed | None = None,
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
        framed = self.framing(header)
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


@dataclass(frozen=True)
class Frame:
    """One engine output frame: the header line, its parse (None if unknown) and payload."""

    line: bytes
    parsed: ParsedLine | None
    payload: bytes | None

    @property
    def kind(self) -> str:
        if self.parsed is not None:
            return self.parsed.kind
        return self.line.split(b" ", 1)[0].decode("ascii", errors="replace")


class FrameReader:
    """``FrameParser`` fed from a blocking binary stream (an engine's stdout), with every
    known line parsed by its grammar.

    ``read_preamble()`` consumes everything up to and including READY; afterwards each
    ``read_frame()`` returns one frame. Returns None at EOF; broken framing raises
    ``ProtocolViolation``.
    """

    def __init__(
        self,
        stream: IO[bytes],
        spec: ProtocolSpec | None = None,
        on_unknown: Callable[[bytes], None] | None = None,
    ) -> None:
        self.stream = stream
        self.spec = spec or load_spec()
        self.on_unknown = on_unknown
        # A stream read without read_preamble() is already past READY.
        self._parser = FrameParser(seen_ready=True, spec=self.spec)
        self._ready: list[WireFrame] = []
        self._eof = False

    def _next(self) -> WireFrame | None:
        while not self._ready:
            if self._eof:
                return None
            # readline never blocks past the bytes a frame needs (payloads end in LF too).
            chunk = self.stream.readline()
            if chunk:
                self._ready += self._parser.feed(chunk)
            else:
                self._eof = True
                self._ready += self._parser.finish()
        return self._ready.pop(0)

    def read_preamble(self) -> list[bytes]:
        """Lines before READY (free-form); raises EOFError if READY never comes."""
        lines: list[bytes] = []
        self._parser.seen_ready = False
        while (frame := self._next()) is not None:
            if frame.kind == "READY":
                return lines
            lines.append(frame.header + b"\n")
        raise EOFError("engine closed stdout before READY")

    def read_frame(self) -> Frame | None:
        frame = self._next()
        if frame is None:
            return None
        line = frame.header + b"\n"
        if frame.kind == BROKEN:
            raise ProtocolViolation("?", frame.problem, frame.header.decode("latin-1"))
        parsed = parse_line(frame.header, self.spec)
        if parsed is None:
            if self.on_unknown is not None:
                self.on_unknown(line)
            return Frame(line, None, frame.payload)
        return Frame(line, parsed, frame.payload)


def format_hex(data: bytes) -> str:
    """Lowercase hex, two characters per byte (EMAP, HITS, TOPK)."""
    return data.hex()
