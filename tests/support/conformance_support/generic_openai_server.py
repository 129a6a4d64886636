"""A minimal OpenAI-compatible server without any colibri extension (no /health, /metrics,
Anthropic or completions endpoints): the conformance suite must run its portable subset
against it and skip the rest. Replies are a fixed word list; usage counts words.

Run: ``python generic_openai_server.py PORT [--claims-colibri]``; with the flag it answers
``Server: colibri`` (a colibri server that lost its extensions, for the capability tests).
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "generic-model"
WORDS = ["Sure", ",", " here", " is", " a", " short", " reply", " for", " you", "."]
CONTEXT = 2048


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
        if self.path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "someone"}],
                },
            )
        else:
            self._error(404, "Not found.", None, "not_found")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path != "/v1/chat/completions":
            self._error(404, "Not found.", None, "not_found")
            return
        if body.get("model") != MODEL:
            self._error(404, "The model does not exist.", "model", "model_not_found")
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self._error(400, "messages is required.", "messages", None)
            return
        prompt_words = sum(len(str(m.get("content", "")).split()) for m in messages)
        if prompt_words > CONTEXT:
            self._error(400, "context too long", "messages", "context_length_exceeded")
            return
        limit = int(body.get("max_tokens") or 16)
        words, finish = WORDS[:limit], "length" if limit < len(WORDS) else "stop"
        stops = body.get("stop") or []
        text = "".join(words)
        for stop in [stops] if isinstance(stops, str) else stops:
            if stop in text:
                text, finish = text[: text.index(stop)], "stop"
        if body.get("stream"):
            self._stream(text, finish)
            return
        self._json(
            200,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_words,
                    "completion_tokens": len(words),
                    "total_tokens": prompt_words + len(words),
                },
            },
        )

    def _stream(self, text: str, finish: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
        deltas = [{"role": "assistant", "content": ""}, {"content": text}, {}]
        for number, delta in enumerate(deltas):
            choice = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish if number == len(deltas) - 1 else None,
            }
            self.wfile.write(
                b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"
            )
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


if __name__ == "__main__":
    if "--claims-colibri" in sys.argv[2:]:
        Handler.version_string = lambda self: "colibri"  # type: ignore[method-assign]
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
