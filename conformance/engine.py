"""The engine adapter: starts any engine command the way colibri's gateway does.

The child gets colibri's environment (``SNAP``, ``SERVE=1``, ``SERVE_BATCH=1``, ``KV_SLOTS``,
``CTX``, ``COLI_STATE_DIR``, ...), so colibri's own C binary is as valid a target as
``colibri engine``. Each session gets a private state directory so persistence files of one
case never leak into another; a restart inside a case keeps it. A session whose case asks for
``experts_apart`` also gets a private copy of the model with the routed experts in a shard of
their own (expert_shard.py), which its steps may damage and mend under the running engine.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from colibri.conformance.capabilities import from_caps
from colibri.conformance.expert_shard import ExpertShard, ModelCopyError, split_experts
from colibri.conformance.frames import Frame
from colibri.conformance.snapshot import link_model

from colibri.protocol import FrameParser, FrameReader

#: Handshake lines that announce optional capabilities (forward compatible: old servers
#: ignore them). Tokens are ``name``, ``name=1`` or ``name=0``.
CAPABILITY_KINDS = ("CAPS", "CAPABILITIES", "FEATURES")

#: In a case's engine ``env`` values, this is replaced by the session's private state
#: directory, so a case can point a file-writing variable (``STATS``) where the
#: ``file`` expectation and the invariants read it, and nowhere else.
STATE_DIR_TOKEN = "{state_dir}"

#: Where the handshake probe asks for a STATS dump (inside the probe's own state dir).
STATS_PROBE_FILE = "conformance-stats-probe.txt"


def expand_env(value: str, state_dir: Path) -> str:
    """A case's environment value with ``{state_dir}`` filled in."""
    return value.replace(STATE_DIR_TOKEN, str(state_dir))


class EngineError(RuntimeError):
    """The engine could not be started or stopped answering."""


class EngineUnresponsive(EngineError):
    """The engine is running and finished its handshake, but answers no request: every case
    would wait out its timeout, so a run stops at once with this one message."""


@dataclass(frozen=True)
class EngineTarget:
    """What to run: a command line plus the model it serves."""

    command: list[str]
    model_dir: Path | None
    extra_env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 120.0
    #: Where the engine keeps its state files: "env" (COLI_STATE_DIR, protocol.md §4.1) or
    #: "snap" (next to the model, as colibri's older engines do: each session then gets a
    #: private model directory of links, see snapshot.py).
    state_dir: str = "env"

    @classmethod
    def from_command(
        cls, command: str, model_dir: Path | None, extra_env: dict[str, str] | None = None
    ) -> EngineTarget:
        argv = shlex.split(command)
        if not argv:
            raise EngineError("--engine-cmd is empty")
        return cls(argv, model_dir, dict(extra_env or {}))

    def environment(
        self, config: dict[str, Any], state_dir: Path, model_dir: Path | None = None
    ) -> dict[str, str]:
        """The engine's environment; ``model_dir`` stands in for the target's model (a
        session's private copy)."""
        env = dict(os.environ)
        env.update(self.extra_env)
        model = model_dir or self.model_dir
        if model is not None:
            env["SNAP"] = str(model)
            if self.state_dir == "snap":
                link_model(model, state_dir)
                env["SNAP"] = str(state_dir)
        env["SERVE"] = "1"
        if config.get("protocol", "mux") == "mux":
            env["SERVE_BATCH"] = "1"
        else:
            env.pop("SERVE_BATCH", None)
        env["KV_SLOTS"] = str(config.get("kv_slots", 2))
        env["CTX"] = str(config.get("ctx", 256))
        env.setdefault("SEED", "1234")
        env["COLI_STATE_DIR"] = str(state_dir)
        persist = bool(config.get("persist", False))
        env["COLI_PERSIST"] = "1" if persist else "0"
        env["KVSAVE"] = "1" if persist else "0"
        env.update(
            {str(k): expand_env(str(v), state_dir) for k, v in config.get("env", {}).items()}
        )
        return env


