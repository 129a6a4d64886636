"""Runs a real `colibri serve` stack (Tornado + supervisor + engine process) in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from colibri.server.context import ServerConfig
from colibri.server.runner import RunningServer, start

FAKE_ENGINE = str(Path(__file__).with_name("fake_engine.py"))


def fake_engine_argv() -> list[str]:
    return [sys.executable, FAKE_ENGINE]


@dataclass
class LiveServer:
    server: RunningServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def state(self) -> Any:
        return self.server.state

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.call(self.server.stop(5.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def launch(config: ServerConfig | None = None, argv: Sequence[str] | None = None,
           env: dict[str, str] | None = None, **overrides: Any) -> LiveServer:
    config = replace(config or ServerConfig(model_id="test-model", keepalive_s=10.0),
                     **overrides)
    loop = asyncio.new_event_loop()
    ready: Future[RunningServer] = Future()

    def main() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                engine_env = dict(os.environ)
                engine_env["KV_SLOTS"] = str(config.kv_slots)
                engine_env.update(env or {})
                ready.set_result(await start(config, list(argv or fake_engine_argv()),
                                             engine_env, 0))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                ready.set_exception(exc)

        loop.create_task(boot())
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return LiveServer(ready.result(60), loop, thread)


@contextlib.contextmanager
def serve_process(args: Sequence[str], env: dict[str, str],
                  cwd: Path) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """``python -m colibri serve ARGS --port 0`` as a child process: yields it, the first line
    it printed ("colibri serving ID on URL") and the URL; the caller ends it (SIGINT) or it is
    killed on the way out."""
    proc = subprocess.Popen([sys.executable, "-m", "colibri", "serve", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        yield proc, line, line.split(" on ")[1].strip() if " on " in line else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def interrupt(proc: subprocess.Popen[str]) -> int:
    """Ctrl-C a served process and wait for its exit status."""
    proc.send_signal(signal.SIGINT)
    return proc.wait(30)
