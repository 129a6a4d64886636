"""Property: whatever JSON a client sends, the server answers with a named error or a valid
response (never a 5xx, never a traceback), and every answer matches spec/schemas."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from colibri.server.context import ServerConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.http_transcript import exchange
from support.server_harness import LiveServer, launch

from colibri import resources

M = "test-model"

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.floats(-1, 3),
                    st.text(max_size=6))
ANY = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)

ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot", 3])
CONTENT = st.one_of(st.text(max_size=12), st.none(), st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image_url"]),
                           "text": st.one_of(st.text(max_size=5), st.integers())}), ANY),
    max_size=2), ANY)
MESSAGE = st.one_of(st.fixed_dictionaries({"role": ROLES, "content": CONTENT}), ANY)
TOOL = st.one_of(st.fixed_dictionaries({"type": st.just("function"), "function":
                                        st.fixed_dictionaries({
                                            "name": st.one_of(st.just("f"), ANY),
                                            "parameters": st.one_of(st.just({
                                                "type": "object", "properties": {}}), ANY)})}),
                 ANY)
OPTIONAL: dict[str, Any] = {
    "stream": st.one_of(st.booleans(), ANY), "max_tokens": st.one_of(st.integers(-1, 8), ANY),
    "temperature": st.one_of(st.floats(-1, 3), ANY), "top_p": st.one_of(st.floats(0, 1), ANY),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=5), ANY),
    "n": ANY, "logprobs": ANY, "top_logprobs": ANY, "echo": ANY, "tools": st.one_of(
        st.lists(TOOL, max_size=2), ANY), "tool_choice": ANY, "reasoning_effort": ANY,
    "enable_thinking": ANY, "cache_slot": ANY, "stream_options": ANY, "seed": ANY,
    "response_format": ANY, "strict_tool_calls": ANY, "modalities": ANY,
}


def body(required: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=OPTIONAL)


CHAT = body({"model": st.just(M), "messages": st.one_of(st.lists(MESSAGE, max_size=3), ANY)})
COMPLETION = body({"model": st.just(M), "prompt": st.one_of(st.text(max_size=10), ANY)})
MESSAGES = st.fixed_dictionaries(
    {"model": st.just(M), "messages": st.one_of(st.lists(MESSAGE, max_size=3), ANY)},
    optional={"max_tokens": st.one_of(st.integers(0, 8), ANY), "system": ANY,
              "thinking": ANY, "tools": ANY, "tool_choice": ANY, "stream": ANY,
              "stop_sequences": ANY, "top_k": ANY, "temperature": ANY})


def _engines() -> list[Any]:
    real = [sys.executable, "-m", "colibri", "engine", "--model",
            str(resources.default_model_dir()), "--kv-slots", "2"]
    # The reference engine and the default model ship in every checkout: no skip if they fail.
    return [pytest.param(None, id="fake"), pytest.param(real, id="reference")]


@pytest.fixture(scope="module", params=_engines())
def server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    live = launch(ServerConfig(model_id=M, kv_slots=2, max_tokens=4), request.param,
                  {"COLI_PERSIST": "0"})
    yield live
    live.stop()


#: FUZZ_EXAMPLES=400 explores more (the default keeps the suite fast).
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def _check(server: LiveServer, path: str, payload: dict[str, Any]) -> None:
    transcript = exchange(server.url, "POST", path, payload)  # validates against spec/schemas
    assert transcript["status"] in (200, 400), transcript


@FUZZ
@given(payload=CHAT)
def test_chat_bodies(server: LiveServer, payload: dict[str, Any]) -> None:
    _check(server, "/v1/chat/completions", payload)


@FUZZ
@given(payload=COMPLETION)
def test_completion_bodies(server: LiveServer, payload: dict[str, Any]) -> None:
    _check(server, "/v1/completions", payload)


@FUZZ
@given(payload=MESSAGES)
def test_messages_bodies(server: LiveServer, payload: dict[str, Any]) -> None:
    _check(server, "/v1/messages", payload)
