"""The line codec's grammar walker: one line of a known kind into typed values
(``parse_line``), or ``ProtocolViolation`` naming the field that breaks its grammar.

Two readings. The strict one (the default) is the spec's grammar to the letter: it is what the
conformance suite holds an engine to, number spellings included (``%.2f`` is two places).
The tolerant one (``strict=False``) is what a server reads an engine's output with: colibri's
other model families speak the same protocol with other C formats (DONE's tok/s as ``%.3f``,
logprobs as ``%.17g``) and append fields to a line (DONE's extra ints, ERROR's ``key=value``
context), and a server must serve any of them. So it takes a number in any spelling its
field's type allows (a fixed-point field any decimal, a logprob also exponents, nan and inf,
an integer field a sign and any digits, hex in either case), still checks every range, and
hands the fields after the grammar's last back in ``ParsedLine.extra`` instead of refusing the
line. Structure is never relaxed: a known kind with a field missing or of the wrong type is a
violation either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from colibri.protocol.spec import LineSpec, ProtocolSpec, ProtocolViolation, Value, load_spec

_INT_TYPES = frozenset({"u64", "uint", "int", "flag", "req_uint"})
_FLOAT_TYPES = frozenset({"fixed1", "fixed2", "fixed3", "fixed6", "logprob", "req_float"})
_HEX_TYPES = frozenset({"hex", "hextext"})
#: Tolerant spellings by type family: what a C printf of that kind of number can write. A
#: fixed-point field (``%.Nf``) is a decimal with any number of places; a logprob may also be
#: ``%g``-style, nan or inf (the legacy ``%.17g`` writers); an integer may carry a sign.
_TOLERANT = {
    "int": re.compile(r"[+-]?[0-9]+\Z"),
    "fixed": re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)\Z"),
    "logprob": re.compile(
        r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z"
        r"|(?i:[+-]?(?:nan|inf(?:inity)?))\Z"
    ),
}
_FIXED_TYPES = frozenset({"fixed1", "fixed2", "fixed3", "fixed6"})


@dataclass(frozen=True)
class ParsedLine:
    """A line that matched its kind's grammar."""

    kind: str
    values: Mapping[str, Value]
    spec: LineSpec
    #: Tolerant reading only: the fields after the grammar's last (empty when strict).
    extra: tuple[str, ...] = ()
    #: Every field outside a repeated group as it was written on the wire, by name: what a
    #: check of exact spellings compares (a strict reading's spelling is the spec's).
    spelled: Mapping[str, str] = field(default_factory=dict)

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


def eval_expr(expr: str, env: Mapping[str, Value]) -> int:
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
    def __init__(
        self, spec: ProtocolSpec, line: LineSpec, text: str, tokens: list[str], strict: bool
    ) -> None:
        self.spec = spec
        self.strict = strict
        self.line = line
        self.text = text
        self.tokens = tokens
        self.pos = 0
        self._patterns: dict[str, re.Pattern[str]] = {}
        self.spelled: dict[str, str] = {}
        self.read: dict[str, Value] = {}  # the line's fields outside repeated groups, so far
        self._depth = 0  # inside how many repeated groups

    def fail(self, message: str, name: str = "", token: str = "") -> ProtocolViolation:
        return ProtocolViolation(
            self.line.kind, message, self.text, field=name, token=token, values=dict(self.read)
        )

    def pattern(self, type_name: str) -> re.Pattern[str]:
        if not self.strict:
            if type_name in _INT_TYPES:
                return _TOLERANT["int"]
            if type_name in _FIXED_TYPES:
                return _TOLERANT["fixed"]
            if type_name == "logprob":
                return _TOLERANT["logprob"]
        if type_name not in self._patterns:
            flags = re.IGNORECASE if not self.strict and type_name in _HEX_TYPES else 0
            regex = f"(?:{self.spec.types[type_name]['regex']})\\Z"
            self._patterns[type_name] = re.compile(regex, flags)
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
            if not self._depth:
                self.spelled[name] = rest
            return rest
        if self.pos >= len(self.tokens):
            raise self.fail(f"missing field {name}", name)
        token = self.tokens[self.pos]
        if not self.pattern(type_name).match(token):
            raise self.fail(f"field {name}={token!r} is not a {type_name}", name, token)
        self.pos += 1
        if not self._depth:
            self.spelled[name] = token
        value: Value
        if type_name in _INT_TYPES:
            value = int(token)
        elif type_name in _FLOAT_TYPES:
            value = float(token)
        elif type_name in _HEX_TYPES:
            value = token.lower()
        else:
            value = token
        if isinstance(value, int):
            low, high = (
                item.get("min", self.spec.types[type_name].get("min")),
                item.get("max", self.spec.types[type_name].get("max")),
            )
            if isinstance(low, int) and value < low:
                raise self.fail(f"field {name}={value} is below {low}", name, token)
            if isinstance(high, int) and value > high:
                raise self.fail(f"field {name}={value} is above {high}", name, token)
        hex_bytes = item.get("hex_bytes")
        if hex_bytes is not None and isinstance(value, str):
            want = eval_expr(str(hex_bytes), env)
            if len(value) != 2 * want:
                raise self.fail(
                    f"field {name} has {len(value) // 2} bytes, expected {want}", name, token
                )
        if not self._depth:
            self.read[name] = value
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
            count = eval_expr(count_spec, env)
        else:
            count = count_spec
        entries: list[dict[str, Any]] = []
        self._depth += 1
        while self.matches(item) if count is None else len(entries) < count:
            sub: dict[str, Value] = {}
            self.items(item["fields"], sub)
            entries.append(sub)
        self._depth -= 1
        return entries


def parse_line(
    text: str | bytes,
    spec: ProtocolSpec | None = None,
    direction: str = "engine",
    *,
    strict: bool = True,
) -> ParsedLine | None:
    """Parse one line (without its LF). None for a kind protocol.json does not define.

    A known kind that violates its grammar raises ProtocolViolation: that is the protocol's
    forward-compatibility rule (unknown kinds are ignored, malformed known kinds are errors).
    ``strict=False`` is the tolerant reading of the module docstring.
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
    if strict and not entry.regex.match(text):
        raise ProtocolViolation(entry.kind, "does not match the line regex", text)
    tokens = text.split(" ")[1:]
    walker = _Walker(spec, entry, text, tokens, strict)
    values: dict[str, Value] = {}
    walker.items(entry.fields, values)
    extra = tuple(tokens[walker.pos :])
    if extra and strict:
        raise walker.fail(f"{len(extra)} unexpected trailing field(s)")
    return ParsedLine(entry.kind, values, entry, extra, walker.spelled)


def format_hex(data: bytes) -> str:
    """Lowercase hex, two characters per byte (EMAP, HITS, TOPK)."""
    return data.hex()
