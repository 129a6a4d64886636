"""The one wire codec of the engine protocols, read from spec/protocol.json.

The engine, the server's engine client and the conformance suite all take the wire from this
package, split by job:

- ``spec``: ``load_spec()``/``SPEC``, every line kind with its compiled regex and field
  grammar, the limits, payload kinds, error codes, extensions and capability keys;
- ``lines``: ``parse_line()``, one line into typed values (or ``ProtocolViolation`` naming
  the field);
- ``records``: every frame kind as one typed record with ``line``/``encode`` and ``decode``
  (the only place a wire keyword is written or a number spelled for the wire);
- ``framing``: ``WireFrame``, the one frame type, and ``FrameParser``, the I/O-free frame
  splitter (bytes in, frames out) of either direction;
- ``reader``: ``FrameReader``, the one reader that feeds the parser from a ``Source`` (the
  engine's stdin, a script, a child's stdout drained by ``StreamSource``) with readiness
  and deadlines;
- ``command_headers``: which command headers carry a payload and how long it is (the
  framing rule the parser takes from the spec for the engine's side).

spec/protocol.md is the prose behind every rule.
"""

from colibri.protocol.command_headers import CommandHeader
from colibri.protocol.framing import (
    BROKEN,
    LINE,
    MAX_LINE_BYTES,
    OVERLONG,
    PREAMBLE,
    TRUNCATED,
    FrameParser,
    WireFrame,
)
from colibri.protocol.lines import ParsedLine, format_hex, parse_line
from colibri.protocol.reader import FrameReader, Source, StreamSource
from colibri.protocol.records import SubmitRequest
from colibri.protocol.spec import (
    END,
    END_LINE,
    LIMITS,
    READY,
    READY_LINE,
    SPEC,
    ErrorSpec,
    ExtensionSpec,
    LineSpec,
    PayloadSpec,
    ProtocolSpec,
    ProtocolViolation,
    Value,
    load_spec,
    spec_from_dict,
)

__all__ = [
    "BROKEN", "END", "END_LINE", "LIMITS", "LINE", "MAX_LINE_BYTES", "OVERLONG", "PREAMBLE",
    "READY", "READY_LINE", "SPEC", "TRUNCATED", "CommandHeader", "ErrorSpec", "ExtensionSpec",
    "FrameParser", "FrameReader", "LineSpec", "ParsedLine", "PayloadSpec", "ProtocolSpec",
    "ProtocolViolation", "Source", "StreamSource", "SubmitRequest", "Value", "WireFrame",
    "format_hex", "load_spec", "parse_line", "spec_from_dict",
]
