"""The engine's SUBMIT/STOP/CANCEL parsers accept exactly what spec/protocol.json's grammar
accepts (within its byte limits)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from colibri.engine.submit_parse import (
    MAX_GRAMMAR,
    MAX_PAYLOAD,
    Control,
    SubmitFrame,
    parse_control,
    submit_frame,
)
from colibri.protocol import ProtocolViolation, load_spec, parse_line
from colibri.protocol.command_headers import HeaderFraming


def frame_submit(line: bytes) -> SubmitFrame | None:
    """The mux command parser's framing of one SUBMIT header, as the engine takes it."""
    return submit_frame(HeaderFraming(load_spec(), "mux", kv_slots=1).frame("SUBMIT", line))

_TOKENS = st.sampled_from(
    [
        "0",
        "1",
        "7",
        "00",
        "16777216",
        "16777217",
        "1048577",
        "0.7",
        ".5",
        "1e-3",
        "2.",
        "+1",
        "-0",
        "nan",
        "inf",
        "x",
        "",
        "logprobs=2",
        "ids=1",
        "seed=99",
        "LOG=1",
        "a=b",
        "=1",
        "k=",
        "abcdefghijklmnop=1",
        "18446744073709551615",
        "99999999999999999999",
        "1 ",
    ]
)


@given(st.lists(_TOKENS, min_size=0, max_size=10))
@example(["0", "0", "0", "0", "0", "0"])
def test_submit_framing_agrees_with_protocol_json(fields: list[str]) -> None:
    # Framing depends only on the line's shape and the size limits (spec/protocol.md §2.4):
    # a header whose values are out of range (id 0, a bad temperature) is still framed, its
    # payload drained, and then answered with an ERROR. So the engine frames a SUBMIT exactly
    # when protocol.json's regex matches and the payload and grammar fit their limits.
    line = "SUBMIT " + " ".join(fields)
    match = load_spec().request_lines["SUBMIT"].regex.match(line)
    framed = frame_submit(line.encode())
    if match is None:
        assert framed is None
        with pytest.raises(ProtocolViolation):
            parse_line(line, direction="server")
        return
    nbytes = int(match["bytes"])
    within = nbytes <= MAX_PAYLOAD and int(match["gbytes"] or 0) <= MAX_GRAMMAR
    assert (framed is not None) == within
    if framed is not None:
        assert framed.nbytes == nbytes
    try:
        parse_line(line, direction="server")
    except ProtocolViolation:
        return
    assert framed is not None, "a header protocol.json fully accepts must be framed"


@given(st.sampled_from(["STOP", "CANCEL"]), st.lists(_TOKENS, max_size=3))
def test_control_lines_agree_with_protocol_json(verb: str, fields: list[str]) -> None:
    line = " ".join([verb, *fields])
    spec = load_spec()
    matches = spec.request_lines[verb].regex.match(line) is not None
    result = parse_control(line.encode())
    if matches and 1 <= int(fields[0]) < 2**64:
        assert result == Control(verb, int(fields[0]))  # type: ignore[arg-type]
    elif line.startswith(verb + " "):
        assert result == "bad"
    else:
        assert result is None
