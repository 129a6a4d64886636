"""Qwen3's native tool calls: one JSON object per ``<tool_call>`` block, as the model's own
chat template writes them into past turns (``fixtures/qwen3_chat_template.jinja``)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Only the body differs from GLM's form; the block markers, the streaming gate and the
recovery and reporting rules are :func:`colibri.server.toolcalls.parse_answer`'s.
"""

from __future__ import annotations

import json
from typing import Any

from colibri.server.toolcalls import (
    CLOSE,
    CallSyntax,
    ParsedAnswer,
    ToolCall,
    new_call_id,
    parse_answer,
)
from colibri.server.validation import ToolSpec


def _decode(body: str) -> tuple[str, dict[str, Any]] | str:
    """The call's name and arguments, or why the body is not ``{"name", "arguments"}``."""
    try:
        document = json.loads(body)
    except ValueError:
        return "the <tool_call> body is not a JSON object"
    if not isinstance(document, dict):
        return "the <tool_call> body is not a JSON object"
    name = document.get("name")
    if not isinstance(name, str) or not name:
        return "no function name in the <tool_call> body"
    args = document.get("arguments", {})
    if isinstance(args, str):
        # The template writes string arguments verbatim, so a model may echo that form.
        try:
            args = json.loads(args)
        except ValueError:
            return "`arguments` is not a JSON object"
    if not isinstance(args, dict):
        return "`arguments` is not a JSON object"
    return name, args


def _problem(body: str) -> str | None:
    decoded = _decode(body)
    return decoded if isinstance(decoded, str) else None


def _read(body: str, tools: ToolSpec) -> ToolCall | None:
    decoded = _decode(body)
    if isinstance(decoded, str):
        return None
    return ToolCall(new_call_id(), decoded[0], decoded[1])


def _recoverable(body: str, tools: ToolSpec) -> bool:
    """An unclosed last block is a call when its JSON is already complete."""
    return _problem(body) is None


QWEN_SYNTAX = CallSyntax(_problem, _read, _recoverable, (CLOSE,))


def parse_qwen_answer(text: str, tools: ToolSpec, length_limited: bool = False) -> ParsedAnswer:
    return parse_answer(text, tools, length_limited, QWEN_SYNTAX)
