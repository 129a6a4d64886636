"""spec/protocol.json: its derived regexes and protocol.md's tables in step with it, loadable,
and its grammars mean what they say."""

from __future__ import annotations

import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.frame_support import feed_in_pieces

from colibri.protocol import (
    BROKEN,
    LIMITS,
    READY_LINE,
    FrameParser,
    FrameReader,
    ProtocolViolation,
    load_spec,
    parse_line,
)

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location(
        "gen_protocol_json", ROOT / "tools/gen_protocol_json.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protocol_json"] = module
    spec.loader.exec_module(module)
    return module


def test_committed_json_matches_its_generator() -> None:
    """Every regex is the one its field grammar derives (the rest is edited by hand)."""
    gen = _generator()
    committed = (ROOT / "spec" / "protocol.json").read_text()
    assert committed == gen.render()  # type: ignore[attr-defined]


def test_protocol_md_tables_are_generated_from_protocol_json() -> None:
    gen = _generator()
    prose = (ROOT / "spec" / "protocol.md").read_text()
    assert prose.count("<!-- generated: ") == len(gen.TABLES)  # type: ignore[attr-defined]
    assert gen.render_prose(prose) == prose  # type: ignore[attr-defined]


def test_protocol_md_frame_tables_name_only_kinds_of_protocol_json() -> None:
    """The hand-written kind tables (2.5, 2.6) are checked against the JSON, both ways."""
    prose = (ROOT / "spec" / "protocol.md").read_text()
    start, stop = prose.index("### 2.5 Response frames"), prose.index("### 2.7 ")
    listed = set(re.findall(r"^\| `([A-Z]+)` \|", prose[start:stop], flags=re.M))
    spec = load_spec()
    engine_mux = {k for k, v in spec.engine_lines.items() if "mux" in v.protocols}
    assert listed == engine_mux - {"READY", "STAT", "CAPS"}


def test_every_kind_documented_in_protocol_md() -> None:
    prose = (ROOT / "spec" / "protocol.md").read_text()
    spec = load_spec()
    for kind in [*spec.engine_lines, *spec.request_lines]:
        assert re.search(rf"(`|\\x0[12]){kind}\b", prose), kind
    for code in spec.errors:
        assert code in prose, code


GOOD = [
    "STAT 0 0.00 0.0 0.12",
    "STAT 3 12.50 97.5 0.12 5 1",
    "CAPS proto=1 seed=1 slots=4",
    "HWINFO 2 16.0 8.1 0 0.0 AMD EPYC  7B13|",
    "GPUS 1 1.000 80.000 12",
    "TIERS 0 4 12 0.00 0.01",
    "EMAP 2 8 " + "00" * 16,
    "HITS 2 8 0300",
    "ENTROPY 1.000 0.918",
    "PERF 7 0.010000 0.000000 0.000000 0.001000 0.002000 0.000000 0.003000",
    "PROF 0.010 5 3 0.000 0.000 0.001 0.002 0.003 4 2.000 3.000 0 0 0 1.500 0.000 1",
    "REPIN 3 5 0 -1",
    "NODES 2 4 00010001ff010000 2 4 0.001 3 0.000",
    "ACCEPT 18446744073709551615 12",
    "DATA 1 3",
    "DATA 1 3 -0.105361 2 7 -0.105361 9 -2.302585",
    "ECHO 1 1 0 nan 0",
    "ECHO 1 2 1 -inf 1 4 -0.500000",
    "TOPK 1 2 -0.100000 41 -1.000000 -",
    "DONE 1 STAT 3 10.00 100.0 0.10 12 0",
    "ERROR 0 BAD_REQUEST",
    "ERROR 9 CONTEXT_EXCEEDED 5000 4094",
]

BAD = [
    "STAT 0 0.0 0.0 0.12",  # tok_s must be %.2f
    "HWINFO 016 1.0 1.0 0 0.0 x|",  # leading zero
    "EMAP 2 8 " + "0A" * 16,  # uppercase hex
    "EMAP 2 8 " + "00" * 15,  # length mismatch
    "HITS 2 8 03",  # length mismatch
    "PROF 1.25 5 3 0.000 0.000 0.001 0.002 0.003 4",  # not %.3f, 10-field form
    "DATA 1 3 -0.105361 2 7 -0.105361",  # k=2 but one entry
    "DATA 1 3 -0.105361 33" + " 1 -1.000000" * 33,  # k > 32
    "DATA 1  3",  # double space
    "DONE 1 STAT 3 10.00 100.0 0.10 12",  # missing length_limited
    "ERROR 1 CONTEXT_EXCEEDED 5",  # one number
    "ACCEPT 01 3",  # leading zero
    "GPUS 2 1.000 80.000 12",  # n=2, one device
    "NODES 2 4 0001 2 4 0.001 4 0.001",  # 2 map bytes for 8 experts
    "NODES 1 2 0001 2 1 0.001",  # n=2, one node
]


