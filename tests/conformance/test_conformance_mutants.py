"""The suite has teeth: each deliberately broken engine is caught by the named cases.

Every mutant wraps the reference mux engine (on the engine tests' fake model, so a start
takes well under a second) in tests/support/conformance_support/mutant_proxy.py. For each mutant the
test runs the cases that must catch it and asserts each one FAILS with the message of the check
meant to catch it, on an engine that started (a timeout counts only for a mutant whose point is
a missing frame); the transparent proxy passes the same cases, so the failures come from the
mutation, not from the proxy. All mutants run side by side, once, the first time a verdict is
needed.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from colibri.conformance.cases import load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import FAIL, PASS, Result
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_suite

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
ENGINE = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'mux_fake_model.py'))}"
PROXY = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'mutant_proxy.py'))}"
MODEL = SUPPORT / "fake-model"

#: mutant -> {case that must catch it: what that case's check must say (a regex)}. A mutant
#: counts as caught only by these cases, failing with these messages: a crash, an engine that
#: did not start or another check failing would be a catch for the wrong reason.
KILLERS: dict[str, dict[str, str]] = {
    "drop_accept": {
        "protocol.frames.turn-order": r"frame order of request 1 /ACCEPT.* does not match: 'DATA",
        "protocol.frames.accept-format": r"no frame #0 matching id=1 kind=ACCEPT \(found 0\)",
    },
    "misformat_done": {
        "protocol.frames.done-format": r"'DONE 1 STAT [0-9]+ [0-9.]+\.[0-9]{3} .*' does not match",
    },
    "wrong_error_code": {
        "protocol.validation.slot-busy": r"expected 'ERROR 2 SLOT_BUSY', got 'ERROR 2 "
                                         r"DUPLICATE_ID'",
    },
    # The refused SUBMIT's payload is not drained: the engine reads it as a command, and the
    # ERROR the case waits for never comes (a missing frame: the timeout is the catch).
    "no_drain_rejected": {
        "protocol.validation.temperature-above-2": r"timed out after 3s waiting for 1 x ERROR",
    },
    "data_out_of_slot_order": {
        "protocol.batching.interleave-slot-order": r"DATA order while batched is \[2, 1, 3",
    },
    "broken_prefix_reuse": {
        "protocol.prefix.extend-equals-cold": r"stream differs from reference at frame",
    },
    "leak_cancelled": {
        "protocol.cancel.acknowledged": r"/ACCEPT\( DATA\)\+ ERROR/ does not match: '.*ERROR DATA'",
    },
    "cancel_as_done": {
        "protocol.cancel.acknowledged": r"/ACCEPT\( DATA\)\+ ERROR/ does not match: '.* DONE'",
    },
    "stop_as_cancel": {
        "protocol.stop.ends-with-done": r"/ACCEPT\( DATA\)\+\( PERF\)\? DONE/ does not match: "
                                        r"'.* ERROR'",
    },
    "no_eof_drain": {
        # Killed at EOF: request 1 ends without DONE, after whatever it had sent by then
        # (nothing, or its ACCEPT and some DATA when the engine was quicker than the EOF).
        "protocol.eof.drains-in-flight": r"frame order of request 1 /.*/ does not match: "
                                         r"'(ACCEPT( DATA)*)?'$",
    },
    "echo_off_by_one": {
        "protocol.logprobs.echo-first-position": r"'ECHO 1 [0-9]+ 1 nan 0 .*' does not match",
        "protocol.logprobs.channel-rules": r"ECHO positions \[1, 2, 3, .*\] are not 0\.\.",
    },
    "wrong_context_limit": {
        "protocol.validation.context-exceeded": r"'ERROR 18 CONTEXT_EXCEEDED [0-9]+ 63' does not "
                                                r"match",
    },
    "empty_prompt_code": {
        "protocol.validation.empty-prompt": r"expected 'ERROR 13 EMPTY_PROMPT', got 'ERROR 13 "
                                            r"BAD_REQUEST'",
    },
    "tail_on_plain_data": {
        "protocol.frames.data-plain-without-logprobs": r"'DATA 1 [0-9]+ -0\.5[0-9]* .*' does not "
                                                       r"match",
    },
    "stat_format": {
        "protocol.handshake.stat-format": r"'STAT 0 0\.00 0\.0 [0-9]+\.[0-9]' does not match",
    },
    # What fields mean together (spec/cases/protocol/INVARIANTS.md), by class of invariant.
    # length vs declared dimension
    "emap_short": {
        "protocol.invariants.telemetry-dimensions": r"EMAP 2x8 declares 16 experts but carries 15 "
                                                    r"bytes of hex",
    },
    # sum vs total
    "tiers_miscount": {
        "protocol.invariants.telemetry-dimensions": r"TIERS [0-9+]+ = 17 experts, EMAP has 2x8 "
                                                    r"= 16",
    },
    "prof_miscount": {
        "protocol.invariants.turn-accounting": r"PROF counts [0-9]+ prompt / 6 completion tokens, "
                                               r"ACCEPT/DONE say [0-9]+ / 5",
    },
    "length_flag_lies": {
        "protocol.invariants.turn-accounting": r"length_limited 0 with 5 of 5 tokens",
    },
    # count vs frames actually sent
    "drop_second_data": {
        "protocol.frames.done-counts": r"relation emitted == #DATA failed: ([0-9]+) == (?!\1)",
        "protocol.invariants.turn-accounting": r"DONE emitted ([0-9]+), (?!\1 )[0-9]+ DATA sent",
    },
    "caps_slots_lie": {
        "protocol.invariants.caps": r"CAPS disagrees with the configuration .*'slots': \(4, 3\)",
    },
    # ordering
    "topk_unsorted": {
        "protocol.invariants.topk-frames": r"TOPK is not by descending logprob",
    },
    "block_out_of_order": {
        "protocol.invariants.turn-end-block": r"DONE is preceded by .* PROF PERF, not .* PERF PROF",
    },
    # range
    "hit_pct_over_100": {
        "protocol.invariants.value-ranges": r"hit % 250\.0 outside 0\.\.100",
    },
    # monotonic sequence
    "heat_decays": {
        "protocol.invariants.heat-accumulates": r"EMAP heat fell for expert cells",
    },
    # cross-frame agreement within a turn
    "echo_payload_shift": {
        "protocol.invariants.logprobs-echo": r"ECHO payloads .* are not the ids sent",
    },
    # across turns (and across a restart)
    "accept_counts_prefill": {
        "protocol.prefix.warm-accept-counts-prompt": r"relation warm ACCEPT nt == cold ACCEPT nt "
                                                     r"failed",
    },
    "heat_forgotten": {
        "protocol.invariants.heat-survives-restart": r"after the restart expert cell [0-9]+ has "
                                                     r"heat 0",
    },
    # a stopped turn ends early, and nothing else answers the STOP
    "stop_stray_error": {
        "protocol.stop.ends-early": r"unexpected frame session=stopped kind=ERROR: "
                                    r"'ERROR 0 BAD_REQUEST'",
        "protocol.stop.ends-with-done": r"unexpected frame kind=ERROR: 'ERROR 0 BAD_REQUEST'",
    },
    "stop_ignored": {
        "protocol.stop.ends-early": r"relation STOP gives length_limited 0 failed: 1 == 0",
    },
    # CANCEL removes the request: an engine that lets it decode on sends no CANCELLED
    "cancel_ignored": {
        "protocol.cancel.acknowledged": r"/ACCEPT\( DATA\)\+ ERROR/ does not match: "
                                        r"'ACCEPT( DATA)+",
    },
    # the seed's turn-end telemetry, order free: a missing line
    "no_entropy": {
        "protocol.frames.seed-telemetry-before-done": r"the seed's telemetry block lacks ENTROPY",
    },
}
#: The mutants whose point is a frame that never comes: only for them is a timeout the catch.
MISSING_FRAME = frozenset({"no_drain_rejected"})
#: Each class of invariant INVARIANTS.md names has at least one mutant above.
CLASSES: dict[str, list[str]] = {
    "length-vs-dimension": ["emap_short"],
    "sum-vs-total": ["tiers_miscount", "prof_miscount", "length_flag_lies"],
    "count-vs-frames": ["drop_second_data", "caps_slots_lie"],
    "ordering": ["topk_unsorted", "block_out_of_order", "data_out_of_slot_order"],
    "range": ["hit_pct_over_100"],
    "monotonic-sequence": ["heat_decays", "echo_off_by_one"],
    "cross-frame-within-turn": ["echo_payload_shift", "stop_stray_error", "stop_ignored"],
    "across-turns": ["accept_counts_prefill", "heat_forgotten", "broken_prefix_reuse"],
}
EVERY_KILLER = sorted({case for cases in KILLERS.values() for case in cases})


@functools.cache
def _proxy_mutants() -> frozenset[str]:
    """The names mutant_proxy.py accepts (read from the script, which imports its siblings)."""
    sys.path.insert(0, str(SUPPORT))
    try:
        spec = importlib.util.spec_from_file_location("mutant_proxy", SUPPORT / "mutant_proxy.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SUPPORT))
    return frozenset(module.MUTANTS)


def _run(mutant: str, case_ids: list[str], capabilities: frozenset[str]) -> dict[str, Result]:
    # A name the proxy does not know makes it print its usage and exit: every case would
    # "fail", so it is the test's error, never a catch.
    if mutant not in _proxy_mutants():
        raise ValueError(f"mutant_proxy.py knows no mutant {mutant!r}")
    # A mutant may make the engine withhold an answer; a short wait keeps the test quick.
    timeout = 10.0 if mutant == "none" else 3.0
    runner = protocol_runner(
        f"{PROXY} {mutant} {ENGINE}", MODEL, timeout=timeout, capabilities=set(capabilities)
    )
    cases = [c for c in load_cases("protocol") if c.id in case_ids]
    assert sorted(c.id for c in cases) == sorted(set(case_ids)), "a killer case was renamed"
    return {r.case_id: r for r in run_suite(runner, cases, Expectations(), reruns=0)}


@functools.cache
def _results() -> dict[str, dict[str, Result]]:
    capabilities = frozenset(protocol_runner(ENGINE, MODEL, timeout=10.0).capabilities)
    plan = {"none": EVERY_KILLER, **{m: sorted(cases) for m, cases in KILLERS.items()}}
    # Most mutant runs wait on a withheld answer or a 3 s timeout, not on the CPU: run many at once.
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {m: pool.submit(_run, m, ids, capabilities) for m, ids in plan.items()}
        return {m: future.result() for m, future in futures.items()}


def caught_for_the_right_reason(mutant: str, results: dict[str, Result]) -> list[str]:
    """What is wrong with how ``mutant`` was caught (empty: each named case failed with its
    check's message, on an engine that started, and a timeout only for a missing frame)."""
    wrong = []
    for case, message in KILLERS[mutant].items():
        result = results[case]
        if result.status != FAIL:
            wrong.append(f"{case}: {result.status}, not fail")
        elif "engine did not start" in result.message:
            wrong.append(f"{case}: the engine did not start ({result.message})")
        elif "timed out" in result.message and mutant not in MISSING_FRAME:
            wrong.append(f"{case}: caught only by a timeout ({result.message})")
        elif not re.search(message, result.message):
            wrong.append(f"{case}: failed for another reason: {result.message!r}")
    return wrong


def test_at_least_twelve_mutants() -> None:
    assert len(KILLERS) >= 12


def test_every_invariant_class_has_a_mutant() -> None:
    assert all(CLASSES.values()) and {m for ms in CLASSES.values() for m in ms} <= set(KILLERS)


def test_every_mutant_is_one_the_proxy_knows() -> None:
    assert set(KILLERS) <= _proxy_mutants()
    with pytest.raises(ValueError, match="knows no mutant 'no_such_mutant'"):
        _run("no_such_mutant", EVERY_KILLER[:1], frozenset())


def test_transparent_proxy_passes_every_killer_case() -> None:
    results = _results()["none"]
    assert {case: r.status for case, r in results.items()} == dict.fromkeys(EVERY_KILLER, PASS)


@pytest.mark.parametrize("mutant", sorted(KILLERS))
def test_mutant_is_caught_by_its_cases_for_the_right_reason(mutant: str) -> None:
    assert caught_for_the_right_reason(mutant, _results()[mutant]) == []


def test_a_catch_for_the_wrong_reason_is_not_a_catch() -> None:
    def failed(message: str) -> Result:
        return Result("protocol.validation.slot-busy", "protocol", "validation", "must", "",
                      FAIL, message)

    case = "protocol.validation.slot-busy"
    right = failed("expect[0] frame: expected 'ERROR 2 SLOT_BUSY', got 'ERROR 2 DUPLICATE_ID'")
    assert caught_for_the_right_reason("wrong_error_code", {case: right}) == []
    for message in ("engine did not start: exited with 2",
                    "session main step 1 (await): timed out after 3s waiting for 1 x ERROR",
                    "expect[0] frame: expected 'ERROR 2 SLOT_BUSY', got 'ERROR 2 BAD_REQUEST'"):
        assert caught_for_the_right_reason("wrong_error_code", {case: failed(message)})
