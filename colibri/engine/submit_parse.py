"""Parsing and validating mux commands (spec/protocol.md 2.2 and 2.3).

The grammar, the limits and the extension ranges are spec/protocol.json's, read through
``colibri.protocol``. A SUBMIT is handled in two stages because the engine must know the
frame's length before it can answer with the request's id: the command parser frames the
header from the spec (its grammar and the two byte limits) and reads payload, grammar and
terminator; ``submit_frame`` takes the framed header, and ``validate_submit`` checks every
value and yields a ``Submission`` (the engine's checked request) or the error code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from colibri.protocol import LIMITS, SPEC, CommandHeader

MAX_PAYLOAD = LIMITS["max_payload_bytes"]
MAX_GRAMMAR = LIMITS["max_grammar_bytes"]
MAX_HEADER = LIMITS["max_header_bytes"]
MAX_LOGPROBS = LIMITS["max_logprobs"]
U64_MAX = (1 << 64) - 1
I32_MAX = (1 << 31) - 1

_STOP = SPEC.request_pattern("STOP")
_CANCEL = SPEC.request_pattern("CANCEL")

#: Extension key -> inclusive (min, max).
EXTENSION_RANGES: dict[str, tuple[int, int]] = {
    key: (ext.min, ext.max) for key, ext in SPEC.extensions.items()
}


@dataclass(frozen=True)
class SubmitFrame:
    """A SUBMIT header whose shape is valid: enough to read the rest of the frame."""

    rid: int  # 0 when the id is 0 or does not fit 64 bits (errors are then reported as id 0)
    fields: dict[str, bytes]
    nbytes: int
    gbytes: int


@dataclass(frozen=True)
class Submission:
    rid: int
    slot: int
    max_tokens: int
    temperature: float
    top_p: float
    logprobs: int
    ids: bool
    seed: int | None
    payload: bytes
    grammar: bytes
    #: Payload byte where ECHO scoring starts (0: every position, the cached prefix dropped).
    echo_at: int = 0


@dataclass(frozen=True)
class Control:
    verb: Literal["STOP", "CANCEL"]
    rid: int


def parse_control(line: bytes) -> Control | Literal["bad"] | None:
    """STOP/CANCEL: a Control, 'bad' if malformed (ERROR 0 BAD_REQUEST), None if not one."""
    if not (line.startswith(b"STOP ") or line.startswith(b"CANCEL ")):
        return None
    verb: Literal["STOP", "CANCEL"] = "STOP" if line.startswith(b"STOP ") else "CANCEL"
    match = (_STOP if verb == "STOP" else _CANCEL).fullmatch(line)
    if match is None:
        return "bad"
    rid = int(match.group("id"))
    if not 1 <= rid <= U64_MAX:
        return "bad"
    return Control(verb, rid)


def submit_frame(header: CommandHeader | None) -> SubmitFrame | None:
    """A SUBMIT header as the command parser framed it; None for anything else (a line that
    is not a SUBMIT that can be framed: ERROR 0, nothing drained)."""
    if header is None or header.kind != "SUBMIT":
        return None
    fields = dict(header.fields)
    rid = int(fields["id"])
    nbytes = int(fields["bytes"])
    return SubmitFrame(rid if rid <= U64_MAX else 0, fields, nbytes, header.payload_bytes - nbytes)


def _extensions(raw: bytes) -> dict[str, int] | None:
    found: dict[str, int] = {}
    for token in raw.split():
        key_b, _, value_b = token.partition(b"=")
        key = key_b.decode("ascii")
        if key not in EXTENSION_RANGES or key in found:
            return None
        value = int(value_b)
        low, high = EXTENSION_RANGES[key]
        if not low <= value <= high:
            return None
        found[key] = value
    return found


def sampling_in_range(temperature: float, top_p: float) -> bool:
    """temperature in [0, 2] and top_p in (0, 1], both finite (SUBMIT and legacy PROMPT)."""
    return (
        math.isfinite(temperature)
        and 0.0 <= temperature <= 2.0
        and math.isfinite(top_p)
        and 0.0 < top_p <= 1.0
    )


def validate_submit(
    frame: SubmitFrame, payload: bytes, grammar: bytes, kv_slots: int
) -> Submission | None:
    """Step 9 of the validation order: None means ERROR <id> BAD_REQUEST."""
    fields = frame.fields
    if frame.rid == 0:
        return None
    slot = int(fields["slot"])
    max_tokens = int(fields["max_tokens"])
    temperature = float(fields["temperature"])
    top_p = float(fields["top_p"])
    if slot >= kv_slots or max_tokens > I32_MAX:
        return None
    if not sampling_in_range(temperature, top_p):
        return None
    extensions = _extensions(fields.get("extensions", b""))
    if extensions is None:
        return None
    logprobs = extensions.get("logprobs", 0)
    if max_tokens == 0 and logprobs == 0:
        return None
    echo_at = extensions.get("echo_at", 0)
    if echo_at and (logprobs == 0 or extensions.get("ids", 0)):
        return None
    if b"\0" in payload or b"\0" in grammar:
        return None
    return Submission(
        rid=frame.rid,
        slot=slot,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        logprobs=logprobs,
        ids=bool(extensions.get("ids", 0)),
        seed=extensions.get("seed"),
        payload=payload,
        grammar=grammar,
        echo_at=echo_at,
    )


def parse_id_payload(payload: bytes, vocab: int) -> list[int] | None:
    """An ids=1 payload: decimal ids separated by bytes <= 0x20; None if malformed."""
    ids: list[int] = []
    for token in re.split(rb"[\x00-\x20]+", payload):
        if not token:
            continue
        if not token.isdigit() or len(token) > 10:
            return None
        value = int(token)
        if value >= vocab:
            return None
        ids.append(value)
    return ids
