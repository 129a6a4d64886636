"""``POST /v1/chat/completions`` and ``POST /v1/completions`` (spec/http.md §4, §5)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from colibri.server import logprobs as lp
from colibri.server import validation as v
from colibri.server.affinity import conversation_key
from colibri.server.context import (
    JSON,
    Exchange,
    ServerState,
    conversation_slot,
    dumps,
    wait_header,
)
from colibri.server.engine_request import check_prompt, submit_request
from colibri.server.errors import bad
from colibri.server.generation import Accepted, EngineResult, EngineTurn, Quiet
from colibri.server.pipeline import OutputPipeline, stop_filter
from colibri.server.structured_output import constrain_output
from colibri.server.thinking import ThinkingSplit
from colibri.server.toolcalls import InvalidToolCall, ToolCall, parse_strict


@dataclass
class ChatPlan:
    prompt: str
    starts_in_reasoning: bool
    thinking: bool
    continued: bool
    shaping: v.Shaping
    logprobs: int | None
    slot: int | None
    stream: bool
    include_usage: bool
    ignore_leading: bool
    strict: bool
    #: The conversation's :func:`conversation_key` (prefix affinity across replicas).
    conversation: str


def thinking_options(body: JSON, think_default: bool) -> tuple[bool, str | None]:
    effort = body.get("reasoning_effort")
    if effort not in v.EFFORTS:
        raise bad("`reasoning_effort` must be none, minimal, low, medium, high, or xhigh.",
                  "reasoning_effort")
    if effort is None and "enable_thinking" not in body and think_default:
        effort = "high"
    thinking = body.get("enable_thinking", effort not in (None, "none"))
    if not isinstance(thinking, bool):
        raise bad("`enable_thinking` must be a boolean.", "enable_thinking")
    return thinking, effort


def plan_chat(state: ServerState, body: JSON) -> ChatPlan:
    config = state.config
    strict = body.get("strict_tool_calls", False)
    if not isinstance(strict, bool):
        raise bad("`strict_tool_calls` must be a boolean.", "strict_tool_calls")
    family = config.family
    family.check_strict(strict)
    if strict and body.get("stream") is True:
        raise bad("`strict_tool_calls` requires `stream: false`.", "stream",
                  "unsupported_parameter")
    if strict and body.get("logprobs"):
        raise bad("`strict_tool_calls` does not support `logprobs` yet.", "logprobs",
                  "unsupported_parameter")
    thinking, effort = thinking_options(body, config.think_default)
    thinking = family.thinking(thinking)
    tools = v.validate_tools(body)
    family.check_tools(body)
    if strict:
        if not tools or body.get("tool_choice") == "none":
            raise bad("`strict_tool_calls` requires active `tools`.", "strict_tool_calls",
                      "unsupported_parameter")
        for i, tool in enumerate(tools):
            params = v.tool_function(tool).get("parameters")
            if not (isinstance(params, dict) and isinstance(params.get("properties"), dict)
                    and isinstance(params.get("required"), list)):
                raise bad("Strict tool schemas need object `parameters`, object `properties` "
                          "and array `required`.", f"tools.{i}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("`messages` must be a non-empty array.", "messages")
    continued = family.template.continues(messages, body)
    rendered = family.template.render(messages, thinking=thinking, effort=effort,
                                      tools=v.lenient_tool_spec(body), continued=continued)
    shaping = v.shaping(body, config.max_tokens)
    constrain_output(shaping, tools, strict, rendered.starts_in_reasoning)
    logprobs = v.chat_logprobs(body)
    if logprobs is not None and shaping.tools is not None:
        raise bad("`logprobs` is not supported together with active `tools` yet.", "logprobs",
                  "unsupported_parameter")
    slot = v.cache_slot(body, config.kv_slots)
    if slot is None and config.kv_slots > 1:
        slot = conversation_slot(messages, config.kv_slots)
    stream = v.stream_flag(body)
    if stream and logprobs is not None:
        raise bad("`logprobs` is not supported together with `stream`.", "logprobs",
                  "unsupported_parameter")
    return ChatPlan(rendered.prompt, rendered.starts_in_reasoning, thinking, continued,
                    shaping, logprobs, slot, stream, v.include_usage(body, stream),
                    v.ignore_leading_stop(body), strict, conversation_key(messages))


class SSE:
    """Chunk writer for one OpenAI stream (same id/created on every chunk)."""

    def __init__(self, exchange: Exchange, obj: str, rid: str, created: int, model: str,
                 include_usage: bool) -> None:
        self.exchange = exchange
        self.head = {"id": rid, "object": obj, "created": created, "model": model}
        self.include_usage = include_usage

    async def chunk(self, choices: list[JSON], **extra: Any) -> None:
        body: JSON = {**self.head, "choices": choices}
        if self.include_usage and "usage" not in extra:
            body["usage"] = None
        body.update(extra)
        await self.exchange.send_sse(b"data: " + dumps(body).encode() + b"\n\n")

    async def done(self) -> None:
        await self.exchange.send_sse(b"data: [DONE]\n\n")


def colibri_stats(result: EngineResult) -> JSON:
    stats = result.stats
    tele = result.telemetry
    return {
        "stats": {"prompt_tokens": stats.prompt_tokens,
                  "completion_tokens": stats.completion_tokens,
                  "tokens_per_second": stats.tokens_per_second,
                  "cache_hit_percent": stats.cache_hit_percent, "rss_gb": stats.rss_gb,
                  "length_limited": stats.length_limited},
        "perf": tele.perf, "topk": None, "entropy": tele.entropy, "gpus": tele.gpus,
        "repin": tele.repin,
    }


def usage(result: EngineResult) -> JSON:
    p, c = result.stats.prompt_tokens, result.stats.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}



def _finish_reason(result: EngineResult, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_calls"
    return "length" if result.stats.length_limited else "stop"


def _delta(kind: str, text: str) -> JSON:
    key = "reasoning_content" if kind == "reasoning" else "content"
    return {"index": 0, "delta": {key: text}, "logprobs": None, "finish_reason": None}


async def chat_completion(state: ServerState, body: JSON, exchange: Exchange) -> None:
    plan = plan_chat(state, body)
    check_prompt(plan.prompt, "messages")
    rid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    family = state.config.family
    stops = stop_filter(plan.shaping.stop, plan.ignore_leading, chat=True,
                        implicit=family.implicit_stops)
    # A family without a reasoning block gets its text as written, `<think>` included.
    split = ThinkingSplit(plan.starts_in_reasoning) if family.reasoning else None
    tools = plan.shaping.tools
    pipe = OutputPipeline(stops, split, tools is not None, plan.stream)
    sse = SSE(exchange, "chat.completion.chunk", rid, created, state.config.model_id,
              plan.include_usage)
    seed = v.seed_extension(body, state.supervisor.supports_seeds)

    async with state.admitted(plan.slot, exchange, plan.conversation) as admission:
        request = submit_request(plan.shaping, plan.prompt, admission.slot,
                                 max(plan.logprobs, 1) if plan.logprobs is not None else 0,
                                 seed)
        async with EngineTurn(state, request, exchange, pipe, stream=plan.stream) as turn:
            async for step in turn:
                if not plan.stream:
                    continue
                if isinstance(step, Accepted):
                    await exchange.start_sse(wait_header(admission))
                    await sse.chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}])
                elif isinstance(step, Quiet):
                    await sse.chunk([_delta("reasoning", state.config.keepalive_text)])
                else:
                    for kind, text in step.pieces:
                        await sse.chunk([_delta(kind, text)])
        result = turn.outcome()
        calls: list[ToolCall] = []
        invalid: list[InvalidToolCall] = []
        content: str | None = pipe.answer
        if tools is not None:
            if plan.strict:
                content, calls = parse_strict(pipe.answer, tools,
                                              result.stats.length_limited)
            else:
                parsed = family.parse_calls(pipe.answer, tools, result.stats.length_limited)
                content, calls, invalid = parsed.content, parsed.calls, parsed.invalid
        finish = _finish_reason(result, calls)
        if plan.stream:
            for i, call in enumerate(calls):
                await sse.chunk([{"index": 0, "delta": {"tool_calls": [
                    {"index": i, **call.openai()}]}, "logprobs": None,
                    "finish_reason": None}])
            if invalid:
                await sse.chunk([{"index": 0, "delta": {"invalid_tool_calls": [
                    bad.json() for bad in invalid]}, "logprobs": None,
                    "finish_reason": None}])
            await sse.chunk([{"index": 0, "delta": {}, "logprobs": None,
                              "finish_reason": finish}])
            if plan.include_usage:
                await sse.chunk([], usage=usage(result))
            await sse.chunk([], colibri=colibri_stats(result))
            await sse.done()
            return
        message: JSON = {"role": "assistant", "content": content, "refusal": None}
        if pipe.reasoning:
            message["reasoning_content"] = pipe.reasoning
        if calls:
            message["tool_calls"] = [c.openai() for c in calls]
        if invalid:
            message["invalid_tool_calls"] = [bad.json() for bad in invalid]
        logprob_body = None
        if plan.logprobs is not None:
            mask = pipe.answer_mask(len(result.raw_text))
            logprob_body = lp.chat_logprobs(result, mask, pipe.answer, plan.logprobs)
        await exchange.send_json(200, {
            "id": rid, "object": "chat.completion", "created": created,
            "model": state.config.model_id,
            "choices": [{"index": 0, "message": message, "logprobs": logprob_body,
                         "finish_reason": finish}],
            "usage": usage(result), "colibri": colibri_stats(result)}, wait_header(admission))


async def completion(state: ServerState, body: JSON, exchange: Exchange) -> None:
    config = state.config
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad("Colibri currently requires `prompt` to be a string.", "prompt")
    if not prompt:
        raise bad("`prompt` must not be empty.", "prompt")
    shaping = v.shaping(body, config.max_tokens)
    constrain_output(shaping, None, False, False)  # the response format's string bound
    logprobs, echo = v.completion_logprobs(body)
    slot = v.cache_slot(body, config.kv_slots)
    stream = v.stream_flag(body)
    if stream and logprobs:
        raise bad("`logprobs` is not supported together with `stream`.", "logprobs",
                  "unsupported_parameter")
    include = v.include_usage(body, stream)
    ignore_leading = v.ignore_leading_stop(body)
    check_prompt(prompt, "prompt")
    rid = "cmpl-" + uuid.uuid4().hex
    created = int(time.time())
    stops = stop_filter(shaping.stop, ignore_leading, chat=False)
    pipe = OutputPipeline(stops, None, False, stream)
    sse = SSE(exchange, "text_completion", rid, created, config.model_id, include)
    seed = v.seed_extension(body, state.supervisor.supports_seeds)

    def choice(text: str, finish: str | None) -> JSON:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    async with state.admitted(slot, exchange) as admission:
        request = submit_request(shaping, prompt, admission.slot, logprobs, seed)

        async with EngineTurn(state, request, exchange, pipe, stream=stream,
                              context_param="prompt") as turn:
            async for step in turn:
                if not stream:
                    continue
                if isinstance(step, Accepted):
                    await exchange.start_sse(wait_header(admission))
                elif isinstance(step, Quiet):
                    await sse.chunk([choice(config.keepalive_text, None)])
                else:
                    for _, text in step.pieces:
                        await sse.chunk([choice(text, None)])
        result = turn.outcome()
        finish = "length" if result.stats.length_limited else "stop"
        if stream:
            await sse.chunk([choice("", finish)])
            if include:
                await sse.chunk([], usage=usage(result))
            await sse.chunk([], colibri=colibri_stats(result))
            await sse.done()
            return
        text = pipe.answer
        logprob_body = None
        if logprobs:
            mask = pipe.answer_mask(len(result.raw_text))
            text, logprob_body = lp.completion_logprobs(result, mask, text, echo)
        await exchange.send_json(200, {
            "id": rid, "object": "text_completion", "created": created,
            "model": config.model_id,
            "choices": [{"index": 0, "text": text, "logprobs": logprob_body,
                         "finish_reason": finish}],
            "usage": usage(result), "colibri": colibri_stats(result)}, wait_header(admission))
