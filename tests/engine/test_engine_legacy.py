"""The legacy protocol (chat turns, RESET, MORE, PROMPT) on the fake model."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine_fakes import FakeBackend, FakeConfig
from support.engine_harness import run_legacy

from colibri.protocol import parse_line

END = b"\x01\x01END\x01\x01\n"
STAT4 = rb"STAT \d+ \d+\.\d\d \d+\.\d \d+\.\d\d\n"
STAT6 = rb"STAT \d+ \d+\.\d\d \d+\.\d \d+\.\d\d \d+ [01]\n"


def replies(out: bytes) -> list[bytes]:
    head, _, body = out.partition(b"TIERS ")
    assert head.startswith(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 ")
    body = body.split(b"\n", 1)[1]
    parts = re.findall(rb"(.*?)" + re.escape(END) + rb"(STAT [^\n]*\n)", body, re.S)
    assert b"".join(text + END + stat for text, stat in parts) == body
    for _, stat in parts:
        assert parse_line(stat[:-1]) is not None
    return [text + END + stat for text, stat in parts]


def test_chat_turn_more_and_reset() -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    out, _ = run_legacy(b"3 4 5\n\x02MORE\n\x02RESET\n\x02MORE\n", model=model, env={"NGEN": "4"})
    turn, more, reset, empty_more = replies(out)
    assert re.fullmatch(rb"( \d+){4}\n" + re.escape(END) + STAT6, turn)
    assert turn.endswith(b" 3 1\n")  # 3 prompt tokens, stopped by NGEN
    assert re.fullmatch(rb"( \d+){4}\n" + re.escape(END) + STAT4, more)
    assert reset == END + reset[len(END) :] and reset.startswith(END + b"STAT 0 0.00 0.0 ")
    assert empty_more.startswith(END + b"STAT 0 0.00 0.0 ")


def test_more_continues_exactly_like_a_longer_answer() -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    short, _ = run_legacy(b"3 4 5\n\x02MORE\n", model=model, env={"NGEN": "3", "SEED": "5"})
    long, _ = run_legacy(
        b"3 4 5\n", model=FakeBackend(FakeConfig(eos_token_ids=())), env={"NGEN": "6", "SEED": "5"}
    )
    a, b = replies(short)
    (c,) = replies(long)
    text = a.split(b"\n")[0] + b.split(b"\n")[0]
    assert text == c.split(b"\n")[0]


def test_api_prompt_frame() -> None:
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    script = b"\x02PROMPT 5 3 0 1\n7 8 9\n\x02PROMPT 5 0 0 1\n\x02PROMPT 3 2 0 1 4\n1 2\n"
    out, _ = run_legacy(script, model=model)
    first, bad_max, bad_slot = replies(out)[:3]
    assert re.fullmatch(rb"( \d+){3}" + re.escape(END) + STAT6, first)
    assert first.endswith(b" 3 1\n")
    assert bad_max == END + bad_max[len(END) :] and bad_max.endswith(b" 0 0\n")
    assert bad_slot.endswith(b" 0 0\n")


def test_prompt_nul_and_lenient_terminator() -> None:
    out, _ = run_legacy(b"\x02PROMPT 3 2 0 1\n1\x002\n\x02PROMPT 1 1 0 1\n7X\x02RESET\n")
    nul, ok, chat_of_x = replies(out)
    assert nul.startswith(END) and nul.endswith(b" 0 0\n")
    assert not ok.startswith(END)
    assert chat_of_x.startswith(END)  # 'X\x02RESET' is a (bad) chat line in an ids model


_LEGACY_LINES = st.one_of(
    st.sampled_from([b"\x02RESET\n", b"\x02MORE\n", b"3 4 5\n", b"\n", b"x\n", b"99999\n"]),
    st.builds(
        lambda n, m, t, p, body, term: b"\x02PROMPT %d %s %s %s\n" % (n, m, t, p) + body + term,
        st.integers(0, 12),
        st.sampled_from([b"0", b"1", b"3", b"x"]),
        st.sampled_from([b"0", b"0.7", b"3", b"nan"]),
        st.sampled_from([b"1", b"0.9", b"0"]),
        st.binary(max_size=12),
        st.sampled_from([b"\n", b"X", b""]),
    ),
    st.binary(max_size=20),
)


@settings(max_examples=80)
@given(st.lists(_LEGACY_LINES, max_size=8))
def test_fuzzed_legacy_input_never_crashes(parts: list[bytes]) -> None:
    out, _ = run_legacy(
        b"".join(parts), model=FakeBackend(FakeConfig(eos_token_ids=())), env={"NGEN": "3"}
    )
    body = out.split(b"\n", 2)[2].split(b"\n", 1)[1]  # after READY, STAT, TIERS
    # every reply ends with END + a STAT line that matches protocol.json
    for match in re.finditer(re.escape(END) + rb"(STAT [^\n]*)\n", body):
        assert parse_line(match.group(1)) is not None
    assert body.count(END) == len(re.findall(re.escape(END) + rb"STAT ", body))


def test_more_at_a_full_context_keeps_the_answer_it_cannot_extend() -> None:
    # NGEN exceeds the context: the turn fills it, leaving its last token (already shown to
    # the user) unforwarded. MORE cannot forward it; it must say so without dropping it, so
    # a second MORE is just as empty instead of re-sampling an earlier position.
    model = FakeBackend(FakeConfig(eos_token_ids=()))
    out, _ = run_legacy(b"3 4 5\n\x02MORE\n\x02MORE\n", model=model, env={"NGEN": "500"})
    turn, first_more, second_more = replies(out)
    assert turn.endswith(b" 3 1\n")  # length-limited by the context
    assert second_more.startswith(END + b"STAT 0 0.00 0.0 ")  # nothing re-sampled
    assert first_more.startswith(END + b"STAT 0 0.00 0.0 ")
