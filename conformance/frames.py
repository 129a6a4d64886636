"""The suite's names for the wire's frames: ``Frame`` is ``colibri.protocol.WireFrame``,
``FrameSplitter`` is ``colibri.protocol.FrameParser`` (an engine's stdout is read by
``colibri.protocol.FrameReader``); kinds, sentinels and limits come from spec/protocol.json.

A check reads a frame's fields through the codec (:func:`line`, :func:`read`): strictly where
it compares spellings, otherwise as a server reads an engine (any spelling a number's type
allows), since the grammar expectation is what holds every line to the spec's spellings.
Fields past the grammar's last are a violation either way: a check relates exactly the fields
of its frame's kind.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeVar

from colibri.protocol import (
    BROKEN,
    END,
    LIMITS,
    PREAMBLE,
    READY,
    SPEC,
    ParsedLine,
    ProtocolViolation,
    parse_line,
)
from colibri.protocol import FrameParser as FrameSplitter
from colibri.protocol import WireFrame as Frame
from colibri.protocol.records import Record

R = TypeVar("R", bound=Record)

LEGACY_END = END

#: Kinds whose header is followed by a byte-counted payload (size in field 2).
PAYLOAD_KINDS: frozenset[str] = SPEC.framed_kinds

#: Kinds whose field 1 is a request id.
TAGGED_KINDS: frozenset[str] = SPEC.tagged_kinds

#: A payload bigger than the spec's frame limit is a framing error rather than read: a
#: garbage count must not hang the reader.
MAX_PAYLOAD = LIMITS["max_frame_payload_bytes"]

#: Lines the legacy protocol prints outside answer text.
LEGACY_STATUS_KINDS: frozenset[str] = frozenset(SPEC.legacy["status_kinds"])

__all__ = [
    "BROKEN", "LEGACY_END", "LEGACY_STATUS_KINDS", "MAX_PAYLOAD", "PAYLOAD_KINDS", "PREAMBLE",
    "READY", "TAGGED_KINDS", "Frame", "FrameSplitter", "line", "read",
]


@lru_cache(maxsize=4096)
def _line(header: bytes, strict: bool) -> ParsedLine | None:
    parsed = parse_line(header, strict=strict)
    if parsed is not None and parsed.extra:
        text = header.decode("utf-8", "replace")
        raise ProtocolViolation(parsed.kind, f"{len(parsed.extra)} unexpected trailing field(s)",
                                text, values=parsed.values)
    return parsed


def line(frame: Frame, *, strict: bool = False) -> ParsedLine | None:
    """The frame's header by its kind's grammar (None for a kind protocol.json does not
    define); ``ProtocolViolation`` when it breaks it."""
    return _line(frame.header, strict)


def read(frame: Frame, kind: type[R], *, strict: bool = False) -> R:
    """The frame as the codec's record of ``kind``; ``ProtocolViolation`` when it is not
    one."""
    parsed = line(frame, strict=strict)
    text = frame.header.decode("utf-8", "replace")
    if parsed is None or parsed.kind != kind.KIND:
        raise ProtocolViolation(kind.KIND, "not a line of this kind", text)
    return kind.from_line(parsed, text, frame.payload)
