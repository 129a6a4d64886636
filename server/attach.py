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
import time
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from colibri.server import examples

DEFAULT_URL = "http://127.0.0.1:8000"
JSON = dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attach", nargs="?", const=DEFAULT_URL, default=None, metavar="URL",
                        help=f"chat with a running server over SSE (default {DEFAULT_URL})")
    parser.add_argument("--api-key", default=os.environ.get("COLI_API_KEY"),
                        help="API key for the attached server (env COLI_API_KEY)")


@dataclass
class Reply:
    """One streamed turn: the answer text (what the history keeps), the reasoning shown apart,
    and the completion tokens the server counted (None when it sent no usage)."""

    text: str = ""
    reasoning: str = ""
    completion_tokens: int | None = None


def turn_body(model: str, history: list[dict[str, str]], max_tokens: int | None) -> JSON:
    body: JSON = {"model": model, "messages": history, "stream": True,
                  "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def stream_reply(url: str, api_key: str | None, body: dict[str, Any], out: TextIO,
                 thinking: TextIO | None = None) -> Reply:
    """POST one streamed chat turn; print the answer to `out` as it arrives and the
    reasoning to `thinking` (None: not shown). Returns the turn."""
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
    reply = Reply()
    for raw in response:
        line = raw.decode("utf-8").rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            reply.completion_tokens = usage["completion_tokens"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta", {})
            thought = delta.get("reasoning_content") or ""
            if thought:
                reply.reasoning += thought
                _show(thinking, thought, dim=True)
            piece = delta.get("content") or ""
            reply.text += piece
            _show(out, piece, dim=False)
    conn.close()
    if reply.reasoning:
        _show(thinking, "\n", dim=False)
    out.write("\n")
    return reply


def _show(stream: TextIO | None, text: str, dim: bool) -> None:
    if stream is None or not text:
        return
    tty = bool(getattr(stream, "isatty", lambda: False)())
    stream.write(f"\x1b[2m{text}\x1b[0m" if dim and tty else text)
    stream.flush()


def footer(reply: Reply, seconds: float) -> str:
    """colibri's `N tok · Ts · x tok/s`; a leading `~` when the server sent no usage and the
    count is estimated from the characters (4 per token)."""
    if reply.completion_tokens is not None:
        return rate_line(reply.completion_tokens, seconds)
    return "~" + rate_line(max(1, len(reply.text + reply.reasoning) // 4), seconds)


def rate_line(tokens: int, seconds: float) -> str:
    """`N tok · Ts · x tok/s` over a reply's wall time (``colibri chat`` prints it too)."""
    rate = tokens / seconds if seconds > 0 else 0.0
    return f"{tokens} tok · {seconds:.1f}s · {rate:.1f} tok/s"


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


QUIT = frozenset({":quit", ":exit", ":q"})


def run(args: argparse.Namespace, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout,
        err: TextIO = sys.stderr) -> int:
    """The attached REPL: each line is a user turn; an empty line, EOF or `:quit` ends
    without sending anything; `:reset` starts a new conversation. Reasoning goes to `err`
    (dimmed on a terminal; COLI_SHOW_THINK=0 hides it), then a stats footer per turn."""
    url = args.attach
    try:
        model = models(url, args.api_key)[0]
    except (OSError, RuntimeError) as exc:
        print(f"colibri chat: cannot reach {url}: {exc}", file=err)
        return 1
    print(f"attached to {url} ({model}); empty line, EOF or :quit ends", file=err)
    offer = examples.try_line(examples.fetch(url))
    if offer:
        print(offer, file=err)
    thinking = None if os.environ.get("COLI_SHOW_THINK") == "0" else err
    max_tokens = getattr(args, "ngen", None)
    history: list[dict[str, str]] = []
    for line in stdin:
        prompt = line.rstrip("\n")
        if not prompt or prompt.strip() in QUIT:
            break
        if prompt.strip() == ":reset":
            history.clear()
            print("[conversation cleared]", file=err)
            continue
        history.append({"role": "user", "content": prompt})
        started = time.monotonic()
        try:
            reply = stream_reply(url, args.api_key, turn_body(model, history, max_tokens),
                                 out, thinking)
        except (OSError, RuntimeError) as exc:
            print(f"colibri chat: {exc}", file=err)
            return 1
        print(f"[{footer(reply, time.monotonic() - started)}]", file=err)
        history.append({"role": "assistant", "content": reply.text})
    return 0
