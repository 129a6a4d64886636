"""`colibri serve --model` on a Qwen3-MoE checkpoint: Qwen3's own ChatML template, its served
id, and the seed's Qwen rules (seeds/api.md: native ``<tool_call>`` blocks, a reasoning block).

The template is held to transformers' rendering two ways: the renderer equals the model's own
``tokenizer_config.json`` template rendered the way ``apply_chat_template`` renders it (the
sandboxed Jinja environment tests/text/test_chat_template.py mirrors), and, end to end through
the OpenAI SDK, the served prompt is the fixture's oracle prompt (rendered and tokenized by
transformers in fixtures/make_qwen3_moe.py): the engine counts its tokens and greedy decoding
of it gives the oracle's continuation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.reference import Tokenizer, load_model
from colibri.server.chat_family import QWEN3_MOE, family_for_model
from colibri.server.errors import APIError
from colibri.server.qwen_toolcalls import parse_qwen_answer
from colibri.server.validation import ToolSpec, resolve_tool_choice
from jinja2 import sandbox as jinja2_sandbox
from support.server_harness import interrupt, serve_process

from colibri.resources import fixture_model_dir

ROOT = Path(__file__).resolve().parents[2]
QWEN = fixture_model_dir("qwen3moe-tiny")
ORACLE: dict[str, Any] = json.loads((QWEN / "oracle.json").read_text())
PROMPT: list[int] = ORACLE["prompt_ids"]
CONTINUATION: list[int] = ORACLE["full_ids"][len(PROMPT):]
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_FN = {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
WEATHER = {"type": "function", "function": WEATHER_FN}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}
MODEL_ID = "qwen3-moe-colibri"


def transformers_render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    config = json.loads((QWEN / "tokenizer_config.json").read_text(encoding="utf-8"))
    env = jinja2_sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return str(env.from_string(config["chat_template"]).render(messages=messages, **kwargs))


def render(messages: list[dict[str, Any]], *, thinking: bool = False,
           tools: ToolSpec | None = None, continued: bool = False) -> str:
    return QWEN3_MOE.template.render(messages, thinking=thinking, effort=None, tools=tools,
                                     continued=continued).prompt


def spec(*tools: dict[str, Any], choice: Any = None) -> ToolSpec:
    body: dict[str, Any] = {"tools": list(tools)}
    if choice is not None:
        body["tool_choice"] = choice
    resolved = resolve_tool_choice(body, list(tools))
    assert resolved is not None
    return resolved


CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATIONS = [
    HELLO,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": " Hi! "},
     {"role": "user", "content": "Again"}],
    # A past reply's own <think> block: dropped before the last query, kept after it.
    [{"role": "user", "content": "Q1"},
     {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
     {"role": "user", "content": "Q2"},
     {"role": "assistant", "content": "A2", "reasoning_content": "r2"},
     {"role": "system", "content": "Late system"}],
    # A tool round trip: calls in JSON, responses grouped into one user turn.
    [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": "", "tool_calls": [
         CALL, {"id": "c2", "type": "function",
                "function": {"name": "clock", "arguments": {"tz": "CET"}}}]},
     {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "noon"},
     {"role": "assistant", "content": "Checking", "tool_calls": [CALL]},
     {"role": "tool", "content": "rain"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("thinking", [False, True])
def test_the_renderer_is_the_models_own_template(messages: list[dict[str, Any]],
                                                 thinking: bool) -> None:
    options: dict[str, Any] = {} if thinking else {"enable_thinking": False}
    assert render(messages, thinking=thinking) == transformers_render(
        messages, add_generation_prompt=True, **options)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_tools_are_offered_as_the_template_offers_them(messages: list[dict[str, Any]]) -> None:
    assert render(messages, tools=spec(WEATHER, CLOCK)) == transformers_render(
        messages, add_generation_prompt=True, enable_thinking=False, tools=[WEATHER, CLOCK])


def test_a_forced_choice_offers_every_tool_and_required_adds_the_line() -> None:
    """seeds/api.md: Qwen neither narrows the tools nor names the forced one; ``required``
    appends the one line every tool block gets, inside the system turn."""
    forced = spec(WEATHER, CLOCK, choice={"type": "function", "function": {"name": "clock"}})
    assert render(HELLO, tools=forced) == render(HELLO, tools=spec(WEATHER, CLOCK))
    required = render(HELLO, tools=spec(WEATHER, choice="required"))
    assert required == render(HELLO, tools=spec(WEATHER)).replace(
        "</tool_call><|im_end|>", "</tool_call>\n\nYou must call one of the functions above. "
        "Do not answer directly.<|im_end|>", 1)


def test_a_continued_assistant_turn_ends_where_its_content_ends() -> None:
    turns = [*HELLO, {"role": "assistant", "content": "Hel"}]
    full = transformers_render(turns, add_generation_prompt=False)
    assert render(turns, continued=True) == full[: full.rindex("Hel") + 3]
    body = {"tools": [WEATHER]}
    with pytest.raises(APIError) as refused:
        QWEN3_MOE.template.continues(turns, body)
    assert (refused.value.param, refused.value.code) == ("tools", "unsupported_parameter")


def test_the_oracle_prompt_is_the_rendered_hello() -> None:
    prompt = render(HELLO)
    assert prompt == ORACLE["prompt_text"]
    assert Tokenizer.from_file(QWEN).encode(prompt) == PROMPT


@pytest.mark.parametrize(("messages", "param"), [
    ([*HELLO, {"role": "narrator", "content": "x"}], "messages.1.role"),
    ([*HELLO, {"role": "assistant", "content": None, "tool_calls": "x"}],
     "messages.1.tool_calls"),
    ([*HELLO, {"role": "assistant", "content": "x", "reasoning_content": 3}],
     "messages.1.reasoning_content"),
])
def test_turns_the_template_cannot_write_are_refused_by_name(messages: list[dict[str, Any]],
                                                             param: str) -> None:
    with pytest.raises(APIError) as refused:
        render([*messages, *HELLO])
    assert (refused.value.status, refused.value.param) == (400, param)


def test_the_family_comes_from_the_model_type() -> None:
    family = family_for_model(QWEN)
    assert family is QWEN3_MOE
    assert (family.name, family.model_id, family.tool_calls, family.reasoning,
            family.implicit_stops) == ("Qwen3-MoE", MODEL_ID, True, True, ())


def test_native_tool_calls_are_read_from_their_json() -> None:
    tools = spec(WEATHER)
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
            '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "clock", "arguments": "{}"}\n'
            '</tool_call>')
    parsed = parse_qwen_answer(text, tools)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"}), ("clock", {})]
    assert (parsed.content, parsed.invalid) == ("Let me check.", [])


def test_a_malformed_call_stays_in_the_content_and_is_reported() -> None:
    broken = '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>'
    parsed = parse_qwen_answer("Before " + broken, spec(WEATHER))
    assert parsed.calls == [] and parsed.content == "Before " + broken
    assert [(i.text, i.error) for i in parsed.invalid] == [
        (broken, "`arguments` is not a JSON object")]
    assert parse_qwen_answer("<tool_call>\nnot json\n</tool_call>", spec(WEATHER)).invalid[
        0].error == "the <tool_call> body is not a JSON object"


def test_an_unclosed_last_call_is_recovered_only_when_its_json_is_complete() -> None:
    tools = spec(WEATHER)
    whole = parse_qwen_answer('Hi<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool',
                              tools)
    assert [c.name for c in whole.calls] == ["get_weather"] and whole.content == "Hi"
    cut = parse_qwen_answer('Hi<tool_call>\n{"name": "get_wea', tools, True)
    assert cut.calls == [] and [i.error for i in cut.invalid] == [
        "ended at the generation limit inside <tool_call>"]


@pytest.fixture(scope="module")
def qwen_server() -> Iterator[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLI_MODEL", "COLI_MODEL_ID", "COLI_THINK", "COLI_CONTINUE_ASSISTANT")}
    with serve_process(["--model", str(QWEN)], env, ROOT) as (proc, line, url):
        assert line.startswith(f"colibri serving {MODEL_ID} on http://127.0.0.1:"), line
        yield url
        assert interrupt(proc) == 0


def _client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def _text(ids: list[int]) -> str:
    tokenizer = Tokenizer.from_file(QWEN)
    return b"".join(tokenizer.token_bytes(t) for t in ids).decode(errors="replace")


def _greedy(prompt: list[int], steps: int) -> list[int]:
    """The reference engine's greedy continuation (first maximum) up to an end-of-turn id,
    which the engine stops on and does not show, for prompts the oracle does not hold."""
    ends = json.loads((QWEN / "generation_config.json").read_text())["eos_token_id"]
    model = load_model(QWEN)
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(np.argmax(model.forward(ids)[-1])))
        if ids[-1] in ends:
            return ids[len(prompt):-1]
    return ids[len(prompt):]


def test_the_openai_sdk_gets_the_oracles_greedy_reply(qwen_server: str) -> None:
    client = _client(qwen_server)
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    reply = client.chat.completions.create(model=MODEL_ID, temperature=0,
                                           max_tokens=len(CONTINUATION), messages=HELLO)
    assert reply.usage is not None and reply.usage.prompt_tokens == len(PROMPT)
    assert reply.choices[0].message.content == _text(CONTINUATION)
    assert getattr(reply.choices[0].message, "reasoning_content", None) is None
    assert reply.choices[0].finish_reason == "length"


def test_thinking_on_leaves_the_block_to_the_model_and_reads_its_reasoning(
        qwen_server: str) -> None:
    prompt = Tokenizer.from_file(QWEN).encode(render(HELLO, thinking=True))
    assert prompt == PROMPT[:-6]  # the oracle prompt without its empty <think> block
    expected = _text(_greedy(prompt, 6))
    assert "think>" not in expected  # the tiny model never closes a block: all reasoning
    reply = _client(qwen_server).chat.completions.create(
        model=MODEL_ID, temperature=0, max_tokens=6, messages=HELLO,
        extra_body={"enable_thinking": True})
    message = reply.choices[0].message
    assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)
    assert getattr(message, "reasoning_content", None) == expected
    assert expected and message.content == ""  # the shared rule: no answer yet is ""


def test_tools_are_rendered_not_refused(qwen_server: str) -> None:
    prompt = Tokenizer.from_file(QWEN).encode(render(HELLO, tools=spec(WEATHER)))
    reply = _client(qwen_server).chat.completions.create(
        model=MODEL_ID, temperature=0, max_tokens=2, messages=HELLO, tools=[WEATHER])
    assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)
    assert reply.choices[0].finish_reason == "length"


def test_strict_tool_calls_are_glm_only(qwen_server: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        _client(qwen_server).chat.completions.create(
            model=MODEL_ID, max_tokens=2, messages=HELLO,
            extra_body={"strict_tool_calls": True, "tools": [WEATHER]})
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["message"] == "`strict_tool_calls` currently supports GLM only."


def test_anthropic_messages_get_the_same_prompt(qwen_server: str) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=qwen_server.removesuffix("/v1"), api_key="unused",
                                 max_retries=0)
    counted = client.messages.count_tokens(model=MODEL_ID, messages=HELLO)
    assert counted.input_tokens == len(PROMPT)
    reply = client.messages.create(model=MODEL_ID, max_tokens=len(CONTINUATION),
                                   messages=HELLO, extra_body={"temperature": 0})
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == _text(CONTINUATION)
