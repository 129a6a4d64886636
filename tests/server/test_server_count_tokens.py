"""`POST /v1/messages/count_tokens` (spec/http.md 9b): Anthropic's shape, and a count that is
exactly the prompt tokens the engine accepts for the same Messages request."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from colibri.server.context import ServerConfig
from support.http_transcript import exchange, validate
from support.server_harness import LiveServer, launch

from colibri import resources

# The official SDKs are imported inside the tests that use them: their pydantic types take
# seconds to import, and every pytest worker imports every test module when it collects.

M = "test-model"
TOOLS = [{"name": "weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello there"}]},
    {"system": "Answer briefly.", "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]}]},
    {"tools": TOOLS, "thinking": {"type": "enabled", "budget_tokens": 1024},
     "messages": [{"role": "user", "content": "Weather in Oslo?"}]},
]


@pytest.fixture(scope="module")
def real() -> Iterator[LiveServer]:
    model = resources.default_model_dir()
    argv = [sys.executable, "-m", "colibri", "engine", "--model", str(model)]
    config = ServerConfig(model_id=M, kv_slots=1, max_tokens=8,
                          tokenizer_path=str(model / "tokenizer.json"))
    live = launch(config, argv, {"CTX": "512", "COLI_PERSIST": "0"})
    yield live
    live.stop()


@pytest.mark.parametrize("request_body", REQUESTS, ids=["plain", "system-turns", "tools"])
def test_count_equals_the_engines_prompt_tokens(real: LiveServer,
                                                request_body: dict[str, Any]) -> None:
    counted = exchange(real.url, "POST", "/v1/messages/count_tokens",
                       {"model": M, **request_body})
    assert counted["status"] == 200, counted
    validate("count_tokens", counted["body"])
    sent = exchange(real.url, "POST", "/v1/messages",
                    {"model": M, "max_tokens": 1, **request_body})
    assert sent["status"] == 200, sent
    assert counted["body"]["input_tokens"] == sent["body"]["usage"]["input_tokens"] > 0


def test_anthropic_sdk_and_named_errors(real: LiveServer) -> None:
    import anthropic
    client = anthropic.Anthropic(base_url=real.url, api_key="k", max_retries=0)
    count = client.messages.count_tokens(model=M, messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="other", messages=[{"role": "user", "content": "Hi"}])
    bad = exchange(real.url, "POST", "/v1/messages/count_tokens",
                   {"model": M, "messages": [{"role": "system", "content": "x"}]})
    assert bad["status"] == 400
    validate("anthropic_error", bad["body"])
    assert bad["body"]["error"]["type"] == "invalid_request_error"
    assert "role 'system' is not supported" in bad["body"]["error"]["message"]


def test_without_a_tokenizer_the_count_is_refused_by_name() -> None:
    """An `--engine-cmd` server without `--model` does not know which tokenizer its engine
    uses: it says so (501) instead of counting with the wrong one."""
    live = launch(replace(ServerConfig(model_id=M), tokenizer_path=None))
    try:
        got = exchange(live.url, "POST", "/v1/messages/count_tokens",
                       {"model": M, "messages": [{"role": "user", "content": "Hi"}]})
    finally:
        live.stop()
    assert got["status"] == 501
    validate("anthropic_error", got["body"])
    assert "tokenizer" in got["body"]["error"]["message"]
