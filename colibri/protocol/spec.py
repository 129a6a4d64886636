"""spec/protocol.json, typed: every line kind with its regex and field grammar, the limits,
payload kinds, error codes, extensions and capability keys (``load_spec``, ``SPEC``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from colibri import resources

#: A parsed field value: numbers, text, or the entries of a repeated group.
Value = int | float | str | list[dict[str, Any]] | None


class ProtocolViolation(ValueError):
    """A line of a known kind that does not match its grammar in spec/protocol.json.

    Where the grammar walker found it, ``field`` names the field that broke (``token`` is
    what stood there, empty when it was missing) and ``values`` holds the line's fields read
    before it: a check can then say how a line disagrees with the dimensions it declares.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        line: str,
        *,
        field: str = "",
        token: str = "",
        values: Mapping[str, Value] | None = None,
    ) -> None:
        super().__init__(f"{kind}: {message}: {line!r}")
        self.kind = kind
        self.line = line
        self.field = field
        self.token = token
        self.values: Mapping[str, Value] = values or {}


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
