"""The invariant checks on hand-made transcripts: each finds what it relates, fails when it
finds nothing to look at, and fails on the one field that breaks it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from colibri.conformance.frames import READY, Frame, FrameSplitter
from colibri.conformance.invariants import INVARIANTS, _hits, check_invariant
from colibri.conformance.outcome import CheckFailure, NotApplicable
from colibri.conformance.prompts import Payload, PromptCodec
from colibri.conformance.protocol_checks import SessionView

CODEC = PromptCodec(ids_mode=True, vocab=64, oracle={})
CAPS = {"proto": 1, "topk": 1, "tokenizer": 0, "slots": 2, "ctx": 256, "vocab": 64}


def block(rid: int, prompt: int, emitted: int, hits: str = "0300") -> str:
    return (
        "HWINFO 2 16.0 8.0 0 0.0 cpu|\nGPUS 0\nTIERS 0 16 0 0.00 0.01\n"
        f"EMAP 2 8 {'41' * 16}\nHITS 2 8 {hits}\nENTROPY 1.000 0.500\n"
        f"PERF {rid} 0.1 0.0 0.0 0.0 0.0 0.0 0.0\n"
        f"PROF 0.100 {prompt} {emitted} 0.000 0.000 0.000 0.000 0.000 3 1.000 2.000 0 0 0 "
        f"1.000 0.000 1\n"
        f"DONE {rid} STAT {emitted} 10.00 100.0 0.10 {prompt} 1\n"
    )


TURN = (
    "ACCEPT 1 2\nECHO 1 2 0 nan 0\n 5\nECHO 1 2 1 -0.500000 1 6 -0.500000\n 6\n"
    "DATA 1 2 -0.100000 1 7 -0.100000\n 7\n"
    "TOPK 1 5 -0.100000 2037 -1.000000 2031 -2.000000 2032 -2.000000 2033 -3.000000 2034\n"
    "DATA 1 2 -0.200000 1 8 -0.200000\n 8\n"
    "TOPK 1 5 -0.200000 2038 -1.000000 2031 -2.000000 2032 -2.000000 2033 -3.000000 2034\n"
)


def view(
    *runs: str, config: dict[str, Any] | None = None, state_dir: Path | None = None
) -> SessionView:
    """A session of one engine process per text (a restart starts a new frame reader)."""
    frames: list[Frame] = []
    for text in runs:
        splitter = FrameSplitter()
        frames += splitter.feed(READY + b"\n" + text.encode())
        assert not splitter.finish()
    requests: dict[int, dict[str, Any]] = {
        1: {"slot": 0, "max_tokens": 2, "temperature": 0.0, "ext": {"logprobs": 1}}
    }
    return SessionView(
        "main",
        frames,
        [],
        True,
        {1: Payload(b"5 6", 2, True)},
        state_dir,
        requests,
        config or {},
        dict(CAPS),
    )


GOOD = TURN + block(1, 2, 2, "0300")
#: Invariants of state files or of one extension have their own transcripts below.
WIRE_INVARIANTS = sorted(
    set(INVARIANTS)
    - {"heat-restored", "state-history", "caps-agree", "echo-at-window", "stats-dump",
       "stats-dump-header"}
)


@pytest.mark.parametrize("name", WIRE_INVARIANTS)
def test_good_transcript_passes(name: str) -> None:
    check_invariant(view(GOOD + block(1, 2, 2).replace("ACCEPT", "")), {"name": name}, CODEC)


@pytest.mark.parametrize("name", sorted(set(INVARIANTS) - {"caps-agree"}))
def test_nothing_to_check_is_a_failure(name: str) -> None:
    with pytest.raises((CheckFailure, NotApplicable)):
        check_invariant(view(""), {"name": name}, CODEC)


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("telemetry-dimensions", "HITS 2 8 0300", "HITS 2 8 03"),
        ("telemetry-dimensions", "ENTROPY 1.000 0.500", "ENTROPY 1.000"),
        ("tiers-match-emap", "TIERS 0 16 0", "TIERS 1 15 0"),
        ("turn-accounting", "PROF 0.100 2 2", "PROF 0.100 3 2"),
        ("length-limited", "0.10 2 1\n", "0.10 2 0\n"),
        ("value-ranges", "HWINFO 2 16.0 8.0", "HWINFO 2 8.0 16.0"),
        ("value-ranges", "1.000 2.000 0 0 0", "3.000 2.000 0 0 0"),
        ("value-ranges", "PERF 1 0.1 0.0 0.0 0.0", "PERF 1 0.1 0.0 0.0 0.2"),
        ("topk-table", "-2.000000 2032 -2.000000 2033", "-2.000000 2033 -2.000000 2032"),
        ("topk-table", "TOPK 1 5 -0.100000 2037", "TOPK 1 5 -0.100000 2036"),
        ("token-payloads", "ECHO 1 2 1 -0.500000 1 6 -0.500000\n 6", "ECHO 1 2 1 -0.5 0\n 9"),
        ("chosen-in-table", "DATA 1 2 -0.100000 1 7 -0.100000", "DATA 1 2 -0.1 1 7 -0.100000"),
        ("chosen-in-table", "DATA 1 2 -0.100000 1 7 -0.100000", "DATA 1 2 -0.100000 1 9 -0.05"),
    ],
)
def test_one_broken_field_fails(name: str, old: str, new: str) -> None:
    assert old in GOOD
    with pytest.raises(CheckFailure):
        check_invariant(view(GOOD.replace(old, new, 1)), {"name": name}, CODEC)


def test_heat_that_falls_or_stays_cold_fails() -> None:
    second = block(1, 2, 2).replace("ACCEPT", "")
    with pytest.raises(CheckFailure, match="heat fell"):
        check_invariant(
            view(GOOD + second.replace("41" * 16, "40" * 16)), {"name": "heat-monotonic"}, CODEC
        )
    cold = GOOD.replace("41" * 16, "40" + "41" * 15)
    with pytest.raises(CheckFailure, match="cold"):
        check_invariant(view(cold + second), {"name": "heat-monotonic"}, CODEC)


def test_heat_restored_compares_across_ready(tmp_path: Path) -> None:
    handshake = "STAT 0 0.00 0.0 0.10\nEMAP 2 8 "
    ok = view(GOOD, handshake + "41" * 16 + "\n", config={"persist": True}, state_dir=tmp_path)
    check_invariant(ok, {"name": "heat-restored"}, CODEC)
    lost = view(GOOD, handshake + "40" * 16 + "\n", config={"persist": True}, state_dir=tmp_path)
    with pytest.raises(CheckFailure, match="after the restart"):
        check_invariant(lost, {"name": "heat-restored"}, CODEC)


def test_hits_padding_bits_must_be_zero() -> None:
    frames = FrameSplitter().feed(READY + b"\nHITS 1 3 07\nHITS 1 3 08\n")
    assert _hits(frames[1], None) == {0, 1, 2}
    with pytest.raises(CheckFailure, match="padding"):
        _hits(frames[2], None)


# -- echo_at: the scored window (protocol.md 2.2, 2.8) ---------------------------------------
#: "ab cd" as tokens "ab" | " c" | "d"; echo_at=3 falls inside " c", so positions 1 and 2.
ECHO_AT = (
    "ACCEPT 1 3\nECHO 1 2 1 -0.500000 1 6 -0.500000\n c\nECHO 1 1 2 -0.500000 1 6 -0.500000\nd\n"
    + block(1, 3, 0).replace("STAT 0 10.00", "STAT 0 0.00")
)


def echo_at_view(text: str, at: int = 3) -> SessionView:
    plain = view(text)
    ask = {"slot": 0, "max_tokens": 0, "temperature": 0.0, "ext": {"logprobs": 1, "echo_at": at}}
    return SessionView(
        "main", plain.frames, [], True, {1: Payload(b"ab cd", None, False)}, None,
        {1: ask}, {}, dict(CAPS, tokenizer=1),
    )


def test_echo_at_window_holds_the_covering_tokens() -> None:
    check_invariant(echo_at_view(ECHO_AT), {"name": "echo-at-window"}, CODEC)
    check_invariant(echo_at_view(ECHO_AT), {"name": "turn-accounting"}, CODEC)
    past_end = "ACCEPT 1 3\n" + block(1, 3, 0)
    check_invariant(echo_at_view(past_end, at=5), {"name": "echo-at-window"}, CODEC)


@pytest.mark.parametrize(
    ("old", "new", "at"),
    [
        # the token merging across byte 3 is missing: only "d" scored
        ("ECHO 1 2 1 -0.500000 1 6 -0.500000\n c\n", "", 3),
        # one token too many: "ab" does not reach past byte 3
        ("ACCEPT 1 3\n", "ACCEPT 1 3\nECHO 1 2 0 nan 0\nab\n", 3),
        # positions do not end at nt - 1
        ("ECHO 1 1 2 -0.5", "ECHO 1 1 3 -0.5", 3),
        # the payloads are not the prompt's tail
        ("\nd\n", "\nx\n", 3),
        # scored although echo_at is past the end
        ("", "", 5),
    ],
)
def test_echo_at_window_fails_on_a_shifted_window(old: str, new: str, at: int) -> None:
    with pytest.raises(CheckFailure):
        broken = echo_at_view(ECHO_AT.replace(old, new, 1), at)
        check_invariant(broken, {"name": "echo-at-window"}, CODEC)


# -- the STATS dump (protocol.md 4.2) ----------------------------------------------------------
#: Two routed layers x 8 experts, three experts per layer routed twice (heat 2): top-2 x 3
#: forwarded tokens (2 prompt + 2 emitted - the last, length-limited) = 6 per layer.
STATS_TURN = GOOD.replace("41" * 16, ("42" * 3 + "40" * 5) * 2)
STATS_FILE = "-1 5 8\n-2 1 3815245270\n" + "".join(
    f"{layer} {expert} 2\n" for layer in (3, 4) for expert in range(3)
)


def stats_view(
    tmp_path: Path, text: str = STATS_FILE, alive: bool = False, turn: str = STATS_TURN
) -> SessionView:
    (tmp_path / "stats.txt").write_text(text)
    plain = view(turn)
    config = {"env": {"STATS": "{state_dir}/stats.txt", "DRAFT": "0"}}
    return SessionView(
        "main", plain.frames, [] if alive else [0], alive, plain.submitted, tmp_path,
        plain.requests, config, plain.caps,
    )


@pytest.fixture()
def stats_codec(tmp_path: Path) -> PromptCodec:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_experts_per_tok": 2}')
    return PromptCodec(ids_mode=True, vocab=64, oracle={}, model_dir=model)


def test_stats_dump_counts_top_k_per_forwarded_token(
    tmp_path: Path, stats_codec: PromptCodec
) -> None:
    check_invariant(stats_view(tmp_path), {"name": "stats-dump"}, stats_codec)


def test_stats_dump_reads_a_seed_engine_without_accept(
    tmp_path: Path, stats_codec: PromptCodec
) -> None:
    # colibri's glm.c sends neither ACCEPT nor ECHO: the forwarded tokens come from DONE's
    # prompt_tokens, a seed field, so the dump is judged on what the seed defines.
    seed_turn = STATS_TURN.replace("ACCEPT 1 2\n", "").replace(
        "ECHO 1 2 0 nan 0\n 5\nECHO 1 2 1 -0.500000 1 6 -0.500000\n 6\n", ""
    )
    assert "ACCEPT" not in seed_turn and "ECHO" not in seed_turn
    check_invariant(stats_view(tmp_path, turn=seed_turn), {"name": "stats-dump"}, stats_codec)
    # glm.c leaves length_limited 0 when max_tokens (not the context) ended the turn: the
    # last token is still unforwarded, because max_tokens of them were emitted.
    unflagged = seed_turn.replace("STAT 2 10.00 100.0 0.10 2 1", "STAT 2 10.00 100.0 0.10 2 0")
    assert unflagged != seed_turn
    check_invariant(stats_view(tmp_path, turn=unflagged), {"name": "stats-dump"}, stats_codec)
    wrong = seed_turn.replace("STAT 2 10.00 100.0 0.10 2 1", "STAT 2 10.00 100.0 0.10 3 1")
    with pytest.raises(CheckFailure, match="top-2 x 4"):
        check_invariant(stats_view(tmp_path, turn=wrong), {"name": "stats-dump"}, stats_codec)


def test_headerless_stats_dump_counts_but_lacks_the_usage_header(
    tmp_path: Path, stats_codec: PromptCodec
) -> None:
    # glm.c's dump is bare "layer expert count" triples: its counts are judged, its missing
    # header records only by the state_layout case.
    bare = STATS_FILE.split("\n", 2)[2]
    check_invariant(stats_view(tmp_path, bare), {"name": "stats-dump"}, stats_codec)
    with pytest.raises(CheckFailure, match="does not start with"):
        check_invariant(stats_view(tmp_path, bare), {"name": "stats-dump-header"}, stats_codec)
    check_invariant(stats_view(tmp_path), {"name": "stats-dump-header"}, stats_codec)
    with pytest.raises(CheckFailure, match="second line"):
        broken = STATS_FILE.replace("-2 1 ", "-2 2 ")
        check_invariant(stats_view(tmp_path, broken), {"name": "stats-dump"}, stats_codec)


@pytest.mark.parametrize(
    ("text", "alive", "match"),
    [
        (STATS_FILE.replace("4 2 2", "4 2 3"), False, "top-2 x 3"),  # same heat, one too many
        (STATS_FILE.replace("3 2 2\n", ""), False, "heats"),
        (STATS_FILE.replace("-2 1 ", "-2 2 "), False, "second line"),
        (STATS_FILE.replace("3 1 2\n3 2 2", "3 2 2\n3 1 2"), False, "ascending"),
        ("", False, "heats"),
        (STATS_FILE, True, "exited"),
    ],
)
def test_stats_dump_fails_on_a_wrong_count(
    tmp_path: Path, stats_codec: PromptCodec, text: str, alive: bool, match: str
) -> None:
    with pytest.raises(CheckFailure, match=match):
        check_invariant(stats_view(tmp_path, text, alive), {"name": "stats-dump"}, stats_codec)
