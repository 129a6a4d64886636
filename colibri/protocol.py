"""Typed access to spec/protocol.json, the grammar of the engine wire protocols.

The server's engine client, the conformance suite and the reference engine's tests all read the
same data through this module: ``load_spec()`` gives every line kind with its compiled regex and
field grammar, ``parse_line()`` turns one line into typed values (or raises
``ProtocolViolation`` naming the field), and ``FrameReader`` reads whole frames, payloads
included, from an engine's stdout. spec/protocol.md is the prose behind every rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from colibri import resources

#: A parsed field value: numbers, text, or the entries of a repeated group.
Value = int | float | str | list[dict[str, Any]] | None

READY_LINE = b"\x01\x01READY\x01\x01\n"
END_LINE = b"\x01\x01END\x01\x01\n"

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
    regex: re.Pattern[str]
    fields: tuple[Mapping[str, Any], ...]
    payload: PayloadSpec | None
    exact: str | None
    description: str


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
        regex=re.compile(str(entry["regex"])),
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
    """Reads engine frames from a binary stream (an engine's stdout) by the spec's rules.

    ``read_preamble()`` consumes everything up to and including READY; afterwards each
    ``read_frame()`` returns one frame, reading a payload of exactly the announced length and
    checking its terminator. Returns None at EOF.
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

    def read_preamble(self) -> list[bytes]:
        """Lines before READY (free-form); raises EOFError if READY never comes."""
        lines: list[bytes] = []
        while True:
            line = self.stream.readline()
            if not line:
                raise EOFError("engine closed stdout before READY")
            if line == READY_LINE:
                return lines
            lines.append(line)

    def read_frame(self) -> Frame | None:
        line = self.stream.readline()
        if not line:
            return None
        if not line.endswith(b"\n"):
            raise ProtocolViolation("?", "line without LF at EOF", line.decode("latin-1"))
        parsed = parse_line(line[:-1], self.spec)
        if parsed is None:
            if self.on_unknown is not None:
                self.on_unknown(line)
            return Frame(line, None, None)
        payload = None
        if parsed.spec.payload is not None:
            n = parsed.payload_length
            payload = self.stream.read(n)
            if len(payload) != n:
                raise ProtocolViolation(parsed.kind, "truncated payload", line.decode("latin-1"))
            end = self.stream.read(1)
            if end != parsed.spec.payload.terminator:
                raise ProtocolViolation(parsed.kind, "bad payload terminator", repr(end))
        return Frame(line, parsed, payload)


def format_hex(data: bytes) -> str:
    """Lowercase hex, two characters per byte (EMAP, HITS, TOPK)."""
    return data.hex()
