"""`colibri chat --attach` against a stub OpenAI server that records what it is sent: the
turn body (max tokens from --ngen, usage requested), `:quit` never sent, reasoning shown
apart from the answer, and the stats footer (exact with usage, `~` estimated without)."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from colibri.server import attach


class Stub(http.server.BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []
    usage = True

    def log_message(self, *_args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(b'{"data": [{"id": "stub-model"}]}', "application/json")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Stub.bodies.append(body)
        chunks: list[dict[str, Any]] = [
            {"choices": [{"delta": {"reasoning_content": "thinking it over"}}]},
            {"choices": [{"delta": {"content": "Hel"}}]},
            {"choices": [{"delta": {"content": "lo"}}]},
        ]
        if Stub.usage:
            chunks.append({"choices": [], "usage": {"completion_tokens": 7}})
        events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        self._send(events + b"data: [DONE]\n\n", "text/event-stream")

    def _send(self, data: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def stub() -> Iterator[str]:
    Stub.bodies, Stub.usage = [], True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def chat(url: str, lines: str, *flags: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ngen", type=int, default=None)
    attach.add_arguments(parser)
    args = parser.parse_args(["--attach", url, *flags])
    out, err = io.StringIO(), io.StringIO()
    code = attach.run(args, io.StringIO(lines), out, err)
    return code, out.getvalue(), err.getvalue()


def test_turns_quit_reasoning_and_footer(stub: str) -> None:
    code, out, err = chat(stub, "hi\nagain\n:quit\nnever sent\n", "--ngen", "5")
    assert code == 0
    assert out == "Hello\nHello\n"  # the answer only: reasoning is shown apart
    assert err.count("thinking it over") == 2 and "[7 tok · " in err and " tok/s]" in err
    assert [b["max_tokens"] for b in Stub.bodies] == [5, 5]
    assert Stub.bodies[0]["stream_options"] == {"include_usage": True}
    # the history keeps the answers, never the reasoning nor `:quit`
    assert Stub.bodies[1]["messages"] == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "again"}]


def test_reset_and_an_estimated_footer(stub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Stub.usage = False
    monkeypatch.setenv("COLI_SHOW_THINK", "0")
    code, _, err = chat(stub, "one\n:reset\ntwo\n")
    assert code == 0 and "thinking" not in err and "[conversation cleared]" in err
    assert "max_tokens" not in Stub.bodies[0]
    assert Stub.bodies[1]["messages"] == [{"role": "user", "content": "two"}]
    # "thinking it over" + "Hello" = 21 characters, ~4 per token, marked as an estimate
    assert "[~5 tok · " in err
