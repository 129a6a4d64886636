"""Raw HTTP exchanges recorded as normalised transcripts, validated against spec/schemas."""

from __future__ import annotations

import http.client
import json
import re
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012

from colibri import resources

KEPT_HEADERS = ("content-type", "retry-after", "cache-control", "connection",
                "access-control-allow-origin", "access-control-allow-methods",
                "access-control-allow-headers", "access-control-expose-headers",
                "access-control-max-age", "vary", "x-accel-buffering")
PRESENCE_HEADERS = ("x-request-id", "x-typesafe-request-id", "x-colibri-queue-wait-ms")

TIMING_KEYS = frozenset({"tokens_per_second", "rss_gb", "cache_hit_percent", "wall_s",
                         "expert_disk_s", "expert_wait_s", "expert_matmul_s", "attention_s",
                         "lm_head_s"})

NORMALISE = [
    (re.compile(r"chatcmpl-[0-9a-f]{32}"), "chatcmpl-ID"),
    (re.compile(r"cmpl-[0-9a-f]{32}"), "cmpl-ID"),
    (re.compile(r"msg_[0-9a-f]{24}"), "msg_ID"),
    (re.compile(r"call_[0-9a-f]{24}"), "call_ID"),
    (re.compile(r"req_[0-9a-f]{32}"), "req_ID"),
]


@cache
def _registry() -> referencing.Registry[Any]:
    resources_list = []
    for path in sorted(resources.spec_path("schemas").glob("*.json")):
        doc = json.loads(path.read_text())
        resources_list.append((doc["$id"], DRAFT202012.create_resource(doc)))
    return referencing.Registry().with_resources(resources_list)


def validate(schema: str, instance: Any) -> None:
    registry = _registry()
    doc = registry.contents(f"https://spec.colibri.invalid/schemas/{schema}.json")
    jsonschema.Draft202012Validator(doc, registry=registry).validate(instance)


def schema_for(method: str, path: str, status: int, streaming: bool) -> str | None:
    if method not in ("GET", "POST") or status == 204:
        return None
    if path == "/health" and method == "GET" and status in (200, 503):
        return "health"
    if status == 422 and path == "/v1/systemone":
        return "validation_error"
    if status >= 400:
        if path.startswith("/v1/messages") and method == "POST":
            return "anthropic_error"
        return "error"
    table = {
        "/v1/chat/completions": ("chat_completion", "chat_completion_chunk"),
        "/v1/completions": ("completion", "completion_chunk"),
        "/v1/messages": ("message", "message_stream_event"),
        "/v1/models": ("model_list", None), "/health": ("health", None),
        "/experts": ("experts", None), "/profile": ("profile", None),
        "/v1/systemone": ("systemone", None),
        "/v1/messages/count_tokens": ("count_tokens", None),
    }
    if path.startswith("/v1/models/"):
        return "model"
    pair = table.get(path)
    if pair is None:
        return None
    return pair[1] if streaming else pair[0]


def parse_sse(text: str) -> list[Any]:
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        name = None
        data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        assert data is not None, f"SSE block without data: {block!r}"
        payload = data if data == "[DONE]" else json.loads(data)
        events.append({"event": name, "data": payload} if name else payload)
    return events


def normalise(value: Any) -> Any:
    text = json.dumps(value, ensure_ascii=False)
    for pattern, replacement in NORMALISE:
        text = pattern.sub(replacement, text)
    node = json.loads(text)
    return _scrub(node)


def _scrub(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in ("created", "release_date", "pid"):
                out[key] = "<" + key + ">"
            elif key == "x-colibri-queue-wait-ms":
                out[key] = "<ms>"
            elif key == "hwinfo" and isinstance(value, dict):
                out[key] = {k: "<host>" for k in value}
            elif key in ("map", "hits") and isinstance(value, str):
                # Expert heat accumulates over every earlier request: only the shape is stable.
                out[key] = f"<hex:{len(value)}>"
            elif key == "entropy" and isinstance(value, list):
                # Routing entropy follows the engine's whole history, not this request.
                out[key] = ["<measured>"] * len(value)
            elif key in TIMING_KEYS and isinstance(value, int | float):
                # Measurements of the engine's machine, not outputs: only their presence counts.
                out[key] = "<measured>"
            else:
                out[key] = _scrub(value)
        return out
    if isinstance(node, list):
        return [_scrub(v) for v in node]
    return node


def exchange(base_url: str, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None, raw: bytes | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
    """One request; returns the transcript (status, kept headers, body or SSE events)."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    data = raw if raw is not None else (
        None if body is None else json.dumps(body, ensure_ascii=False).encode())
    all_headers = {"Content-Type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    conn.request(method, path, body=data, headers=all_headers)
    response = conn.getresponse()
    truncated = False
    try:
        content = response.read()
    except http.client.IncompleteRead as cut:
        # The server closed a stream mid-way (engine failure): keep the complete events.
        truncated = True
        content = cut.partial[: cut.partial.rfind(b"\n\n") + 2]
    conn.close()
    got = {k.lower(): v for k, v in response.getheaders()}
    transcript: dict[str, Any] = {"status": response.status}
    if truncated:
        transcript["truncated"] = True
    transcript["headers"] = {k: got[k] for k in KEPT_HEADERS if k in got}
    for key in PRESENCE_HEADERS:
        if key in got:
            transcript["headers"][key] = "<present>"
    ctype = got.get("content-type", "")
    streaming = ctype.startswith("text/event-stream")
    if streaming:
        transcript["events"] = parse_sse(content.decode())
    elif ctype.startswith("application/json"):
        transcript["body"] = json.loads(content)
    else:
        transcript["text"] = content.decode("utf-8", "replace")
    schema = schema_for(method, path.split("?")[0], response.status, streaming)
    if schema is not None:
        items = transcript["events"] if streaming else [transcript.get("body")]
        for item in items:
            if item == "[DONE]":
                continue
            validate(schema, item["data"] if streaming and "event" in item else item)
            if streaming and "event" in item:
                assert item["event"] == item["data"]["type"]
    return transcript
