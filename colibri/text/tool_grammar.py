"""Grammars the server builds for the GLM output format (spec/http.md, "Structured output"):
an answer after the reasoning block, and the tool-call envelope

    free text <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>...

with each argument value constrained by its parameter schema: a string parameter is written
raw (as the template and colibri.server.toolcalls read it), any other as JSON. Arguments
come in the order the schema declares them; required ones must appear, others may, and no
undeclared key is allowed. With a response format beside the tools the reply is either the
formatted answer or tool calls (no free text). All are llguidance Lark grammars
(colibri.text.grammar) that nest the client's grammar section as one rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from colibri.text.grammar import LARK_PREFIX, gbnf_to_lark, grammar_kind

__all__ = ["after_reasoning", "nested", "tool_envelope"]

#: Free text that never spells a tool-call tag (the tags are added tokens, which text rules
#: cannot produce anyway; this also forbids spelling them byte by byte).
_TEXT = r"/(?s:.*)/ & ~/(?s:.*<\/?(tool_call|arg_key|arg_value)>.*)/"
_RAW_VALUE = r"/(?s:.*)/ & ~/(?s:.*<\/?(tool_call|arg_key|arg_value)>.*)/"


_REASONING = r"/(?s:.*)/ & ~/(?s:.*<\/?think>.*)/"


def _lit(text: str) -> str:
    return json.dumps(text)


def _json(schema: Any) -> str:
    """A ``%json`` rule body, compact like a top-level JSON-Schema section (no whitespace
    between tokens: llguidance's nested default would allow it)."""
    compact = dict(schema) if isinstance(schema, Mapping) else {}
    compact["x-guidance"] = {"whitespace_flexible": False}
    return f"%json {json.dumps(compact, ensure_ascii=False)}"


def nested(section: str) -> str:
    """A grammar section (JSON Schema, Lark or GBNF) as the body of one rule of a larger
    Lark grammar; GrammarError for a GBNF grammar that does not convert."""
    kind = grammar_kind(section)
    if kind == "json_schema":
        return _json(json.loads(section))
    lark = section if kind == "lark" else gbnf_to_lark(section)
    return "%lark {\n" + lark + "\n}"


def after_reasoning(section: str) -> str:
    """A grammar section allowed only after the model's ``</think>``."""
    return (
        f"{LARK_PREFIX} {{}}\n"
        "start: REASONING </think> answer\n"
        f"REASONING: {_REASONING}\n"
        f"answer: {nested(section)}\n"
    )


def _argument(rule: str, key: str, schema: Any, lines: list[str]) -> str:
    value = f"{rule}_v"
    if isinstance(schema, Mapping) and schema.get("type") == "string" and not (
        {"enum", "const", "pattern", "format"} & set(schema)
    ):
        lines.append(f"{value.upper()}: {_RAW_VALUE}")
        value = value.upper()
    elif isinstance(schema, Mapping) and schema.get("type") == "string" and (
        "enum" in schema or "const" in schema
    ):
        options = schema.get("enum", [schema.get("const")])
        lines.append(f"{value}: " + " | ".join(_lit(str(o)) for o in options))
    else:
        lines.append(f"{value}: {_json(schema)}")
    lines.append(f"{rule}: <arg_key> {_lit(key)} </arg_key> <arg_value> {value} </arg_value>")
    return rule


def _call(index: int, function: Mapping[str, Any], lines: list[str]) -> str:
    rule = f"call{index}"
    params = function.get("parameters")
    props = params.get("properties") if isinstance(params, Mapping) else None
    required = params.get("required", []) if isinstance(params, Mapping) else []
    parts = [_lit(str(function.get("name", "")))]
    if isinstance(props, Mapping):
        for j, (key, schema) in enumerate(props.items()):
            arg = _argument(f"{rule}_a{j}", str(key), schema, lines)
            parts.append(arg if key in required else f"{arg}?")
    else:
        # No declared parameters: any keys, any raw values.
        lines.append(f"{rule.upper()}_K: /[^<]+/")
        lines.append(f"{rule.upper()}_V: {_RAW_VALUE}")
        parts.append(
            f"(<arg_key> {rule.upper()}_K </arg_key> <arg_value> {rule.upper()}_V </arg_value>)*"
        )
    lines.append(f"{rule}: <tool_call> " + " ".join(parts) + " </tool_call>")
    return rule


def tool_envelope(
    functions: Sequence[Mapping[str, Any]],
    required: bool,
    reasoning: bool = False,
    answer: str | None = None,
) -> str:
    """Free text then tool calls of ``functions``, or when ``required`` one or more calls
    and nothing else; with ``answer`` (a response format's grammar section, ignored when a
    call is required) the reply is either that answer or one or more calls; with
    ``reasoning`` the model first closes its reasoning block with ``</think>``."""
    lines: list[str] = []
    calls = [_call(i, fn, lines) for i, fn in enumerate(functions)]
    # A required call comes at once: free text before it could run on to max_tokens.
    if required:
        body = "call+"
    elif answer is not None:
        body = "(answer | call+)"
        lines.append(f"answer: {nested(answer)}")
    else:
        body = "TEXT call*"
    head = [
        f"{LARK_PREFIX} {{}}",
        f"start: {'REASONING </think> ' if reasoning else ''}{body}",
        f"TEXT: {_TEXT}",
        f"REASONING: {_REASONING}",
        "call: " + " | ".join(calls),
    ]
    return "\n".join(head + lines) + "\n"
