"""The out-of-core case (spec/cases/protocol/out_of_core.json) has teeth, and what it needs of
the harness works: a session's model copy with the routed experts in a shard apart, damaged
and mended in place under the running engine.

Both engines pass the case (the whole suite also runs it, test_conformance_suite.py); two
engines that do not answer ``ERROR <id> EXPERT_READ`` fail it, each with the message of the
check meant to catch it: one that maps its experts whatever RAM_GB says (the truncated shard
kills it) and one that names the failure with another code.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from colibri.conformance.cases import CaseError, load_cases, parse_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.expert_shard import (
    DENSE_SHARD,
    EXPERT_SHARD,
    INDEX,
    ExpertShard,
    split_experts,
)
from colibri.conformance.outcome import FAIL, PASS, Result
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_suite
from colibri.reference.safetensors import Checkpoint, read_all
from support.accelerated_support import needs_library

from colibri.resources import fixture_model_dir

CASE_ID = "protocol.out_of_core.expert-read-error"
ENGINE = f"{shlex.quote(sys.executable)} -m colibri engine"
TINY = fixture_model_dir("glm5-tiny")
#: An engine that names a failed expert read with another code: the ERROR line is rewritten,
#: every other byte passes through.
WRONG_CODE = r"""
import re, subprocess, sys, threading
engine = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
def pump():
    for chunk in iter(lambda: sys.stdin.buffer.read1(65536), b""):
        engine.stdin.write(chunk)
        engine.stdin.flush()
    engine.stdin.close()
threading.Thread(target=pump, daemon=True).start()
for line in engine.stdout:
    line = re.sub(rb"^ERROR (\S+) EXPERT_READ\n", rb"ERROR \1 BAD_REQUEST\n", line)
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
sys.exit(engine.wait())
"""


def _run(command: str) -> Result:
    runner = protocol_runner(command, TINY, timeout=30.0,
                             capabilities={"mux", "accept", "ids", "ram_budget"})
    cases = [c for c in load_cases("protocol") if c.id == CASE_ID]
    assert len(cases) == 1, "the out-of-core case was renamed"
    [result] = run_suite(runner, cases, Expectations(), reruns=0)
    return result


@pytest.mark.parametrize("backend", ["", pytest.param(" --accelerated", marks=needs_library)])
def test_both_engines_pass_the_case(backend: str) -> None:
    result = _run(ENGINE + backend)
    assert (result.status, result.message) == (PASS, "")


def test_an_engine_that_maps_its_experts_under_ram_gb_is_caught() -> None:
    """Without RAM_GB the reference maps its experts: touching the truncated shard kills it."""
    result = _run(f"env -u RAM_GB {ENGINE}")
    assert result.status == FAIL
    assert re.search(r"session damaged step 2 \(await\): engine output ended while waiting "
                     r"for DONE or ERROR for request 1; it was killed by SIG[A-Z]+",
                     result.message), result.message


def test_an_engine_that_answers_another_code_is_caught(tmp_path: Path) -> None:
    proxy = tmp_path / "wrong_code.py"
    proxy.write_text(WRONG_CODE, encoding="utf-8")
    result = _run(f"{shlex.quote(sys.executable)} {shlex.quote(str(proxy))} {ENGINE}")
    assert result.status == FAIL
    assert "expected 'ERROR 1 EXPERT_READ', got 'ERROR 1 BAD_REQUEST'" in result.message


def test_the_copy_holds_every_tensor_with_the_experts_in_a_shard_apart(tmp_path: Path) -> None:
    shard = split_experts(TINY, tmp_path / "model")
    assert shard == tmp_path / "model" / EXPERT_SHARD
    original = read_all(TINY / "model.safetensors")
    dense = read_all(tmp_path / "model" / DENSE_SHARD)
    experts = read_all(shard)
    assert experts and all(".mlp.experts." in name for name in experts)
    assert not any(".mlp.experts." in name for name in dense)
    assert sorted(dense | experts) == sorted(original)
    for name, array in (dense | experts).items():
        assert array.dtype == original[name].dtype and np.array_equal(array, original[name])
    weight_map = json.loads((tmp_path / "model" / INDEX).read_text())["weight_map"]
    assert {weight_map[n] for n in experts} == {EXPERT_SHARD}
    assert len(Checkpoint(tmp_path / "model").tensors) == len(original)
    # Everything else is the model's own file, linked.
    assert (tmp_path / "model" / "config.json").resolve() == (TINY / "config.json").resolve()


def test_damage_and_mend_happen_in_place(tmp_path: Path) -> None:
    path = split_experts(TINY, tmp_path / "model")
    whole = path.read_bytes()
    inode = path.stat().st_ino
    shard = ExpertShard(path, tmp_path / "backup")
    shard.truncate()
    header_end = 8 + int.from_bytes(whole[:8], "little")
    assert path.stat().st_size == header_end and path.stat().st_ino == inode
    shard.restore()
    assert path.read_bytes() == whole and path.stat().st_ino == inode


def _case(engine: dict[str, object]) -> dict[str, object]:
    return {"id": "protocol.x.damage", "suite": "protocol", "area": "x", "level": "must",
            "description": "damages the experts' shard", "clause": "protocol.md §2.4",
            "requires": ["ram_budget"], "engine": engine,
            "steps": [{"op": "truncate_experts"}, {"op": "restore_experts"}],
            "expect": [{"type": "grammar"}]}


def test_damage_steps_need_a_model_copy_and_an_engine_of_their_own() -> None:
    with pytest.raises(CaseError, match=r"truncate_experts.* without engine\.experts_apart"):
        parse_cases(_case({"kv_slots": 1}), "x.json")
    [case] = parse_cases(_case({"experts_apart": True}), "x.json")
    assert case.fresh
    with pytest.raises(CaseError, match="experts_apart"):
        parse_cases(_case({"experts_apart": "yes"}), "x.json")
