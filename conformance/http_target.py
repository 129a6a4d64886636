"""The HTTP adapter: any base URL, or a server command the suite starts and waits for.

Capabilities are probed, so a generic OpenAI-compatible server runs the portable subset:
``openai_chat`` and ``streaming`` always; ``colibri_ext`` when /health has colibri's
scheduler snapshot; ``metrics`` when /metrics is Prometheus text; ``anthropic`` when
/v1/messages answers with the Anthropic error envelope; ``completions`` when
/v1/completions exists; ``auth`` when an API key is configured; ``managed_server`` when the
suite started the server itself (cases may then ask for their own server flags).
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import socket
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import IO, Any

from colibri.conformance.outcome import NotApplicable


class HttpTargetError(RuntimeError):
    pass


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    header_list: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    @property
    def is_sse(self) -> bool:
        return (self.header("content-type") or "").startswith("text/event-stream")


@dataclass
class Endpoint:
    base_url: str
    api_key: str | None
    timeout: float

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urllib.parse.urlsplit(self.base_url)
        return parts.hostname or "127.0.0.1", parts.port or 80

    def connect(self) -> http.client.HTTPConnection:
        host, port = self.host_port
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def prefix(self) -> str:
        return urllib.parse.urlsplit(self.base_url).path.rstrip("/")

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str | None] | None = None,
        body: bytes | None = None,
        auth: str = "key",
    ) -> Response:
        conn = self.connect()
        try:
            conn.putrequest(
                method,
                self.prefix() + path,
                skip_host="Host" in (headers or {}),
                skip_accept_encoding=True,
            )
            final = self.auth_headers(auth)
            final.update(headers or {})
            if body is not None:
                final.setdefault("Content-Type", "application/json")
                final["Content-Length"] = str(len(body))
            for name, value in final.items():
                if value is not None:
                    conn.putheader(name, value)
            conn.endheaders(body)
            raw = conn.getresponse()
            data = raw.read()
            pairs = [(k, v) for k, v in raw.getheaders()]
            return Response(raw.status, {k.lower(): v for k, v in pairs}, pairs, data)
        finally:
            conn.close()

    def auth_headers(self, auth: str) -> dict[str, str | None]:
        if auth == "none" or self.api_key is None:
            return {}
        if auth == "wrong":
            return {"Authorization": "Bearer wrong-" + self.api_key}
        if auth == "x-api-key":
            return {"x-api-key": self.api_key}
        return {"Authorization": f"Bearer {self.api_key}"}


class ManagedServer:
    """A server process started from --server-cmd on a free loopback port."""

    def __init__(self, command: str, extra: list[str], timeout: float) -> None:
        self.port = _free_port()
        argv = [part.replace("{port}", str(self.port)) for part in shlex.split(command)]
        if not any("{port}" in part for part in shlex.split(command)):
            argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        argv += extra
        self._log: IO[bytes] = tempfile.TemporaryFile()
        # A private state directory: the engine behind a colibri server persists KV and usage
        # there, and must neither read nor leave behind the user's (or another run's) state.
        self._state = tempfile.TemporaryDirectory(prefix="colibri-conformance-http-")
        env = dict(os.environ, COLI_STATE_DIR=self._state.name)
        try:
            self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            raise HttpTargetError(f"cannot start {shlex.join(argv)}: {exc}") from exc
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        """Ready means answering HTTP with its engine up: /health 200 on a colibri server,
        or anything but a 5xx on /v1/models for a server without /health."""
        deadline = time.monotonic() + timeout
        check = Endpoint(self.base_url, None, 2.0)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HttpTargetError(
                    f"server exited with status {self.proc.returncode}: {self.log()}"
                )
            try:
                health = check.request("GET", "/health")
                if health.status == 200:
                    return
                if health.status == 404 and check.request("GET", "/v1/models").status < 500:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.close()
        raise HttpTargetError(f"server on port {self.port} not ready within {timeout:.0f}s")

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read()[-1500:].decode("utf-8", "replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._state.cleanup()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class HttpTarget:
    endpoint: Endpoint
    model_id: str
    server_cmd: str | None
    api_key: str | None
    capabilities: set[str] = field(default_factory=set)
    servers: dict[tuple[str, ...], ManagedServer] = field(default_factory=dict)

    def endpoint_for(self, extra: tuple[str, ...]) -> Endpoint:
        if not extra:
            return self.endpoint
        if self.server_cmd is None:
            raise NotApplicable("needs a server started by the suite (--server-cmd)")
        if extra not in self.servers:
            self.servers[extra] = ManagedServer(self.server_cmd, list(extra), 60.0)
        key = self.api_key
        if "--api-key" in extra:
            key = extra[extra.index("--api-key") + 1]
        return Endpoint(self.servers[extra].base_url, key, self.endpoint.timeout)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()


#: What every colibri server has. A server the suite starts itself (--server-cmd) that says it
#: is colibri (``Server: colibri``) is held to these instead of probed for them, so a
#: regression fails the cases that need them rather than turning them into skips.
COLIBRI_SERVER_CAPABILITIES = frozenset({"colibri_ext", "metrics", "anthropic", "completions",
                                         "systemone"})


def identifies_as_colibri(endpoint: Endpoint) -> bool:
    try:
        server = endpoint.request("GET", "/v1/models").header("server") or ""
    except OSError as exc:
        raise HttpTargetError(f"cannot reach {endpoint.base_url}: {exc}") from exc
    return server.split("/")[0].split(" ")[0].lower() == "colibri"


def probe(endpoint: Endpoint, model: str) -> set[str]:
    caps = {"openai_chat", "streaming", "tools"}
    try:
        health = endpoint.request("GET", "/health")
        if isinstance(health.json(), dict) and "scheduler" in health.json():
            caps.add("colibri_ext")
        metrics = endpoint.request("GET", "/metrics")
        if metrics.status == 200 and b"# TYPE" in metrics.body:
            caps.add("metrics")
        messages = endpoint.request("POST", "/v1/messages", body=b"{}")
        if isinstance(messages.json(), dict) and messages.json().get("type") == "error":
            caps.add("anthropic")
        # System One answers an empty body with its 422 `detail` list (no model check).
        decision = endpoint.request("POST", "/v1/systemone", body=b"{}")
        if decision.status == 422 and isinstance((decision.json() or {}).get("detail"), list):
            caps.add("systemone")
        # Token counting needs the server to know its model's tokenizer (not every colibri
        # server does: --engine-cmd without --model answers 501), so it is always probed.
        count = endpoint.request("POST", "/v1/messages/count_tokens", body=json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "Hi"}]}).encode())
        if count.status == 200 and isinstance((count.json() or {}).get("input_tokens"), int):
            caps.add("count_tokens")
        # A model check may come before routing (404 model_not_found), so name the model.
        body = json.dumps({"model": model, "prompt": ""}).encode()
        completions = endpoint.request("POST", "/v1/completions", body=body)
        code = (completions.json() or {}).get("error", {}) if completions.status == 404 else {}
        if completions.status != 404 or (
            isinstance(code, dict) and code.get("code") != "not_found"
        ):
            caps.add("completions")
    except OSError as exc:
        raise HttpTargetError(f"cannot reach {endpoint.base_url}: {exc}") from exc
    return caps


def discover_model(endpoint: Endpoint) -> str:
    response = endpoint.request("GET", "/v1/models")
    document = response.json()
    try:
        return str(document["data"][0]["id"])
    except (TypeError, KeyError, IndexError) as exc:
        raise HttpTargetError(
            f"GET /v1/models gave no model id (status {response.status})"
        ) from exc
