"""``colibri chat --attach [URL]``: a terminal chat against a running `colibri serve` over SSE.

`colibri chat` (the engine helper's command) adds ``--attach`` with :func:`add_arguments`
and hands over to :func:`run` when it is given. Only the standard library is used: the
server's own chunk format is simple enough that an SDK would add nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
from typing import Any, TextIO
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:8000"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attach", nargs="?", const=DEFAULT_URL, default=None, metavar="URL",
                        help=f"chat with a running server over SSE (default {DEFAULT_URL})")
    parser.add_argument("--api-key", default=os.environ.get("COLI_API_KEY"),
                        help="API key for the attached server (env COLI_API_KEY)")


def stream_reply(url: str, api_key: str | None, body: dict[str, Any], out: TextIO) -> str:
    """POST one streamed chat turn and print its content as it arrives; returns the text."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=600)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn.request("POST", parts.path.rstrip("/") + "/v1/chat/completions",
                 body=json.dumps(body).encode(), headers=headers)
    response = conn.getresponse()
    if response.status != 200:
        error = json.loads(response.read() or b"{}").get("error", {})
        raise RuntimeError(f"HTTP {response.status}: {error.get('message', 'error')}")
    text = ""
    for raw in response:
        line = raw.decode("utf-8").rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        for choice in json.loads(data).get("choices", []):
            piece = choice.get("delta", {}).get("content") or ""
            text += piece
            out.write(piece)
            out.flush()
    conn.close()
    out.write("\n")
    return text


def models(url: str, api_key: str | None) -> list[str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=30)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conn.request("GET", parts.path.rstrip("/") + "/v1/models", headers=headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status} from {url}/v1/models")
    return [m["id"] for m in json.loads(response.read())["data"]]


def run(args: argparse.Namespace, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    url = args.attach
    try:
        model = models(url, args.api_key)[0]
    except (OSError, RuntimeError) as exc:
        print(f"colibri chat: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    print(f"attached to {url} ({model}); empty line or EOF ends", file=sys.stderr)
    history: list[dict[str, str]] = []
    for line in stdin:
        prompt = line.rstrip("\n")
        if not prompt:
            break
        history.append({"role": "user", "content": prompt})
        try:
            reply = stream_reply(url, args.api_key, {"model": model, "messages": history,
                                                     "stream": True}, out)
        except (OSError, RuntimeError) as exc:
            print(f"colibri chat: {exc}", file=sys.stderr)
            return 1
        history.append({"role": "assistant", "content": reply})
    return 0
