"""Write spec/schemas/*.json and spec/openapi.yaml: the machine-readable HTTP surface.

The schemas are the single source; the OpenAPI document inlines them under
``components/schemas``. ``openapi.yaml`` is written in YAML's JSON-compatible flow style so
that the server (which has no YAML dependency) can serve it as ``GET /openapi.json`` with
``json.loads``. Run ``python tools/make_http_spec.py`` after changing a shape; the test suite
fails when the committed files differ from what this script writes.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "spec" / "schemas"
BASE = "https://spec.colibri.invalid/schemas/"

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM_OR_NULL: Schema = {"type": ["number", "null"]}
NULL: Schema = {"type": "null"}


def ref(name: str) -> Schema:
    return {"$ref": f"{name}.json"}


def obj(props: dict[str, Schema], required: list[str] | None = None, extra: bool = False,
        **more: Any) -> Schema:
    out: Schema = {"type": "object", "properties": props,
                   "required": list(props) if required is None else required,
                   "additionalProperties": extra}
    out.update(more)
    return out


def const(value: Any) -> Schema:
    return {"const": value}


def enum(*values: Any) -> Schema:
    return {"enum": list(values)}


USAGE = obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})

TOOL_CALL = obj({
    "id": {"type": "string", "pattern": "^call_[0-9a-f]{24}$"},
    "type": const("function"),
    "function": obj({"name": STR, "arguments": STR}),
})

# Sameness (spec/model.md §15): `x-colibri-sameness` names the fields that two correct
# engines may print differently. "logprob": a kind-(b) number (the engine's %.6f logprob,
# compared within the model's tolerance); "ranking": a top-k table, compared tie-aware. Every
# field without it is kind (a), exact. colibri.conformance.golden_compare reads these marks.
LOGPROB: Schema = {**NUM_OR_NULL, "x-colibri-sameness": "logprob"}

TOP_LOGPROB = obj({"token": STR, "logprob": LOGPROB,
                   "bytes": {"type": ["array", "null"], "items": INT}})

CHAT_LOGPROBS = {"oneOf": [NULL, obj({
    "content": {"type": "array", "items": obj({
        "token": STR, "logprob": LOGPROB, "bytes": {"type": "array", "items": INT},
        "top_logprobs": {"type": "array", "items": TOP_LOGPROB,
                         "x-colibri-sameness": "ranking"}})},
    "refusal": NULL})]}

LEGACY_LOGPROBS = {"oneOf": [NULL, obj({
    "tokens": {"type": "array", "items": STR},
    "token_logprobs": {"type": "array", "items": LOGPROB},
    "top_logprobs": {"type": "array", "items": {"type": ["object", "null"],
                                                  "additionalProperties": LOGPROB,
                                                  "x-colibri-sameness": "ranking"}},
    "text_offset": {"type": "array", "items": INT}})]}

FINISH = enum("stop", "length", "tool_calls")

COLIBRI_STATS = obj({
    "stats": obj({
        "prompt_tokens": INT, "completion_tokens": INT, "tokens_per_second": {"type": "number"},
        "cache_hit_percent": {"type": "number"}, "rss_gb": {"type": "number"},
        "length_limited": {"type": "boolean"}}),
    "perf": {"oneOf": [NULL, obj({
        "wall_s": {"type": "number"}, "prompt_tokens": INT, "completion_tokens": INT,
        "expert_disk_s": {"type": "number"}, "expert_wait_s": {"type": "number"},
        "expert_matmul_s": {"type": "number"}, "attention_s": {"type": "number"},
        "lm_head_s": {"type": "number"}, "forwards": INT})]},
    "topk": NULL,
    "entropy": {"oneOf": [NULL, {"type": "array", "items": {"type": "number"}}]},
    "gpus": {"oneOf": [NULL, {"type": "array", "items": obj({
        "used_gb": {"type": "number"}, "total_gb": {"type": "number"}, "experts": INT})}]},
    "repin": {"type": "array", "items": obj({"layer": INT, "expert": INT, "old_tier": INT,
                                              "gpu": INT})},
}, description="The seed document's per-turn engine statistics (serve_protocol.md).")

ID_CHAT = {"type": "string", "pattern": "^chatcmpl-[0-9a-f]{32}$"}
ID_CMPL = {"type": "string", "pattern": "^cmpl-[0-9a-f]{32}$"}

# A <tool_call> block the model wrote that is not a call (spec/http.md §7.1): its text, which
# stays in the content, and why it is not a call.
INVALID_TOOL_CALLS = {"type": "array", "minItems": 1,
                      "items": obj({"text": STR, "error": STR})}

CHAT_MESSAGE = obj({
    "role": const("assistant"), "content": {"type": ["string", "null"]}, "refusal": NULL,
    "reasoning_content": STR, "tool_calls": {"type": "array", "items": TOOL_CALL, "minItems": 1},
    "invalid_tool_calls": INVALID_TOOL_CALLS,
}, required=["role", "content", "refusal"])

CHAT_COMPLETION = obj({
    "id": ID_CHAT, "object": const("chat.completion"), "created": INT, "model": STR,
    "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": obj({
        "index": const(0), "message": CHAT_MESSAGE, "logprobs": CHAT_LOGPROBS,
        "finish_reason": FINISH})},
    "usage": USAGE, "colibri": ref("colibri_stats"),
}, required=["id", "object", "created", "model", "choices", "usage"])

CHUNK_DELTA = obj({
    "role": const("assistant"), "content": STR, "reasoning_content": STR,
    "tool_calls": {"type": "array", "items": obj({
        "index": INT, "id": TOOL_CALL["properties"]["id"], "type": const("function"),
        "function": obj({"name": STR, "arguments": STR})})},
    "invalid_tool_calls": INVALID_TOOL_CALLS,
}, required=[], maxProperties=2)

CHAT_CHUNK = obj({
    "id": ID_CHAT, "object": const("chat.completion.chunk"), "created": INT, "model": STR,
    "choices": {"type": "array", "maxItems": 1, "items": obj({
        "index": const(0), "delta": CHUNK_DELTA, "logprobs": NULL,
        "finish_reason": {"oneOf": [NULL, FINISH]}})},
    "usage": {"oneOf": [NULL, USAGE]}, "colibri": ref("colibri_stats"),
}, required=["id", "object", "created", "model", "choices"],
    description="One `data:` event of a streamed chat completion. The usage chunk and the "
                "`colibri` stats chunk carry an empty `choices` array.")

COMPLETION = obj({
    "id": ID_CMPL, "object": const("text_completion"), "created": INT, "model": STR,
    "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": obj({
        "index": const(0), "text": STR, "logprobs": LEGACY_LOGPROBS, "finish_reason": FINISH})},
    "usage": USAGE, "colibri": ref("colibri_stats"),
}, required=["id", "object", "created", "model", "choices", "usage"])

COMPLETION_CHUNK = obj({
    "id": ID_CMPL, "object": const("text_completion"), "created": INT, "model": STR,
    "choices": {"type": "array", "maxItems": 1, "items": obj({
        "index": const(0), "text": STR, "logprobs": NULL,
        "finish_reason": {"oneOf": [NULL, FINISH]}})},
    "usage": {"oneOf": [NULL, USAGE]}, "colibri": ref("colibri_stats"),
}, required=["id", "object", "created", "model", "choices"])

ERROR = obj({"error": obj({
    "message": STR,
    "type": enum("invalid_request_error", "authentication_error", "rate_limit_error",
                 "server_error"),
    "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}})},
    description="The OpenAI error envelope (every path except /v1/messages).")

ANTHROPIC_ERROR = obj({
    "type": const("error"),
    "error": obj({"type": ERROR["properties"]["error"]["properties"]["type"],
                  "message": STR})},
    description="The Anthropic error envelope used on /v1/messages.")

MODEL = obj({
    "id": STR, "object": const("model"), "created": INT, "owned_by": const("colibri"),
    "input_modalities": {"type": "array", "items": const("text")},
    "capabilities": {"type": "array", "items": STR}})

MODEL_LIST = obj({
    "object": const("list"), "data": {"type": "array", "items": ref("model"),
                                      "minItems": 1, "maxItems": 1},
    "models": {"type": "array", "items": obj({
        "name": STR, "description": STR,
        "release_date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}})}})

ANTHROPIC_USAGE = obj({"input_tokens": INT, "output_tokens": INT})

THINKING_BLOCK = obj({"type": const("thinking"), "thinking": STR, "signature": STR})
TEXT_BLOCK = obj({"type": const("text"), "text": STR})
TOOL_USE_BLOCK = obj({"type": const("tool_use"),
                      "id": {"type": "string", "pattern": "^call_[0-9a-f]{24}$"},
                      "name": STR, "input": {"type": "object"}})

STOP_REASON = enum("end_turn", "max_tokens", "tool_use")

MESSAGE = obj({
    "id": {"type": "string", "pattern": "^msg_[0-9a-f]{24}$"}, "type": const("message"),
    "role": const("assistant"), "model": STR,
    "content": {"type": "array", "items": {"oneOf": [THINKING_BLOCK, TEXT_BLOCK,
                                                     TOOL_USE_BLOCK]}},
    "stop_reason": STOP_REASON, "stop_sequence": NULL, "usage": ANTHROPIC_USAGE,
    "invalid_tool_calls": INVALID_TOOL_CALLS,
}, required=["id", "type", "role", "model", "content", "stop_reason", "stop_sequence",
             "usage"])

MESSAGE_START_MESSAGE = copy.deepcopy(MESSAGE)
MESSAGE_START_MESSAGE["properties"]["content"] = {"type": "array", "maxItems": 0}
MESSAGE_START_MESSAGE["properties"]["stop_reason"] = NULL
del MESSAGE_START_MESSAGE["properties"]["invalid_tool_calls"]

MESSAGE_EVENT = {"oneOf": [
    obj({"type": const("message_start"), "message": MESSAGE_START_MESSAGE}),
    obj({"type": const("content_block_start"), "index": INT, "content_block": {"oneOf": [
        THINKING_BLOCK, TEXT_BLOCK, TOOL_USE_BLOCK]}}),
    obj({"type": const("content_block_delta"), "index": INT, "delta": {"oneOf": [
        obj({"type": const("thinking_delta"), "thinking": STR}),
        obj({"type": const("signature_delta"), "signature": STR}),
        obj({"type": const("text_delta"), "text": STR}),
        obj({"type": const("input_json_delta"), "partial_json": STR})]}}),
    obj({"type": const("content_block_stop"), "index": INT}),
    obj({"type": const("message_delta"),
         "delta": obj({"stop_reason": STOP_REASON, "stop_sequence": NULL,
                       "invalid_tool_calls": INVALID_TOOL_CALLS},
                      required=["stop_reason", "stop_sequence"]),
         "usage": obj({"output_tokens": INT})}),
    obj({"type": const("message_stop")}),
    obj({"type": const("ping")}),
], "description": "The `data:` of one named SSE event on /v1/messages; its `type` equals the "
                  "`event:` name."}

SCHEDULER = obj({
    "active": INT, "queued": INT, "capacity": INT, "max_queue": INT,
    "queue_timeout_seconds": {"type": "number"}, "admitted": INT, "completed": INT,
    "failed": INT, "rejected": INT, "timed_out": INT, "cancelled": INT})

HEALTH = {"oneOf": [
    obj({"status": const("ok")}),
    obj({"status": enum("ok", "restarting", "down"), "arch": const("glm"),
         "scheduler": SCHEDULER, "kv_slots": INT,
         "input_modalities": {"type": "array", "items": const("text")},
         "continue_assistant": {"type": "boolean"},
         "tiers": obj({"vram": INT, "ram": INT, "disk": INT, "vram_gb": {"type": "number"},
                       "ram_gb": {"type": "number"}}),
         "hwinfo": obj({"cores": INT, "ram_total_gb": {"type": "number"},
                        "ram_avail_gb": {"type": "number"}, "gpus": INT,
                        "vram_total_gb": {"type": "number"}, "cpu": STR, "gpu": STR}),
         "capabilities": {"type": "array", "items": STR},
         "engine": obj({"state": enum("starting", "ready", "restarting", "down"),
                        "restarts": INT, "pid": {"type": ["integer", "null"]},
                        "last_exit": {"type": ["string", "null"]},
                        "seeds": {"type": "boolean"}}),
         # Only with `colibri serve --replicas N` above 1 (spec/http.md, Replicas).
         "replicas": obj({
             "engines": {"type": "array", "minItems": 2, "items": obj({
                 "replica": INT, "state": enum("starting", "ready", "restarting", "down"),
                 "restarts": INT, "pid": {"type": ["integer", "null"]},
                 "last_exit": {"type": ["string", "null"]}, "active": INT})},
             "affinity": obj({"hits": INT, "misses": INT, "new": INT})})},
        required=["status", "arch", "scheduler", "kv_slots", "input_modalities",
                  "continue_assistant", "capabilities", "engine"]),
    obj({"status": enum("restarting", "down")}),
]}

EXPERTS = obj({"rows": INT, "cols": INT, "map": {"type": "string", "pattern": "^[0-9a-f]*$"},
               "hits": {"type": "string", "pattern": "^[0-9a-f]*$"}, "seq": INT})

PROFILE_TURN = obj({
    "wall_s": {"type": "number"}, "prompt_tokens": INT, "completion_tokens": INT,
    "expert_disk_s": {"type": "number"}, "expert_wait_s": {"type": "number"},
    "expert_matmul_s": {"type": "number"}, "attention_s": {"type": "number"},
    "lm_head_s": {"type": "number"}, "forwards": INT})

PROFILE = obj({"seq": INT, "turns": {"type": "array", "maxItems": 120, "items": PROFILE_TURN}})

MESSAGE_IN = {"type": "object", "required": ["role"], "properties": {
    "role": enum("system", "developer", "user", "assistant", "tool"),
    "content": {"type": ["string", "array", "null"]},
    "reasoning_content": STR, "tool_calls": {"type": "array"}, "tool_call_id": STR,
    "name": STR}}

#: spec/http.md 4.3.1: every kind but "text" is enforced by the engine's grammar section.
RESPONSE_FORMAT: Schema = {
    "description": "Structured output, enforced (spec/http.md 4.3.1). A schema or grammar "
                   "that cannot be enforced is a 400 naming the unsupported feature.",
    "oneOf": [
        NULL,
        obj({"type": const("text")}, extra=True),
        obj({"type": const("json_object")}, extra=True,
            description="content is one JSON object"),
        obj({"type": const("json_schema"), "json_schema": obj(
            {"name": STR, "description": STR,
             "schema": {"type": "object", "description": "a JSON Schema (draft 2020-12 "
                        "subset: no not, if/then, dependentSchemas, unevaluated*)"},
             "strict": {"type": ["boolean", "null"],
                        "description": "read and ignored: the schema is always enforced"}},
            required=["schema"], extra=True)}, extra=True,
            description="content is JSON valid against `schema`"),
        obj({"type": const("gbnf"), "grammar": {"type": "string", "minLength": 1,
                                                "description": "a llama.cpp GBNF grammar"}},
            extra=True, description="content is in the grammar's language"),
    ]}

#: A chat tool: `{"type":"function","function":{...}}` or a bare function object; `strict`
#: constrains the call's arguments to `parameters` (spec/http.md 4.3, 4.3.1).
FUNCTION: Schema = {
    "type": "object", "required": ["name"], "additionalProperties": True,
    "properties": {
        "name": STR, "description": STR,
        "parameters": {"type": "object", "description": "a JSON Schema of the arguments"},
        "strict": {"type": "boolean", "description": "true: the arguments are enforced "
                                                     "against `parameters`"}}}
CHAT_TOOL: Schema = {"oneOf": [
    obj({"type": const("function"), "function": FUNCTION}, extra=True), FUNCTION]}

SAMPLING_FIELDS: dict[str, Schema] = {
    "model": STR,
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "n": const(1), "best_of": {"enum": [None, 1]},
    "logit_bias": {"type": ["object", "null"], "maxProperties": 0},
    "stop": {"oneOf": [NULL, {"type": "string", "minLength": 1},
                       {"type": "array", "minItems": 1, "maxItems": 4,
                        "items": {"type": "string", "minLength": 1}}]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": ["object", "null"],
                       "properties": {"include_usage": {"type": "boolean"}}},
    "cache_slot": {"type": ["integer", "null"], "minimum": 0, "maximum": 15},
    "seed": {"description": "Accepted; passed to the engine only when it announces "
                            "per-request seeds."},
    "x_colibri_ignore_leading_stop": {"type": "boolean"},
    "frequency_penalty": {"enum": [None, 0, False]},
    "presence_penalty": {"enum": [None, 0, False]},
    "modalities": {"type": "array", "items": const("text"), "minItems": 1},
    "response_format": RESPONSE_FORMAT,
    "tools": {"type": ["array", "null"], "items": CHAT_TOOL},
    "tool_choice": {"oneOf": [enum("auto", "none", "required"), {"type": "object"}]},
}

CHAT_REQUEST: Schema = {
    "type": "object", "required": ["model", "messages"], "additionalProperties": True,
    "description": "Fields colibri reads. Unknown fields are accepted and ignored.",
    "properties": {
        **SAMPLING_FIELDS,
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE_IN},
        "reasoning_effort": {"enum": [None, "none", "minimal", "low", "medium", "high",
                                      "xhigh"]},
        "enable_thinking": {"type": "boolean"},
        "strict_tool_calls": {"type": "boolean", "description": "every active tool strict, "
                              "and the reply refused (502) unless it is complete calls"},
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 32},
        "echo": {"enum": [None, False]},
    }}

COMPLETION_REQUEST: Schema = {
    "type": "object", "required": ["model", "prompt"], "additionalProperties": True,
    "description": "Fields colibri reads. Unknown fields are accepted and ignored.",
    "properties": {
        **SAMPLING_FIELDS,
        "prompt": {"type": "string", "minLength": 1},
        "logprobs": {"oneOf": [NULL, const(False), {"type": "integer", "minimum": 0,
                                                    "maximum": 32}]},
        "echo": {"type": ["boolean", "null"]},
        "suffix": NULL,
    }}

MESSAGES_REQUEST: Schema = {
    "type": "object", "required": ["model", "messages", "max_tokens"],
    "additionalProperties": True,
    "properties": {
        "model": STR, "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "properties": {
                "role": enum("user", "assistant"),
                "content": {"type": ["string", "array"]}}}},
        "system": {"type": ["string", "array"]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "thinking": {"type": "object"},
        "tools": {"type": "array", "items": {
            "type": "object", "required": ["name"], "additionalProperties": True,
            "properties": {
                "name": STR, "description": STR,
                "input_schema": {"type": "object", "description": "a JSON Schema of the input"},
                "strict": {"type": "boolean", "description": "true: tool_use input is "
                                                             "enforced against input_schema "
                                                             "(spec/http.md 4.3.1)"}}}},
        "tool_choice": {"type": "object"},
        "stop_sequences": {"enum": [None, "", []]},
        "top_k": NULL,
        "cache_slot": {"type": ["integer", "null"], "minimum": 0},
    }}

# Anthropic's token count: a Messages body without max_tokens (and without sampling fields,
# which it ignores), answered with the number of prompt tokens.
COUNT_TOKENS_REQUEST: Schema = {
    "type": "object", "required": ["model", "messages"], "additionalProperties": True,
    "description": "The fields of a Messages request that shape its prompt; others are ignored.",
    "properties": {k: MESSAGES_REQUEST["properties"][k]
                   for k in ("model", "messages", "system", "thinking", "tools", "tool_choice")}}
COUNT_TOKENS = obj({"input_tokens": {"type": "integer", "minimum": 0}})

# System One (spec/http.md "System One"). `model` is read by nobody: any value, or none.
SYSTEMONE_REQUEST: Schema = {
    "type": "object", "required": ["state", "question", "options"],
    "additionalProperties": True,
    "description": "Fields colibri reads. Unknown fields (model included) are ignored.",
    "properties": {
        "model": {"description": "Not checked on this route (colibri's behaviour)."},
        "state": STR,
        "question": {"type": "string", "minLength": 1},
        "options": {"type": "array", "minItems": 2, "maxItems": 64, "uniqueItems": True,
                    "items": {"type": "string", "minLength": 1}},
        "normalize": enum("sum", "mean"),
    }}

# The option probabilities and the entropy are functions of the kind-(b) logprobs: compared
# with the logprob tolerance, like the logprobs themselves.
PROBABILITY: Schema = {"type": "number", "minimum": 0, "maximum": 1,
                       "x-colibri-sameness": "logprob"}
SYSTEMONE = obj({
    "answer": STR,
    "entropy": {"type": "number", "minimum": 0, "x-colibri-sameness": "logprob",
                "description": "Entropy of the option distribution, in bits."},
    "normalize": enum("sum", "mean"),
    "choices": {"type": "array", "minItems": 2, "items": obj({
        "option": STR, "p": PROBABILITY,
        "logprob": {"type": "number", "maximum": 0, "x-colibri-sameness": "logprob"},
        "mean_logprob": {"type": "number", "maximum": 0, "x-colibri-sameness": "logprob"},
        "tokens": {"type": "integer", "minimum": 1}})},
    "usage": obj({"prompt_tokens": INT, "completion_tokens": const(0), "read_tokens": INT,
                  "total_tokens": INT}),
})

VALIDATION_ERROR = obj({"detail": {"type": "array", "minItems": 1, "items": obj({
    "loc": {"type": "array", "prefixItems": [const("body")], "minItems": 2,
            "items": {"type": ["string", "integer"]}},
    "msg": STR, "type": STR})}})

# `colibri atlas analyze --web` (notes: colibri-tools.md §1.4), served as /experts.json.
ATLAS = obj({
    "categories": {"type": "array", "minItems": 2, "items": STR},
    "experts": {"type": "object", "additionalProperties": False, "patternProperties": {
        "^[0-9]+:[0-9]+$": obj({
            "affinity": {"type": "object", "additionalProperties": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1}},
            "entropy": {"type": "number", "minimum": 0,
                        "description": "-sum v*log2 v over the rounded affinity, in bits, "
                                       "rounded to 2 decimals"},
            "top": STR,
            "label": {"type": "string", "pattern": "^(generalist|specialist: .+)$"}})}},
})

# What /experts.json answers while no atlas has been written.
ATLAS_ABSENT = obj({"atlas": const("absent"), "message": STR})

# GET /examples.json: the prompts the served model ships in its examples.json (none: empty).
EXAMPLES = obj({
    "chat": {"type": "array", "items": obj({
        "prompt": {"type": "string", "minLength": 1}, "skill": {"type": ["string", "null"]}})},
    "systemone": {"oneOf": [NULL, obj({
        "state": STR, "question": {"type": "string", "minLength": 1},
        "options": {"type": "array", "minItems": 2, "items": STR}})]},
}, description="Prompts the served model answers well: the dashboard offers them in an empty "
               "chat and pre-fills System One with `systemone`.")

SCHEMAS: dict[str, tuple[str, Schema]] = {
    "error": ("OpenAI error envelope", ERROR),
    "anthropic_error": ("Anthropic error envelope", ANTHROPIC_ERROR),
    "model": ("A served model", MODEL),
    "model_list": ("GET /v1/models", MODEL_LIST),
    "chat_request": ("POST /v1/chat/completions body", CHAT_REQUEST),
    "chat_completion": ("Non-streamed chat completion", CHAT_COMPLETION),
    "chat_completion_chunk": ("Streamed chat completion chunk", CHAT_CHUNK),
    "completion_request": ("POST /v1/completions body", COMPLETION_REQUEST),
    "completion": ("Non-streamed legacy completion", COMPLETION),
    "completion_chunk": ("Streamed legacy completion chunk", COMPLETION_CHUNK),
    "messages_request": ("POST /v1/messages body", MESSAGES_REQUEST),
    "message": ("Non-streamed Anthropic message", MESSAGE),
    "message_stream_event": ("Streamed Anthropic event", MESSAGE_EVENT),
    "count_tokens_request": ("POST /v1/messages/count_tokens body", COUNT_TOKENS_REQUEST),
    "count_tokens": ("POST /v1/messages/count_tokens reply", COUNT_TOKENS),
    "colibri_stats": ("The `colibri` stats object", COLIBRI_STATS),
    "health": ("GET /health", HEALTH),
    "experts": ("GET /experts", EXPERTS),
    "profile": ("GET /profile", PROFILE),
    "systemone_request": ("POST /v1/systemone body", SYSTEMONE_REQUEST),
    "systemone": ("POST /v1/systemone reply", SYSTEMONE),
    "validation_error": ("422 validation error (`detail` list)", VALIDATION_ERROR),
    "atlas": ("GET /experts.json: the expert atlas (dashboard shape)", ATLAS),
    "atlas_absent": ("GET /experts.json when no atlas was written", ATLAS_ABSENT),
    "examples": ("GET /examples.json: the served model's example prompts", EXAMPLES),
}


def schema_documents() -> dict[str, Schema]:
    docs: dict[str, Schema] = {}
    for name, (title, body) in SCHEMAS.items():
        doc: Schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                       "$id": f"{BASE}{name}.json", "title": title}
        doc.update(copy.deepcopy(body))
        docs[name] = doc
    return docs


def _inline_refs(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.endswith(".json"):
                out[key] = f"#/components/schemas/{value[:-5]}"
            elif key in ("$id", "$schema"):
                continue
            else:
                out[key] = _inline_refs(value)
        return out
    if isinstance(node, list):
        return [_inline_refs(v) for v in node]
    return node


def _json(schema: str) -> Schema:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


#: The model the request examples name: `colibri serve --model DIR`'s default `--model-id`.
EXAMPLE_MODEL = "glm-5.2-colibri"
HELLO = [{"role": "user", "content": "Hello"}]


def _request(schema: str, **examples: Schema) -> Schema:
    """A required JSON body with named examples. Each asks for two tokens at most, so a client
    (or a fuzzer) that sends them all gets answers quickly even from a CPU engine."""
    content = _json(schema)
    content["application/json"]["examples"] = {name: {"value": value}
                                               for name, value in examples.items()}
    return {"required": True, "content": content}


def _errors(envelope: str, *codes: int) -> dict[str, Any]:
    words = {400: "Invalid request (see spec/http.md, validation catalogue)",
             401: "Missing or invalid API key", 403: "Host not allowed",
             404: "Unknown model or path", 429: "Queue full or queue timeout (Retry-After: 1)",
             500: "Engine failure before the response started",
             502: "Invalid model tool call (strict_tool_calls)",
             503: "Scheduler closed or engine restarting"}
    return {str(c): {"description": words[c], "content": _json(envelope)} for c in codes}


def _sse(schema: str, text: str) -> Schema:
    return {"text/event-stream": {
        "schema": {"type": "string", "description": text},
        "x-colibri-event-schema": {"$ref": f"#/components/schemas/{schema}"}}}


def openapi_document() -> Schema:
    gen_errors = (400, 401, 403, 404, 429, 500, 503)
    chat: Schema = {"model": EXAMPLE_MODEL, "messages": HELLO, "max_tokens": 2}
    completion: Schema = {"model": EXAMPLE_MODEL, "prompt": "Once upon a time", "max_tokens": 2}
    message: Schema = {"model": EXAMPLE_MODEL, "max_tokens": 2, "messages": HELLO}
    queue_header = {"x-colibri-queue-wait-ms": {
        "description": "Milliseconds the request waited for a KV slot.",
        "schema": {"type": "integer"}}}

    def generation(summary: str, operation: str, request: Schema, description: str, body: str,
                   chunk: str, stream_text: str, errors: dict[str, Any]) -> Schema:
        """A generation endpoint: POST ``request``, 200 with ``body`` JSON or ``chunk`` SSE."""
        return {"post": {
            "summary": summary, "operationId": operation,
            "requestBody": request,
            "responses": {"200": {
                "description": description,
                "headers": queue_header,
                "content": {**_json(body), **_sse(chunk, stream_text)}},
                **errors}}}
    paths: Schema = {
        "/v1/models": {"get": {
            "summary": "List the served model", "operationId": "listModels",
            "responses": {"200": {"description": "The model list", "content": _json(
                "model_list")}, **_errors("error", 401, 403)}}},
        "/v1/models/{model}": {"get": {
            "summary": "One model", "operationId": "getModel",
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": STR}],
            "responses": {"200": {"description": "The model", "content": _json("model")},
                          **_errors("error", 401, 403, 404)}}},
        "/v1/chat/completions": generation(
            "OpenAI chat completion", "createChatCompletion", _request(
                "chat_request", plain=chat, stream={**chat, "stream": True, "stream_options": {
                    "include_usage": True}}, logprobs={**chat, "logprobs": True,
                                                       "top_logprobs": 2}),
            "JSON, or SSE `data:` chunks ending with `data: [DONE]`", "chat_completion",
            "chat_completion_chunk", "`data: <chunk>` events, then `data: [DONE]`",
            _errors("error", *gen_errors, 502)),
        "/v1/completions": generation(
            "Legacy text completion", "createCompletion", _request(
                "completion_request", plain=completion, stream={**completion, "stream": True},
                logprobs={**completion, "logprobs": 2}),
            "JSON, or SSE `data:` chunks ending with `data: [DONE]`", "completion",
            "completion_chunk", "`data: <chunk>` events, then `data: [DONE]`",
            _errors("error", *gen_errors)),
        "/v1/messages": generation(
            "Anthropic Messages", "createMessage", _request(
                "messages_request", plain=message, stream={**message, "stream": True}),
            "JSON, or named SSE events (no [DONE])", "message",
            "message_stream_event", "`event: <type>` + `data: <event>` pairs",
            _errors("anthropic_error", *gen_errors)),
        "/v1/messages/count_tokens": {"post": {
            "summary": "Anthropic token count of a Messages request",
            "operationId": "countMessageTokens",
            "description": "The prompt tokens the engine would accept for the same Messages "
                           "request, counted with the served model's tokenizer; no engine "
                           "call, no KV slot.",
            "requestBody": _request("count_tokens_request", plain={
                "model": EXAMPLE_MODEL, "system": "Answer briefly.", "messages": HELLO}),
            "responses": {"200": {"description": "The count",
                                  "content": _json("count_tokens")},
                          "501": {"description": "The served model's tokenizer is unknown "
                                                 "(an --engine-cmd server without --model)",
                                  "content": _json("anthropic_error")},
                          **_errors("anthropic_error", 400, 401, 403, 404)}}},
        "/v1/systemone": {"post": {
            "summary": "System One: the probability of each option of a closed question",
            "operationId": "systemOne",
            "description": "Scores every option through the engine's logprob channel; "
                           "generates nothing. `model` is not checked.",
            "requestBody": _request("systemone_request", plain={
                "state": "The invoice is dated 3 March and is due in 30 days. It has not been "
                         "paid.",
                "question": "Is the invoice overdue on 10 April?", "options": ["yes", "no"]}),
            "responses": {"200": {"description": "The decision", "headers": queue_header,
                                  "content": _json("systemone")},
                          "422": {"description": "Validation error, or a document or option "
                                                 "that does not fit the context",
                                  "content": _json("validation_error")},
                          **_errors("error", 400, 401, 403, 429, 500, 503)}}},
        "/health": {"get": {
            "summary": "Liveness; full snapshot only when authenticated",
            "operationId": "health",
            "responses": {"200": {"description": "Engine ready", "content": _json("health")},
                          "503": {"description": "Engine restarting or down",
                                  "content": _json("health")},
                          **_errors("error", 403)}}},
        "/metrics": {"get": {
            "summary": "Prometheus text exposition 0.0.4", "operationId": "metrics",
            "responses": {"200": {"description": "Scheduler metrics", "content": {
                "text/plain; version=0.0.4; charset=utf-8": {"schema": STR}}},
                **_errors("error", 401, 403)}}},
        "/experts": {"get": {
            "summary": "Expert tier map telemetry (empty unless authenticated)",
            "operationId": "experts",
            "responses": {"200": {"description": "EMAP/HITS", "content": _json("experts")},
                          **_errors("error", 403)}}},
        "/profile": {"get": {
            "summary": "Per-turn timing ring (empty unless authenticated)",
            "operationId": "profile",
            "responses": {"200": {"description": "PROF turns", "content": _json("profile")},
                          **_errors("error", 403)}}},
        "/experts.json": {"get": {
            "summary": "The expert atlas (`colibri atlas analyze --web`), or that there is none",
            "operationId": "atlas",
            "responses": {"200": {
                "description": "experts.json, or the empty state while none was written",
                "content": {"application/json": {"schema": {"oneOf": [
                    {"$ref": "#/components/schemas/atlas"},
                    {"$ref": "#/components/schemas/atlas_absent"}]}}}},
                **_errors("error", 403)}}},
        "/examples.json": {"get": {
            "summary": "Example prompts the served model ships (examples.json), or none",
            "operationId": "examples",
            "responses": {"200": {"description": "The examples; empty lists and null when "
                                                 "the model ships none",
                                  "content": _json("examples")},
                          **_errors("error", 403)}}},
        "/openapi.json": {"get": {
            "summary": "This document", "operationId": "openapi",
            "responses": {"200": {"description": "OpenAPI 3.1",
                                  "content": {"application/json": {"schema": {
                                      "type": "object"}}}}}}},
        # The template parameter belongs to the path item: OpenAPI 3.1 requires every
        # operation under a templated path to declare it, the preflight included.
        "/{path}": {
            "parameters": [{"name": "path", "in": "path", "required": True, "schema": STR}],
            "get": {
                "summary": "Static web/dist with SPA fallback", "operationId": "static",
                "responses": {"200": {"description": "A file of web/dist, or index.html"},
                              **_errors("error", 401, 403, 404)}},
            "options": {"summary": "CORS preflight (any path)", "operationId": "preflight",
                        "responses": {"204": {"description": "Preflight answer"},
                                      "403": {"description": "Host not allowed"}}}},
    }
    components = {name: _inline_refs(doc) for name, doc in schema_documents().items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "colibri HTTP API", "version": "1.0.0",
                 "description": "OpenAI- and Anthropic-compatible surface of `colibri serve`. "
                                "Normative prose: spec/http.md."},
        "servers": [{"url": "http://127.0.0.1:8000"}],
        "security": [{}, {"bearer": []}, {"apiKey": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
    }


def rendered() -> dict[Path, str]:
    sys.path.insert(0, str(Path(__file__).parent))
    import http_error_catalogue

    files = {SCHEMA_DIR / f"{name}.json": json.dumps(doc, indent=2) + "\n"
             for name, doc in schema_documents().items()}
    files[ROOT / "spec" / "openapi.yaml"] = json.dumps(openapi_document(), indent=1) + "\n"
    http_md = ROOT / "spec" / "http.md"
    files[http_md] = http_error_catalogue.render(http_md.read_text(), ROOT / "server")
    return files


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in rendered().items():
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale:", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
