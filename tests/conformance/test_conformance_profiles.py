"""Profiles, capabilities and what a report says about a target that is not ours.

The seed-core double (tests/support/conformance_support/mutant_proxy.py, mode ``seed_core``:
the reference engine on glm5-tiny behind a proxy that speaks only serve_protocol.md) must
pass every `core` case and be reported as lacking each extension and the serve_codec dialect,
never as failing them. It runs once (core cases only; the `colibri` and `serve_codec` cases
skip without starting an engine).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from colibri.conformance.byte_tokenizer import byte_of_ids, tokenizer_json
from colibri.conformance.capabilities import (
    CODEC,
    COLIBRI,
    CORE,
    EXTENSIONS,
    REVISION_1,
    SEED_CORE,
    SERVE_CODEC,
    from_caps,
    kinds_text,
    pattern_for,
)
from colibri.conformance.cases import load_cases
from colibri.conformance.engine import EngineTarget
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import PASS, SKIP, Result
from colibri.conformance.probe_turn import probe_turn
from colibri.conformance.profile_report import lacking, profile_counts
from colibri.conformance.prompts import PromptCodec
from colibri.conformance.protocol_runner import ProtocolRunner
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.report import write_json, write_junit
from colibri.conformance.runner import run_parallel
from colibri.conformance.target_file import TargetDescription, TargetFileError

from colibri.resources import fixture_model_dir
from colibri.text.tokenizer import Tokenizer

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
PYTHON = shlex.quote(sys.executable)
PROXY = f"{PYTHON} {shlex.quote(str(SUPPORT / 'mutant_proxy.py'))}"
SEED_DOUBLE = f"{PROXY} seed_core {PYTHON} -m colibri engine"
FAKE_ENGINE = f"{PYTHON} {shlex.quote(str(SUPPORT / 'mux_fake_model.py'))}"
CASES = load_cases("protocol")


@functools.cache
def _double() -> tuple[ProtocolRunner, list[Result]]:
    runner = protocol_runner(SEED_DOUBLE, fixture_model_dir("glm5-tiny"), timeout=30.0)
    capabilities = set(runner.capabilities)
    results = run_parallel(runner, CASES, Expectations(), reruns=0, jobs=2)
    runner.capabilities = capabilities
    return runner, results


def test_every_case_names_capabilities_and_core_cases_their_seed_clause() -> None:
    core = [c for c in CASES if c.profile == CORE]
    assert core and all(c.seed.startswith("serve_protocol.md") for c in core)
    # Every extension is what some case needs; otherwise it could never be reported lacking.
    needed = {name for c in CASES for name in c.requires}
    assert EXTENSIONS <= needed, sorted(EXTENSIONS - needed)
    assert all(c.profile == COLIBRI for c in CASES if c.requires & EXTENSIONS)


def test_frame_patterns_drop_the_kinds_of_extensions_a_target_lacks() -> None:
    turn = "ACCEPT( DATA)+( PERF)? DONE"
    seed = set(SEED_CORE)
    assert pattern_for(turn, seed) == "( DATA)+( PERF)? DONE"
    assert pattern_for(turn, seed | {"accept"}) == " " + turn
    assert kinds_text(["DATA", "PERF", "DONE"]) == " DATA PERF DONE"
    # Without the extension its frame must not be there either: the pattern no longer has it.
    import re

    assert not re.fullmatch(pattern_for(turn, seed), kinds_text(["ACCEPT", "DATA", "DONE"]))
    assert pattern_for(".* PROF DONE", seed) == " .* DONE"


def test_caps_claims_revision_1_only_with_proto_and_keyed_extensions_only_when_non_zero() -> None:
    announced = from_caps({"proto": "1", "logprobs": "32", "ids": "1", "mtp": "0"})
    assert REVISION_1 <= announced and {"logprobs", "ids"} <= announced
    assert "mtp" not in announced
    assert from_caps({"ids": "1"}) == {"caps", "ids"}


def test_probe_finds_accept_stop_and_prof_on_an_engine_that_has_them() -> None:
    model = SUPPORT / "fake-model"
    found = probe_turn(EngineTarget.from_command(FAKE_ENGINE, model),
                       PromptCodec.for_model(model, "ids"), 10.0)
    assert found == {"accept", "stop", "prof"}


def test_seed_core_double_is_probed_without_assuming_extensions() -> None:
    runner, _ = _double()
    assert runner.capabilities == SEED_CORE | {"text_prompts", "byte_tokenizer", "oracle"}


def test_seed_core_double_passes_core_with_no_must_failure() -> None:
    _, results = _double()
    core = {r.case_id: (r.status, r.message) for r in results if r.profile == CORE}
    assert core and {k: v for k, v in core.items() if v[0] != PASS} == {}
    assert "protocol.golden.oracle-greedy-bytes" in core  # model math judged through bytes


def test_seed_core_double_is_reported_lacking_each_extension_never_failing() -> None:
    _, results = _double()
    colibri = [r for r in results if r.profile == COLIBRI]
    assert colibri and all(r.status == SKIP and r.lacks for r in colibri)
    codec = [r for r in results if r.profile == SERVE_CODEC]
    assert codec and all(r.status == SKIP and r.lacks for r in codec)
    assert set(lacking(results)) == EXTENSIONS | CODEC
    counts = profile_counts(results)
    assert counts[CORE]["fail"] == 0 and counts[CORE][PASS] == len(
        [c for c in CASES if c.profile == CORE]
    )
    assert counts[COLIBRI][SKIP] == len(colibri)
    assert counts[SERVE_CODEC] == {PASS: 0, "fail": 0, "xfail": 0, SKIP: len(codec)}


def test_reports_carry_suite_and_spec_versions_and_each_case_profile(tmp_path: Path) -> None:
    _, results = _double()
    write_json(results, tmp_path / "r.json")
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["suite"] == "protocol" and "+cases." in document["suite_version"]
    assert document["spec"]["protocol.md"] == "revision 1"
    assert document["profiles"][CORE]["fail"] == 0
    by_id = {c["id"]: c for c in document["cases"]}
    assert by_id["protocol.stop.ends-early"]["lacks"] == ["stop"]
    assert by_id["protocol.frames.turn-order"]["profile"] == CORE
    write_junit(results, tmp_path / "r.xml", "colibri-conformance-protocol")
    root = ET.parse(tmp_path / "r.xml").getroot()
    found = root.find("testsuite/properties")
    assert found is not None
    props = {p.get("name"): p.get("value") for p in found}
    assert props["suite_version"] == document["suite_version"]
    assert props["spec:protocol.md"] == "revision 1"


def test_byte_level_tokenizer_is_one_token_per_byte_and_spells_the_oracle_in_ascii(
    tmp_path: Path,
) -> None:
    codec = PromptCodec.for_model(fixture_model_dir("glm5-tiny"), "ids")
    byte_of = byte_of_ids(codec.vocab, codec.oracle)
    assert sorted(byte_of) == list(range(256))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tokenizer_json(byte_of)))
    tokenizer = Tokenizer.from_file(path)
    text = bytes(range(1, 128)).decode("ascii") + "Tell me about b\u00efrds \u2603"
    assert tokenizer.encode(text) == [byte_of.index(b) for b in text.encode()]
    oracle = codec.with_bytes(byte_of, tmp_path).spell(codec.oracle_ids("full_ids"))
    assert all(0x21 <= b < 0x7F for b in oracle)


def test_target_description_is_validated_and_snap_state_gets_a_private_model_dir(
    tmp_path: Path,
) -> None:
    (tmp_path / "engine").write_text("")
    description = TargetDescription.from_document(
        {"command": "engine 64 16 16", "state_dir": "snap", "tokenizer": "byte-level",
         "capabilities": ["persistence"], "expectations": "known.json"},
        tmp_path, "t.json",
    )
    assert description.command.startswith(str(tmp_path / "engine"))
    assert description.expectations == tmp_path / "known.json"
    with pytest.raises(TargetFileError, match="tokenizer"):
        TargetDescription.from_document({"command": "x", "tokenizer": "sentencepiece"},
                                        tmp_path, "t.json")
    with pytest.raises(TargetFileError, match="not protocol extensions"):
        TargetDescription.from_document({"command": "x", "capabilities": ["mux"]},
                                        tmp_path, "t.json")
    model = fixture_model_dir("glm5-tiny")
    target = EngineTarget(["engine"], model, state_dir="snap")
    state = tmp_path / "state"
    state.mkdir()
    env = target.environment({}, state)
    assert env["SNAP"] == str(state)
    assert (state / "config.json").resolve() == (model / "config.json").resolve()


def test_pytest_plugin_runs_cases_inside_another_projects_pytest(tmp_path: Path) -> None:
    """The entry point loads the plugin into a plain pytest run of an unrelated directory."""
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
        "--colibri-engine-cmd", FAKE_ENGINE, "--colibri-model", str(SUPPORT / "fake-model"),
        "--colibri-cases", "protocol.frames.turn-order", "--colibri-cases",
        "protocol.golden.oracle-greedy-bytes", "--colibri-jobs", "1",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    # The fake model has no oracle: the golden case is skipped, naming what is missing.
    assert "1 passed, 1 skipped" in summary, done.stdout[-2000:]
    assert "target lacks: byte_tokenizer, oracle" in done.stdout
    quiet = subprocess.run(command[:6], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600, check=False)
    assert "no tests ran" in quiet.stdout  # inert without its options


def test_byte_level_target_uses_a_models_own_tokenizer() -> None:
    # glm.c always loads <SNAP>/tokenizer.json: a model that ships one needs no generated one.
    description = TargetDescription.from_document(
        {"command": SEED_DOUBLE, "tokenizer": "byte-level"}, SUPPORT, "t.json"
    )
    model = fixture_model_dir("glm5-chat-tiny")
    assert (model / "tokenizer.json").is_file()
    # capabilities given: no engine is started, only the payload form is decided.
    own = protocol_runner(SEED_DOUBLE, model, description=description, capabilities=set())
    assert not own.codec.ids_mode and own.codec.byte_of is None
    assert own.target.model_dir == model
    tiny = protocol_runner(SEED_DOUBLE, fixture_model_dir("glm5-tiny"),
                           description=description, capabilities=set())
    assert tiny.codec.byte_of is not None  # no tokenizer: the generated byte-level one


def test_shipped_c_engine_target_description_is_valid() -> None:
    path = Path(__file__).parents[2] / "fixtures" / "targets" / "colibri-glm-c.target.json"
    description = TargetDescription.load(path)
    assert (description.state_dir, description.tokenizer) == ("snap", "byte-level")
    assert description.capabilities == frozenset()