class EngineSession:
    """One running engine plus everything it wrote; restartable against the same state."""

    def __init__(self, target: EngineTarget, config: dict[str, Any]) -> None:
        self.target = target
        self.config = dict(config)
        self._state = tempfile.TemporaryDirectory(prefix="colibri-conformance-")
        self.state_dir = Path(self._state.name)
        self.frames: list[Frame] = []
        self.sent: list[bytes] = []
        self.exit_codes: list[int] = []
        self.generation = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: FrameReader | None = None
        self._stderr: IO[bytes] | None = None
        self._stdin_closed = False
        self._generation_start = 0
        self._model_copy: tempfile.TemporaryDirectory[str] | None = None
        self.model_dir: Path | None = None
        #: The experts' shard of the private model copy (``experts_apart``), else None.
        self.expert_shard: ExpertShard | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.spawn()
        self.await_ready()

    def spawn(self) -> None:
        """Start the process without waiting (so several engines can load in parallel)."""
        legacy = self.config.get("protocol", "mux") == "legacy"
        if self.config.get("experts_apart") and self._model_copy is None:
            self._copy_model()
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                self.target.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=self.target.environment(self.config, self.state_dir, self.model_dir),
                bufsize=0,
            )
        except OSError as exc:
            raise EngineError(f"cannot start {shlex.join(self.target.command)}: {exc}") from exc
        self._stdin_closed = False
        self.generation += 1
        # A restarted engine's READY is a new frame: the previous process's must not count.
        self._generation_start = len(self.frames)
        assert self._proc.stdout is not None
        self._reader = FrameReader(cast(BinaryIO, self._proc.stdout), FrameParser(legacy=legacy))

    def _copy_model(self) -> None:
        """The session's model: a copy with the routed experts in their own shard, kept for
        the whole session (a restart serves the same files)."""
        source = self.target.model_dir
        if source is None:
            raise EngineError("experts_apart needs a model directory (--model)")
        self._model_copy = tempfile.TemporaryDirectory(prefix="colibri-conformance-model-")
        root = Path(self._model_copy.name)
        try:
            shard = split_experts(source, root / "model")
        except (ModelCopyError, OSError) as exc:
            raise EngineError(f"cannot put the experts of {source} apart: {exc}") from exc
        self.model_dir = root / "model"
        self.expert_shard = ExpertShard(shard, root / "experts.whole")

    def await_ready(self) -> None:
        start = self._generation_start
        self.wait_for(
            lambda f: f.kind == "READY", self.target.startup_timeout, "READY", start=start
        )
        # The status line after READY is part of the handshake every server waits for.
        self.wait_for(
            lambda f: f.kind == "STAT", self.target.startup_timeout, "the STAT after READY",
            start=start,
        )

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        """Close stdin (graceful), then escalate; never leaves a child behind."""
        proc = self._proc
        if proc is None:
            return
        self.close_stdin()
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self._drain()
        self.exit_codes.append(code)
        self._proc = None

    def kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        self.exit_codes.append(proc.wait())
        self._drain()
        self._proc = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._stderr is not None:
                self._stderr.close()
            self._state.cleanup()
            if self._model_copy is not None:
                self._model_copy.cleanup()

    def _drain(self) -> None:
        reader = self._reader
        if reader is None:
            return
        deadline = time.monotonic() + 5
        while not reader.eof and time.monotonic() < deadline:
            try:
                frame = reader.next(deadline - time.monotonic())
            except TimeoutError:
                break
            if frame is not None:
                self.frames.append(frame)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stderr_tail(self, limit: int = 1500) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        data = self._stderr.read()
        return data[-limit:].decode("utf-8", "replace")

    # -- io ----------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or self._stdin_closed:
            raise EngineError("engine stdin is not open")
        self.sent.append(data)
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise EngineError(f"engine closed its stdin ({exc})") from exc

    def close_stdin(self) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None and not self._stdin_closed:
            self._stdin_closed = True
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass

    def wait_for(
        self, predicate: Any, timeout: float, what: str, start: int | None = None
    ) -> Frame:
        """Read until a frame satisfies predicate (also checks frames already read)."""
        for frame in self.frames[start or 0 :]:
            if predicate(frame):
                return frame
        reader = self._reader
        if reader is None:
            raise EngineError(f"engine not running while waiting for {what}")
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                item = reader.next(remaining)
            except TimeoutError as exc:
                raise EngineError(f"timed out after {timeout:.0f}s waiting for {what}") from exc
            if item is None:
                tail = self.stderr_tail(300).strip()
                hint = f" (stderr: {tail})" if tail else ""
                raise EngineError(
                    f"engine output ended while waiting for {what}{self._how_it_ended()}{hint}"
                )
            self.frames.append(item)
            if predicate(item):
                return item

    def _how_it_ended(self) -> str:
        """How the process ended, once its output has: a crash (a signal) reads differently
        from an exit, and neither is a frame the case can name."""
        proc = self._proc
        if proc is None:
            return ""
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        if code < 0:
            try:
                return f"; it was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"; it was killed by signal {-code}"
        return f"; it exited with status {code}"

    def await_exit(self, timeout: float) -> int:
        proc = self._proc
        if proc is None:
            raise EngineError("engine is not running")
        reader = self._reader
        deadline = time.monotonic() + timeout
        while reader is not None and not reader.eof:
            try:
                item = reader.next(deadline - time.monotonic())
            except TimeoutError as exc:
                raise EngineError(f"engine did not exit within {timeout:.0f}s") from exc
            if item is not None:
                self.frames.append(item)
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired as exc:
            raise EngineError(
                f"engine closed stdout but did not exit within {timeout:.0f}s"
            ) from exc
        self.exit_codes.append(code)
        self._proc = None
        return code


def capabilities_from_frames(frames: list[Frame]) -> set[str]:
    """Capabilities announced in the handshake (none without a capability line)."""
    found: set[str] = set()
    for frame in frames:
        if frame.kind in CAPABILITY_KINDS:
            found |= from_caps(dict(token.partition("=")[::2] for token in frame.fields[1:]))
    return found


def probe_capabilities(
    target: EngineTarget, protocol_timeout: float = 30.0
) -> tuple[set[str], list[Frame]]:
    """Start the engine once, read its whole handshake (EOF makes it exit), parse caps.

    The same run probes the STATS dump (protocol.md 4.2), which no handshake line announces:
    an engine that wrote the file named by ``STATS`` when it exited has ``stats_dump``.
    """
    # SERVE_TOPK=1 so an engine able to send TOPK frames says so in its capability line.
    env = {"SERVE_TOPK": "1", "STATS": f"{STATE_DIR_TOKEN}/{STATS_PROBE_FILE}"}
    session = EngineSession(target, {"kv_slots": 1, "env": env})
    try:
        session.start()
        session.close_stdin()
        code = session.await_exit(protocol_timeout)
        found = capabilities_from_frames(session.frames)
        if code == 0 and (session.state_dir / STATS_PROBE_FILE).is_file():
            found.add("stats_dump")
        return found, list(session.frames)
    finally:
        session.close()
