"""`colibri serve --model` on an OLMoE checkpoint: OLMoE's own chat template, its served id,
and the seed's OLMoE rules (seeds/api.md: active tools answer HTTP 400, thinking is off).

The template is held to transformers' rendering two ways: the renderer equals the model's
own ``tokenizer_config.json`` template rendered the way ``apply_chat_template`` renders it
(the sandboxed Jinja environment tests/text/test_chat_template.py mirrors), and, end to end
through the OpenAI SDK, the served prompt is the fixture's oracle prompt (rendered and
tokenized by transformers in fixtures/make_olmoe.py): the engine counts its tokens and greedy
decoding of it gives the oracle's continuation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from colibri.reference import Tokenizer
from colibri.server.chat_family import GLM, ChatFamilyError, family_for_model
from colibri.server.errors import APIError
from jinja2 import sandbox as jinja2_sandbox
from support.server_harness import interrupt, serve_process

from colibri.resources import fixture_model_dir

ROOT = Path(__file__).resolve().parents[2]
OLMOE = fixture_model_dir("olmoe-tiny")
ORACLE: dict[str, Any] = json.loads((OLMOE / "oracle.json").read_text())
PROMPT: list[int] = ORACLE["prompt_ids"]
CONTINUATION: list[int] = ORACLE["full_ids"][len(PROMPT):]
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
TOOLS_REFUSED = ("The OLMoE engine does not support tool calling: active `tools` and "
                 "`tool_choice` are refused (send none, or `tool_choice: \"none\"`).")


def transformers_render(messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
    config = json.loads((OLMOE / "tokenizer_config.json").read_text(encoding="utf-8"))
    env = jinja2_sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(config["chat_template"])
    return str(template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=config["bos_token"], eos_token=config["eos_token"]))


def render(messages: list[dict[str, Any]], continued: bool = False) -> str:
    return family_for_model(OLMOE).template.render(
        messages, thinking=False, effort=None, tools=None, continued=continued).prompt


CONVERSATIONS = [
    HELLO,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": [{"type": "text", "text": "Two "}, {"type": "text",
                                                                       "text": "parts"}]}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": " Hi! "},
     {"role": "user", "content": "Again"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_the_renderer_is_the_models_own_template(messages: list[dict[str, Any]]) -> None:
    flat = [{**m, "content": "".join(p["text"] for p in m["content"])}
            if isinstance(m["content"], list) else m for m in messages]
    assert render(messages) == transformers_render(flat, add_generation_prompt=True)


def test_a_continued_assistant_turn_ends_where_its_content_ends() -> None:
    """transformers' continue_final_message: the prompt stops after the final content, with
    no end-of-text; a finished last turn (not continued) gets its eos and a new cue."""
    turns = [*HELLO, {"role": "assistant", "content": "Hel"}]
    full = transformers_render(turns, add_generation_prompt=False)
    assert render(turns, continued=True) == full[: full.rindex("Hel") + 3]
    assert render(turns) == transformers_render(turns, add_generation_prompt=True)


def test_the_oracle_prompt_is_the_rendered_hello() -> None:
    prompt = render(HELLO)
    assert prompt == ORACLE["prompt_text"]
    assert Tokenizer.from_file(OLMOE).encode(prompt) == PROMPT


@pytest.mark.parametrize(("message", "param", "code"), [
    ({"role": "tool", "content": "42"}, "messages.1.role", "unsupported_role"),
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
     "messages.1.tool_calls", "unsupported_value"),
    ({"role": "narrator", "content": "x"}, "messages.1.role", "unsupported_role"),
])
def test_turns_the_template_cannot_write_are_refused_by_name(message: dict[str, Any],
                                                             param: str, code: str) -> None:
    with pytest.raises(APIError) as refused:
        render([*HELLO, message, *HELLO])
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, param, code)


def test_the_family_comes_from_the_model_type(tmp_path: Path) -> None:
    assert family_for_model(fixture_model_dir("glm5-tiny")) is GLM
    assert family_for_model(fixture_model_dir("deepseek3-tiny")) is GLM
    assert family_for_model(tmp_path) is GLM  # no config.json: an --engine-cmd's own model
    olmoe = family_for_model(OLMOE)
    assert (olmoe.name, olmoe.model_id, olmoe.tool_calls, olmoe.reasoning,
            olmoe.implicit_stops) == ("OLMoE", "olmoe-colibri", False, False, ())
    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    with pytest.raises(ChatFamilyError, match="model_type 'mamba' has no chat template"):
        family_for_model(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "olmoe"}')
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
    with pytest.raises(ChatFamilyError, match="no string `bos_token`"):
        family_for_model(tmp_path)


@pytest.fixture(scope="module")
def olmoe_server() -> Iterator[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLI_MODEL", "COLI_MODEL_ID", "COLI_THINK", "COLI_CONTINUE_ASSISTANT")}
    # COLI_THINK=1 asks for thinking by default; OLMoE has none, so it must change nothing.
    with serve_process(["--model", str(OLMOE)], {**env, "COLI_THINK": "1"}, ROOT) as (
            proc, line, url):
        assert line.startswith("colibri serving olmoe-colibri on http://127.0.0.1:"), line
        yield url
        assert interrupt(proc) == 0


def _client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def _oracle_reply() -> str:
    tokenizer = Tokenizer.from_file(OLMOE)
    return b"".join(tokenizer.token_bytes(t) for t in CONTINUATION).decode(errors="replace")


def test_the_openai_sdk_gets_the_oracles_greedy_reply(olmoe_server: str) -> None:
    client = _client(olmoe_server)
    assert [m.id for m in client.models.list()] == ["olmoe-colibri"]
    reply = client.chat.completions.create(model="olmoe-colibri", temperature=0,
                                           max_tokens=len(CONTINUATION), messages=HELLO)
    assert reply.usage is not None and reply.usage.prompt_tokens == len(PROMPT)
    assert reply.choices[0].message.content == _oracle_reply()
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("extra", [{"enable_thinking": True}, {"reasoning_effort": "high"}])
def test_thinking_is_forced_off(olmoe_server: str, extra: dict[str, Any]) -> None:
    reply = _client(olmoe_server).chat.completions.create(
        model="olmoe-colibri", temperature=0, max_tokens=len(CONTINUATION), messages=HELLO,
        extra_body=extra)
    message = reply.choices[0].message
    assert message.content == _oracle_reply()
    assert getattr(message, "reasoning_content", None) is None
    assert reply.usage is not None and reply.usage.prompt_tokens == len(PROMPT)


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required"}, "tools"),
    ({"functions": [WEATHER["function"]]}, "tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice"),
])
def test_active_tools_answer_400(olmoe_server: str, extra: dict[str, Any], param: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        _client(olmoe_server).chat.completions.create(
            model="olmoe-colibri", max_tokens=2, messages=HELLO, extra_body=extra)
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["message"], error["param"], error["code"]) == (
        TOOLS_REFUSED, param, "unsupported_parameter")


def test_strict_tool_calls_are_glm_only(olmoe_server: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        _client(olmoe_server).chat.completions.create(
            model="olmoe-colibri", max_tokens=2, messages=HELLO,
            extra_body={"strict_tool_calls": True, "tools": [WEATHER]})
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["message"] == "`strict_tool_calls` currently supports GLM only."


def test_inactive_tools_are_served_without_them(olmoe_server: str) -> None:
    reply = _client(olmoe_server).chat.completions.create(
        model="olmoe-colibri", temperature=0, max_tokens=len(CONTINUATION), messages=HELLO,
        tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.content == _oracle_reply()
    assert reply.usage is not None and reply.usage.prompt_tokens == len(PROMPT)


def test_anthropic_messages_get_the_same_prompt_and_rules(olmoe_server: str) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=olmoe_server.removesuffix("/v1"), api_key="unused",
                                 max_retries=0)
    counted = client.messages.count_tokens(model="olmoe-colibri", messages=HELLO)
    assert counted.input_tokens == len(PROMPT)
    reply = client.messages.create(model="olmoe-colibri", max_tokens=len(CONTINUATION),
                                   messages=HELLO,
                                   thinking={"type": "enabled", "budget_tokens": 1024},
                                   extra_body={"temperature": 0})
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == _oracle_reply()
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="olmoe-colibri", max_tokens=2, messages=HELLO,
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["error"]["message"] == TOOLS_REFUSED
