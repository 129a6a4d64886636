"""The grammar section a chat request sends for the GLM output format (spec/http.md 4.3.1,
"Structured output"), shared by ``/v1/chat/completions`` and ``/v1/messages``.

Strict tools get the tool-call envelope; a response format beside them makes the reply
either the formatted answer or tool calls (OpenAI's reading: the model may call a tool or
answer in the format); alone, the format constrains the answer. With thinking on, each of
them starts after the model's ``</think>``: the reasoning itself is free.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from colibri.server import validation as v
from colibri.server.context import JSON
from colibri.server.errors import bad

from colibri.text.grammar import GrammarError
from colibri.text.grammar import check as check_grammar
from colibri.text.tool_grammar import after_reasoning, tool_envelope

__all__ = ["constrain_output", "openai_parameters_param"]


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
    answer = shaping.grammar.decode() if shaping.grammar else None
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
