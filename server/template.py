"""GLM-5 chat template rendering (spec/http.md §7), byte-exact with colibri's gateway."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from colibri.server.errors import bad
from colibri.server.validation import ToolSpec, declared_tools

from colibri.text import chat_format as glm

JSON = dict[str, Any]

EFFORT_WORDS = {"minimal": "Low", "low": "Low", "medium": "Medium", "high": "High",
                "xhigh": "Max"}

TOOLS_HEAD = (glm.SYSTEM + "\n# Tools\n\nYou may call one or more functions to assist with the "
              "user query.\n\nYou are provided with function signatures within <tools></tools> "
              "XML tags:\n<tools>\n")
TOOLS_TAIL = ("</tools>\n\nFor each function call, output the function name and arguments "
              "within the following XML format:\n<tool_call>{function-name}<arg_key>"
              "{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}"
              "</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>")
REQUIRED_LINE = "\n\nYou must call one of the functions above. Do not answer directly."


@dataclass(frozen=True)
class Rendered:
    prompt: str
    #: The reply starts inside the reasoning block (thinking on and a cue was appended).
    starts_in_reasoning: bool
    continued: bool


def continue_assistant_enabled() -> bool:
    return os.environ.get("COLI_CONTINUE_ASSISTANT", "1") != "0"


def message_text(content: Any, index: int) -> str:
    """A message's text: a string, or an array of text parts joined (every family's rule)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text"):
                raise bad("Colibri currently supports text message content only.",
                          f"messages.{index}.content.{k}", "unsupported_content_type")
            text = part.get("text")
            if not isinstance(text, str):
                raise bad("Text content parts require a string `text` field.",
                          f"messages.{index}.content.{k}.text")
            parts.append(text)
        return "".join(parts)
    raise bad("Message content must be a string or an array of text parts.",
              f"messages.{index}.content")


def tool_call_fields(call: Any, index: int, j: int) -> tuple[str, Any]:
    """A past tool call's function name and its ``arguments`` as sent (``tool_calls[j]`` of
    message ``index``), refused by name when the call is not shaped as OpenAI's."""
    if not isinstance(call, dict):
        raise bad("Each tool call must be an object.", f"messages.{index}.tool_calls.{j}")
    fn = call.get("function", {})
    if not isinstance(fn, dict):
        raise bad("`function` must be an object.", f"messages.{index}.tool_calls.{j}.function")
    name = fn.get("name", "")
    if not isinstance(name, str):
        raise bad("`function.name` must be a string.",
                  f"messages.{index}.tool_calls.{j}.function.name")
    return name, fn.get("arguments")


def _tool_call_text(call: Any, index: int, j: int) -> str:
    name, args = tool_call_fields(call, index, j)
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            args = None
    out = "<tool_call>" + name
    if isinstance(args, dict):
        for key, value in args.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            out += f"<arg_key>{key}</arg_key><arg_value>{shown}</arg_value>"
    return out + "</tool_call>"


def _assistant(message: JSON, index: int) -> str:
    reasoning = message.get("reasoning_content", "")
    if reasoning is None:
        reasoning = ""
    if not isinstance(reasoning, str):
        raise bad("`reasoning_content` must be a string.",
                  f"messages.{index}.reasoning_content")
    content = message.get("content")
    text = "" if content is None else message_text(content, index)
    out = glm.assistant_turn(reasoning, text.strip())
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad("`tool_calls` must be an array.", f"messages.{index}.tool_calls")
        out += "".join(_tool_call_text(c, index, j) for j, c in enumerate(calls))
    return out


def tools_block(tools: ToolSpec) -> str:
    lines = ""
    for fn in tools.functions:
        shown = {k: v for k, v in fn.items() if k not in ("defer_loading", "strict")}
        lines += json.dumps(shown, ensure_ascii=False) + "\n"
    block = TOOLS_HEAD + lines + TOOLS_TAIL
    if tools.forced is not None:
        block += f"\n\nYou must call the function `{tools.forced}`. Do not answer directly."
    elif tools.choice == "required":
        block += REQUIRED_LINE
    return block


def refuse_tools_in_continuation(last: JSON, n: int, body: JSON) -> None:
    """Every family with a tool format parses a reply's calls from the turn's start, so a
    continued turn (message ``n``, ``last``) is refused together with tools."""
    if declared_tools(body):
        raise bad("A continued assistant turn cannot be combined with `tools`: the tool-call "
                  "parsers read an assistant turn from its start, and a continuation can end "
                  "anywhere -- including inside a <tool_call> block.", "tools",
                  "unsupported_parameter")
    if last.get("tool_calls"):
        raise bad("A continued `assistant` message cannot carry `tool_calls`.",
                  f"messages.{n}.tool_calls", "unsupported_value")


def check_continuation(messages: list[Any], body: JSON) -> bool:
    """Whether a trailing assistant turn is continued; raises the colibri refusals."""
    if not continue_assistant_enabled() or not messages:
        return False
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return False
    n = len(messages) - 1
    refuse_tools_in_continuation(last, n, body)
    if len(messages) < 2:
        raise bad("A continued `assistant` turn needs a preceding turn to continue from.",
                  "messages")
    content = last.get("content")
    if content is not None and not isinstance(content, str | list):
        raise bad("Message content must be a string or an array of blocks.",
                  f"messages.{n}.content")
    text = "" if content is None else message_text(content, n)
    if not text.strip():
        raise bad("A continued `assistant` turn needs text to continue. An empty one ends the "
                  "prompt on a closed, empty <think></think> block, which is the "
                  "out-of-distribution position #1327 removed -- the model reasons straight "
                  "through it instead of answering.", f"messages.{n}.content",
                  "invalid_value")
    if text != text.rstrip():
        raise bad("A continued `assistant` turn cannot end with whitespace: the template "
                  "strips it, so the model would resume from different bytes than the ones "
                  "sent. Put the space at the start of what you expect back instead.",
                  f"messages.{n}.content", "invalid_value")
    return True


def render_chat(messages: list[Any], *, thinking: bool, effort: str | None,
                tools: ToolSpec | None, continued: bool) -> Rendered:
    out = glm.PREFIX
    if thinking:
        out += glm.SYSTEM + "Reasoning Effort: " + EFFORT_WORDS.get(effort or "", "High")
    if tools is not None:
        out += tools_block(tools)
    in_observation = False
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad("Each message must be an object.", f"messages.{i}")
        role = message.get("role")
        if role != "tool":
            in_observation = False
        if role in ("system", "developer"):
            out += glm.SYSTEM + message_text(message.get("content"), i)
        elif role == "user":
            out += glm.USER + message_text(message.get("content"), i)
        elif role == "assistant":
            out += _assistant(message, i)
        elif role == "tool":
            if not in_observation:
                out += glm.OBSERVATION
                in_observation = True
            out += "<tool_response>" + message_text(message.get("content"), i) + "</tool_response>"
        else:
            raise bad(f"Unsupported message role: {role!r}.", f"messages.{i}.role",
                      "unsupported_role")
    if continued:
        return Rendered(out, False, True)
    out += glm.assistant_cue(thinking)
    return Rendered(out, thinking, False)


class GlmTemplate:
    """GLM-5's renderer (also DeepSeek-V3's here) as one family's template
    (server/chat_family.py)."""

    def continues(self, messages: list[Any], body: JSON) -> bool:
        return check_continuation(messages, body)

    def render(self, messages: list[Any], *, thinking: bool, effort: str | None,
               tools: ToolSpec | None, continued: bool) -> Rendered:
        return render_chat(messages, thinking=thinking, effort=effort, tools=tools,
                           continued=continued)
