"""The suite has teeth: each deliberately broken engine is caught by the named cases.

Every mutant wraps the reference mux engine (on the engine tests' fake model, so a start
takes well under a second) in tests/support/conformance_support/mutant_proxy.py. For each mutant the
test runs the cases that must catch it and asserts each one FAILS; the transparent proxy
passes the same cases, so the failures come from the mutation, not from the proxy. All
mutants run side by side, once, the first time a verdict is needed.
"""

from __future__ import annotations

import functools
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from colibri.conformance.cases import load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import FAIL, PASS
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_suite

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
ENGINE = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'mux_fake_model.py'))}"
PROXY = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'mutant_proxy.py'))}"
MODEL = SUPPORT / "fake-model"

#: mutant -> cases that must fail under it.
KILLERS: dict[str, list[str]] = {
    "drop_accept": ["protocol.frames.turn-order", "protocol.frames.accept-format"],
    "misformat_done": ["protocol.frames.done-format"],
    "wrong_error_code": ["protocol.validation.slot-busy"],
    "no_drain_rejected": ["protocol.validation.temperature-above-2"],
    "data_out_of_slot_order": ["protocol.batching.interleave-slot-order"],
    "broken_prefix_reuse": ["protocol.prefix.extend-equals-cold"],
    "leak_cancelled": ["protocol.cancel.acknowledged"],
    "cancel_as_done": ["protocol.cancel.acknowledged"],
    "stop_as_cancel": ["protocol.stop.ends-with-done"],
    "no_eof_drain": ["protocol.eof.drains-in-flight"],
    "echo_off_by_one": ["protocol.logprobs.echo-first-position", "protocol.logprobs.channel-rules"],
    "wrong_context_limit": ["protocol.validation.context-exceeded"],
    "empty_prompt_code": ["protocol.validation.empty-prompt"],
    "tail_on_plain_data": ["protocol.frames.data-plain-without-logprobs"],
    "stat_format": ["protocol.handshake.stat-format"],
    # What fields mean together (spec/cases/protocol/INVARIANTS.md), by class of invariant.
    # length vs declared dimension
    "emap_short": ["protocol.invariants.telemetry-dimensions"],
    # sum vs total
    "tiers_miscount": ["protocol.invariants.telemetry-dimensions"],
    "prof_miscount": ["protocol.invariants.turn-accounting"],
    "length_flag_lies": ["protocol.invariants.turn-accounting"],
    # count vs frames actually sent
    "drop_second_data": ["protocol.frames.done-counts", "protocol.invariants.turn-accounting"],
    "caps_slots_lie": ["protocol.invariants.caps"],
    # ordering
    "topk_unsorted": ["protocol.invariants.topk-frames"],
    "block_out_of_order": ["protocol.invariants.turn-end-block"],
    # range
    "hit_pct_over_100": ["protocol.invariants.value-ranges"],
    # monotonic sequence
    "heat_decays": ["protocol.invariants.heat-accumulates"],
    # cross-frame agreement within a turn
    "echo_payload_shift": ["protocol.invariants.logprobs-echo"],
    # across turns (and across a restart)
    "accept_counts_prefill": ["protocol.prefix.warm-accept-counts-prompt"],
    "heat_forgotten": ["protocol.invariants.heat-survives-restart"],
    # a stopped turn ends early, and nothing else answers the STOP
    "stop_stray_error": ["protocol.stop.ends-early", "protocol.stop.ends-with-done"],
    "stop_ignored": ["protocol.stop.ends-early"],
    # CANCEL removes the request: an engine that lets it decode on sends no CANCELLED
    "cancel_ignored": ["protocol.cancel.acknowledged"],
    # the seed's turn-end telemetry, order free: a missing line
    "no_entropy": ["protocol.frames.seed-telemetry-before-done"],
}
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


def _run(mutant: str, case_ids: list[str], capabilities: frozenset[str]) -> dict[str, str]:
    # A mutant may make the engine withhold an answer; a short wait keeps the test quick.
    timeout = 10.0 if mutant == "none" else 3.0
    runner = protocol_runner(
        f"{PROXY} {mutant} {ENGINE}", MODEL, timeout=timeout, capabilities=set(capabilities)
    )
    cases = [c for c in load_cases("protocol") if c.id in case_ids]
    assert sorted(c.id for c in cases) == sorted(set(case_ids)), "a killer case was renamed"
    return {r.case_id: r.status for r in run_suite(runner, cases, Expectations(), reruns=0)}


@functools.cache
def _statuses() -> dict[str, dict[str, str]]:
    capabilities = frozenset(protocol_runner(ENGINE, MODEL, timeout=10.0).capabilities)
    plan = {"none": EVERY_KILLER, **KILLERS}
    # Most mutant runs wait on a withheld answer or a 3 s timeout, not on the CPU: run many at once.
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {m: pool.submit(_run, m, ids, capabilities) for m, ids in plan.items()}
        return {m: future.result() for m, future in futures.items()}


def test_at_least_twelve_mutants() -> None:
    assert len(KILLERS) >= 12


def test_every_invariant_class_has_a_mutant() -> None:
    assert all(CLASSES.values()) and {m for ms in CLASSES.values() for m in ms} <= set(KILLERS)


def test_transparent_proxy_passes_every_killer_case() -> None:
    assert _statuses()["none"] == dict.fromkeys(EVERY_KILLER, PASS)


@pytest.mark.parametrize("mutant", sorted(KILLERS))
def test_mutant_is_caught(mutant: str) -> None:
    assert _statuses()[mutant] == dict.fromkeys(KILLERS[mutant], FAIL)
