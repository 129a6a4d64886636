"""The one frame reader: readiness and deadlines over any source, and what a violation says
about where a line broke."""

from __future__ import annotations

import os

import pytest

from colibri.protocol import READY_LINE, FrameParser, FrameReader, ProtocolViolation, parse_line


def test_a_pipe_reader_waits_with_a_deadline_and_sees_eof() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb", buffering=0) as stream:
        reader = FrameReader(stream, FrameParser())
        assert not reader.ready(0.0)
        with pytest.raises(TimeoutError):
            reader.next(0.05)
        os.write(write_fd, READY_LINE + b"ACCEPT 1 2\nDATA 1 2\nab")
        assert reader.next(5.0) is not None  # READY
        accept = reader.next(5.0)
        assert accept is not None and accept.kind == "ACCEPT"
        with pytest.raises(TimeoutError):
            reader.next(0.05)  # the payload's terminator has not come
        os.write(write_fd, b"\n")
        os.close(write_fd)
        data = reader.next(5.0)
        assert data is not None and data.payload == b"ab" and data.line == b"DATA 1 2\n"
        assert reader.next(5.0) is None and reader.eof


def test_read_frame_parses_each_line() -> None:
    import io

    reader = FrameReader(io.BytesIO(b"DONE 1 STAT 2 1.00 0.0 0.10 3 1\n"))
    frame = reader.read_frame()
    assert frame is not None and frame.parsed is not None
    assert frame.parsed.get_int("prompt_tokens") == 3
    assert frame.record() is not None and reader.read_frame() is None


def test_a_violation_names_the_field_and_what_came_before_it() -> None:
    with pytest.raises(ProtocolViolation) as caught:
        parse_line("EMAP 2 8 " + "41" * 15)
    assert caught.value.field == "map" and len(caught.value.token) == 30
    assert caught.value.values == {"rows": 2, "cols": 8}


def test_a_parsed_line_keeps_each_fields_spelling() -> None:
    parsed = parse_line("DONE 1 STAT 2 10.000 100.0 0.10 2 1", strict=False)
    assert parsed is not None and parsed.spelled["tok_s"] == "10.000"
    assert parsed.get_float("tok_s") == 10.0
