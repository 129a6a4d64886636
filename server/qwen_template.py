"""Qwen3's ChatML template (``fixtures/qwen3_chat_template.jinja``, the Qwen3-MoE checkpoints'
own), rendered byte for byte as transformers' ``apply_chat_template`` renders it::

    <|im_start|>system\\nS<|im_end|>\\n<|im_start|>user\\nU<|im_end|>\\n<|im_start|>assistant\\n

With thinking off the cue ends in the empty ``<think>\\n\\n</think>\\n\\n`` block the template
writes for ``enable_thinking=False``; with it on the model opens its own block. Past assistant
turns after the last user query keep their reasoning in a ``<think>`` block, earlier ones lose
it; tools are offered as JSON lines in a ``<tools>`` block and calls are JSON objects in
``<tool_call>`` blocks; tool results are grouped into one user turn of ``<tool_response>``
blocks. Where the Jinja template silently drops a turn it cannot write (an unknown role) or
fails (``content: null``), we refuse by name or read an empty string (spec/DEVIATIONS.md).
"""

from __future__ import annotations

import json
from typing import Any

from colibri.server.errors import bad
from colibri.server.template import (
    REQUIRED_LINE,
    Rendered,
    continue_assistant_enabled,
    message_text,
    refuse_tools_in_continuation,
    tool_call_fields,
)
from colibri.server.validation import ToolSpec

JSON = dict[str, Any]

START = "<|im_start|>"
END = "<|im_end|>\n"
EMPTY_THINKING = "<think>\n\n</think>\n\n"
TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query."
              "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
              "\n<tools>")
TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name "
              "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
              "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


def _tojson(value: Any) -> str:
    """transformers' ``tojson`` filter: ``json.dumps`` with non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False)


def _tools_system(tools: ToolSpec, system: str | None) -> str:
    """The system turn that offers the tools. Every declared tool is offered, a forced choice
    included (the template neither narrows nor names it, seeds/api.md); ``required`` adds
    the one line every tool block gets."""
    out = START + "system\n" + ("" if system is None else system + "\n\n") + TOOLS_HEAD
    for fn in tools.offered or tools.functions:
        out += "\n" + _tojson({"type": "function", "function": fn})
    out += TOOLS_TAIL
    if tools.choice == "required":
        out += REQUIRED_LINE
    return out + END


def _is_tool_response(text: str) -> bool:
    return text.startswith("<tool_response>") and text.endswith("</tool_response>")


def _last_query(roles: list[str], texts: list[str]) -> int:
    """The index of the last real user query (not a wrapped tool response): assistant turns
    after it keep their reasoning."""
    for i in range(len(roles) - 1, -1, -1):
        if roles[i] == "user" and not _is_tool_response(texts[i]):
            return i
    return len(roles) - 1


def _reasoning_and_content(message: JSON, text: str, index: int) -> tuple[str, str]:
    """A past reply's reasoning: the ``reasoning_content`` sent back, else the ``<think>``
    block the content itself carries (the template's own split)."""
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise bad("`reasoning_content` must be a string.",
                      f"messages.{index}.reasoning_content")
        return reasoning, text
    if "</think>" not in text:
        return "", text
    head, tail = text.split("</think>")[0], text.split("</think>")[-1]
    return head.rstrip("\n").split("<think>")[-1].lstrip("\n"), tail.lstrip("\n")


def _calls_text(message: JSON, content: str, index: int) -> str:
    calls = message.get("tool_calls")
    if not calls:
        return ""
    if not isinstance(calls, list):
        raise bad("`tool_calls` must be an array.", f"messages.{index}.tool_calls")
    out = ""
    for j, call in enumerate(calls):
        name, args = tool_call_fields(call, index, j)
        if j > 0 or content:
            out += "\n"
        shown = args if isinstance(args, str) else _tojson(args)
        out += f'<tool_call>\n{{"name": "{name}", "arguments": {shown}}}\n</tool_call>'
    return out


class QwenTemplate:
    """The Qwen3 renderer (server/chat_family.py's Qwen3-MoE family)."""

    def continues(self, messages: list[Any], body: JSON) -> bool:
        """A trailing assistant turn is continued (transformers' ``continue_final_message``):
        the prompt ends where its content ends, inside the reply's turn."""
        if not continue_assistant_enabled() or not messages:
            return False
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "assistant":
            return False
        refuse_tools_in_continuation(last, len(messages) - 1, body)
        return True

    def render(self, messages: list[Any], *, thinking: bool, effort: str | None,
               tools: ToolSpec | None, continued: bool) -> Rendered:
        """Qwen3 has no effort levels: any effort that turns thinking on is just "on"."""
        roles: list[str] = []
        texts: list[str] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise bad("Each message must be an object.", f"messages.{i}")
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise bad(f"Unsupported message role: {role!r}.", f"messages.{i}.role",
                          "unsupported_role")
            # OpenAI's `developer` is the system role under its newer name.
            roles.append("system" if role == "developer" else str(role))
            content = message.get("content")
            texts.append("" if content is None and role == "assistant"
                         else message_text(content, i))
        first_system = texts[0] if roles and roles[0] == "system" else None
        if tools is not None:
            out = _tools_system(tools, first_system)
        elif first_system is not None:
            out = START + "system\n" + first_system + END
        else:
            out = ""
        query = _last_query(roles, texts)
        last = len(messages) - 1
        for i, (role, text) in enumerate(zip(roles, texts, strict=True)):
            if role == "user" or (role == "system" and i > 0):
                out += START + role + "\n" + text + END
            elif role == "assistant":
                reasoning, content = _reasoning_and_content(messages[i], text, i)
                out += START + "assistant\n"
                if i > query and (i == last or reasoning):
                    out += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
                    out += content.lstrip("\n")
                else:
                    out += content
                if i == last and continued:
                    return Rendered(out, False, True)
                out += _calls_text(messages[i], content, i) + END
            elif role == "tool":
                if i == 0 or roles[i - 1] != "tool":
                    out += START + "user"
                out += "\n<tool_response>\n" + text + "\n</tool_response>"
                if i == last or roles[i + 1] != "tool":
                    out += END
        out += START + "assistant\n"
        if not thinking:
            return Rendered(out + EMPTY_THINKING, False, False)
        # The model opens its own <think> block; its text up to </think> is reasoning.
        return Rendered(out, True, False)
