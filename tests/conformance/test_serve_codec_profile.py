"""The serve_codec profile: colibri's family-engine dialect (spec/protocol.md §5).

The serve_codec double (tests/support/conformance_support/serve_codec_double.py, started
through mutant_proxy.py: the reference engine on glm5-tiny behind a proxy that speaks the
dialect) is declared in a target description, must pass every serve_codec case and is reported
under the profile; each of its mutants must be caught by the case written for it, with that
case's own message. That the reference engine, which speaks the GLM dialect, is reported
lacking the dialect rather than failing it is checked on its full run
(test_conformance_suite.py).
"""

from __future__ import annotations

import functools
import io
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from colibri.conformance.capabilities import (
    CODEC,
    CODEC_WIRE,
    PROFILES,
    SEED_CORE,
    SERVE_CODEC,
)
from colibri.conformance.cases import load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.frames import FrameSplitter
from colibri.conformance.outcome import FAIL, PASS, SKIP, XFAIL, Result
from colibri.conformance.profile_report import profile_counts, write_profile_summary
from colibri.conformance.prompts import Payload, submit_frame
from colibri.conformance.protocol_runner import ProtocolRunner
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.report import write_json
from colibri.conformance.request_ids import names
from colibri.conformance.runner import run_parallel, run_suite
from colibri.conformance.target_file import TargetDescription, TargetFileError

from colibri.resources import fixture_model_dir

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
PYTHON = shlex.quote(sys.executable)
PROXY = f"{PYTHON} {shlex.quote(str(SUPPORT / 'mutant_proxy.py'))}"
ENGINE = f"{PYTHON} -m colibri engine"
MODEL = fixture_model_dir("glm5-tiny")
CASES = [c for c in load_cases("protocol") if c.profile == SERVE_CODEC]
#: What the double's target description says: the dialect and every switch of its profile.
DESCRIPTION = {"name": "serve_codec double", "command": f"{PROXY} serve_codec {ENGINE}",
               "capabilities": sorted(CODEC)}

#: mutant -> (the case that must catch it, what that case's failure says).
KILLERS = {
    "serve_codec_numeric_ids": (
        "protocol.serve_codec.string-ids",
        "timed out after 3s waiting for DONE or ERROR for request req-7",
    ),
    "serve_codec_done_2f": (
        "protocol.serve_codec.done-format",
        "does not match /DONE d-1 STAT [0-9]+ [0-9]+\\.[0-9]{3} ",
    ),
    "serve_codec_unknown_refused": (
        "protocol.serve_codec.unknown-commands-ignored",
        "expected 0 frame(s) kind=ERROR, got 6: ERROR 0 BAD_REQUEST",
    ),
    "serve_codec_long_ids": (
        "protocol.serve_codec.id-length-limit",
        "expected 1 frame(s) kind=ACCEPT, got 2: ACCEPT " + "x" * 64,
    ),
}


@functools.cache
def _double() -> tuple[ProtocolRunner, list[Result]]:
    description = TargetDescription.from_document(DESCRIPTION, SUPPORT, "double.target.json")
    runner = protocol_runner(ENGINE, MODEL, description=description, timeout=30.0)
    capabilities = set(runner.capabilities)
    results = run_parallel(runner, CASES, Expectations(), reruns=0, jobs=2)
    runner.capabilities = capabilities
    return runner, results


def _mutant(mode: str, case_id: str) -> Result:
    # The capabilities are the double's, so no probe runs; a mutant may withhold an answer,
    # so a short wait keeps the test quick.
    runner = protocol_runner(f"{PROXY} {mode} {ENGINE}", MODEL, prompts="bytes", timeout=3.0,
                             capabilities=_double()[0].capabilities)
    [result] = run_suite(runner, [c for c in CASES if c.id == case_id], Expectations(),
                         reruns=0)
    return result


@functools.cache
def _mutants() -> dict[str, Result]:
    with ThreadPoolExecutor(max_workers=len(KILLERS)) as pool:
        futures = {m: pool.submit(_mutant, m, case) for m, (case, _) in KILLERS.items()}
        return {m: future.result() for m, future in futures.items()}


