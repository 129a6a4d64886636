"""Process wiring for ``colibri serve``: engine command, listening socket, connection caps,
startup and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tornado.httpserver
import tornado.iostream
import tornado.netutil
from colibri.server.app import make_app
from colibri.server.context import ServerConfig, ServerState
from colibri.server.replicas import ReplicaSet
from colibri.server.supervisor import EngineSupervisor

LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1")
#: The most engine replicas one gateway runs: each is a whole engine (its weights in memory).
MAX_REPLICAS = 64


class ConfigError(ValueError):
    """A setting `colibri serve` refuses before binding anything."""


@dataclass
class EngineSpec:
    model_dir: str
    accelerated: bool = False
    engine_cmd: str | None = None
    #: ``colibri engine --backend NAME`` (``accelerated`` is the same as --accelerated).
    backend: str | None = None


def engine_argv(spec: EngineSpec, kv_slots: int) -> list[str]:
    if spec.engine_cmd:
        return shlex.split(spec.engine_cmd)
    argv = [sys.executable, "-m", "colibri", "engine", "--model", spec.model_dir,
            "--kv-slots", str(kv_slots)]
    if spec.accelerated or spec.backend == "accelerated":
        argv.append("--accelerated")
    elif spec.backend is not None:
        argv += ["--backend", spec.backend]
    return argv


def engine_env(spec: EngineSpec, config: ServerConfig) -> dict[str, str]:
    """colibri's launcher environment, so harnesses written for the C engine work too."""
    env = dict(os.environ)
    env.update({"SNAP": spec.model_dir, "SERVE": "1", "SERVE_BATCH": "1",
                "NGEN": str(config.max_tokens), "KV_SLOTS": str(config.kv_slots)})
    return env


def validate(config: ServerConfig, port: int) -> None:
    if config.max_tokens < 1:
        raise ConfigError("--max-tokens must be at least 1")
    if not 0 <= port <= 65535:
        raise ConfigError("--port must be between 1 and 65535")
    if config.max_queue < 0:
        raise ConfigError("--max-queue must be at least 0")
    if config.queue_timeout <= 0:
        raise ConfigError("--queue-timeout must be positive")
    if not 1 <= config.kv_slots <= 16:
        raise ConfigError("--kv-slots must be between 1 and 16")
    if not 1 <= config.replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas must be between 1 and {MAX_REPLICAS}, "
                          f"got {config.replicas}")
    if (config.bind_host not in LOOPBACK_BINDS and not config.api_key
            and os.environ.get("COLI_ALLOW_INSECURE_BIND") != "1"):
        raise ConfigError(f"refusing to bind {config.bind_host} without COLI_API_KEY set (set "
                          "COLI_ALLOW_INSECURE_BIND=1 to override)")


class CappedHTTPServer(tornado.httpserver.HTTPServer):
    """Closes sockets beyond the total and per-peer connection caps without a response."""

    def initialize(self, *args: Any, max_connections: int = 64,
                   max_per_ip: int = 8, **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.per_ip: Counter[str] = Counter()
        self.peers: dict[object, str] = {}
        self.live = 0

    def handle_stream(self, stream: tornado.iostream.IOStream, address: Any) -> None:
        peer = str(address[0]) if isinstance(address, tuple) else "unix"
        if self.live >= self.max_connections or self.per_ip[peer] >= self.max_per_ip:
            print(f"[api] {peer} - refused: connection cap reached", file=sys.stderr)
            stream.close()
            return
        self.live += 1
        self.per_ip[peer] += 1
        before = set(self._connections)
        super().handle_stream(stream, address)
        for conn in set(self._connections) - before:
            self.peers[conn] = peer

    def on_close(self, server_conn: object) -> None:
        peer = self.peers.pop(server_conn, None)
        if peer is not None:
            self.live -= 1
            self.per_ip[peer] -= 1
        super().on_close(server_conn)


def bind(host: str, port: int) -> list[socket.socket]:
    return tornado.netutil.bind_sockets(port, address=host)


class RunningServer:
    """A started server (engine READY, socket listening) that can be stopped."""

    def __init__(self, state: ServerState, http: CappedHTTPServer,
                 sockets: list[socket.socket]) -> None:
        self.state = state
        self.http = http
        self.sockets = sockets

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    async def stop(self, drain_s: float = 30.0) -> None:
        self.state.scheduler.close()
        self.http.stop()
        await self.state.supervisor.close(drain_s)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.http.close_all_connections(), 2.0)


async def start(config: ServerConfig, argv: Sequence[str], env: dict[str, str],
                port: int) -> RunningServer:
    """Bind first (an occupied port fails before any engine starts), then start the engine
    (with ``config.replicas`` above 1, that many engines behind the one socket)."""
    sockets = bind(config.bind_host, port)
    supervisor = (EngineSupervisor(argv, env) if config.replicas == 1
                  else ReplicaSet(argv, env, config.replicas, config.kv_slots))
    state = ServerState(config, supervisor)
    try:
        await supervisor.start()
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    http = CappedHTTPServer(make_app(state), max_body_size=1 << 23,
                            idle_connection_timeout=config.read_deadline_s,
                            body_timeout=config.read_deadline_s,
                            max_connections=config.max_connections,
                            max_per_ip=config.max_connections_per_ip)
    http.add_sockets(sockets)
    return RunningServer(state, http, sockets)


async def serve_forever(config: ServerConfig, argv: Sequence[str], env: dict[str, str],
                        port: int) -> int:
    server = await start(config, argv, env, port)
    host = config.bind_host if ":" not in config.bind_host else f"[{config.bind_host}]"
    root = f"http://{host}:{server.port}"
    # The first line is what scripts and tests read (the model id and the API base URL); the
    # next two are for the person who ran `make serve`.
    print(f"colibri serving {config.model_id} on {root}/v1", flush=True)
    print(f"dashboard: {root}/  (open it in a browser)", flush=True)
    print(f"try: colibri chat --attach {root}  (or the OpenAI and Anthropic SDKs on {root}/v1)",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("colibri: shutting down", file=sys.stderr)
    await server.stop(float(os.environ.get("COLI_ENGINE_DRAIN_S", "30")))
    return 0
