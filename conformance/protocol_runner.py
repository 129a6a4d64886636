"""Running protocol cases against an engine command.

A case is a list of sessions (usually one); each session is one engine process (possibly
restarted) driven by the case's steps. Cases that do not need a pristine process share a
pooled engine per configuration, which keeps a full run well under a minute; the pool
discards an engine as soon as a case leaves it with requests in flight or dead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from colibri.conformance.capabilities import CODEC_WIRE
from colibri.conformance.cases import Case
from colibri.conformance.engine import EngineError, EngineSession, EngineTarget
from colibri.conformance.frames import Frame
from colibri.conformance.fuzz import run_fuzz
from colibri.conformance.grammar import Grammar
from colibri.conformance.outcome import CheckFailure, NotApplicable
from colibri.conformance.prompts import Payload, PromptCodec, submit_frame
from colibri.conformance.protocol_checks import SessionView, check_protocol
from colibri.conformance.request_ids import RequestRef, names

TERMINAL = ("DONE", "ERROR")
_TEMPLATE = re.compile(r"\{(payload|len|ext|ids|spaces)(?::([^}]*))?\}")


@dataclass
class LiveSession:
    name: str
    engine: EngineSession
    start: int  # index of this case's first frame in engine.frames
    pooled: bool
    submitted: dict[RequestRef, Payload] = field(default_factory=dict)
    requests: dict[RequestRef, dict[str, Any]] = field(default_factory=dict)
    open_ids: set[RequestRef] = field(default_factory=set)

    def view(self) -> SessionView:
        frames = self.engine.frames
        return SessionView(
            self.name,
            frames[self.start :],
            list(self.engine.exit_codes),
            self.engine.alive,
            dict(self.submitted),
            self.engine.state_dir,
            dict(self.requests),
            dict(self.engine.config),
            latest_caps(frames),
        )


class EnginePool:
    """Reusable engines keyed by configuration."""

    def __init__(self, target: EngineTarget) -> None:
        self.target = target
        self._idle: dict[str, EngineSession] = {}

    def take(self, config: dict[str, Any]) -> EngineSession:
        key = json.dumps(config, sort_keys=True)
        session = self._idle.pop(key, None)
        if session is not None and session.alive:
            return session
        if session is not None:
            session.close()
        session = EngineSession(self.target, config)
        session.start()
        return session

    def give_back(self, config: dict[str, Any], session: EngineSession) -> None:
        key = json.dumps(config, sort_keys=True)
        old = self._idle.pop(key, None)
        if old is not None:
            old.close()
        self._idle[key] = session

    def close(self) -> None:
        for session in self._idle.values():
            session.close()
        self._idle.clear()


class ProtocolRunner:
    def __init__(
        self,
        target: EngineTarget,
        codec: PromptCodec,
        grammar: Grammar,
        capabilities: set[str],
        timeout: float = 30.0,
    ) -> None:
        self.target = target
        self.codec = codec
        self.grammar = grammar
        self.capabilities = capabilities
        self.timeout = timeout
        self.pool = EnginePool(target)
        self._spares: list[tuple[str, EngineSession]] = []
        self._prepared: set[str] = set()

    def clone(self) -> ProtocolRunner:
        """An independent runner (its own engines) for the same target and capabilities."""
        return ProtocolRunner(
            self.target, self.codec, self.grammar, set(self.capabilities), self.timeout
        )

    def close(self) -> None:
        self.pool.close()
        for _, engine in self._spares:
            engine.close()
        self._spares.clear()

    def prepare(self, case: Case) -> None:
        """Spawn the engines the next case will need while the current one runs."""
        if not case.fresh or not case.requires <= self.capabilities or case.id in self._prepared:
            return
        self._prepared.add(case.id)
        for spec in case.sessions:
            if not spec.fresh:
                continue
            engine = EngineSession(self.target, spec.engine)
            try:
                engine.spawn()
            except EngineError:
                engine.close()
                return
            self._spares.append((json.dumps(spec.engine, sort_keys=True), engine))

    def _fresh(self, config: dict[str, Any]) -> EngineSession:
        key = json.dumps(config, sort_keys=True)
        for number, (spare_key, engine) in enumerate(self._spares):
            if spare_key == key:
                del self._spares[number]
                engine.await_ready()
                return engine
        engine = EngineSession(self.target, config)
        engine.start()
        return engine

    # -- one case ------------------------------------------------------------------------
    def run(self, case: Case) -> list[str]:
        """Run a case; returns warnings (failed `should` expectations). Raises on failure."""
        live: list[LiveSession] = []
        if len(case.sessions) > 1:
            # Sessions run one after the other, but their engines can load side by side.
            self.prepare(case)
        try:
            for spec in case.sessions:
                session = self._open(spec.fresh, spec.engine)
                live.append(session)
                session.name = spec.name
                for number, step in enumerate(spec.steps):
                    try:
                        self._step(session, step)
                    except EngineError as exc:
                        raise CheckFailure(
                            f"session {spec.name} step {number} ({step['op']}): {exc}"
                            + _stderr_hint(session.engine)
                        ) from exc
            views = {s.name: s.view() for s in live}
            return check_protocol(
                case, views, self.grammar, self.codec, frozenset(self.capabilities)
            )
        finally:
            for session in live:
                self._release(case, session)

    def _open(self, fresh: bool, config: dict[str, Any]) -> LiveSession:
        try:
            if fresh:
                return LiveSession("main", self._fresh(config), 0, pooled=False)
            engine = self.pool.take(config)
        except EngineError as exc:
            raise CheckFailure(f"engine did not start: {exc}") from exc
        return LiveSession("main", engine, len(engine.frames), pooled=True)

    def _release(self, case: Case, session: LiveSession) -> None:
        engine = session.engine
        if session.pooled and engine.alive and not session.open_ids:
            self.pool.give_back(engine.config, engine)
        else:
            engine.close()

    # -- steps -----------------------------------------------------------------------------
    def _step(self, session: LiveSession, step: dict[str, Any]) -> None:
        op = step["op"]
        engine = session.engine
        if op == "submit":
            engine.send(self._submit(session, step))
        elif op == "burst":
            # One write: the engine reads one command per loop iteration, so every command of
            # a burst is seen while the requests before it are still active, however fast.
            engine.send(b"".join(self._command(session, sub) for sub in step["steps"]))
        elif op == "send":
            data = (
                bytes.fromhex(step["hex"]) if "hex" in step else self._expand(step.get("text", ""))
            )
            engine.send(data)
        elif op in ("stop", "cancel"):
            engine.send(self._command(session, step))
        elif op == "await":
            self._await(session, step)
        elif op == "close_stdin":
            engine.close_stdin()
        elif op == "await_exit":
            engine.await_exit(self.timeout)
            session.open_ids.clear()
        elif op == "restart":
            if engine.alive:
                engine.stop()
            engine.start()
            session.open_ids.clear()
        elif op == "kill":
            engine.kill()
            session.open_ids.clear()
        elif op == "legacy":
            before = sum(1 for f in engine.frames if f.kind == "STAT")
            engine.send(self._expand(step["text"]))
            wanted = before + int(step.get("turns", 1))
            seen = [before]

            def stat_count(frame: Frame) -> bool:
                if frame.kind == "STAT":
                    seen[0] += 1
                return seen[0] >= wanted

            if seen[0] < wanted:
                engine.wait_for(
                    stat_count, self.timeout, "the legacy reply's STAT", start=len(engine.frames)
                )
        elif op in ("truncate_experts", "restore_experts"):
            shard = engine.expert_shard
            if shard is None:  # pragma: no cover - case loading refuses it
                raise NotApplicable(f"{op} needs the session's engine to set experts_apart")
            if op == "truncate_experts":
                shard.truncate()
            else:
                shard.restore()
        elif op == "fuzz":
            run_fuzz(
                engine,
                self.codec,
                self.grammar,
                int(step.get("examples", 40)),
                int(step.get("slot", 1)),
                self.timeout,
            )
        else:  # pragma: no cover - the schema rejects unknown ops
            raise NotApplicable(f"unknown step {op!r}")

    def _command(self, session: LiveSession, step: dict[str, Any]) -> bytes:
        if step["op"] == "submit":
            return self._submit(session, step)
        if step["op"] in ("stop", "cancel"):
            return f"{step['op'].upper()} {step['id']}\n".encode()
        return self._expand(step.get("text", ""))

    def _submit(self, session: LiveSession, step: dict[str, Any]) -> bytes:
        payload = self.codec.encode(step["prompt"])
        ext: dict[str, int] = dict(step.get("ext", {}))
        if payload.ids:
            ext.setdefault("ids", 1)
        grammar: bytes = str(step.get("grammar", "")).encode("utf-8")
        codec_wire = CODEC_WIRE in self.capabilities
        if grammar and codec_wire:
            raise NotApplicable("the serve_codec dialect has no grammar section (protocol.md §5.2)")
        rid: RequestRef = step["id"]
        frame = submit_frame(
            rid, int(step.get("slot", 0)), payload, int(step.get("max_tokens", 8)),
            float(step.get("temperature", 0)), float(step.get("top_p", 1)), ext, grammar,
            keys_after_top_p=codec_wire,
        )
        session.submitted[rid] = payload
        session.requests[rid] = {
            "slot": int(step.get("slot", 0)),
            "max_tokens": int(step.get("max_tokens", 8)),
            "temperature": float(step.get("temperature", 0)),
            "ext": ext,
        }
        session.open_ids.add(rid)
        return frame

    def _await(self, session: LiveSession, step: dict[str, Any]) -> None:
        engine = session.engine
        if "done" in step:
            for rid in step["done"]:
                engine.wait_for(
                    lambda f, rid=rid: f.kind in TERMINAL and names(f, rid),
                    self.timeout,
                    f"DONE or ERROR for request {rid}",
                    start=session.start,
                )
                session.open_ids.discard(rid)
        if "frame" in step:
            spec = step["frame"]
            wanted = int(spec.get("count", 1))
            matches = [0]

            def hit(frame: Frame) -> bool:
                if frame.kind == spec["kind"] and ("id" not in spec or names(frame, spec["id"])):
                    matches[0] += 1
                return matches[0] >= wanted

            engine.wait_for(hit, self.timeout, f"{wanted} x {spec['kind']}", start=session.start)
            if spec["kind"] in TERMINAL and "id" in spec:
                session.open_ids.discard(spec["id"])

    def _expand(self, text: str) -> bytes:
        """Templates in raw sends: {payload:TEXT}, {len:TEXT}, {ext}, {ids}, and {spaces:N}
        (N blanks: a header line longer than an engine's limit yet otherwise valid)."""
        out = bytearray()
        position = 0
        for match in _TEMPLATE.finditer(text):
            out.extend(text[position : match.start()].encode("utf-8"))
            name, argument = match.group(1), match.group(2) or ""
            if name == "payload":
                out.extend(self.codec.encode(argument).data)
            elif name == "len":
                out.extend(str(len(self.codec.encode(argument).data)).encode())
            elif name == "ext":
                out.extend(b" 0 ids=1" if self.codec.ids_mode else b"")
            elif name == "ids":
                out.extend(b" ids=1" if self.codec.ids_mode else b"")
            else:
                out.extend(b" " * int(argument))
            position = match.end()
        out.extend(text[position:].encode("utf-8"))
        return bytes(out)


def latest_caps(frames: list[Frame]) -> dict[str, int]:
    """The key=value pairs of the last CAPS line (a restart announces them again)."""
    for frame in reversed(frames):
        if frame.kind == "CAPS":
            pairs = (token.partition("=") for token in frame.fields[1:])
            return {k: int(v) for k, _, v in pairs if v.isdigit()}
    return {}


def _stderr_hint(engine: EngineSession) -> str:
    tail = engine.stderr_tail(400).strip()
    return f"\n  engine stderr: ...{tail}" if tail else ""
