"""GLM tool-call parsing into OpenAI ``tool_calls`` / Anthropic ``tool_use`` (spec/http.md §7.1).

The model writes ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>``.
Default mode recovers an unclosed last call and reports every other irregular block as an
invalid tool call beside the content; strict mode refuses anything irregular.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colibri.server.errors import APIError
from colibri.server.validation import ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
CLOSED_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
ARG_PAIR = re.compile(r"<arg_key>([^<]*)</arg_key><arg_value>(.*?)</arg_value>", re.S)
NAME = re.compile(r"\s*([A-Za-z0-9_.\-]+)")
STREAM_HOLD = len(OPEN) - 1


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {
            "name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _schema_type(tools: ToolSpec, name: str, key: str) -> str | None:
    for fn in tools.functions:
        if fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            prop = props.get(key) if isinstance(props, dict) else None
            if not isinstance(prop, dict):
                return None
            kind = prop.get("type")
            if isinstance(kind, list):
                kind = next((k for k in kind if k != "null"), None)
            return kind if isinstance(kind, str) else None
    return None


def typed_value(kind: str | None, raw: str) -> Any:
    if kind == "string":
        return raw
    if kind is not None and kind not in ("integer", "number", "boolean", "object", "array"):
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if kind in ("integer", "number") and isinstance(value, bool):
        return raw
    return value


def salvage_enabled() -> bool:
    return os.environ.get("COLI_TOOL_SALVAGE") == "1"


def _salvage(name: str, rest: str, tools: ToolSpec) -> dict[str, Any]:
    """COLI_TOOL_SALVAGE=1: a call without argument tags gets its remaining text as the
    first required (else first declared) parameter, JSON-parsed when it parses."""
    payload = re.sub(r"<[^>]*>", "", rest).strip()
    if payload.startswith("(") and payload.endswith(")"):
        payload = payload[1:-1].strip()
    if not payload:
        return {}
    key = "input"
    for fn in tools.functions:
        if fn.get("name") == name and isinstance(fn.get("parameters"), dict):
            params = fn["parameters"]
            required = params.get("required") or []
            props = params.get("properties") or {}
            if required:
                key = str(required[0])
            elif props:
                key = str(next(iter(props)))
    try:
        value: Any = json.loads(payload)
    except ValueError:
        value = payload
    return {key: value}


def _call_from_body(body: str, tools: ToolSpec) -> ToolCall | None:
    match = NAME.match(body)
    name = match.group(1) if match else body.strip()
    if not name:
        return None
    args = {k: typed_value(_schema_type(tools, name, k), v)
            for k, v in ARG_PAIR.findall(body)}
    if not args and salvage_enabled() and match is not None:
        args = _salvage(name, body[match.end():], tools)
    return ToolCall(new_call_id(), name, args)


def _declared(tools: ToolSpec) -> set[str]:
    return {str(fn.get("name")) for fn in tools.functions}


@dataclass(frozen=True)
class InvalidToolCall:
    """A ``<tool_call>`` the model wrote that is not a call: its text, left in the content,
    and why it was not read as one (spec/http.md §7.1)."""

    text: str
    error: str

    def json(self) -> dict[str, str]:
        return {"text": self.text, "error": self.error}


@dataclass(frozen=True)
class ParsedAnswer:
    content: str | None
    calls: list[ToolCall]
    invalid: list[InvalidToolCall]


#: Markers that belong inside a ``<tool_call>`` block only.
INNER_MARKERS = (CLOSE, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def _body_problem(body: str) -> str | None:
    """Why a closed call's body is not ``name<arg_key>k</arg_key><arg_value>v</arg_value>…``
    (None: it is). With COLI_TOOL_SALVAGE=1 a body with no argument tags is salvaged, so
    text after the name is not a problem there."""
    match = NAME.match(body)
    if match is None:
        return "no function name after <tool_call>"
    rest = body[match.end():]
    if not ARG_PAIR.search(rest) and salvage_enabled():
        return None
    if ARG_PAIR.sub("", rest).strip():
        return "text outside <arg_key>/<arg_value> pairs"
    return None


def _glm_recoverable(body: str, tools: ToolSpec) -> bool:
    return bool(ARG_PAIR.search(body)) or body.strip() in _declared(tools)


@dataclass(frozen=True)
class CallSyntax:
    """What a family writes between ``<tool_call>`` and ``</tool_call>``: the families share
    the block markers, the streaming gate and the recovery rules of :func:`parse_answer`, and
    differ only in how a block's body reads as a call."""

    #: Why a closed block's body is not a call (None: it is one).
    problem: Callable[[str], str | None]
    #: The call a body holds, or None.
    read: Callable[[str, ToolSpec], ToolCall | None]
    #: Whether the body of an unclosed last block is complete enough to recover as a call.
    recoverable: Callable[[str, ToolSpec], bool]
    #: Markers that belong inside a block only; found in prose they are reported.
    inner_markers: tuple[str, ...]


GLM_SYNTAX = CallSyntax(_body_problem, _call_from_body, _glm_recoverable, INNER_MARKERS)


