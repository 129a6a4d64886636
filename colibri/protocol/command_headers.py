"""Which command headers carry a payload and how long it is, from spec/protocol.json.

A request kind with a ``payload`` entry (SUBMIT, the legacy PROMPT) is followed by as many
bytes as its length field says (plus its extra length field: SUBMIT's grammar), then the
terminator. Before reading them a reader must know the header can be framed at all, or a bad
count would swallow the commands after it: the header must match its kind's grammar, and its
fields must be in their ranges. Which ranges count differs by protocol, as the spec says:

- mux (spec/protocol.md 2.3 step 6): only the length fields'. The other values are checked
  after the frame is read, so the error can name the request's id (step 9);
- legacy (section 3): every field's, ``KV_SLOTS`` being the engine's slot count. A PROMPT has
  no id to answer on, and colibri refuses such a header before its payload, which is then
  read as command lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from colibri.protocol.lines import eval_expr
from colibri.protocol.spec import LineSpec, ProtocolSpec


@dataclass(frozen=True)
class CommandHeader:
    """A header that can be framed: its kind, its fields as the grammar's named groups
    matched them, and the bytes that follow it before the terminator."""

    kind: str
    fields: Mapping[str, bytes]
    payload_bytes: int


def _scalars(items: tuple[Mapping[str, Any], ...]) -> Iterator[Mapping[str, Any]]:
    for item in items:
        if "type" in item:
            yield item
        elif "optional" in item:
            yield from _scalars(tuple(item["optional"]))


def _in_range(item: Mapping[str, Any], text: bytes, kv_slots: int) -> bool:
    value: float = float(text) if item["type"] == "req_float" else int(text)
    if not math.isfinite(value):
        return False
    env = {"KV_SLOTS": kv_slots}
    low, high = item.get("min"), item.get("max")
    if isinstance(low, str):
        low = eval_expr(low, env)
    if isinstance(high, str):
        high = eval_expr(high, env)
    if low is not None and value < low:
        return False
    if high is not None and value > high:
        return False
    above = item.get("min_exclusive")
    return above is None or value > above


class HeaderFraming:
    """The framing rule of one protocol's commands (``mux`` or ``legacy``)."""

    def __init__(self, spec: ProtocolSpec, protocol: str, kv_slots: int) -> None:
        self.kv_slots = kv_slots
        self._lines: dict[str, tuple[LineSpec, re.Pattern[bytes], tuple[Mapping[str, Any], ...]]]
        self._lines = {}
        for kind, line in spec.request_lines.items():
            if line.payload is None or protocol not in line.protocols:
                continue
            lengths = {line.payload.length_field, line.payload.extra_length_field}
            checked = tuple(item for item in _scalars(line.fields)
                            if protocol == "legacy" or item["name"] in lengths)
            self._lines[kind] = (line, spec.request_pattern(kind), checked)

    def frame(self, kind: str, header: bytes) -> CommandHeader | None:
        """The header's framing, or None when it carries no payload or cannot be framed
        (then nothing after it is read as its payload)."""
        entry = self._lines.get(kind)
        if entry is None:
            return None
        line, pattern, checked = entry
        match = pattern.fullmatch(header)
        if match is None:
            return None
        fields = {name: value for name, value in match.groupdict().items() if value is not None}
        for item in checked:
            text = fields.get(str(item["name"]))
            if text is not None and not _in_range(item, text, self.kv_slots):
                return None
        assert line.payload is not None
        extra = line.payload.extra_length_field
        size = int(fields[line.payload.length_field]) + int(fields.get(extra or "", b"0"))
        return CommandHeader(kind, fields, size)
