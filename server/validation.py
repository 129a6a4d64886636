"""Request-field validation shared by chat, completions and the translated Anthropic body.

Rules, messages, params and codes follow colibri's gateway catalogue (spec/http.md §4);
the order of the checks is part of the contract, because the first failure wins.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from colibri.server.errors import APIError, bad

from colibri.text.grammar import GrammarError
from colibri.text.grammar import check as check_grammar

JSON = dict[str, Any]

EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class ToolSpec:
    """The active tool declarations after ``tool_choice`` narrowing."""

    functions: tuple[JSON, ...]
    choice: str | JSON
    forced: str | None
    #: Every declared function, before a forced choice narrows ``functions``: a template
    #: that does not narrow (Qwen3's, seeds/api.md) offers them all.
    offered: tuple[JSON, ...] = ()


@dataclass
class Shaping:
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    grammar: bytes
    tools: ToolSpec | None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def tool_function(tool: JSON) -> JSON:
    function = tool.get("function")
    return function if isinstance(function, dict) else tool


def declared_tools(body: JSON) -> object:
    """``tools`` when present and not null (``[]`` included), else the legacy ``functions``."""
    tools = body.get("tools")
    return body.get("functions") if tools is None else tools


def validate_tools(body: JSON) -> list[JSON] | None:
    if body.get("tools") is not None:
        tools = body["tools"]
        if not isinstance(tools, list):
            # `{}`, false, 0 and "" are mistakes, not "no tools".
            raise bad("`tools` must be an array.", "tools", "invalid_value")
        if not tools:
            return None  # `tools: []` means no tools, whatever `functions` says
    else:
        tools = body.get("functions")
        if tools is None:
            return None
        if not isinstance(tools, list) or not tools:
            raise bad("`tools` must be a non-empty array.", "tools", "invalid_value")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad(f"Each tool must be an object, got {type(tool).__name__} at index {i}.",
                      f"tools.{i}", "invalid_value")
        if "function" in tool and not isinstance(tool["function"], dict):
            raise bad(f"Tool function must be an object at index {i}.",
                      f"tools.{i}.function", "invalid_value")
        fn = tool_function(tool)
        prefix = f"tools.{i}.function" if "function" in tool else f"tools.{i}"
        name = fn.get("name")
        if name is None or name == "":
            raise bad(f"Each tool must have a `name` at index {i}.", f"{prefix}.name",
                      "invalid_value")
        if not isinstance(name, str):
            raise bad(f"Tool `name` must be a string at index {i}.", f"{prefix}.name",
                      "invalid_value")
        params = fn.get("parameters")
        if params is None:
            continue
        if not isinstance(params, dict):
            raise bad(f"Tool `parameters` must be an object at index {i}.",
                      f"{prefix}.parameters", "invalid_value")
        if "properties" in params and not isinstance(params["properties"], dict):
            raise bad(f"Tool `parameters.properties` must be an object at index {i}.",
                      f"{prefix}.parameters.properties", "invalid_value")
        if "required" in params and not isinstance(params["required"], list):
            raise bad(f"Tool `parameters.required` must be an array at index {i}.",
                      f"{prefix}.parameters.required", "invalid_value")
    return tools


def lenient_tool_spec(body: JSON) -> ToolSpec | None:
    """The tools to render into the prompt, or None when ``tools``/``tool_choice`` is invalid:
    that error is reported in its place (the check order is the contract) by shaping()."""
    try:
        return resolve_tool_choice(body, validate_tools(body))
    except APIError:
        return None


def resolve_tool_choice(body: JSON, tools: list[JSON] | None) -> ToolSpec | None:
    choice = body.get("tool_choice")
    forced: str | None = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad('`tool_choice` must be one of "auto", "none", "required", or a function '
                      "object.", "tool_choice", "unsupported_value")
    elif isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else (
            choice.get("name") if "function" not in choice else None)
        if not isinstance(name, str) or not name:
            raise bad("`tool_choice` function object must include a name.", "tool_choice",
                      "invalid_value")
        declared = [tool_function(t).get("name") for t in tools or []]
        if tools and name not in declared:
            raise bad(f"`tool_choice` names {name!r}, which is not in `tools`.",
                      "tool_choice", "invalid_value")
        forced = name
    else:
        raise bad("`tool_choice` must be a string or a function object.", "tool_choice",
                  "invalid_value")
    if not tools:
        if choice != "none" and body.get("tool_choice") is not None:
            raise bad("`tool_choice` requires `tools`.", "tool_choice", "invalid_value")
        return None
    if choice == "none":
        return None
    offered = tuple(tool_function(t) for t in tools)
    functions = offered
    if forced is not None:
        functions = tuple(f for f in functions if f.get("name") == forced)
    return ToolSpec(functions, choice, forced, offered)


def validate_stop(body: JSON) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list):
        raise bad("`stop` must be a string or an array of strings.", "stop", "invalid_value")
    if not 1 <= len(items) <= 4:
        raise bad("`stop` must contain between 1 and 4 sequences.", "stop", "invalid_value")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            param = "stop" if isinstance(stop, str) else f"stop.{i}"
            raise bad("Each `stop` sequence must be a non-empty string.", param,
                      "invalid_value")
    return tuple(items)


def _response_format(body: JSON) -> bytes:
    fmt = body.get("response_format")
    if fmt is None:
        return b""
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad("`response_format` must be an object with a `type`.", "response_format",
                  "invalid_value")
    kind = fmt["type"]
    grammar = ""
    if kind == "text":
        return b""
    if kind == "json_object":
        grammar = json.dumps({"type": "object"})
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("`response_format.json_schema.schema` must be an object.",
                      "response_format", "invalid_value")
        grammar = json.dumps(schema, ensure_ascii=False)
    elif kind == "gbnf":
        text = fmt.get("grammar")
        if not isinstance(text, str) or not text:
            raise bad("`response_format.grammar` must be a non-empty GBNF string.",
                      "response_format", "invalid_value")
        grammar = text
    else:
        raise bad('`response_format.type` must be "text", "json_object", "json_schema" or '
                  '"gbnf".', "response_format", "unsupported_value")
    data = grammar.encode()
    if len(data) > 1 << 20:
        raise bad("`response_format` grammar/schema exceeds 1 MiB.", "response_format",
                  "invalid_value")
    try:
        check_grammar(grammar)
    except GrammarError as exc:
        what = "schema" if kind.startswith("json") else "grammar"
        raise bad(f"`response_format` {what} cannot be enforced: {exc}", "response_format",
                  "invalid_value") from None
    return data


#: The sampling a request gets when it names none (``COLI_TEMP`` overrides the temperature).
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9


def default_temperature() -> float:
    try:
        value = float(os.environ.get("COLI_TEMP", str(DEFAULT_TEMPERATURE)))
    except ValueError:
        return DEFAULT_TEMPERATURE
    return value if math.isfinite(value) and 0 <= value <= 2 else DEFAULT_TEMPERATURE


def shaping(body: JSON, server_max_tokens: int) -> Shaping:
    """colibri's ``generation_options``: every check in its order."""
    if body.get("n", 1) != 1:
        raise bad("Colibri currently supports `n=1` only.", "n", "unsupported_value")
    if body.get("best_of") not in (None, 1):
        raise bad("Colibri currently supports `best_of` equal to 1 only.", "best_of",
                  "unsupported_value")
    if body.get("logit_bias") not in (None, {}):
        raise bad("Colibri does not support a non-empty `logit_bias` yet.", "logit_bias",
                  "unsupported_value")
    if body.get("suffix") is not None:
        raise bad("Colibri does not support `suffix` infill yet.", "suffix",
                  "unsupported_parameter")
    if "modalities" in body and body["modalities"] is not None:
        mods = body["modalities"]
        if not isinstance(mods, list) or not mods or not all(isinstance(m, str) for m in mods):
            raise bad("`modalities` must be a non-empty array of strings.", "modalities",
                      "invalid_value")
        if "audio" in mods:
            raise bad("Colibri does not support audio output via `modalities`.", "modalities",
                      "unsupported_value")
        if any(m != "text" for m in mods):
            raise bad("Colibri supports only text output via `modalities`.", "modalities",
                      "unsupported_value")
    tools = validate_tools(body)
    spec = resolve_tool_choice(body, tools)
    stop = validate_stop(body)
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name):
            raise bad("Token penalties are not supported yet.", None, "unsupported_parameter")
    grammar = _response_format(body)
    field_name = "max_completion_tokens"
    max_tokens = body.get(field_name)
    if max_tokens is None:
        field_name = "max_tokens"
        max_tokens = body.get(field_name)
    if max_tokens is None:
        max_tokens = server_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise bad(f"`{field_name}` must be a positive integer.", field_name)
    temperature = body.get("temperature")
    if temperature is None:
        temperature = default_temperature()
    if not _is_number(temperature) or not math.isfinite(temperature) or not (
            0 <= temperature <= 2):
        raise bad("`temperature` must be between 0 and 2.", "temperature")
    top_p = body.get("top_p")
    if top_p is None:
        top_p = DEFAULT_TOP_P
    if not _is_number(top_p) or not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise bad("`top_p` must be greater than 0 and at most 1.", "top_p")
    return Shaping(min(max_tokens, server_max_tokens), float(temperature), float(top_p), stop,
                   grammar, spec)


