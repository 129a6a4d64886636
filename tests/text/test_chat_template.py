"""The Jinja chat template shipped in the default tokenizer renders GLM-5's layout.

Expected strings are colibri's gateway renderings (notes: colibri-http.md section 8). The
environment mirrors the one transformers' ``apply_chat_template`` builds (sandboxed,
``trim_blocks``/``lstrip_blocks``, a ``tojson`` that keeps non-ASCII, ``raise_exception``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from colibri.reference import Tokenizer
from jinja2 import sandbox as jinja2_sandbox

from colibri.resources import fixtures_dir

TOKENIZER_DIR = fixtures_dir() / "tokenizer"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
TOOLS_BLOCK = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"name": "get_weather", "description": "Weather for a city", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}}}\n'
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key>"
    "<arg_value>{arg-value-2}</arg_value>...</tool_call>"
)


def render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = jinja2_sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(config["chat_template"])
    return str(template.render(messages=messages, add_generation_prompt=True, **kwargs))


@pytest.mark.parametrize(
    ("messages", "options", "expected"),
    [
        (
            [{"role": "system", "content": "You are helpful"},
             {"role": "user", "content": "Hello"}],
            {"enable_thinking": False},
            "[gMASK]<sop><|system|>You are helpful<|user|>Hello<|assistant|><think></think>",
        ),
        (
            [{"role": "system", "content": "You are helpful"},
             {"role": "user", "content": "Hello"}],
            {},
            "[gMASK]<sop><|system|>Reasoning Effort: High<|system|>You are helpful"
            "<|user|>Hello<|assistant|><think>",
        ),
        (
            [{"role": "system", "content": "System"},
             {"role": "developer", "content": "Developer"},
             {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
             {"role": "assistant", "content": " Hello "},
             {"role": "user", "content": "Again"}],
            {"enable_thinking": False},
            "[gMASK]<sop><|system|>System<|system|>Developer<|user|>Hi<|assistant|><think></think>"
            "Hello<|user|>Again<|assistant|><think></think>",
        ),
        (
            [{"role": "user", "content": "Hi"}],
            {"enable_thinking": True, "reasoning_effort": "high"},
            "[gMASK]<sop><|system|>Reasoning Effort: High<|user|>Hi<|assistant|><think>",
        ),
        (
            [{"role": "user", "content": "Hi"}],
            {"reasoning_effort": "minimal"},
            "[gMASK]<sop><|system|>Reasoning Effort: Low<|user|>Hi<|assistant|><think>",
        ),
        (
            [{"role": "user", "content": "Hi"}],
            {"reasoning_effort": "xhigh"},
            "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think>",
        ),
        (
            [{"role": "user", "content": "Weather in Berlin?"},
             {"role": "assistant", "content": None, "reasoning_content": "use the tool",
              "tool_calls": [{"type": "function", "function": {
                  "name": "get_weather", "arguments": {"city": "Berlin", "days": 2}}}]},
             {"role": "tool", "content": "cloudy"},
             {"role": "tool", "content": "14 C"}],
            {"enable_thinking": False, "tools": [WEATHER_TOOL]},
            "[gMASK]<sop>" + TOOLS_BLOCK + "<|user|>Weather in Berlin?<|assistant|><think>"
            "use the tool</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin"
            "</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
            "<|observation|><tool_response>cloudy</tool_response><tool_response>14 C"
            "</tool_response><|assistant|><think></think>",
        ),
        (
            [{"role": "user", "content": "Hi"}],
            {"enable_thinking": False, "tools": [WEATHER_TOOL], "tool_choice": "required"},
            "[gMASK]<sop>" + TOOLS_BLOCK + "\n\nYou must call one of the functions above. "
            "Do not answer directly.<|user|>Hi<|assistant|><think></think>",
        ),
        (
            [{"role": "user", "content": "Hi"}],
            {"enable_thinking": False, "tools": [WEATHER_TOOL], "tool_choice": "none"},
            "[gMASK]<sop><|user|>Hi<|assistant|><think></think>",
        ),
        (
            [{"role": "user", "content": "Say hi"},
             {"role": "assistant", "content": "Héllo"}],
            {"enable_thinking": False},
            "[gMASK]<sop><|user|>Say hi<|assistant|><think></think>Héllo",
        ),
    ],
)
def test_template_renders_colibris_layout(
    messages: list[dict[str, Any]], options: dict[str, Any], expected: str
) -> None:
    assert render(messages, **options) == expected


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="Unsupported message role: robot"):
        render([{"role": "robot", "content": "beep"}])


def test_rendered_prompt_tokenizes_into_control_tokens() -> None:
    tok = Tokenizer.from_file(TOKENIZER_DIR)
    text = render([{"role": "user", "content": "Hello"}], enable_thinking=False)
    ids = tok.encode(text)
    names = ["[gMASK]", "<sop>", "<|user|>"]
    assert ids[:3] == [tok.token_to_id(n) for n in names]
    assert tok.decode(ids) == text
