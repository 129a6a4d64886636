"""The grammar section a chat request sends for the GLM output format (spec/http.md 4.3.1,
"Structured output"), shared by ``/v1/chat/completions`` and ``/v1/messages``.

Strict tools get the tool-call envelope; a response format beside them makes the reply
either the formatted answer or tool calls (OpenAI's reading: the model may call a tool or
answer in the format); alone, the format constrains the answer. With thinking on, each of
them starts after the model's ``</think>``: the reasoning itself is free.

A JSON Schema string with no ``maxLength`` gets a default bound (:func:`bound_strings`): a
small model that never writes the closing quote would otherwise run to ``max_tokens`` and
leave JSON that does not parse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from colibri.server import validation as v
from colibri.server.context import JSON
from colibri.server.errors import bad

from colibri.text.grammar import GrammarError, grammar_kind
from colibri.text.grammar import check as check_grammar
from colibri.text.tool_grammar import after_reasoning, tool_envelope

__all__ = ["bound_strings", "constrain_output", "default_string_bound",
           "openai_parameters_param"]

#: The ``maxLength`` a response format's string gets when its schema gives none (characters);
#: ``COLI_JSON_MAX_STRING`` changes it, ``0`` turns the bound off (spec/http.md 4.3.1).
DEFAULT_MAX_STRING = 256
#: A string with one of these is already bounded, or bounded in a way maxLength must not meet.
_SHAPED = ("maxLength", "enum", "const", "pattern", "format")
#: Keywords whose values are data, not schemas.
_DATA = ("enum", "const", "default", "examples")
#: Keywords whose values map names to schemas (a property may be called "default").
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def default_string_bound() -> int:
    """``COLI_JSON_MAX_STRING`` (characters, 0: off), else :data:`DEFAULT_MAX_STRING`."""
    raw = os.environ.get("COLI_JSON_MAX_STRING", "")
    try:
        return max(0, int(raw)) if raw.strip() else DEFAULT_MAX_STRING
    except ValueError:
        return DEFAULT_MAX_STRING


def _bound_map(value: Any, bound: int) -> Any:
    """A name -> schema map (``properties``...): every value is a schema, whatever its name."""
    if not isinstance(value, dict):
        return value
    return {name: bound_strings(item, bound) for name, item in value.items()}


def _is_string(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def bound_strings(schema: Any, bound: int) -> Any:
    """A copy of a JSON Schema in which every string schema without a bound of its own gets
    ``maxLength`` (``bound``, or its ``minLength`` when that is larger)."""
    if isinstance(schema, list):
        return [bound_strings(item, bound) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _bound_map(value, bound) if key in _MAPS
           else value if key in _DATA else bound_strings(value, bound)
           for key, value in schema.items()}
    if bound > 0 and _is_string(out) and not any(key in out for key in _SHAPED):
        least = out.get("minLength")
        out["maxLength"] = max(bound, least) if isinstance(least, int) else bound
    return out


def _bounded_answer(answer: str) -> str:
    """The response format with its strings bounded, when it is a JSON Schema the bound
    leaves enforceable; else as it came."""
    bound = default_string_bound()
    if bound == 0 or grammar_kind(answer) != "json_schema":
        return answer
    bounded = json.dumps(bound_strings(json.loads(answer), bound), ensure_ascii=False)
    try:
        check_grammar(bounded)
    except GrammarError:
        return answer
    return bounded


def openai_parameters_param(index: int, tool: JSON) -> str:
    """Where a chat tool's schema sits: ``tools.<i>.function.parameters`` (or a bare
    function's ``tools.<i>.parameters``)."""
    return f"tools.{index}.function.parameters" if "function" in tool else (
        f"tools.{index}.parameters")


def constrain_output(
    shaping: v.Shaping,
    tools: list[JSON] | None,
    strict: bool,
    thinking: bool,
    parameters_param: Callable[[int, JSON], str] = openai_parameters_param,
) -> None:
    """Replace ``shaping.grammar`` (the response format's section, or empty) with the grammar
    the engine enforces; a strict tool schema that cannot be enforced is a 400 naming the
    unsupported feature at ``parameters_param(i, tool)``."""
    spec = shaping.tools
    strict_tools = strict or any(v.tool_function(t).get("strict") is True for t in tools or [])
    answer = _bounded_answer(shaping.grammar.decode()) if shaping.grammar else None
    if spec is not None and strict_tools:
        for i, tool in enumerate(tools or []):
            params = v.tool_function(tool).get("parameters")
            if not isinstance(params, dict):
                continue
            try:
                check_grammar(json.dumps(params))
            except GrammarError as exc:
                param = parameters_param(i, tool)
                # The field's own name in the message: Anthropic errors carry no `param`.
                field = param.rsplit(".", 1)[-1]
                raise bad(f"Tool `{field}` cannot be enforced: {exc}", param,
                          "invalid_value") from None
        required = spec.forced is not None or spec.choice == "required"
        shaping.grammar = tool_envelope(spec.functions, required, thinking, answer).encode()
    elif answer is not None and thinking:
        shaping.grammar = after_reasoning(answer).encode()
    elif answer is not None:
        shaping.grammar = answer.encode()
