"""HTTP profiles: every case names one, public-API cases cite the public reference and need
no colibri extension, and the stream rules of the references reject what they forbid."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from colibri.conformance.cases import load_cases
from colibri.conformance.http_profiles import HTTP_PROFILES, profile_counts, select_profiles
from colibri.conformance.http_stream_rules import anthropic_blocks, openai_chunks
from colibri.conformance.outcome import FAIL, PASS, CheckFailure, Result
from colibri.conformance.report import write_json

CASES = load_cases("http")
#: Capabilities only colibri's surface has: a public-API case may not need them.
COLIBRI_ONLY = {"colibri_ext", "systemone", "metrics", "managed_server"}


def test_every_http_case_names_a_profile() -> None:
    assert {c.profile for c in CASES} == set(HTTP_PROFILES)


@pytest.mark.parametrize(("profile", "reference"), [("openai", "OpenAI API reference"),
                                                    ("anthropic", "Anthropic API reference")])
def test_public_profiles_cite_their_reference_and_need_no_extension(
    profile: str, reference: str
) -> None:
    cases = [c for c in CASES if c.profile == profile]
    assert len(cases) >= 10
    assert all(not (c.requires & COLIBRI_ONLY) for c in cases), [c.id for c in cases]
    new = [c for c in cases if c.id.startswith(f"http.{profile}.")]
    assert new and all(reference in c.clause for c in new)


def test_select_profiles_and_counts(tmp_path: Path) -> None:
    chosen = select_profiles(CASES, ["anthropic"])
    assert chosen and {c.profile for c in chosen} == {"anthropic"}
    assert select_profiles(CASES, []) == CASES
    with pytest.raises(ValueError, match="unknown profile"):
        select_profiles(CASES, ["gemini"])
    results = [
        Result("http.a.one", "http", "a", "must", "x", PASS, profile="openai", warnings=["w"]),
        Result("http.a.two", "http", "a", "must", "x", FAIL, profile="openai"),
        Result("http.a.three", "http", "a", "must", "x", PASS, profile="colibri"),
    ]
    counts = profile_counts(results)
    assert list(counts) == ["openai", "colibri"]
    assert counts["openai"][PASS] == 1 and counts["openai"][FAIL] == 1
    assert counts["openai"]["warned"] == 1
    write_json(results, tmp_path / "r.json")
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["profiles"]["openai"]["fail"] == 1
    assert [r["profile"] for r in document["cases"]] == ["openai", "openai", "colibri"]


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c1", "created": 1, "model": "m", "choices": choices, **extra}


GOOD = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "hi"}), _chunk({}, "stop")]


def test_openai_chunk_rules_accept_a_documented_stream() -> None:
    openai_chunks(GOOD, None)
    openai_chunks(GOOD, "none")
    with_usage = [{**c, "usage": None} for c in GOOD] + [
        _chunk(None, usage={"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3})]
    openai_chunks(with_usage, "final")


BROKEN: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "another id": lambda cs: [cs[0], {**cs[1], "id": "c2"}, cs[2]],
    "no role first": lambda cs: cs[1:],
    "no finish_reason": lambda cs: cs[:2],
    "finished twice": lambda cs: [*cs, _chunk({}, "stop")],
    "content after the end": lambda cs: [*cs, _chunk({"content": "more"})],
    "undocumented finish_reason": lambda cs: [cs[0], cs[1], _chunk({}, "done")],
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_openai_chunk_rules_reject(name: str) -> None:
    with pytest.raises(CheckFailure):
        openai_chunks(BROKEN[name](GOOD), None)


def test_openai_usage_rules_reject_a_missing_or_wrong_usage_chunk() -> None:
    with pytest.raises(CheckFailure, match="exactly one"):
        openai_chunks(GOOD, "final")
    wrong = [{**c, "usage": None} for c in GOOD] + [
        _chunk(None, usage={"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 4})]
    with pytest.raises(CheckFailure, match="total_tokens"):
        openai_chunks(wrong, "final")
    with pytest.raises(CheckFailure, match="without include_usage"):
        openai_chunks(wrong, "none")


def _events(*blocks: int, reason: str = "end_turn") -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "message_start",
                                     "message": {"content": [], "usage": {"input_tokens": 1}}}]
    for index in blocks:
        events += [{"type": "content_block_start", "index": index, "content_block": {}},
                   {"type": "content_block_delta", "index": index, "delta": {}},
                   {"type": "content_block_stop", "index": index}]
    return events + [{"type": "message_delta", "delta": {"stop_reason": reason},
                      "usage": {"output_tokens": 2}}, {"type": "message_stop"}]


def test_anthropic_block_rules() -> None:
    anthropic_blocks(_events(0, 1))
    for broken in (_events(1), _events(0, 0), _events(0, reason="done")):
        with pytest.raises(CheckFailure):
            anthropic_blocks(broken)
