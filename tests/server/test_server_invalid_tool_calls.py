"""Tool calls in the GLM envelope come back as `tool_calls`; a `<tool_call>` block that is
not a call stays in the content and is reported in `invalid_tool_calls` (spec/http.md §7.1),
on chat (plain and streamed) and on /v1/messages."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tornado.httpclient
from colibri.server.context import ServerConfig
from colibri.server.toolcalls import parse_answer
from colibri.server.validation import ToolSpec
from support.server_harness import LiveServer, launch

from colibri import resources

SUPPORT = Path(__file__).resolve().parents[1] / "support"
WEATHER_FN = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER = ToolSpec((WEATHER_FN,), "auto", None)
TOOLS = [{"type": "function", "function": WEATHER_FN}]
GOOD = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
#: What the fake engine answers for each directive: replies in the GLM envelope, good and bad.
SCRIPTS = {
    "good": ["Checking.", GOOD],
    "noargs": ["<tool_call>get_weather(Oslo)</tool_call>"],
    "noname": ["<tool_call><arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"],
    "mixed": ["<tool_call>get_weather city=Oslo</tool_call>", " then ", GOOD],
    "unclosed": ["Sure. <tool_call>get weather in Oslo"],
    "stray": ["city</arg_key><arg_value>Oslo</arg_value>"],
}


def _engine_argv() -> list[str]:
    code = (f"import sys; sys.path.insert(0, {str(SUPPORT)!r}); import fake_engine as f; "
            f"f.SCRIPTS.update({SCRIPTS!r}); sys.exit(f.Engine().run())")
    return [sys.executable, "-c", code]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = launch(ServerConfig(model_id="m"), _engine_argv())
    yield live
    live.stop()


def _fetch(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    client = tornado.httpclient.HTTPClient()
    try:
        response = client.fetch(server.url + path, method="POST", body=json.dumps(body),
                                raise_error=False, request_timeout=60,
                                headers={"Content-Type": "application/json"})
    finally:
        client.close()
    return response.code, response.body


def _chat(server: LiveServer, script: str, **extra: Any) -> tuple[int, Any]:
    code, raw = _fetch(server, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": f"q @@{script}@@"}],
        "tools": TOOLS, **extra})
    if extra.get("stream"):
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        return code, [json.loads(e) for e in events if e != "[DONE]"]
    return code, json.loads(raw)


def _schema(name: str) -> jsonschema.Draft202012Validator:
    registry_dir = resources.spec_path("schemas")
    store = {json.loads(p.read_text())["$id"]: json.loads(p.read_text())
             for p in registry_dir.glob("*.json")}
    schema = json.loads((registry_dir / f"{name}.json").read_text())
    from referencing import Registry, Resource

    registry = Registry().with_resources(
        [(uri, Resource.from_contents(doc)) for uri, doc in store.items()])
    return jsonschema.Draft202012Validator(schema, registry=registry)


# ---- the parser ------------------------------------------------------------------------------


def test_a_well_formed_call_is_a_call_and_nothing_is_reported() -> None:
    parsed = parse_answer("Checking." + GOOD, WEATHER)
    assert parsed.content == "Checking." and parsed.invalid == []
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", {"city": "Oslo"})]


@pytest.mark.parametrize(("text", "error"), [
    ("<tool_call>get_weather(Oslo)</tool_call>", "text outside <arg_key>/<arg_value> pairs"),
    ("<tool_call><arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
     "no function name after <tool_call>"),
    ("Sure. <tool_call>get weather in Oslo", "<tool_call> without </tool_call>"),
    ("city</arg_key><arg_value>Oslo</arg_value>", "</arg_key> outside a <tool_call> block"),
])
def test_a_malformed_block_stays_in_the_content_and_is_reported(text: str, error: str) -> None:
    parsed = parse_answer(text, WEATHER)
    assert parsed.calls == []
    assert parsed.content == text.strip()
    assert error in [bad.error for bad in parsed.invalid]


def test_an_unclosed_block_at_the_token_limit_says_so() -> None:
    parsed = parse_answer("<tool_call>get weather", WEATHER, length_limited=True)
    assert [bad.error for bad in parsed.invalid] == [
        "ended at the generation limit inside <tool_call>"]


def test_good_calls_beside_a_malformed_block_are_kept() -> None:
    parsed = parse_answer("<tool_call>get_weather city=Oslo</tool_call> then " + GOOD, WEATHER)
    assert [c.arguments for c in parsed.calls] == [{"city": "Oslo"}]
    assert [bad.text for bad in parsed.invalid] == ["<tool_call>get_weather city=Oslo</tool_call>"]
    assert parsed.content == "<tool_call>get_weather city=Oslo</tool_call> then"


# ---- over HTTP -------------------------------------------------------------------------------


def test_chat_returns_the_envelope_as_tool_calls(server: LiveServer) -> None:
    code, body = _chat(server, "good")
    assert code == 200, body
    _schema("chat_completion").validate(body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert "invalid_tool_calls" not in choice["message"]
    call = choice["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Oslo"})


@pytest.mark.parametrize(("script", "error"), [
    ("noargs", "text outside <arg_key>/<arg_value> pairs"),
    ("noname", "no function name after <tool_call>"),
    ("unclosed", "<tool_call> without </tool_call>"),
    ("stray", "</arg_key> outside a <tool_call> block"),
])
def test_chat_reports_a_malformed_call(server: LiveServer, script: str, error: str) -> None:
    code, body = _chat(server, script)
    assert code == 200, body
    _schema("chat_completion").validate(body)
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message and body["choices"][0]["finish_reason"] == "stop"
    assert message["content"] == "".join(SCRIPTS[script]).strip()
    assert error in [bad["error"] for bad in message["invalid_tool_calls"]]


def test_chat_keeps_good_calls_beside_a_malformed_one(server: LiveServer) -> None:
    code, body = _chat(server, "mixed")
    message = body["choices"][0]["message"]
    assert code == 200 and body["choices"][0]["finish_reason"] == "tool_calls"
    assert len(message["tool_calls"]) == 1
    assert [bad["text"] for bad in message["invalid_tool_calls"]] == [
        "<tool_call>get_weather city=Oslo</tool_call>"]


def test_a_streamed_chat_reports_a_malformed_call_before_the_finish(server: LiveServer) -> None:
    code, chunks = _chat(server, "noname", stream=True)
    assert code == 200
    validator = _schema("chat_completion_chunk")
    for chunk in chunks:
        validator.validate(chunk)
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    reported = [d["delta"]["invalid_tool_calls"] for d in deltas
                if "invalid_tool_calls" in d["delta"]]
    assert [bad["error"] for bad in reported[0]] == ["no function name after <tool_call>"]
    assert deltas[-1]["finish_reason"] == "stop" and "invalid_tool_calls" not in deltas[-1]["delta"]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_report_a_malformed_call(server: LiveServer, stream: bool) -> None:
    code, raw = _fetch(server, "/v1/messages", {
        "model": "m", "max_tokens": 64, "stream": stream,
        "messages": [{"role": "user", "content": "q @@noargs@@"}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER_FN["parameters"]}]})
    assert code == 200, raw
    if not stream:
        body = json.loads(raw)
        _schema("message").validate(body)
        assert body["stop_reason"] == "end_turn"
        assert [bad["error"] for bad in body["invalid_tool_calls"]] == [
            "text outside <arg_key>/<arg_value> pairs"]
        return
    events = [json.loads(line[6:]) for line in raw.decode().splitlines()
              if line.startswith("data: ")]
    validator = _schema("message_stream_event")
    for event in events:
        validator.validate(event)
    delta = next(e for e in events if e["type"] == "message_delta")["delta"]
    assert delta["invalid_tool_calls"][0]["text"] == SCRIPTS["noargs"][0]
