"""A Messages request (Anthropic) as the prompt the engine gets: its messages and tools
translated to the OpenAI shapes the served family's chat template renders, in spec/http.md
§9's order.
``/v1/messages`` sends this prompt; ``/v1/messages/count_tokens`` counts it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from colibri.server import validation as v
from colibri.server.chat_family import ChatFamily
from colibri.server.context import JSON
from colibri.server.errors import bad
from colibri.server.template import Rendered

BLOCKS_MESSAGE = ("Colibri supports `text`, `image`, `tool_use` and `tool_result` content "
                  "blocks only.")


def _system(body: JSON) -> str | None:
    system = body.get("system")
    if system is None or system == "":
        return None
    if isinstance(system, str):
        return system
    if isinstance(system, list) and all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in system):
        return "".join(b["text"] for b in system) or None
    raise bad("`system` must be a string or an array of text blocks.", "system")


def _tool_result_text(content: Any) -> Any:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return "" if content is None else content


def translate_messages(body: JSON) -> list[JSON]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("`messages` must be a non-empty array.", "messages")
    out: list[JSON] = []
    system = _system(body)
    if system is not None:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad("Each message must be an object.", f"messages.{i}")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"Input message role {role!r} is not supported. Anthropic messages are "
                      "`user` or `assistant`; a system prompt goes in the top-level `system`.",
                      f"messages.{i}.role", "unsupported_role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad("Message content must be a string or an array of blocks.",
                      f"messages.{i}.content")
        texts: list[str] = []
        reasoning = None
        calls: list[JSON] = []
        results: list[JSON] = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            param = f"messages.{i}.content.{j}"
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "image" and role == "user":
                raise bad("Colibri currently supports text message content only.", param,
                          "unsupported_content_type")
            elif kind == "thinking" and role == "assistant":
                if not isinstance(block.get("thinking"), str) or not isinstance(
                        block.get("signature"), str):
                    raise bad("A `thinking` block needs string `thinking` and `signature`.",
                              param)
                reasoning = block["thinking"]
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("name"), str):
                    raise bad("A `tool_use` block needs a string `name`.", param)
                args = block.get("input") or {}
                if not isinstance(args, dict):
                    raise bad("`input` must be an object.", param)
                calls.append({"id": block.get("id") or "toolu_" + uuid.uuid4().hex[:24],
                              "type": "function", "function": {
                                  "name": block["name"],
                                  "arguments": json.dumps(args, ensure_ascii=False)}})
            elif kind == "tool_result" and role == "user":
                results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                "content": _tool_result_text(block.get("content"))})
            else:
                raise bad(BLOCKS_MESSAGE, f"{param}.type", "unsupported_content_type")
        if role == "user":
            out.extend(results)
            if texts or not results:
                out.append({"role": "user", "content": "".join(texts)})
        else:
            turn: JSON = {"role": "assistant", "content": "".join(texts) or None}
            if reasoning is not None:
                turn["reasoning_content"] = reasoning
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
    return out


def translate_tools(body: JSON) -> tuple[list[JSON] | None, Any]:
    tools = body.get("tools")
    translated = None
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("`tools` must be an array.", "tools")
        translated = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise bad("Each tool must be an object.", f"tools.{i}")
            if not isinstance(tool.get("name"), str):
                raise bad("Each tool requires a string `name`.", f"tools.{i}.name")
            schema = tool.get("input_schema", {"type": "object", "properties": {}})
            if not isinstance(schema, dict):
                raise bad("`input_schema` must be an object.", f"tools.{i}.input_schema")
            fn: JSON = {"name": tool["name"]}
            if isinstance(tool.get("description"), str):
                fn["description"] = tool["description"]
            fn["parameters"] = schema
            strict = tool.get("strict")
            if strict is not None and not isinstance(strict, bool):
                raise bad("`strict` must be a boolean.", f"tools.{i}.strict")
            if strict:
                fn["strict"] = True
            translated.append({"type": "function", "function": fn})
    choice = body.get("tool_choice")
    mapped: Any = None
    if choice is not None:
        if not isinstance(choice, dict):
            raise bad("`tool_choice` must be an object.", "tool_choice")
        kind = choice.get("type")
        if kind == "auto":
            mapped = "auto"
        elif kind == "any":
            mapped = "required"
        elif kind == "none":
            mapped = "none"
        elif kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise bad("`tool_choice.name` is required when type is `tool`.",
                          "tool_choice")
            mapped = {"type": "function", "function": {"name": choice["name"]}}
        else:
            raise bad("`tool_choice.type` must be auto, any, none, or tool.", "tool_choice",
                      "unsupported_value")
    return translated or None, mapped


def _thinking(body: JSON, think_default: bool) -> bool:
    if "thinking" not in body:
        return think_default
    thinking = body["thinking"]
    if not isinstance(thinking, dict):
        raise bad("`thinking` must be an object.", "thinking")
    return thinking.get("type") == "enabled"


def render_request(body: JSON, think_default: bool, need_max_tokens: bool,
                   family: ChatFamily) -> tuple[list[JSON], JSON, Rendered]:
    """Translate a Messages body and render the family's prompt, in spec/http.md §9's order;
    the prompt is the one the engine gets (and `count_tokens` counts)."""
    translated = translate_messages(body)
    tools, choice = translate_tools(body)
    thinking = family.thinking(_thinking(body, think_default))
    if need_max_tokens and body.get("max_tokens") is None:
        raise bad("`max_tokens` is required.", "max_tokens")
    openai_body: JSON = {"messages": translated, "max_tokens": body.get("max_tokens"),
                         "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                         "stream": body.get("stream", False),
                         "cache_slot": body.get("cache_slot")}
    if tools is not None:
        openai_body["tools"] = tools
    if choice is not None:
        openai_body["tool_choice"] = choice
    family.check_tools(openai_body)
    continued = family.template.continues(translated, openai_body)
    rendered = family.template.render(translated, thinking=thinking,
                                      effort="high" if thinking else None,
                                      tools=v.lenient_tool_spec(openai_body),
                                      continued=continued)
    return translated, openai_body, rendered
