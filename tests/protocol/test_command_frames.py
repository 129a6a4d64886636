"""The command direction of the one frame reader (``FrameParser.for_commands``): what an engine
reads from the server (spec/protocol.md 2.3 validation steps 1, 6, 7, 8 and section 3's PROMPT)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from support.frame_support import feed_in_pieces

from colibri.engine.submit_parse import MAX_HEADER
from colibri.protocol import BROKEN, LINE, OVERLONG, TRUNCATED, FrameParser, WireFrame


def _mux() -> FrameParser:
    return FrameParser.for_commands("mux", MAX_HEADER, kv_slots=1)


def _shape(frames: list[WireFrame]) -> list[tuple[str, bytes, bytes | None]]:
    return [(f.kind, f.header, f.payload) for f in frames]


MUX_STREAM = (
    b"SUBMIT 1 0 3 4 0 1\nab\n\n"  # a payload holding an LF
    b"STOP 1\n"
    b"SUBMIT 2 0 2 4 0.7 0.9 3 seed=5\nhi{x}\n"  # payload + grammar
    b"SUBMIT 3 0 99999999999 4 0 1\n"  # cannot be framed: nothing drained
    b"CANCEL 7\n"
    b"\n"
    b"garbage words\n"
    b"SUBMIT 4 0 1 4 0 1\nab"  # the payload is not followed by LF
    b"STOP 4"  # a last line without LF
)


@given(st.lists(st.integers(min_value=0, max_value=len(MUX_STREAM)), max_size=12))
def test_commands_do_not_depend_on_how_the_bytes_arrive(cuts: list[int]) -> None:
    at_once = _mux()
    whole = at_once.feed(MUX_STREAM) + at_once.finish()
    got = feed_in_pieces(_mux(), MUX_STREAM, cuts)
    assert got == whole
    assert _shape(got) == [
        ("SUBMIT", b"SUBMIT 1 0 3 4 0 1", b"ab\n"),
        ("STOP", b"STOP 1", None),
        ("SUBMIT", b"SUBMIT 2 0 2 4 0.7 0.9 3 seed=5", b"hi{x}"),
        ("SUBMIT", b"SUBMIT 3 0 99999999999 4 0 1", None),
        ("CANCEL", b"CANCEL 7", None),
        (LINE, b"", None),
        (LINE, b"garbage words", None),
        (BROKEN, b"SUBMIT 4 0 1 4 0 1", b"a"),
        ("STOP", b"STOP 4", None),
    ]


def test_a_line_over_the_limit_is_drained_to_its_lf_once() -> None:
    long = b"x" * (MAX_HEADER + 1)
    parser = _mux()
    # Reported as soon as it is known to be too long, then drained in pieces.
    assert [f.kind for f in parser.feed(long)] == [OVERLONG]
    assert parser.feed(b"y" * 10_000) == []
    assert _shape(parser.feed(b"zz\nSTOP 2\n")) == [("STOP", b"STOP 2", None)]
    # Exactly the limit is still a line; one byte more is not, LF present or not.
    exact = b"x" * MAX_HEADER
    assert [f.kind for f in _mux().feed(exact + b"\n")] == [LINE]
    assert [f.kind for f in _mux().feed(long + b"\nSTOP 1\n")] == [OVERLONG, "STOP"]
    cut = _mux()
    assert [f.kind for f in cut.feed(long)] == [OVERLONG] and cut.finish() == []


def test_eof_inside_a_frame_is_truncated_and_a_strict_terminator_is_required() -> None:
    short = _mux()
    assert short.feed(b"SUBMIT 1 0 5 4 0 1\nab") == []
    assert [f.kind for f in short.finish()] == [TRUNCATED]
    # The whole payload but not its LF: still truncated (step 7), not BAD_FRAME.
    no_lf = _mux()
    assert no_lf.feed(b"SUBMIT 1 0 2 4 0 1\nab") == []
    assert [f.kind for f in no_lf.finish()] == [TRUNCATED]
    header_only = _mux()
    assert header_only.feed(b"SUBMIT 1 0 2 4 0 1") == []
    assert [f.kind for f in header_only.finish()] == [TRUNCATED]


def test_the_legacy_prompt_terminator_is_lenient() -> None:
    def legacy() -> FrameParser:
        return FrameParser.for_commands("legacy", 1 << 24, kv_slots=1)

    # A byte other than LF after the payload starts the next line.
    frames = legacy().feed(b"\x02PROMPT 2 4 0 1\nabXhello\n\x02RESET\n")
    assert _shape(frames) == [
        ("PROMPT", b"\x02PROMPT 2 4 0 1", b"ab"),
        (LINE, b"Xhello", None),
        ("RESET", b"\x02RESET", None),
    ]
    # The payload's end at EOF is enough; the parser waits for the byte after it otherwise.
    at_eof = legacy()
    assert at_eof.feed(b"\x02PROMPT 2 4 0 1\nab") == []
    assert _shape(at_eof.finish()) == [("PROMPT", b"\x02PROMPT 2 4 0 1", b"ab")]
    cut = legacy()
    assert cut.feed(b"\x02PROMPT 5 4 0 1\nab") == [] and cut.finish()[0].kind == TRUNCATED


def test_payload_lengths_and_refusals_come_from_the_spec() -> None:
    # mux: only the length fields are checked before the payload (step 6); a slot out of
    # range is framed, so its error can name the request (step 9).
    framed = _mux().feed(b"SUBMIT 9 5 2 4 3 1 1\nab{\n")
    assert _shape(framed) == [("SUBMIT", b"SUBMIT 9 5 2 4 3 1 1", b"ab{")]
    assert framed[0].framed is not None and framed[0].framed.payload_bytes == 3
    too_big = _mux().feed(b"SUBMIT 9 0 2 4 0 1 1048577\nab\n")
    assert _shape(too_big) == [("SUBMIT", b"SUBMIT 9 0 2 4 0 1 1048577", None),
                               (LINE, b"ab", None)]
    # mux does not frame the legacy PROMPT; legacy refuses a header on any field's range
    # (KV_SLOTS included) and then reads its payload as lines.
    assert _shape(_mux().feed(b"\x02PROMPT 2 4 0 1\nab\n"))[1] == (LINE, b"ab", None)
    legacy = FrameParser.for_commands("legacy", 1 << 24, kv_slots=2)
    for refused in (b"\x02PROMPT 2 0 0 1", b"\x02PROMPT 2 4 3 1", b"\x02PROMPT 2 4 0 0",
                    b"\x02PROMPT 2 4 0 1 2"):
        assert _shape(legacy.feed(refused + b"\nab\n")) == [("PROMPT", refused, None),
                                                              (LINE, b"ab", None)]
    assert _shape(legacy.feed(b"\x02PROMPT 2 4 0 1 1\nab\n")) == [
        ("PROMPT", b"\x02PROMPT 2 4 0 1 1", b"ab")]
