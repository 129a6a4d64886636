"""``POST /v1/messages``: the Anthropic Messages API over the same engine (spec/http.md §9)."""

from __future__ import annotations

import json
import uuid

from colibri.server import validation as v
from colibri.server.affinity import conversation_key
from colibri.server.anthropic_request import render_request
from colibri.server.context import JSON, Exchange, ServerState, conversation_slot, dumps
from colibri.server.context import wait_header as queue_wait_header
from colibri.server.engine_request import check_prompt, submit_request
from colibri.server.errors import bad
from colibri.server.generation import Accepted, EngineTurn, Quiet
from colibri.server.pipeline import OutputPipeline, stop_filter
from colibri.server.structured_output import constrain_output
from colibri.server.thinking import ThinkingSplit
from colibri.server.toolcalls import InvalidToolCall, ToolCall

SIGNATURE = "colibri-local"


def _input_schema_param(index: int, _tool: JSON) -> str:
    return f"tools.{index}.input_schema"


def _stop_reason(length_limited: bool, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    return "max_tokens" if length_limited else "end_turn"


class MessageStream:
    """The events of one streamed message: a thinking block (index 0) while the model
    reasons, then one text block, then a block per tool call, each with its own index."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.thinking = False
        self.text = -1
        self.next = 0

    async def send(self, name: str, data: JSON) -> None:
        await self.exchange.send_sse(
            f"event: {name}\ndata: ".encode() + dumps(data).encode() + b"\n\n")

    async def start(self, message: JSON, thinking: bool) -> None:
        await self.send("message_start", {"type": "message_start", "message": message})
        block: JSON = ({"type": "thinking", "thinking": "", "signature": ""} if thinking
                       else {"type": "text", "text": ""})
        self.thinking, self.text, self.next = thinking, -1 if thinking else 0, 1
        await self.send("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": block})

    async def piece(self, kind: str, text: str) -> None:
        if kind == "reasoning" and self.thinking:
            await self.send("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": {"type": "thinking_delta",
                                                              "thinking": text}})
            return
        await self.close_thinking()
        if self.text < 0:
            self.text, self.next = self.next, self.next + 1
            await self.send("content_block_start", {
                "type": "content_block_start", "index": self.text,
                "content_block": {"type": "text", "text": ""}})
        await self.send("content_block_delta", {"type": "content_block_delta",
                                                "index": self.text,
                                                "delta": {"type": "text_delta", "text": text}})

    async def close_thinking(self) -> None:
        if self.thinking:
            self.thinking = False
            await self.send("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                    "delta": {"type": "signature_delta",
                                                              "signature": SIGNATURE}})
            await self.send("content_block_stop", {"type": "content_block_stop", "index": 0})

    async def finish(self, calls: list[ToolCall], reason: str, output_tokens: int,
                     invalid: list[InvalidToolCall]) -> None:
        await self.close_thinking()
        if self.text >= 0:
            await self.send("content_block_stop", {"type": "content_block_stop",
                                                   "index": self.text})
        for index, call in enumerate(calls, self.next):
            await self.send("content_block_start", {
                "type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": call.id, "name": call.name, "input": {}}})
            await self.send("content_block_delta", {
                "type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(call.arguments, ensure_ascii=False)}})
            await self.send("content_block_stop", {"type": "content_block_stop",
                                                   "index": index})
        delta: JSON = {"stop_reason": reason, "stop_sequence": None}
        if invalid:
            delta["invalid_tool_calls"] = [bad.json() for bad in invalid]
        await self.send("message_delta", {"type": "message_delta", "delta": delta,
                                          "usage": {"output_tokens": output_tokens}})
        await self.send("message_stop", {"type": "message_stop"})


async def messages(state: ServerState, body: JSON, exchange: Exchange) -> None:
    config = state.config
    for name, label in (("stop_sequences", "custom stop sequences"),
                        ("top_k", "top-k sampling")):
        if name in body and body[name] not in (None, [], ""):
            raise bad(f"Colibri does not support `{name}` ({label}) yet.", name,
                      "unsupported_value")
    translated, openai_body, rendered = render_request(body, config.think_default, True,
                                                       config.family)
    shaping = v.shaping(openai_body, config.max_tokens)
    constrain_output(shaping, openai_body.get("tools"), False, rendered.starts_in_reasoning,
                     _input_schema_param)
    slot = v.cache_slot(openai_body, config.kv_slots)
    if slot is None and config.kv_slots > 1:
        slot = conversation_slot(translated, config.kv_slots)
    stream = v.stream_flag(openai_body)
    check_prompt(rendered.prompt, "messages")
    tools = shaping.tools
    split = ThinkingSplit(rendered.starts_in_reasoning) if (
        rendered.starts_in_reasoning or tools is not None) else None
    stops = stop_filter((), False, chat=True, implicit=config.family.implicit_stops)
    pipe = OutputPipeline(stops, split, tools is not None, stream)
    mid = "msg_" + uuid.uuid4().hex[:24]
    model = config.model_id
    thinking_on = rendered.starts_in_reasoning
    events = MessageStream(exchange)

    async with state.admitted(slot, exchange, conversation_key(translated)) as admission:
        request = submit_request(shaping, rendered.prompt, admission.slot, 0, {})
        async with EngineTurn(state, request, exchange, pipe, stream=stream) as turn:
            async for step in turn:
                if not stream:
                    continue
                if isinstance(step, Accepted):
                    await exchange.start_sse(queue_wait_header(admission))
                    await events.start({
                        "id": mid, "type": "message", "role": "assistant", "model": model,
                        "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": 0, "output_tokens": 0}}, thinking_on)
                elif isinstance(step, Quiet):
                    await events.send("ping", {"type": "ping"})
                else:
                    for kind, piece in step.pieces:
                        await events.piece(kind, piece)
        result = turn.outcome()
        calls: list[ToolCall] = []
        invalid: list[InvalidToolCall] = []
        text: str = pipe.answer
        if tools is not None:
            parsed = config.family.parse_calls(pipe.answer, tools,
                                               result.stats.length_limited)
            calls, invalid = parsed.calls, parsed.invalid
            text = parsed.content or ""
        reason = _stop_reason(result.stats.length_limited, calls)
        if stream:
            await events.finish(calls, reason, result.stats.completion_tokens, invalid)
            return
        blocks: list[JSON] = []
        if thinking_on:
            blocks.append({"type": "thinking", "thinking": pipe.reasoning,
                           "signature": SIGNATURE})
        if text:
            blocks.append({"type": "text", "text": text})
        for call in calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                           "input": call.arguments})
        reply: JSON = {
            "id": mid, "type": "message", "role": "assistant", "model": model,
            "content": blocks, "stop_reason": reason, "stop_sequence": None,
            "usage": {"input_tokens": result.stats.prompt_tokens,
                      "output_tokens": result.stats.completion_tokens}}
        if invalid:
            reply["invalid_tool_calls"] = [bad.json() for bad in invalid]
        await exchange.send_json(200, reply, queue_wait_header(admission))