def test_the_profile_is_the_dialect_and_each_switch_is_some_cases_need() -> None:
    assert PROFILES[SERVE_CODEC] == CODEC and CODEC_WIRE in CODEC
    needed = {name for case in CASES for name in case.requires}
    assert needed == CODEC, sorted(CODEC - needed)
    assert all(CODEC_WIRE in case.requires for case in CASES)
    # A case of the dialect is in no other profile: its seed clause is not asked for either.
    everything = load_cases("protocol")
    assert [c.id for c in everything if c.requires & CODEC] == [c.id for c in CASES]


def test_a_target_description_may_declare_the_dialect_but_not_core() -> None:
    description = TargetDescription.from_document(DESCRIPTION, SUPPORT, "t.json")
    assert description.capabilities == CODEC
    with pytest.raises(TargetFileError, match="not protocol extensions or dialect switches"):
        TargetDescription.from_document({"command": "x", "capabilities": ["codec", "mux"]},
                                        SUPPORT, "t.json")


def test_a_submit_step_is_framed_the_dialects_way() -> None:
    payload = Payload(b"Hello", None, False)
    codec = submit_frame("req-7", 1, payload, 4, 0.0, 1.0, {"logprobs": 1},
                         keys_after_top_p=True)
    assert codec == b"SUBMIT req-7 1 5 4 0 1 logprobs=1\nHello\n"
    glm = submit_frame(7, 1, payload, 4, 0.0, 1.0, {"logprobs": 1})
    assert glm == b"SUBMIT 7 1 5 4 0 1 0 logprobs=1\nHello\n"


def test_ids_are_compared_the_way_their_dialect_reads_them() -> None:
    [frame] = FrameSplitter(seen_ready=True).feed(b"ACCEPT 007 3\n")
    assert names(frame, 7)  # the GLM dialect reads a number: 007 is 7
    assert names(frame, "007") and not names(frame, "7")  # serve_codec: the bytes
    [untagged] = FrameSplitter(seen_ready=True).feed(b"HITS 007 3\n")
    assert not names(untagged, "007")


def test_the_double_is_driven_by_its_declaration_and_probes_alone() -> None:
    runner, _ = _double()
    # No CAPS line behind the double (it drops the GLM engine's): the dialect is what the
    # description declared, ACCEPT, STOP and PROF what the safe probe saw.
    facts = {"text_prompts", "byte_tokenizer", "oracle"}
    assert runner.capabilities == SEED_CORE | CODEC | facts | {"accept", "stop", "prof"}


def test_the_double_passes_every_serve_codec_case() -> None:
    _, results = _double()
    verdicts = {r.case_id: (r.status, r.message) for r in results}
    assert len(verdicts) == len(CASES) >= 15
    assert {k: v for k, v in verdicts.items() if v[0] != PASS} == {}


def test_the_profiles_table_reports_the_dialect(tmp_path: Path) -> None:
    _, results = _double()
    counts = profile_counts(results)
    assert counts[SERVE_CODEC] == {PASS: len(CASES), "fail": 0, XFAIL: 0, SKIP: 0}
    # A sibling of core, not an extension of it: neither of the nested rows counts its cases.
    assert sum(counts["core"].values()) == sum(counts["colibri"].values()) == 0
    table = io.StringIO()
    write_profile_summary(results, table)
    rows = {line.split()[0]: line.split()[1:] for line in table.getvalue().splitlines()
            if line.startswith("  ")}
    assert rows[SERVE_CODEC] == [str(len(CASES)), "0", "0", "0"]  # pass fail xfail skip
    assert "fails an extension" not in table.getvalue()
    write_json(results, tmp_path / "r.json")
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["profiles"][SERVE_CODEC][PASS] == len(CASES)
    assert {c["profile"] for c in document["cases"]} == {SERVE_CODEC}


@pytest.mark.parametrize("mode", sorted(KILLERS))
def test_each_mutant_of_the_double_is_caught_by_its_case(mode: str) -> None:
    case_id, message = KILLERS[mode]
    result = _mutants()[mode]
    assert (result.case_id, result.status) == (case_id, FAIL)
    assert message in result.message, result.message
