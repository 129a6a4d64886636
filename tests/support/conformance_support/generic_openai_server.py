"""A minimal OpenAI-compatible server without any colibri extension (no /health, /metrics,
Anthropic or completions endpoints): the conformance suite must judge it on the `openai`
profile (what OpenAI's API reference documents) and skip the rest. Replies are a fixed word
list, one word per "token"; usage counts words.

It does what the reference documents and nothing more: range checks with the error envelope,
``n`` choices, ``stream_options.include_usage``, stop sequences cut in streams too,
``logprobs``/``top_logprobs``, and a call of the first tool under ``tool_choice: required``.

Run: ``python generic_openai_server.py PORT [--claims-colibri] [--lenient]``. With
``--claims-colibri`` it answers ``Server: colibri`` (a colibri server that lost its
extensions, for the capability tests); with ``--lenient`` it checks nothing and streams no
usage chunk, the divergences measured on llama.cpp's server, which the `openai` profile must
catch.
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "generic-model"
LENIENT = "--lenient" in sys.argv[2:]
WORDS = ["Sure", ",", " here", " is", " a", " short", " reply", " for", " you", "."]
CONTEXT = 2048
ROLES = ("developer", "system", "user", "assistant", "tool")
#: (field, lowest, highest) of the numeric ranges the reference documents.
RANGES = (
    ("temperature", 0, 2),
    ("top_p", 0, 1),
    ("presence_penalty", -2, 2),
    ("frequency_penalty", -2, 2),
    ("top_logprobs", 0, 20),
    ("n", 1, 128),
)


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None, status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def check(body: Any) -> None:
    """The request checks of the reference, first failure wins."""
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.", None)
    if body.get("model") != MODEL:
        raise BadRequest("The model does not exist.", "model", 404, "model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages is required.", "messages")
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest("Invalid role.", f"messages.{number}.role")
        if not isinstance(message.get("content"), (str, list)):
            raise BadRequest("Invalid content.", f"messages.{number}.content")
    for name, low, high in RANGES:
        value = body.get(name)
        if value is not None and not (isinstance(value, (int, float)) and low <= value <= high):
            raise BadRequest(f"{name} must be between {low} and {high}.", name)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and not (isinstance(value, int) and value >= 1):
            raise BadRequest(f"{name} must be a positive integer.", name)
    stops = body.get("stop")
    if isinstance(stops, list) and not 1 <= len(stops) <= 4:
        raise BadRequest("Up to 4 stop sequences.", "stop")
    for bias in (body.get("logit_bias") or {}).values():
        if not -100 <= bias <= 100:
            raise BadRequest("logit_bias values are between -100 and 100.", "logit_bias")


def answer(body: dict[str, Any]) -> tuple[list[str], str, int]:
    """(the words of the reply, its finish_reason, the prompt's word count)."""
    prompt_words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    if prompt_words > CONTEXT:
        raise BadRequest("context too long", "messages", code="context_length_exceeded")
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    words, finish = WORDS[:limit], "length" if limit < len(WORDS) else "stop"
    stops = body.get("stop") or []
    for stop in [stops] if isinstance(stops, str) else stops:
        text = "".join(words)
        if stop in text:
            cut = text.index(stop)
            kept: list[str] = []
            for word in words:
                if len("".join(kept + [word])) > cut:
                    kept.append(word[: cut - len("".join(kept))])
                    break
                kept.append(word)
            words, finish = [w for w in kept if w], "stop"
    return words, finish, prompt_words


def tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools") or []
    if body.get("tool_choice") != "required" or not tools:
        return None
    name = tools[0]["function"]["name"]
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}


def logprobs(words: list[str], top: int) -> dict[str, Any]:
    def entry(word: str) -> dict[str, Any]:
        return {"token": word, "logprob": -1.0, "bytes": list(word.encode())}

    return {"content": [{**entry(w), "top_logprobs": [entry(w)] + [entry("?")] * (top - 1)}
                        for w in words]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _json(self, status: int, document: Any) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, param: str | None, code: str | None) -> None:
        error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
        self._json(status, {"error": error})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "someone"}
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [model]})
        elif self.path == f"/v1/models/{MODEL}":
            self._json(200, model)
        else:
            self._error(404, "Not found.", None, "not_found")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/chat/completions":
            self._error(404, "Not found.", None, "not_found")
            return
        try:
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                raise BadRequest("We could not parse the JSON body.", None) from None
            if LENIENT:
                body = {"messages": [{"content": ""}], **body, "stream_options": None}
            else:
                check(body)
            words, finish, prompt_words = answer(body)
        except BadRequest as exc:
            self._error(exc.status, str(exc), exc.param, exc.code)
            return
        call = tool_call(body)
        if call is not None:
            words, finish = [], "tool_calls"
        choices = int(body.get("n") or 1)
        usage = {"prompt_tokens": prompt_words, "completion_tokens": len(words) * choices,
                 "total_tokens": prompt_words + len(words) * choices}
        if body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(words, finish, call, choices, usage if include else None)
            return
        message: dict[str, Any] = {"role": "assistant", "content": "".join(words)}
        if call is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        top = body.get("top_logprobs") or 0
        self._json(200, {
            "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": i, "message": message, "finish_reason": finish,
                         "logprobs": logprobs(words, top) if body.get("logprobs") else None}
                        for i in range(choices)],
            "usage": usage,
        })

    def _stream(self, words: list[str], finish: str, call: dict[str, Any] | None,
                choices: int, usage: dict[str, Any] | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        base: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                "created": 0, "model": MODEL}
        if usage is not None:
            base["usage"] = None
        body = [{"tool_calls": [{"index": 0, **call}]}] if call else [{"content": w} for w in words]
        deltas = [{"role": "assistant", "content": ""}, *body, {}]
        for index in range(choices):
            for number, delta in enumerate(deltas):
                reason = finish if number == len(deltas) - 1 else None
                choice = {"index": index, "delta": delta, "finish_reason": reason}
                self._event({**base, "choices": [choice]})
        if usage is not None:
            self._event({**base, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

    def _event(self, chunk: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


if __name__ == "__main__":
    if "--claims-colibri" in sys.argv[2:]:
        Handler.version_string = lambda self: "colibri"  # type: ignore[method-assign]
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
