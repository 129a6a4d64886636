"""The benchmarks' client for the server's streamed answers: one POST, its SSE chunks parsed.

Written on ``http.client`` rather than the OpenAI SDK so a timed round measures the server,
not a client library's parsing."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any


def stream_chunks(port: int, path: str, payload: dict[str, Any],
                  timeout: float = 600.0) -> Iterator[dict[str, Any]]:
    """POST ``payload`` to ``path`` on the local server and yield each ``data:`` chunk as
    JSON until ``[DONE]``; ``RuntimeError`` when the server does not answer 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(payload),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"server answered HTTP {response.status}")
        for raw in response:
            line = raw.decode()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):].strip()
            if data == "[DONE]":
                return
            chunk: dict[str, Any] = json.loads(data)
            yield chunk
    finally:
        conn.close()
