"""The conformance framework itself: case data, frame splitting, verdict logic, reporters."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from colibri.conformance.cases import CaseError, load_cases, parse_cases
from colibri.conformance.expectations import Expectations, ExpectationsError
from colibri.conformance.frames import READY, FrameSplitter
from colibri.conformance.http_runner import _metrics, sse_events
from colibri.conformance.http_target import Response
from colibri.conformance.outcome import FAIL, PASS, SKIP, XFAIL, XPASS, CheckFailure, Result
from colibri.conformance.report import summary_table, verdict, write_json, write_junit
from colibri.conformance.runner import run_case, run_suite
from hypothesis import given
from hypothesis import strategies as st

from colibri.resources import spec_path

SECTION = re.compile(r"^#{2,3} ([0-9]+(?:\.[0-9]+)?)\.? ", re.M)


def _sections(document: str) -> list[str]:
    return SECTION.findall(spec_path(document).read_text(encoding="utf-8"))


@pytest.mark.parametrize(("suite", "document"), [("protocol", "protocol.md"), ("http", "http.md")])
def test_every_spec_section_is_checked_by_a_case(suite: str, document: str) -> None:
    cited: set[str] = set()
    for case in load_cases(suite):
        if case.profile in ("openai", "anthropic"):
            if case.id.startswith(f"http.{case.profile}."):
                continue  # they cite the public API reference (test_http_profiles.py)
            # the other cases of a public profile cite the API reference first, then our section
            assert document + " §" in case.clause, case.id
        else:
            assert case.clause.startswith(document + " §"), case.id
        cited.update(re.findall(r"§([0-9]+(?:\.[0-9]+)?)", case.clause))
    sections = _sections(document)
    assert sorted(cited - set(sections)) == [], "cases cite sections that do not exist"
    uncovered = [
        s for s in sections if s not in cited and not any(c.startswith(s + ".") for c in cited)
    ]
    assert uncovered == []


def test_suites_are_substantial_and_ids_unique() -> None:
    protocol, http = load_cases("protocol"), load_cases("http")
    assert len(protocol) >= 70 and len(http) >= 60
    ids = [c.id for c in protocol + http]
    assert len(ids) == len(set(ids))
    assert {c.level for c in protocol + http} == {"must", "should"}


def _case(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "protocol.sample.case",
        "suite": "protocol",
        "area": "sample",
        "description": "a sample case for tests",
        "clause": "protocol.md §2.5",
        "seed": "serve_protocol.md, Requests: EOF on stdin",
        "level": "must",
        "steps": [{"op": "close_stdin"}],
        "expect": [{"type": "grammar"}],
    }
    base.update(changes)
    return base


def test_schema_rejects_malformed_cases_naming_them() -> None:
    parse_cases(_case(), "ok.json")
    with pytest.raises(CaseError, match="protocol.sample.case"):
        parse_cases(_case(level="may"), "bad.json")
    with pytest.raises(CaseError):
        parse_cases(_case(steps=[{"op": "submit", "id": 1}]), "bad.json")  # no prompt
    with pytest.raises(CaseError, match="does not apply"):
        parse_cases(_case(expect=[{"type": "status", "equals": 200}]), "bad.json")
    with pytest.raises(CaseError, match="must start with"):
        parse_cases(_case(id="protocol.x.y", suite="http", profile="openai", steps=[]), "bad.json")
    http_case = _case(id="http.x.y", suite="http", steps=[], expect=[{"type": "status"}])
    parse_cases({**http_case, "profile": "colibri"}, "ok.json")
    with pytest.raises(CaseError, match="'profile' is a required property"):
        parse_cases(http_case, "bad.json")  # an HTTP case names whose contract it checks


def test_a_changed_case_file_is_validated_again(tmp_path: Path) -> None:
    # load_cases validates each file's bytes once per process; the same path with other
    # bytes is new text and gets the schema again.
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(_case()), encoding="utf-8")
    assert "protocol.sample.case" in [c.id for c in load_cases("protocol", [extra])]
    assert "protocol.sample.case" in [c.id for c in load_cases("protocol", [extra])]
    extra.write_text(json.dumps(_case(level="may")), encoding="utf-8")
    with pytest.raises(CaseError, match="level"):
        load_cases("protocol", [extra])


def test_unknown_capability_is_refused() -> None:
    with pytest.raises(CaseError):
        parse_cases(_case(requires=["teleportation"]), "bad.json")


# -- frames ------------------------------------------------------------------------------
_header_text = st.text(alphabet="ABCDEFGHIJ0123456789 .-", min_size=1, max_size=30).map(
    lambda s: "X" + s.replace("\n", "")
)
_frame = st.one_of(
    _header_text.map(lambda h: (h.encode(), None)),
    st.tuples(st.integers(1, 99), st.binary(max_size=40)).map(
        lambda t: (f"DATA {t[0]} {len(t[1])}".encode(), t[1])
    ),
)


@given(st.lists(_frame, max_size=12), st.lists(st.integers(1, 17), max_size=20))
def test_splitter_recovers_frames_whatever_the_chunking(
    frames: list[tuple[bytes, bytes | None]], cuts: list[int]
) -> None:
    wire = (
        b"pre amble\n"
        + READY
        + b"\n"
        + b"".join(h + b"\n" + (p + b"\n" if p is not None else b"") for h, p in frames)
    )
    splitter, got, position = FrameSplitter(), [], 0
    for cut in cuts:
        got += splitter.feed(wire[position : position + cut])
        position += cut
    got += splitter.feed(wire[position:]) + splitter.finish()
    assert [f.kind for f in got[:2]] == ["PREAMBLE", "READY"]
    assert [(f.header, f.payload) for f in got[2:]] == frames
    assert b"".join(f.wire() for f in got[1:]) == wire[len(b"pre amble\n") :]


def test_bad_payload_terminator_is_a_broken_frame() -> None:
    frames = FrameSplitter(seen_ready=True).feed(b"DATA 1 2\nabX")
    assert frames[0].kind == "BROKEN" and "LF" in frames[0].problem


def test_legacy_replies_split_into_text_and_stat() -> None:
    splitter = FrameSplitter(legacy=True)
    data = (
        READY
        + b"\nSTAT 0 0.00 0.0 0.10\nTIERS 0 0 8 0.00 0.00\n"
        + b"Hello STAT world\x01\x01END\x01\x01\nSTAT 3 1.00 0.0 0.10 5 0\n"
    )
    kinds = [(f.kind, f.payload) for f in splitter.feed(data)]
    assert kinds == [
        ("READY", None),
        ("STAT", None),
        ("TIERS", None),
        ("TEXT", b"Hello STAT world"),
        ("STAT", None),
    ]


# -- verdicts ----------------------------------------------------------------------------
class _Scripted:
    """An executor whose verdict per case is scripted (and counts attempts)."""

    def __init__(self, outcomes: dict[str, list[str]], capabilities: set[str]) -> None:
        self.outcomes = outcomes
        self.capabilities = capabilities
        self.calls: dict[str, int] = {}

    def run(self, case: Any) -> list[str]:
        number = self.calls.get(case.id, 0)
        self.calls[case.id] = number + 1
        if self.outcomes[case.id][min(number, len(self.outcomes[case.id]) - 1)] == "fail":
            raise CheckFailure("scripted failure")
        return []

    def close(self) -> None:
        pass


def _cases(*names: str, requires: list[str] | None = None) -> list[Any]:
    return [
        parse_cases(_case(id=f"protocol.t.{n}", requires=requires or []), "t.json")[0]
        for n in names
    ]


def test_expectations_turn_failures_into_xfail_and_flaky_into_reruns(tmp_path: Path) -> None:
    path = tmp_path / "expect.json"
    path.write_text(
        json.dumps(
            {
                "cases": {
                    "protocol.t.known": {"status": "xfail", "reason": "known bug"},
                    "protocol.t.fixed": {"status": "xfail", "reason": "was broken"},
                    "protocol.t.flaky": {"status": "flaky", "reason": "timing"},
                    "protocol.t.skipped": {"status": "skip", "reason": "too slow here"},
                }
            }
        )
    )
    expectations = Expectations.load(path)
    executor = _Scripted(
        {
            "protocol.t.known": ["fail"],
            "protocol.t.fixed": ["pass"],
            "protocol.t.flaky": ["fail", "pass"],
            "protocol.t.skipped": ["fail"],
            "protocol.t.broken": ["fail"],
        },
        set(),
    )
    cases = _cases("known", "fixed", "flaky", "skipped", "broken")
    results = {r.case_id: r for r in run_suite(executor, cases, expectations, reruns=2)}
    assert {k: r.status for k, r in results.items()} == {
        "protocol.t.known": XFAIL,
        "protocol.t.fixed": XPASS,
        "protocol.t.flaky": PASS,
        "protocol.t.skipped": SKIP,
        "protocol.t.broken": FAIL,
    }
    assert results["protocol.t.flaky"].attempts == 2
    assert executor.calls.get("protocol.t.skipped") is None
    assert not verdict(list(results.values()))
    updated = expectations.updated(list(results.values()))
    assert updated.cases["protocol.t.broken"].status == "xfail"
    assert "protocol.t.fixed" not in updated.cases
    assert updated.cases["protocol.t.known"].reason == "known bug"
    updated.save(path)
    again = run_suite(executor, cases, Expectations.load(path), reruns=2)
    assert verdict(again)


def test_missing_capability_skips_with_reason() -> None:
    executor = _Scripted({"protocol.t.needs": ["fail"]}, {"mux"})
    result = run_case(executor, _cases("needs", requires=["logprobs"])[0], Expectations())
    assert result.status == SKIP and "logprobs" in result.message


def test_expectation_files_need_reasons(tmp_path: Path) -> None:
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"cases": {"protocol.t.a": {"status": "xfail"}}}))
    with pytest.raises(ExpectationsError, match="reason"):
        Expectations.load(path)


def test_reporters(tmp_path: Path) -> None:
    results = [
        Result("protocol.a.one", "protocol", "a", "must", "protocol.md §1", PASS),
        Result("protocol.a.two", "protocol", "a", "must", "protocol.md §1", FAIL, "boom"),
        Result("protocol.b.three", "protocol", "b", "should", "protocol.md §2", SKIP, "lacks x"),
    ]
    write_json(results, tmp_path / "r.json")
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["ok"] is False and [c["status"] for c in document["cases"]] == [
        "pass",
        "fail",
        "skip",
    ]
    write_junit(results, tmp_path / "r.xml", "suite")
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "1"
    out = io.StringIO()
    summary_table(results, out)
    assert re.search(r"protocol\.a\s+1\s+1", out.getvalue())
    assert "FAIL protocol.a.two" in out.getvalue()


# -- HTTP helpers ------------------------------------------------------------------------
def test_sse_parsing() -> None:
    body = b'event: ping\ndata: {"type":"ping"}\n\n: keepalive\n\ndata: a\ndata: b\n\n'
    assert sse_events(body) == [
        {"event": "ping", "data": '{"type":"ping"}'},
        {"comment": ": keepalive"},
        {"data": "a\nb"},
    ]


def _metrics_response(text: str) -> Response:
    return Response(200, {}, [], text.encode())


def test_metrics_check_catches_inconsistent_histograms() -> None:
    good = (
        '# HELP h x\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\n'
        "h_sum 0.5\nh_count 2\n"
    )
    _metrics({"required": ["h"]}, _metrics_response(good))
    with pytest.raises(CheckFailure, match="cumulative"):
        _metrics({}, _metrics_response(good.replace('le="1"} 1', 'le="1"} 3')))
    with pytest.raises(CheckFailure, match="missing"):
        _metrics({"required": ["other"]}, _metrics_response(good))
    with pytest.raises(CheckFailure, match="sample"):
        _metrics({}, _metrics_response("not a metric line at all\n"))


def test_every_error_code_and_line_kind_is_asserted_by_a_case() -> None:
    protocol = json.loads(spec_path("protocol.json").read_text(encoding="utf-8"))
    text = json.dumps([c.raw for c in load_cases("protocol")])
    missing_codes = [e["code"] for e in protocol["errors"] if e["code"] not in text]
    assert missing_codes == []
    core = {"READY", "STAT", "ACCEPT", "DATA", "ECHO", "TOPK", "DONE", "ERROR", "PROF", "END"}
    kinds = {line["kind"] for line in protocol["lines"] if line["direction"] == "engine"}
    assert core <= kinds
    assert [k for k in sorted(core) if k not in text and k != "END"] == []


def test_bodies_are_matched_to_their_schemas() -> None:
    from colibri.conformance.http_runner import HttpRunner, _schema_registry, body_schema

    runner = HttpRunner.__new__(HttpRunner)
    runner._schemas = _schema_registry()
    bad = Response(200, {"content-type": "application/json"}, [], b'{"object": "chat.completion"}')
    assert body_schema("POST", "/v1/chat/completions", bad) == "chat_completion.json"
    with pytest.raises(CheckFailure, match="required"):
        runner._schema({"schema": "chat_completion.json"}, bad)
    body = b'{"type":"error","error":{"type":"authentication_error","message":"y"}}'
    error = Response(401, {}, [], body)
    assert body_schema("POST", "/v1/messages", error) == "anthropic_error.json"
    runner._schema({"schema": "anthropic_error.json"}, error)
    assert body_schema("GET", "/v1/models/some-id", _metrics_response("{}")) == "model.json"
    assert body_schema("GET", "/static.js", _metrics_response("x")) is None


def test_schema_check_fails_when_there_is_nothing_to_validate() -> None:
    from colibri.conformance.http_runner import HttpRunner, _schema_registry

    runner = HttpRunner.__new__(HttpRunner)
    runner._schemas = _schema_registry()
    sse = {"content-type": "text/event-stream"}
    only_done = Response(200, sse, [], b"data: [DONE]\n\n")
    with pytest.raises(CheckFailure, match="no documents to validate"):
        runner._schema({"schema": "chat_completion_chunk.json"}, only_done)
    ping = Response(200, sse, [], b'event: ping\ndata: {"type": "ping"}\n\n')
    with pytest.raises(CheckFailure, match="no documents to validate.*message_stop"):
        runner._schema({"schema": "message_stream_event.json", "event": "message_stop"}, ping)


def test_logprobs_check_fails_without_data_frames() -> None:
    from colibri.conformance.frames import Frame
    from colibri.conformance.prompts import PromptCodec
    from colibri.conformance.protocol_checks import SessionView, _logprobs

    frames = [Frame(0, "ACCEPT", b"ACCEPT 1 0"), Frame(1, "DONE", b"DONE 1 0 0 0 0 0 0")]
    views = {"main": SessionView("main", frames, [], True, {})}
    codec = PromptCodec(ids_mode=True, vocab=256, oracle={})
    with pytest.raises(CheckFailure, match="no DATA frames for request 1"):
        _logprobs(views, {"id": 1, "k": 2}, codec)


def test_an_engine_without_a_stats_dump_skips_the_stats_cases() -> None:
    """No handshake line announces the STATS dump: the probe asks for one and looks. The
    engine tests' fake engine never writes it, so its stats cases skip instead of failing."""
    import shlex
    import sys

    from colibri.conformance.engine import EngineTarget, probe_capabilities

    support = Path(__file__).parents[1] / "support" / "conformance_support"
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(support / 'mux_fake_model.py'))}"
    target = EngineTarget.from_command(command, support / "fake-model")
    found, _ = probe_capabilities(target, 10.0)
    assert "echo_at" in found and "stats_dump" not in found
    executor = _Scripted({}, {"mux", "logprobs", "ids"} | found)
    stats = [c for c in load_cases("protocol") if c.area == "stats"]
    results = [run_case(executor, case, Expectations()) for case in stats]
    assert stats and all(r.status == SKIP and "stats_dump" in r.message for r in results)


def test_file_expectations_stay_inside_the_state_dir(tmp_path: Path) -> None:
    from colibri.conformance.grammar import load_grammar
    from colibri.conformance.prompts import PromptCodec
    from colibri.conformance.protocol_checks import SessionView, check_protocol

    (tmp_path / "dump.txt").write_text("x")
    views = {"main": SessionView("main", [], [0], False, {}, tmp_path)}
    codec = PromptCodec(ids_mode=True, vocab=64, oracle={})

    def check(**exp: Any) -> None:
        case = dataclasses.replace(_cases("file")[0], expect=[{"type": "file", **exp}])
        check_protocol(case, views, load_grammar(spec_path("protocol.json")), codec)

    check(path="dump.txt", size=1)
    check(path="other.txt", exists=False)
    for bad in ({"path": "../dump.txt"}, {"path": "dump.txt", "size": 0},
                {"path": "dump.txt", "exists": False}, {"path": "missing.txt"}):
        with pytest.raises(CheckFailure):
            check(**bad)