def cache_slot(body: JSON, kv_slots: int) -> int | None:
    slot = body.get("cache_slot")
    if slot is None:
        return None
    if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < kv_slots:
        raise bad(f"`cache_slot` must be an integer between 0 and {kv_slots - 1}.",
                  "cache_slot")
    return slot


def stream_flag(body: JSON) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("`stream` must be a boolean.", "stream")
    return stream


def include_usage(body: JSON, stream: bool) -> bool:
    if not stream:
        return False
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad("`stream_options` must be an object.", "stream_options")
    return bool(options.get("include_usage"))


def ignore_leading_stop(body: JSON) -> bool:
    value = body.get("x_colibri_ignore_leading_stop", False)
    if not isinstance(value, bool):
        raise bad("`x_colibri_ignore_leading_stop` must be a boolean.",
                  "x_colibri_ignore_leading_stop", "invalid_value")
    return value


def _echo(body: JSON) -> bool:
    echo = body.get("echo")
    if echo is None:
        return False
    if not isinstance(echo, bool):
        raise bad("`echo` must be a boolean.", "echo", "invalid_value")
    return echo


def chat_logprobs(body: JSON) -> int | None:
    """None when off, else the number of alternatives to report (0..32)."""
    if _echo(body):
        raise bad("`echo` is not supported for chat completions.", "echo",
                  "unsupported_parameter")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("`logprobs` must be a boolean.", "logprobs", "invalid_value")
    top = body.get("top_logprobs")
    if top is None:
        top = 0
    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 32:
        raise bad("`top_logprobs` must be an integer between 0 and 32.", "top_logprobs",
                  "invalid_value")
    return top if logprobs else None


def completion_logprobs(body: JSON) -> tuple[int, bool]:
    logprobs = body.get("logprobs")
    if logprobs is True:
        raise bad("`logprobs` must be an integer between 0 and 32.", "logprobs",
                  "invalid_value")
    if logprobs is None or logprobs is False:
        logprobs = 0
    if not isinstance(logprobs, int) or not 0 <= logprobs <= 32:
        raise bad("`logprobs` must be an integer between 0 and 32.", "logprobs",
                  "invalid_value")
    echo = _echo(body)
    if echo and logprobs == 0:
        raise bad("`echo` requires `logprobs`.", "echo", "unsupported_parameter")
    return logprobs, echo


def seed_extension(body: JSON, engine_takes_seeds: bool) -> dict[str, int]:
    """The SUBMIT extension for ``seed``, only when the engine announced per-request seeds."""
    seed = body.get("seed")
    if not engine_takes_seeds or not isinstance(seed, int) or isinstance(seed, bool):
        return {}
    if not 0 <= seed < 1 << 63:
        return {}
    return {"seed": seed}
