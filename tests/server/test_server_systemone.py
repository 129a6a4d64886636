"""`POST /v1/systemone` (spec/http.md 9a): validation, the scoring rule, prefix reuse.

The embedded model has random weights, so these tests pin mechanics and math -- which tokens
are scored, how p/entropy follow from them, that a kept KV prefix changes no number -- never
which answer is "right"."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from colibri.server import systemone as s1
from colibri.server.context import ServerConfig
from colibri.server.engine_events import TokenRecord
from colibri.server.generation import TokenSpan
from support.http_transcript import exchange, validate
from support.server_harness import LiveServer, launch

from colibri import resources

M = "test-model"
DOC = {"state": "The invoice is dated 3 March and is due in 30 days. It has not been paid.",
       "question": "Is the invoice overdue on 10 April?"}


def span(payload: bytes, lp: float) -> TokenSpan:
    return TokenSpan(payload, TokenRecord(logprob=lp, candidates=()), 0, 0)


def detail(body: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    try:
        s1.parse(body)
    except s1.Unprocessable as error:
        return [(tuple(d["loc"]), d["type"]) for d in error.detail]
    return []


def test_every_bad_field_is_named_at_once() -> None:
    assert detail({}) == [(("body", "state"), "missing"), (("body", "question"), "missing"),
                          (("body", "options"), "missing")]
    got = detail({"state": 3, "question": " ", "options": ["a", "a", 7, ""],
                  "normalize": "max"})
    assert got == [(("body", "state"), "string_type"), (("body", "question"), "value_error"),
                   (("body", "options", 1), "value_error"),
                   (("body", "options", 2), "string_type"),
                   (("body", "options", 3), "value_error"), (("body", "normalize"), "enum")]
    assert detail({**DOC, "options": []}) == [(("body", "options"), "too_short")]
    assert detail({**DOC, "options": ["x"]}) == [(("body", "options"), "too_short")]
    assert detail({**DOC, "options": "yes"}) == [(("body", "options"), "list_type")]
    assert detail({**DOC, "options": [str(i) for i in range(65)]}) == [
        (("body", "options"), "too_long")]
    assert detail({**DOC, "options": ["a\x00", "b"]}) == [(("body", "options", 0),
                                                            "value_error")]
    assert detail({**DOC, "options": ["yes", "no"]}) == []


def test_scored_tokens_are_those_reaching_past_the_prompt() -> None:
    # prompt "ab" (2 bytes); the engine merged "b"+"c" of "abcd" into one token
    echo = [span(b"a", math.nan), span(b"bc", -1.0), span(b"d", -2.0)]
    assert s1.option_tokens(echo, 2, kept_prefix=False) == [-1.0, -2.0]
    # a token ending exactly at the boundary belongs to the prompt
    echo = [span(b"a", math.nan), span(b"b", -0.5), span(b"cd", -2.0)]
    assert s1.option_tokens(echo, 2, kept_prefix=False) == [-2.0]
    # with echo_at the engine already sent only the option's tokens
    assert s1.option_tokens([span(b"cd", -2.0)], 2, kept_prefix=True) == [-2.0]


def test_distribution_is_a_stable_softmax() -> None:
    ps = s1.distribution([-1000.0, -1000.0 - math.log(3)])
    assert ps == pytest.approx([0.75, 0.25])
    assert math.fsum(s1.distribution([-3.0, -1.0, -2.0])) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def real() -> Iterator[LiveServer]:
    argv = [sys.executable, "-m", "colibri", "engine", "--model",
            str(resources.default_model_dir())]
    live = launch(ServerConfig(model_id=M, kv_slots=1, max_tokens=8), argv,
                  {"CTX": "256", "COLI_PERSIST": "0"})
    yield live
    live.stop()


def ask(live: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    return exchange(live.url, "POST", "/v1/systemone", body)


def test_reply_shape_and_math(real: LiveServer) -> None:
    options = ["yes", "no", "yes, by a week"]  # "yes" is a token prefix of the third
    got = ask(real, {**DOC, "options": options, "model": "anything"})
    assert got["status"] == 200, got
    body = got["body"]
    validate("systemone", body)
    choices = body["choices"]
    assert [c["option"] for c in choices] == options
    assert math.fsum(c["p"] for c in choices) == pytest.approx(1.0, abs=1e-12)
    best = max(choices, key=lambda c: c["p"])
    assert body["answer"] == best["option"] and body["normalize"] == "sum"
    assert body["entropy"] == pytest.approx(-sum(c["p"] * math.log2(c["p"]) for c in choices))
    for c in choices:
        assert c["mean_logprob"] == pytest.approx(c["logprob"] / c["tokens"])
    # softmax of the summed logprobs
    ref = s1.distribution([c["logprob"] for c in choices])
    assert [c["p"] for c in choices] == pytest.approx(ref)
    assert choices[2]["tokens"] > choices[0]["tokens"]
    usage = body["usage"]
    assert usage["completion_tokens"] == 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + sum(c["tokens"] for c in choices)
    assert usage["read_tokens"] == sum(usage["prompt_tokens"] + c["tokens"] for c in choices)


def test_mean_normalisation(real: LiveServer) -> None:
    body = ask(real, {**DOC, "options": ["yes", "yes, by a week"], "normalize": "mean"})["body"]
    ref = s1.distribution([c["mean_logprob"] for c in body["choices"]])
    assert [c["p"] for c in body["choices"]] == pytest.approx(ref)
    assert body["normalize"] == "mean"


def test_kept_prefix_changes_no_number(real: LiveServer) -> None:
    """echo_at + slot prefix reuse vs a cold full echo per option: kind (c), byte-exact."""
    request = {**DOC, "options": ["no", "yes", "yes, by a week", "not yet"]}
    caps = real.state.supervisor.telemetry.caps
    assert caps.get("echo_at") == "1"
    warm = ask(real, request)["body"]
    caps["echo_at"] = "0"
    try:
        cold = ask(real, request)["body"]
    finally:
        caps["echo_at"] = "1"
    assert warm == cold


def test_options_that_do_not_fit_name_their_field(real: LiveServer) -> None:
    long_option = "word " * 100  # P (which lists it) fits; P + option does not
    got = ask(real, {**DOC, "options": ["yes", long_option]})
    assert got["status"] == 422
    validate("validation_error", got["body"])
    assert [d["loc"] for d in got["body"]["detail"]] == [["body", "options", 1]]
    assert got["body"]["detail"][0]["type"] == "context_length_exceeded"
    got = ask(real, {"state": long_option * 3, "question": "q?", "options": ["yes", "no"]})
    assert got["status"] == 422
    assert [d["loc"] for d in got["body"]["detail"]] == [["body", "state"]]


def test_capability_is_advertised(real: LiveServer) -> None:
    models = exchange(real.url, "GET", "/v1/models")["body"]
    assert "systemone" in models["data"][0]["capabilities"]
    assert "/v1/systemone" in models["models"][0]["description"]
    health = exchange(real.url, "GET", "/health")["body"]
    assert health["capabilities"] == ["chat", "systemone"]


def test_validation_before_admission_and_model_is_not_checked(real: LiveServer) -> None:
    got = ask(real, {"model": "gpt-4", "question": 1, "options": ["a", "b"], "state": ""})
    assert got["status"] == 422
    assert got["body"] == {"detail": [{"loc": ["body", "question"],
                                       "msg": "Input should be a valid string.",
                                       "type": "string_type"}]}
    # framing errors stay the OpenAI 400 envelope
    raw = exchange(real.url, "POST", "/v1/systemone", raw=b"[1]")
    assert raw["status"] == 400 and raw["body"]["error"]["message"].startswith("Request body")


def test_fake_engine_without_echo_at_scores_by_bytes() -> None:
    live = launch(ServerConfig(model_id=M, kv_slots=1, max_tokens=8))
    try:
        body = ask(live, {"state": "", "question": "q", "options": ["ab", "c"]})["body"]
    finally:
        live.stop()
    # the fake engine tokenizes by byte: "ab" is two tokens, "c" one
    assert [c["tokens"] for c in body["choices"]] == [2, 1]
    validate("systemone", body)
