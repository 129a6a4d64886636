"""Transport-level guarantees: body framing, keep-alive, Host allowlist, connection caps, read
deadline, and the `colibri serve` command itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from colibri.server.context import ServerConfig
from support.http_transcript import exchange
from support.server_harness import FAKE_ENGINE, LiveServer, interrupt, launch, serve_process

M = "test-model"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = launch(ServerConfig(model_id=M, allowed_hosts=("llm.example.com",),
                               max_connections_per_ip=3, read_deadline_s=1.0))
    yield live
    live.stop()


def raw(server: LiveServer, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.server.port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_oversized_body_is_refused_and_closed(server: LiveServer) -> None:
    size = (4 << 20) + 1
    reply = raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: " + str(size).encode() + b"\r\n\r\n" + b"x" * size)
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"Request body must be between 1 and 4194304 bytes." in reply


def test_transfer_encoding_is_refused(server: LiveServer) -> None:
    reply = raw(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"Transfer-Encoding is not supported; send one Content-Length." in reply


@pytest.mark.parametrize("content_type", ["multipart/form-data", "text/plain",
                                          "application/x-www-form-urlencoded"])
def test_content_type_is_not_checked(server: LiveServer, content_type: str) -> None:
    """spec/http.md 2.2: the body is JSON whatever the type says, even a type Tornado would
    parse as a form (and refuse, a multipart one without a boundary)."""
    for path in ("/v1/chat/completions", "/v1/messages"):
        reply = exchange(server.url, "POST", path, {
            "model": M, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Content-Type": content_type})
        assert reply["status"] == 200, reply


def test_unknown_method_is_405_naming_the_methods(server: LiveServer) -> None:
    """spec/http.md 2.1: `Allow` lists the methods, as RFC 9110 15.5.6 requires of a 405."""
    reply = raw(server, b"DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Connection: close\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405")
    assert b"\r\nAllow: GET, POST, OPTIONS\r\n" in head + b"\r\n"
    assert b'"code":"method_not_allowed"' in body


def test_json_responses_keep_the_connection(server: LiveServer) -> None:
    request = (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.server.port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            assert head.startswith(b"HTTP/1.1 200") and b'"object":"list"' in body


def test_allowed_host_extends_the_guard(server: LiveServer) -> None:
    assert exchange(server.url, "GET", "/health", headers={"Host": "llm.example.com"})[
        "status"] == 200
    refused = exchange(server.url, "GET", "/health", headers={"Host": "other.example:80"})
    assert refused["status"] == 403
    assert "--allowed-host other.example" in refused["body"]["error"]["message"]


def peer_connections_reach(server: LiveServer, count: int) -> None:
    """Wait until the server counts ``count`` open connections from 127.0.0.1: it accepts and
    closes them on its own thread, so an earlier test's keep-alive connection can still be
    counted (and would make the cap refuse one of the held ones instead of the extra one)."""
    deadline = time.monotonic() + 10
    while server.server.http.per_ip["127.0.0.1"] != count:
        assert time.monotonic() < deadline, (
            f"server counts {server.server.http.per_ip['127.0.0.1']} connections, not {count}")
        time.sleep(0.01)


def test_per_peer_connection_cap(server: LiveServer) -> None:
    peer_connections_reach(server, 0)
    held = [socket.create_connection(("127.0.0.1", server.server.port)) for _ in range(3)]
    try:
        peer_connections_reach(server, 3)
        extra = socket.create_connection(("127.0.0.1", server.server.port), timeout=10)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            assert extra.recv(100) == b""  # closed without a response
        except ConnectionResetError:
            pass
        extra.close()
    finally:
        for sock in held:
            sock.close()


def test_read_deadline_closes_a_silent_client(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Length: 50\r\n\r\n{")
        # The server closes with our unread bytes in its buffer, which the kernel may turn
        # into a reset instead of a clean EOF: both mean the deadline closed the connection.
        try:
            received = sock.recv(100)
        except ConnectionResetError:
            received = b""
        assert received == b""


def test_serve_command_runs_an_engine_and_shuts_down() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = ["--engine-cmd", f"{sys.executable} {FAKE_ENGINE}", "--model-id", M]
    with serve_process(args, env, ROOT) as (proc, line, v1):
        assert line.startswith(f"colibri serving {M} on http://127.0.0.1:")
        url = v1.removesuffix("/v1")
        reply = exchange(url, "POST", "/v1/chat/completions", {
            "model": M, "messages": [{"role": "user", "content": "hi"}]})
        assert reply["body"]["choices"][0]["message"]["content"] == "Héllo"
        chat = subprocess.run([sys.executable, "-m", "colibri", "chat", "--attach", url],
                              input="hi\n\n", capture_output=True, text=True, timeout=60,
                              cwd=ROOT, env=env)
        assert chat.returncode == 0 and chat.stdout == "Héllo\n"
        assert interrupt(proc) == 0


def test_serve_refuses_public_bind_without_key() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLI_API_KEY",
                                                             "COLI_ALLOW_INSECURE_BIND")}
    done = subprocess.run([sys.executable, "-m", "colibri", "serve", "--host", "0.0.0.0",
                           "--engine-cmd", "false"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 1
    assert "refusing to bind 0.0.0.0 without COLI_API_KEY" in done.stderr


def test_wildcard_cors_and_exact_origins() -> None:
    live = launch(ServerConfig(model_id=M, cors_origins=("*",)))
    try:
        reply = exchange(live.url, "GET", "/v1/models", headers={"Origin": "http://x.example"})
        assert reply["headers"]["access-control-allow-origin"] == "*"
        assert "vary" not in reply["headers"]
    finally:
        live.stop()
    exact = launch(ServerConfig(model_id=M, cors_origins=("https://ui.example",)))
    try:
        ok = exchange(exact.url, "OPTIONS", "/v1/chat/completions",
                      headers={"Origin": "https://ui.example"})
        assert ok["status"] == 204
        assert ok["headers"]["access-control-allow-origin"] == "https://ui.example"
        assert ok["headers"]["vary"] == "Origin"
        other = exchange(exact.url, "OPTIONS", "/v1/chat/completions",
                         headers={"Origin": "http://localhost:5173"})
        assert "access-control-allow-origin" not in other["headers"]
    finally:
        exact.stop()


def test_serve_reports_an_engine_that_never_gets_ready() -> None:
    done = subprocess.run([sys.executable, "-m", "colibri", "serve", "--port", "0",
                           "--engine-cmd", f"{sys.executable} -c 'print(1)'"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "did not become READY" in done.stderr