def parse_answer(text: str, tools: ToolSpec, length_limited: bool = False,
                 syntax: CallSyntax = GLM_SYNTAX) -> ParsedAnswer:
    """The calls in the answer text, and each ``<tool_call>`` that is not one. A malformed
    block stays in the content (nothing the model wrote is dropped) and is reported beside
    it, so that a client never takes a failed call for prose without being told."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    kept: list[str] = []
    at = 0
    for match in CLOSED_CALL.finditer(text):
        kept.append(text[at:match.start()])
        at = match.end()
        problem = syntax.problem(match.group(1))
        call = None if problem else syntax.read(match.group(1), tools)
        if call is None:
            invalid.append(InvalidToolCall(match.group(0),
                                           problem or "no function name after <tool_call>"))
            kept.append(match.group(0))
        else:
            calls.append(call)
    kept.append(text[at:])
    content = "".join(kept)
    # Only the text outside the calls already read: a malformed block kept above holds its
    # own <tool_call>, which must not be taken for the unclosed last one.
    outside = CLOSED_CALL.sub("", text)
    tail_at = outside.rfind(OPEN)
    if tail_at >= 0:
        block = outside[tail_at:]
        body = block[len(OPEN):]
        for size in range(len(CLOSE) - 1, 0, -1):
            if body.endswith(CLOSE[:size]):
                body = body[:-size]
                break
        recovered = None
        if syntax.recoverable(body, tools):
            recovered = syntax.read(body, tools)
        if recovered is not None:
            calls.append(recovered)
            content = content[:content.rfind(OPEN)]
        else:
            invalid.append(InvalidToolCall(block, "ended at the generation limit inside "
                                           "<tool_call>" if length_limited else
                                           "<tool_call> without </tool_call>"))
    prose = outside[:tail_at] if tail_at >= 0 else outside
    for marker in syntax.inner_markers:
        if marker in prose:
            invalid.append(InvalidToolCall(marker, f"{marker} outside a <tool_call> block"))
    if "</think>" in content:
        content = content.split("</think>", 1)[1]
    content = content.replace("<think>", "").replace("</think>", "").strip()
    return ParsedAnswer(content or None, calls, invalid)


def parse_tool_calls(text: str, tools: ToolSpec) -> tuple[str | None, list[ToolCall]]:
    """Content (stripped, None when empty) and the calls found in the answer text."""
    parsed = parse_answer(text, tools)
    return parsed.content, parsed.calls


def _strict_fail(reason: str) -> APIError:
    return APIError(502, f"Invalid GLM tool call: {reason}", type="server_error",
                    code="invalid_model_tool_call")


def parse_strict(text: str, tools: ToolSpec, length_limited: bool) -> tuple[str | None,
                                                                               list[ToolCall]]:
    if length_limited and OPEN in text:
        raise APIError(502, "GLM tool call ended at the generation limit.",
                       type="server_error", code="invalid_model_tool_call")
    calls: list[ToolCall] = []
    functions = {str(fn.get("name")): fn for fn in tools.functions}
    for match in CLOSED_CALL.finditer(text):
        body = match.group(1)
        name_match = NAME.match(body)
        name = name_match.group(1) if name_match else ""
        if name not in functions:
            raise _strict_fail("undeclared function")
        rest = body[name_match.end():] if name_match else body
        if ARG_PAIR.sub("", rest).strip():
            raise _strict_fail("malformed argument syntax")
        params = functions[name].get("parameters")
        props = params.get("properties", {}) if isinstance(params, dict) else {}
        required = params.get("required", []) if isinstance(params, dict) else []
        args: dict[str, Any] = {}
        for key, raw in ARG_PAIR.findall(rest):
            if key not in props or key in args:
                raise _strict_fail("unknown, duplicate, or malformed argument")
            kind = _schema_type(tools, name, key)
            value = typed_value(kind, raw)
            if not _matches(kind, value):
                raise _strict_fail("argument does not match its declared type")
            args[key] = value
        if any(r not in args for r in required):
            raise _strict_fail("missing required argument")
        calls.append(ToolCall(new_call_id(), name, args))
    outside = CLOSED_CALL.sub("", text)
    if any(m in outside for m in ("<tool_call", "</tool_call", "<arg_key", "<arg_value")):
        raise _strict_fail("incomplete or stray tool marker")
    if "</think>" in outside:
        outside = outside.split("</think>", 1)[1]
    content = outside.replace("<think>", "").replace("</think>", "").strip()
    return (content or None), calls


def _matches(kind: str | None, value: Any) -> bool:
    checks: dict[str, Any] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
    }
    check = checks.get(kind or "")
    return True if check is None else bool(check(value))


class ToolStreamGate:
    """Streaming content release with tools active: a fixed 10-character hold-back, and
    nothing after the first ``<tool_call>``."""

    def __init__(self) -> None:
        self.pending = ""
        self.in_call = False

    def feed(self, text: str) -> str:
        if self.in_call:
            return ""
        text = self.pending + text
        at = text.find(OPEN)
        if at >= 0:
            self.in_call = True
            self.pending = ""
            return text[:at]
        cut = max(0, len(text) - STREAM_HOLD)
        self.pending = text[cut:]
        return text[:cut]

    def finish(self) -> str:
        out = "" if self.in_call else self.pending
        self.pending = ""
        return out