@pytest.mark.parametrize("line", GOOD)
def test_good_lines_parse(line: str) -> None:
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed.kind == line.split(" ")[0]


@pytest.mark.parametrize("line", BAD)
def test_bad_lines_are_violations(line: str) -> None:
    with pytest.raises(ProtocolViolation):
        parse_line(line)


def test_typed_values() -> None:
    data = parse_line("DATA 1 3 -0.105361 2 7 -0.105361 9 -2.302585")
    assert data is not None
    assert data.get_int("n") == 3 and data.payload_length == 3
    assert data.values["top"] == [
        {"token": 7, "logprob": -0.105361},
        {"token": 9, "logprob": -2.302585},
    ]
    hw = parse_line("HWINFO 2 16.0 8.1 0 0.0 AMD EPYC  7B13|")
    assert hw is not None and hw.values["cpu_gpu"] == "AMD EPYC  7B13|"
    err = parse_line("ERROR 9 CONTEXT_EXCEEDED 5000 4094")
    assert err is not None and err.get_int("limit") == 4094


def test_unknown_kinds_are_ignored_not_errors() -> None:
    assert parse_line("GPUDETAIL 1 0") is None
    assert parse_line("LOGPROB 1 2 3") is None


def test_request_grammar() -> None:
    sub = parse_line("SUBMIT 1 0 5 16 0.7 0.9 0 logprobs=2 ids=1", direction="server")
    assert sub is not None
    assert sub.values["gbytes"] == 0 and sub.payload_length == 5
    assert sub.values["extensions"] == [{"extension": "logprobs=2"}, {"extension": "ids=1"}]
    codec = parse_line("SUBMIT 1 0 6 16 0 1 logprobs=1", direction="server")
    assert codec is not None and "gbytes" not in codec.values
    grammar = parse_line("SUBMIT 4 1 5 16 0 1 12", direction="server")
    assert grammar is not None and grammar.payload_length == 17
    prompt = parse_line("\x02PROMPT 5 8 0.7 0.9 2", direction="server")
    assert prompt is not None and prompt.get_int("kv_slot") == 2
    assert parse_line("\x02RESET", direction="server") is not None
    with pytest.raises(ProtocolViolation):
        parse_line("SUBMIT 1 0 5 16 0.7", direction="server")


@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 32).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(
                st.tuples(st.integers(0, 2**31 - 1), st.floats(-1e6, 0.0)),
                min_size=k,
                max_size=k,
            ),
        )
    ),
    st.floats(-1e6, 0.0),
)
def test_data_tail_roundtrip(
    rid: int, table: tuple[int, list[tuple[int, float]]], lp: float
) -> None:
    k, entries = table
    tail = f" {lp:.6f} {k}" + "".join(f" {t} {v:.6f}" for t, v in entries)
    parsed = parse_line(f"DATA {rid} 4{tail}")
    assert parsed is not None
    assert parsed.get_int("id") == rid and parsed.get_int("k") == k
    top = parsed.values["top"]
    assert isinstance(top, list) and [e["token"] for e in top] == [t for t, _ in entries]


def test_regex_and_walker_agree_on_samples() -> None:
    spec = load_spec()
    for line in GOOD:
        kind = line.split(" ")[0]
        assert spec.engine_lines[kind].regex.match(line)
    # The regex alone cannot count repeats; the walker does.
    assert re.match(spec.engine_lines["GPUS"].regex, "GPUS 2 1.000 80.000 12")


def test_frame_reader_reads_payloads() -> None:
    stream = io.BytesIO(
        b"== banner ==\n"
        + READY_LINE
        + b"STAT 0 0.00 0.0 0.10\n"
        + b"ACCEPT 1 2\n"
        + b"DATA 1 2\na\n\n"
        + b"GPUDETAIL 1 0\n"
        + b"DONE 1 STAT 1 1.00 0.0 0.10 2 0\n"
    )
    unknown: list[bytes] = []
    reader = FrameReader(stream, on_unknown=unknown.append)
    assert reader.read_preamble() == [b"== banner ==\n"]
    kinds = []
    payloads = []
    while (frame := reader.read_frame()) is not None:
        kinds.append(frame.kind)
        payloads.append(frame.payload)
    assert kinds == ["STAT", "ACCEPT", "DATA", "GPUDETAIL", "DONE"]
    assert payloads[2] == b"a\n"
    assert unknown == [b"GPUDETAIL 1 0\n"]


def test_frame_reader_rejects_bad_terminator() -> None:
    reader = FrameReader(io.BytesIO(b"DATA 1 2\nabX"))
    with pytest.raises(ProtocolViolation):
        reader.read_frame()


