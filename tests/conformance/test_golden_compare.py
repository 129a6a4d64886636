"""The golden matcher (colibri.conformance.golden_compare): exact everywhere except the
kind-(b) fields the spec names, which get the model's tolerance (spec/model.md §15)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from colibri.conformance import golden_compare as gc
from colibri.conformance.sameness import Tolerance, printed, ranking_difference
from hypothesis import given
from hypothesis import strategies as st

from colibri import resources
from colibri.protocol import load_spec, parse_line

TESTS = Path(__file__).parents[1]
TINY = resources.fixture_model_dir("glm5-tiny")
TOL = Tolerance.for_model_dir(TINY)
LP = printed(TOL.logprob, 6)  # what a printed %.6f logprob may move by
FRAMES = gc.FrameComparer(TOL)
JSON = gc.JsonComparer(TOL)
GOLDEN = json.loads(
    (TESTS / "engine" / "__snapshots__" / "test_engine_models"
     / "test_golden_transcript_glm5_tiny.json").read_text()
)


def _battery(case: str) -> dict[str, Any]:
    stored = TESTS / "server" / "__snapshots__" / "test_server_battery"
    path = stored / f"test_battery[tiny-reference-{case}].json"
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _f6(value: float) -> str:
    return f"{value:.6f}"


def _perturb_line(line: str, shift: Any) -> str:
    """Move every logprob of a DATA/ECHO/TOPK line by ``shift()``, as an engine with other
    kernels would print it (TOPK re-sorted, since the engine sorts its own values)."""
    head, sep, payload = line.partition(" | ")
    parsed = parse_line(head)
    assert parsed is not None
    v = dict(parsed.values)

    def lp(x: Any) -> str:
        return _f6(float(x) + shift()) if math.isfinite(float(x)) else head.split()[4]

    if parsed.kind == "TOPK":
        cands = [(float(c["logprob"]) + shift(), c["text"]) for c in v["candidates"]]
        cands.sort(key=lambda c: -c[0])
        body = "".join(f" {_f6(x)} {t}" for x, t in cands)
        return f"TOPK {v['id']} {v['count']}{body}"
    tail = "".join(f" {e['token']} {lp(e['logprob'])}" for e in v.get("top", []))
    if parsed.kind == "ECHO":
        out = f"ECHO {v['id']} {v['n']} {v['pos']} {lp(v['logprob'])} {v['k']}{tail}"
    elif "logprob" in v:
        out = f"DATA {v['id']} {v['n']} {lp(v['logprob'])} {v['k']}{tail}"
    else:
        return line
    return out + sep + payload


def _kind_b(line: str) -> bool:
    """A line with at least one finite logprob."""
    head = line.partition(" | ")[0].split()
    if head[0] == "DATA":
        return len(head) > 3
    return head[0] == "TOPK" or (head[0] == "ECHO" and head[4] != "nan")


def test_the_grammar_names_the_kind_b_fields_and_every_table_has_an_order() -> None:
    spec = load_spec()
    assert gc.kind_b_kinds(spec) == {"DATA", "ECHO", "TOPK"}
    assert gc.table_groups(spec) == set(gc.TABLE_ORDER)


def test_the_golden_transcript_is_the_same_as_itself() -> None:
    result = FRAMES.lines(GOLDEN, GOLDEN)
    assert result.ok, result.report()
    assert set(result.worst) == {"DATA.logprob", "DATA.top.logprob", "ECHO.logprob",
                                 "ECHO.top.logprob", "TOPK.candidates.logprob"}
    assert max(result.worst.values()) == 0.0


@given(st.data())
def test_a_perturbation_within_tolerance_passes(data: st.DataObject) -> None:
    # Each underlying value moves by at most tau_logprob; printing adds up to 5e-7.
    def shift() -> float:
        return data.draw(st.floats(-TOL.logprob, TOL.logprob))

    moved = [_perturb_line(line, shift) if _kind_b(line) else line for line in GOLDEN]
    result = FRAMES.lines(moved, GOLDEN)
    assert result.ok, result.report()


@given(index=st.sampled_from([i for i, line in enumerate(GOLDEN) if _kind_b(line)]),
       sign=st.sampled_from([-1.0, 1.0]))
def test_a_logprob_just_beyond_tolerance_fails(index: int, sign: float) -> None:
    beyond = LP + 2e-6
    calls = iter(range(10_000))

    def shift() -> float:
        return sign * beyond if next(calls) == 0 else 0.0

    moved = list(GOLDEN)
    moved[index] = _perturb_line(GOLDEN[index], shift)
    result = FRAMES.lines(moved, GOLDEN)
    assert not result.ok
    assert f"line {index}" in result.report()


@pytest.mark.parametrize(("kind", "old", "new"), [
    ("DATA", " |  172", " |  173"),          # payload (token text)
    ("DATA", "DATA 1 4 ", "DATA 1 5 "),      # n
    ("ECHO", "ECHO 1 3 1 ", "ECHO 1 3 2 "),  # pos
    ("ECHO", " 227 -4.305925", " 228 -4.305925"),  # an untied id of the table
    ("ACCEPT", "ACCEPT 1 12", "ACCEPT 1 13"),
    ("ENTROPY", "ENTROPY 1.000 1.000", "ENTROPY 1.000 1.001"),  # counts, not logits
    ("PROF", "PROF * 5 2", "PROF * 5 3"),
    ("CAPS", "slots=2", "slots=3"),
])
def test_every_other_field_is_exact(kind: str, old: str, new: str) -> None:
    index = next(i for i, line in enumerate(GOLDEN) if line.startswith(kind) and old in line)
    moved = list(GOLDEN)
    moved[index] = GOLDEN[index].replace(old, new, 1)
    assert moved[index] != GOLDEN[index]
    result = FRAMES.lines(moved, GOLDEN)
    assert not result.ok
    assert "exact" in result.report() or "tie-aware" in result.report()


def test_a_missing_or_extra_line_fails() -> None:
    assert not FRAMES.lines(GOLDEN[:-1], GOLDEN).ok
    assert not FRAMES.lines(GOLDEN + ["GPUS 0"], GOLDEN).ok


def test_nan_is_exact() -> None:
    line = "ECHO 1 2 0 nan 0 |  3"
    assert FRAMES.line(line, line).ok
    assert not FRAMES.line("ECHO 1 2 0 -9.000000 0 |  3", line).ok


def test_topk_ties_may_swap_untied_may_not() -> None:
    tied = "TOPK 1 3 -4.000000 61 -4.000010 62 -4.500000 63"
    swapped = "TOPK 1 3 -4.000005 62 -4.000008 61 -4.500000 63"
    assert FRAMES.line(swapped, tied).ok
    untied = "TOPK 1 3 -4.000000 61 -4.100000 62 -4.500000 63"
    assert not FRAMES.line("TOPK 1 3 -4.000000 62 -4.100000 61 -4.500000 63", untied).ok
    # The engine sorts TOPK: an actual table out of order fails even within tolerance.
    assert not FRAMES.line("TOPK 1 3 -4.000010 61 -4.000000 62 -4.500000 63", tied).ok


def test_slot_order_tables_compare_in_presentation_order() -> None:
    expected = "DATA 1 4 -4.000000 3 5 -4.500000 6 -4.000000 7 -4.000010 |  6"
    # A slot permutation (colibri's slot order follows comparisons with logits outside
    # the table), and a swap of the tied pair 6/7: same table.
    assert FRAMES.line("DATA 1 4 -4.000000 3 6 -4.000000 7 -4.000010 5 -4.500000 |  6",
                       expected).ok
    assert FRAMES.line("DATA 1 4 -4.000000 3 5 -4.500000 7 -4.000000 6 -4.000010 |  6",
                       expected).ok
    # Ids swapped between untied values: not the same table.
    assert not FRAMES.line("DATA 1 4 -4.000000 3 6 -4.500000 5 -4.000000 7 -4.000010 |  6",
                           expected).ok
    # A different k, or a table where none was.
    assert not FRAMES.line("DATA 1 4 -4.000000 2 6 -4.000000 7 -4.000010 |  6", expected).ok
    assert not FRAMES.line("DATA 1 4 |  6", expected).ok


def test_a_line_that_breaks_the_grammar_is_reported() -> None:
    expected = "DATA 1 4 -4.000000 1 6 -4.000000 |  6"
    result = FRAMES.line("DATA 1 4 -4.0 1 6 -4.000000 |  6", expected)
    assert not result.ok and "grammar" in result.report()


# ---------------------------------------------------------------------------------- HTTP


def _walk_numbers(node: Any, key: str) -> list[tuple[Any, Any]]:
    """(container, key) of every number under ``key`` (a dict key), depth first."""
    found: list[tuple[Any, Any]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, float):
                found.append((node, k))
            found += _walk_numbers(v, key)
    elif isinstance(node, list):
        for v in node:
            found += _walk_numbers(v, key)
    return found


@given(st.data())
def test_http_logprobs_within_tolerance_pass(data: st.DataObject) -> None:
    expected = _battery("chat-logprobs")
    actual = copy.deepcopy(expected)
    for node, key in _walk_numbers(actual, "logprob"):
        node[key] = round(node[key] + data.draw(st.floats(-TOL.logprob, TOL.logprob)), 6)
    result = JSON.transcript(actual, expected, "chat_completion")
    assert result.ok, result.report()


def test_http_chat_logprob_beyond_tolerance_and_exact_fields() -> None:
    expected = _battery("chat-logprobs")
    assert JSON.transcript(expected, expected, "chat_completion").ok
    content = expected["body"]["choices"][0]["logprobs"]["content"]
    cases = []
    beyond = copy.deepcopy(expected)
    beyond["body"]["choices"][0]["logprobs"]["content"][2]["logprob"] += LP + 2e-6
    cases.append(beyond)
    beyond_top = copy.deepcopy(expected)
    beyond_top["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1][
        "logprob"] -= LP + 2e-6
    cases.append(beyond_top)
    text = copy.deepcopy(expected)
    text["body"]["choices"][0]["logprobs"]["content"][0]["token"] = " nf"
    cases.append(text)
    usage = copy.deepcopy(expected)
    usage["body"]["usage"]["prompt_tokens"] += 1
    cases.append(usage)
    swapped = copy.deepcopy(expected)  # ids exchanged between untied logprobs
    top = swapped["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert abs(top[0]["logprob"] - top[1]["logprob"]) > 4 * LP
    top[0]["logprob"], top[1]["logprob"] = top[1]["logprob"], top[0]["logprob"]
    cases.append(swapped)
    for case in cases:
        assert not JSON.transcript(case, expected, "chat_completion").ok
    assert content  # the snapshot has logprobs to compare


def test_http_tables_tie_aware_and_slot_order_free() -> None:
    expected = _battery("chat-logprobs")
    moved = copy.deepcopy(expected)
    top = moved["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    top.reverse()  # the same entries in another slot order
    assert JSON.transcript(moved, expected, "chat_completion").ok
    tied = copy.deepcopy(expected)
    top = tied["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    tied_exp = copy.deepcopy(expected)
    exp_top = tied_exp["body"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    exp_top[1]["logprob"] = exp_top[0]["logprob"] - 1e-5
    top[0]["logprob"], top[1]["logprob"] = exp_top[0]["logprob"] - 1e-5, exp_top[0]["logprob"]
    assert JSON.transcript(tied, tied_exp, "chat_completion").ok


def test_http_completion_maps_and_token_logprobs() -> None:
    expected = _battery("completion-logprobs-echo-stop")
    assert JSON.transcript(expected, expected, "completion").ok
    near = copy.deepcopy(expected)
    lp = near["body"]["choices"][0]["logprobs"]
    lp["token_logprobs"][3] = round(lp["token_logprobs"][3] + TOL.logprob, 6)
    table = lp["top_logprobs"][2]
    key = next(iter(table))
    table[key] = round(table[key] - TOL.logprob, 6)
    assert JSON.transcript(near, expected, "completion").ok
    far = copy.deepcopy(expected)
    far["body"]["choices"][0]["logprobs"]["token_logprobs"][3] += LP + 2e-6
    assert not JSON.transcript(far, expected, "completion").ok
    renamed = copy.deepcopy(expected)
    table = renamed["body"]["choices"][0]["logprobs"]["top_logprobs"][2]
    table["<token_id:9999>"] = table.pop(next(iter(table)))
    assert not JSON.transcript(renamed, expected, "completion").ok
    offsets = copy.deepcopy(expected)
    offsets["body"]["choices"][0]["logprobs"]["text_offset"][1] += 1
    assert not JSON.transcript(offsets, expected, "completion").ok
    null = copy.deepcopy(expected)
    null["body"]["choices"][0]["logprobs"]["token_logprobs"][0] = -1.0
    assert not JSON.transcript(null, expected, "completion").ok


def test_http_numbers_the_schema_does_not_name_are_exact() -> None:
    expected = _battery("health-open")
    assert JSON.transcript(expected, expected, "health").ok
    for path in (("scheduler", "queue_timeout_seconds"), ("tiers", "ram_gb")):
        moved = copy.deepcopy(expected)
        moved["body"][path[0]][path[1]] += 1e-9
        assert not JSON.transcript(moved, expected, "health").ok
    # Without a schema everything is exact, logprobs included.
    chat = _battery("chat-logprobs")
    moved = copy.deepcopy(chat)
    moved["body"]["choices"][0]["logprobs"]["content"][0]["logprob"] += 1e-6
    assert not JSON.transcript(moved, chat, None).ok
    assert JSON.transcript(moved, chat, "chat_completion").ok
    # 1 and 1.0 are different JSON values.
    assert not JSON.body({"a": 1}, {"a": 1.0}, None).ok


def test_sse_events_are_compared_event_by_event() -> None:
    expected = _battery("chat-stream")
    assert "events" in expected
    assert JSON.transcript(expected, expected, "chat_completion_chunk").ok
    moved = copy.deepcopy(expected)
    moved["events"] = moved["events"][:-1]
    assert not JSON.transcript(moved, expected, "chat_completion_chunk").ok


def test_the_report_names_the_field_the_values_and_the_tolerance() -> None:
    expected = "DATA 1 4 -4.000000 1 6 -4.000000 |  6"
    report = FRAMES.line("DATA 1 4 -4.001000 1 6 -4.000000 |  6", expected).report()
    assert "(DATA) logprob" in report and "-4.001" in report and f"{LP:.3g}" in report


def test_ranking_difference_accepts_text_ids() -> None:
    table: list[tuple[int | str, float]] = [("61", -4.0), ("62", -4.5)]
    assert ranking_difference(table, table, 1e-5) is None
    assert ranking_difference([("62", -4.0), ("61", -4.5)], table, 1e-5) is not None