def test_protocol_json_matches_its_schema() -> None:
    import json

    import jsonschema

    schema = json.loads((ROOT / "spec" / "schemas" / "protocol.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    document = json.loads((ROOT / "spec" / "protocol.json").read_text())
    jsonschema.validate(document, schema)
    # every field type names a type, every error code the engine writes is listed
    spec = load_spec()
    codes = {
        "BAD_REQUEST",
        "BAD_FRAME",
        "SLOT_BUSY",
        "DUPLICATE_ID",
        "EMPTY_PROMPT",
        "CONTEXT_EXCEEDED",
        "NOT_FOUND",
        "CANCELLED",
        "BAD_GRAMMAR",
        "EXPERT_READ",
    }
    assert set(spec.errors) == codes

    def types(items: list[dict[str, object]]) -> set[str]:
        found: set[str] = set()
        for item in items:
            if "type" in item:
                found.add(str(item["type"]))
            for key in ("optional", "fields"):
                sub = item.get(key)
                if isinstance(sub, list):
                    found |= types(sub)
        return found

    for line in document["lines"]:
        assert types(line["fields"]) <= set(spec.types), line["kind"]


# --- one reader of the spec, one frame reader --------------------------------------------------

PACKAGES = ("colibri", "server", "conformance", "reference", "accelerated")


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_colibri_protocol_is_the_only_reader_of_protocol_json() -> None:
    readers = [
        str(p.relative_to(ROOT)) for p in _sources()
        if '"protocol.json"' in (text := p.read_text(encoding="utf-8"))
        and re.search(r"json\.loads?\(", text)
    ]
    assert readers == ["colibri/protocol/spec.py"]


def test_no_module_spells_the_wire_constants_itself() -> None:
    """READY/END, the payload kinds and the limits come from colibri.protocol."""
    patterns = {
        "sentinel": re.compile(r"\\x01\\x01(READY|END)"),
        "payload kinds": re.compile(r"\{\s*\"DATA\",\s*\"ECHO\""),
        "limit": re.compile(r"\b(MAX_PAYLOAD|MAX_GRAMMAR|MAX_HEADER|MAX_LOGPROBS|HITS_EVERY|"
                            r"TOPK_COUNT|MAX_KV_SLOTS)\s*=\s*[0-9(]"),
    }
    found = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in _sources()
        for name, pattern in patterns.items()
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert found == []


STREAM = (
    b"== banner ==\n" + READY_LINE + b"STAT 0 0.00 0.0 0.10\nACCEPT 1 2\n"
    b"DATA 1 3\na\nb\nECHO 1 1 0 nan 0\n\x00\nTOOL 1 2\n{}\nGPUDETAIL 1 0\n"
    b"DONE 1 STAT 1 1.00 0.0 0.10 2 0\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_frame_parser_does_not_care_how_the_bytes_arrive(cuts: list[int]) -> None:
    whole = FrameParser().feed(STREAM)
    assert feed_in_pieces(FrameParser(), STREAM, cuts) == whole
    assert [f.kind for f in whole] == [
        "PREAMBLE", "READY", "STAT", "ACCEPT", "DATA", "ECHO", "TOOL", "GPUDETAIL", "DONE"
    ]
    assert whole[4].payload == b"a\nb" and whole[6].payload == b"{}"
    assert [f.request_id for f in whole[3:7]] == [1, 1, 1, 1]


def test_frame_parser_breaks_on_oversized_counts_and_bad_terminators() -> None:
    limit = LIMITS["max_frame_payload_bytes"]
    over = FrameParser(seen_ready=True).feed(f"DATA 1 {limit + 1}\n".encode())
    assert [f.kind for f in over] == [BROKEN]
    bad = FrameParser(seen_ready=True).feed(b"DATA 1 2\nabX")
    assert bad[0].kind == BROKEN and "not followed by LF" in bad[0].problem
    cut = FrameParser(seen_ready=True)
    assert cut.feed(b"DATA 1 5\nab") == [] and cut.finish()[0].kind == BROKEN


def test_every_reader_takes_its_numbers_from_the_spec() -> None:
    from colibri.conformance import frames as conformance_frames

    from colibri.engine import submit_parse

    spec = load_spec()
    assert conformance_frames.MAX_PAYLOAD == 65536
    assert conformance_frames.PAYLOAD_KINDS == spec.framed_kinds
    assert submit_parse.MAX_PAYLOAD == spec.limits["max_payload_bytes"]
    assert submit_parse.EXTENSION_RANGES["logprobs"] == (0, spec.limits["max_logprobs"])
    assert conformance_frames.FrameSplitter is FrameParser
