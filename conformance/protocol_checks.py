"""Expectations over engine transcripts: grammar, frames, sequences, relations, equivalence."""

from __future__ import annotations

import functools
import math
import operator
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colibri.conformance.capabilities import CAPABILITIES, kinds_text, pattern_for
from colibri.conformance.cases import Case
from colibri.conformance.frames import PREAMBLE, Frame, read
from colibri.conformance.golden_bytes import check_golden_bytes, oracle_continuation
from colibri.conformance.grammar import Grammar
from colibri.conformance.invariants import check_invariant
from colibri.conformance.outcome import CheckFailure, NotApplicable
from colibri.conformance.prompts import Payload, PromptCodec
from colibri.conformance.request_ids import RequestRef, names
from colibri.conformance.sameness import Tolerance, printed

from colibri.protocol import SPEC, ProtocolViolation
from colibri.protocol.records import Data, Echo

#: A case names a frame's field by its name in the kind's grammar (spec/protocol.json), so
#: cases can say {"kind": "DONE", "name": "emitted"}, or by its position; these are the other
#: names cases use for a field.
FIELD_ALIASES: dict[str, dict[str, str]] = {
    "DATA": {"nbytes": "n"},
    "ECHO": {"nbytes": "n", "position": "pos"},
    "DONE": {"stat": "2"},
    "ERROR": {"arg1": "prompt_tokens", "arg2": "limit"},
    "STAT": {"f1": "produced", "f2": "tok_s", "f3": "hit_pct"},
}

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True)
class SessionView:
    name: str
    frames: list[Frame]
    exit_codes: list[int]
    alive: bool
    submitted: dict[RequestRef, Payload]
    state_dir: Path | None = None
    #: What each SUBMIT asked (max_tokens, temperature, slot, ext), by request id.
    requests: dict[RequestRef, dict[str, Any]] = field(default_factory=dict)
    #: The engine's configuration (kv_slots, ctx, persist, env) as the case gave it.
    config: dict[str, Any] = field(default_factory=dict)
    #: The latest CAPS line of the engine (also when its handshake came before this case).
    caps: dict[str, int] = field(default_factory=dict)


Views = dict[str, SessionView]
EVERY_CAPABILITY = frozenset(CAPABILITIES)


def _session(views: Views, name: str | None) -> SessionView:
    if name is None:
        return next(iter(views.values()))
    if name not in views:
        raise CheckFailure(f"no session named {name!r}")
    return views[name]


def select(views: Views, selector: dict[str, Any]) -> list[Frame]:
    view = _session(views, selector.get("session"))
    frames = [f for f in view.frames if f.kind != PREAMBLE]
    if "kind" in selector:
        frames = [f for f in frames if f.kind == selector["kind"]]
    if "id" in selector:
        frames = [f for f in frames if names(f, selector["id"])]
    return frames


def _pick(views: Views, selector: dict[str, Any]) -> Frame:
    frames = select(views, selector)
    n = int(selector.get("n", 0))
    try:
        return frames[n]
    except IndexError:
        raise CheckFailure(
            f"no frame #{n} matching {_describe(selector)} (found {len(frames)})"
        ) from None


@functools.cache
def field_positions(kind: str) -> dict[str, int]:
    """Where each field of ``kind``'s grammar stands on its line (the keyword at 0), up to
    the first repeated group: a field is found by its place, so a line a check cannot read
    as a whole (a dialect's request ids, a field spelled off the spec) still has it."""
    positions = {"kind": 0}
    line_spec = SPEC.engine_lines.get(kind)
    items = list(line_spec.fields) if line_spec is not None else []
    at = 1
    while items:
        item = items.pop(0)
        if "optional" in item:
            items[:0] = item["optional"]
        elif "repeat" in item:
            break
        else:
            if "name" in item:
                positions[str(item["name"])] = at
            at += 1
    return positions


def field_value(frame: Frame, name: str) -> str:
    """A field as the engine spelled it, by its name in the kind's grammar, one of
    ``FIELD_ALIASES`` or its position."""
    name = FIELD_ALIASES.get(frame.kind, {}).get(name, name)
    fields = frame.fields
    index = int(name) if name.isdigit() else field_positions(frame.kind).get(name, -1)
    if index < 0 or index >= len(fields):
        raise CheckFailure(f"{frame.kind} frame has no field {name!r}: {frame.describe()!r}")
    return fields[index]


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CheckFailure(f"{what} is not a number: {text!r}") from None


def resolve(views: Views, codec: PromptCodec, value: dict[str, Any]) -> float:
    if "const" in value:
        return float(value["const"])
    if "count" in value:
        return float(len(select(views, value["count"])))
    if "field" in value:
        spec = value["field"]
        return _number(
            field_value(_pick(views, spec), spec["name"]), f"{_describe(spec)}.{spec['name']}"
        )
    if "sum" in value:
        return sum(resolve(views, codec, part) for part in value["sum"])
    if "prompt_tokens" in value:
        tokens = codec.encode(value["prompt_tokens"]).tokens
        if tokens is None:
            raise NotApplicable("prompt token count is only known for ids payloads")
        return float(tokens)
    raise CheckFailure(f"unsupported relation operand {value!r}")


def _describe(selector: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in selector.items() if k != "name") or "any frame"


def _kinds_of(view: SessionView, rid: RequestRef | None) -> str:
    frames = [f for f in view.frames if f.kind != PREAMBLE]
    if rid is not None:
        frames = [f for f in frames if names(f, rid)]
    return " ".join(f.kind for f in frames)


def token_stream(view: SessionView, rid: RequestRef) -> list[tuple[str, bytes]]:
    """What must not depend on batching or caching: tokens, tails, echo and final counts."""
    out: list[tuple[str, bytes]] = []
    for frame in view.frames:
        if not names(frame, rid):
            continue
        if frame.kind in ("DATA", "ECHO", "TOPK"):
            out.append(
                (frame.kind, " ".join(frame.fields[2:]).encode() + b"|" + (frame.payload or b""))
            )
        elif frame.kind == "ACCEPT":
            out.append(("ACCEPT", " ".join(frame.fields[2:]).encode()))
        elif frame.kind == "DONE":
            fields = frame.fields
            where = field_positions("DONE")
            kept = [fields[where[n]] for n in ("emitted", "prompt_tokens", "length_limited")
                    if where[n] < len(fields)]
            out.append(("DONE", " ".join(kept).encode()))
        elif frame.kind == "ERROR":
            out.append(("ERROR", " ".join(frame.fields[2:]).encode()))
    return out


# -- the expectation types ------------------------------------------------------------------
def _grammar(views: Views, exp: dict[str, Any], grammar: Grammar) -> None:
    targets = [views[exp["session"]]] if "session" in exp else list(views.values())
    problems = []
    for view in targets:
        for frame in view.frames:
            problem = grammar.check(frame)
            if problem:
                problems.append(f"[{view.name}] {problem}")
        if exp.get("unknown_kinds") == "forbid":
            problems.extend(
                f"[{view.name}] kind {f.kind} is not in protocol.json"
                for f in view.frames
                if f.kind not in grammar.rules and f.kind not in (PREAMBLE, "READY")
            )
    if problems:
        raise CheckFailure(
            "grammar: " + "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")
        )


def _frame(views: Views, exp: dict[str, Any]) -> None:
    selector: dict[str, Any] = {k: exp[k] for k in ("session", "id", "kind", "n") if k in exp}
    frames = select(views, selector)
    if "count" in exp:
        if len(frames) != exp["count"]:
            listing = ", ".join(f.describe() for f in frames[:4])
            raise CheckFailure(
                f"expected {exp['count']} frame(s) {_describe(selector)}, "
                f"got {len(frames)}: {listing}"
            )
        if not any(k in exp for k in ("equals", "matches", "payload", "fields")):
            return
    if exp.get("absent"):
        if frames:
            raise CheckFailure(f"unexpected frame {_describe(selector)}: {frames[0].describe()!r}")
        return
    frame = _pick(views, selector)
    if "equals" in exp and frame.header.decode("utf-8", "replace") != exp["equals"]:
        raise CheckFailure(f"expected {exp['equals']!r}, got {frame.describe()!r}")
    if "matches" in exp and not re.fullmatch(
        exp["matches"], frame.header.decode("utf-8", "replace")
    ):
        raise CheckFailure(f"{frame.describe()!r} does not match /{exp['matches']}/")
    if "payload" in exp and frame.payload != exp["payload"].encode("utf-8"):
        raise CheckFailure(f"payload {frame.payload!r} != {exp['payload']!r}")
    for name, wanted in exp.get("fields", {}).items():
        got = field_value(frame, name)
        if got != str(wanted):
            raise CheckFailure(
                f"{frame.kind} field {name} is {got!r}, expected {wanted!r}: {frame.describe()!r}"
            )


def _sequence(views: Views, exp: dict[str, Any], capabilities: frozenset[str]) -> None:
    view = _session(views, exp.get("session"))
    kinds = _kinds_of(view, exp.get("id"))
    if not re.fullmatch(pattern_for(exp["pattern"], capabilities), kinds_text(kinds.split())):
        who = f"request {exp['id']}" if "id" in exp else f"session {view.name}"
        shown = kinds if len(kinds) < 300 else kinds[:150] + " ... " + kinds[-140:]
        raise CheckFailure(f"frame order of {who} /{exp['pattern']}/ does not match: {shown!r}")


def _relation(views: Views, exp: dict[str, Any], codec: PromptCodec) -> None:
    left = resolve(views, codec, exp["left"])
    right = resolve(views, codec, exp["right"])
    op = exp["op"]
    if op not in OPERATORS:
        raise CheckFailure(f"unknown operator {op!r}")
    if math.isnan(left) or math.isnan(right) or not OPERATORS[op](left, right):
        raise CheckFailure(
            f"relation {exp.get('why', '')} failed: {left:g} {op} {right:g}".replace("  ", " ")
        )


def _same_stream(views: Views, exp: dict[str, Any]) -> None:
    left_spec, right_spec = exp["left"], exp["right"]
    left = token_stream(_session(views, left_spec.get("session")), left_spec["id"])
    right = token_stream(_session(views, right_spec.get("session")), right_spec["id"])
    kinds = set(exp.get("kinds", ["ACCEPT", "ECHO", "DATA", "TOPK", "DONE"]))
    left = [item for item in left if item[0] in kinds]
    right = [item for item in right if item[0] in kinds]
    if exp.get("mode", "exact") == "suffix":
        # echo_at scoring on a warm slot: its frames are the tail of a cold full echo (§2.8).
        if not left or left != right[len(right) - len(left) :]:
            raise CheckFailure(_first_difference(left, right[-len(left) :], "is not a tail of"))
        return
    if exp.get("mode", "exact") == "prefix":
        # A STOPped/CANCELled request may end anywhere, but what it sent must be a prefix.
        left = [item for item in left if item[0] in ("ECHO", "DATA", "TOPK", "ACCEPT")]
        right = [item for item in right if item[0] in ("ECHO", "DATA", "TOPK", "ACCEPT")]
        if left != right[: len(left)]:
            raise CheckFailure(_first_difference(left, right, "is not a prefix of"))
        return
    if left != right:
        raise CheckFailure(_first_difference(left, right, "differs from"))


def _first_difference(
    left: list[tuple[str, bytes]], right: list[tuple[str, bytes]], verb: str
) -> str:
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return f"stream {verb} reference at frame {i}: {a!r} vs {b!r}"
    return f"stream {verb} reference: {len(left)} vs {len(right)} frames"


def _exit(views: Views, exp: dict[str, Any]) -> None:
    view = _session(views, exp.get("session"))
    if view.alive or not view.exit_codes:
        raise CheckFailure("the engine did not exit")
    if view.exit_codes[-1] != exp.get("code", 0):
        raise CheckFailure(f"exit status {view.exit_codes[-1]}, expected {exp.get('code', 0)}")


def _golden(views: Views, exp: dict[str, Any], codec: PromptCodec) -> None:
    view = _session(views, exp.get("session"))
    prompt = codec.oracle_ids(exp.get("prompt", "prompt_ids"))
    expected, stops = oracle_continuation(
        codec, exp.get("oracle", "full_ids"), exp.get("prompt", "prompt_ids")
    )
    got: list[int] = []
    for frame in view.frames:
        if frame.kind == "DATA" and frame.request_id == exp["id"]:
            table = _top(frame, Data)
            if not table:
                raise CheckFailure(f"DATA without a logprob tail: {frame.describe()!r}")
            got.append(table[0][0])  # k=1 table: its single entry is the greedy token
    # The oracle decodes a fixed number of steps; an engine stops at end-of-sequence, which
    # it does not send as DATA (oracle_continuation cuts there).
    limit = int(exp.get("limit", len(expected)))
    stops = stops and limit > len(expected)
    expected = expected[:limit]
    if "logits" in exp:
        if "tolerance" in exp:
            # The tolerance is the model's rule (spec/model.md §15), never a case's number.
            raise CheckFailure("a golden case may not state its own tolerance")
        _golden_logprobs(
            view, int(exp["id"]), codec, str(exp["logits"]), len(prompt), expected
        )
        return
    if "echo" in exp:
        _golden_echo(view, int(exp["id"]), codec.oracle_ids(str(exp["echo"])), len(prompt))
        return
    if got[: len(expected)] != expected:
        raise CheckFailure(f"greedy tokens {got[: len(expected)]} != oracle {expected}")
    if len(got) < len(expected):
        raise CheckFailure(f"only {len(got)} tokens, the oracle has {len(expected)}")
    if stops and len(got) != len(expected):
        raise CheckFailure(
            f"the oracle reaches end-of-sequence after {len(expected)} tokens, "
            f"the engine sent {len(got)}"
        )


def _top(frame: Frame, kind: type[Data] | type[Echo]) -> tuple[tuple[int, float], ...]:
    """The logprob table of a DATA or ECHO frame (empty where it has none)."""
    try:
        logprobs = read(frame, kind).logprobs
    except ProtocolViolation:
        return ()
    return logprobs.top if logprobs is not None else ()


def _golden_echo(view: SessionView, rid: int, predictions: list[int], prompt_len: int) -> None:
    """ECHO at position p (p >= 1) carries, with logprobs=1, the argmax after tokens 0..p-1:
    the oracle's teacher-forced prediction for position p-1."""
    got: list[int] = []
    for frame in view.frames:
        if frame.kind == "ECHO" and frame.request_id == rid and field_value(frame, "pos") != "0":
            table = _top(frame, Echo)
            if not table:
                raise CheckFailure(f"ECHO without a k=1 table: {frame.describe()!r}")
            got.append(table[0][0])
    want = predictions[: prompt_len - 1]
    if got != want:
        raise CheckFailure(f"teacher-forced argmax {got} != oracle tf_pred {want}")


def check_protocol(
    case: Case,
    views: Views,
    grammar: Grammar,
    codec: PromptCodec,
    capabilities: frozenset[str] = EVERY_CAPABILITY,
) -> list[str]:
    warnings: list[str] = []
    for number, exp in enumerate(case.expect):
        kind = exp["type"]
        try:
            if kind == "grammar":
                _grammar(views, exp, grammar)
            elif kind == "frame":
                _frame(views, exp)
            elif kind == "sequence":
                _sequence(views, exp, capabilities)
            elif kind == "relation":
                _relation(views, exp, codec)
            elif kind == "same_stream":
                _same_stream(views, exp)
            elif kind == "exit":
                _exit(views, exp)
            elif kind == "golden":
                _golden(views, exp, codec)
            elif kind == "golden_bytes":
                check_golden_bytes(_session(views, exp.get("session")).frames, exp, codec)
            elif kind == "legacy":
                _legacy(views, exp)
            elif kind == "state_files":
                _state_files(views, exp, codec)
            elif kind == "file":
                _file(views, exp)
            elif kind == "interleave":
                _interleave(views, exp)
            elif kind == "logprobs":
                _logprobs(views, exp, codec)
            elif kind == "invariant":
                check_invariant(_session(views, exp.get("session")), exp, codec)
            else:
                raise CheckFailure(f"expectation type {kind!r} is not implemented")
        except NotApplicable as exc:
            warnings.append(f"expect[{number}] {kind}: not applicable here ({exc})")
        except CheckFailure as exc:
            message = f"expect[{number}] {kind}: {exc}"
            if exp.get("level", "must") == "should" and case.level == "must":
                warnings.append(message)
            else:
                raise CheckFailure(message) from None
    return warnings


def _legacy(views: Views, exp: dict[str, Any]) -> None:
    """Legacy replies: TEXT then a STAT line with at least `min_fields` numbers."""
    view = _session(views, exp.get("session"))
    frames = [f for f in view.frames if f.kind in ("TEXT", "STAT")]
    turns = [
        (a, b)
        for a, b in zip(frames, frames[1:], strict=False)
        if a.kind == "TEXT" and b.kind == "STAT"
    ]
    if len(turns) < int(exp.get("turns", 1)):
        raise CheckFailure(f"expected {exp.get('turns', 1)} legacy replies, got {len(turns)}")
    for text, stat in turns:
        numbers = stat.fields[1:]
        if len(numbers) < int(exp.get("min_fields", 4)):
            raise CheckFailure(f"legacy STAT has {len(numbers)} fields: {stat.describe()!r}")
        for value in numbers[:4]:
            _number(value, "legacy STAT field")
        if "text" in exp and (text.payload or b"").strip() != exp["text"].encode():
            raise CheckFailure(f"legacy text {text.payload!r} != {exp['text']!r}")


def _interleave(views: Views, exp: dict[str, Any]) -> None:
    """Once every listed request is active, each decode step emits one DATA per request in
    ascending slot order (the case lists ids in slot order). The last request to arrive
    emits its first token right after its prefill, before the first shared step."""
    view = _session(views, exp.get("session"))
    ids: list[int] = [int(i) for i in exp["ids"]]
    frames = [f for f in view.frames if f.request_id in ids]
    accepts = [i for i, f in enumerate(frames) if f.kind == "ACCEPT"]
    if len(accepts) != len(ids):
        raise CheckFailure(f"expected {len(ids)} ACCEPT frames, got {len(accepts)}")
    last = frames[accepts[-1]].request_id
    ends = [i for i, f in enumerate(frames) if f.kind in ("DONE", "ERROR")]
    first_end = min(ends, default=len(frames))
    window = [f.request_id for f in frames[accepts[-1] + 1 : first_end] if f.kind == "DATA"]
    while window and window[0] == last:
        window.pop(0)
    if len(window) < len(ids):
        raise CheckFailure(f"only {len(window)} DATA frames while all requests were active")
    expected = [ids[i % len(ids)] for i in range(len(window))]
    if window != expected:
        raise CheckFailure(f"DATA order while batched is {window[:12]}, expected {expected[:12]}")


def _table(
    frame: Frame, kind: type[Data] | type[Echo], k_expected: int | None, vocab: int, what: str
) -> tuple[float, list[tuple[int, float]]]:
    try:
        logprobs = read(frame, kind).logprobs
    except ProtocolViolation as exc:
        if exc.field == "logprob" and exc.token:
            raise CheckFailure(f"{exc.token!r} is not a logprob") from None
        k = exc.values.get("k", exc.token if exc.field == "k" else None)
        if k is None and kind is Echo:
            raise CheckFailure(f"{what}: no logprob tail") from None
        raise CheckFailure(f"{what}: tail length does not match k={k}") from None
    if logprobs is None:
        raise CheckFailure(f"{what}: no logprob tail")
    lp, k = logprobs.logprob, len(logprobs.top)
    if k_expected is not None and k != k_expected:
        raise CheckFailure(f"{what}: table has {k} entries, expected {k_expected}")
    entries = []
    for tid, value in logprobs.top:
        if tid >= vocab:
            raise CheckFailure(f"{what}: token id {str(tid)!r} out of range")
        if not math.isfinite(value) or value > 0:
            raise CheckFailure(f"{what}: logprob {value} is not finite and <= 0")
        entries.append((tid, value))
    if len({t for t, _ in entries}) != len(entries):
        raise CheckFailure(f"{what}: repeated token ids in the table")
    return lp, entries


def _position(echo: Frame) -> int:
    """An ECHO's prompt position (-1 where the line has none)."""
    try:
        return read(echo, Echo).pos
    except ProtocolViolation as exc:
        position = exc.values.get("pos")
        return position if isinstance(position, int) else -1


def _tail(frame: Frame) -> list[str]:
    """A DATA or ECHO line's logprob tail as spelled: everything after its fixed fields."""
    fixed = 4 if frame.kind == "ECHO" else 3
    return frame.fields[fixed:]


def _logprobs(views: Views, exp: dict[str, Any], codec: PromptCodec) -> None:
    view = _session(views, exp.get("session"))
    rid = int(exp["id"])
    k = int(exp["k"])
    frames = [f for f in view.frames if f.request_id == rid]
    accept = next((f for f in frames if f.kind == "ACCEPT"), None)
    if accept is None:
        raise CheckFailure("no ACCEPT")
    prompt_tokens = int(field_value(accept, "prompt_tokens"))
    echoes = [f for f in frames if f.kind == "ECHO"]
    positions = [_position(f) for f in echoes]
    if positions != list(range(prompt_tokens)):
        raise CheckFailure(f"ECHO positions {positions[:10]} are not 0..{prompt_tokens - 1}")
    seen_data = False
    for f in frames:
        if f.kind == "DATA":
            seen_data = True
            lp, entries = _table(f, Data, k, codec.vocab, f"DATA {f.describe()!r}")
            if not math.isfinite(lp) or lp > 0:
                raise CheckFailure(f"chosen-token logprob {lp} is not finite and <= 0")
            if exp.get("greedy") and entries and lp != max(v for _, v in entries):
                raise CheckFailure(f"greedy token logprob {lp} is not the table maximum")
        elif f.kind == "ECHO":
            if seen_data:
                raise CheckFailure("ECHO after DATA")
            if _position(f) == 0:
                if _tail(f) != ["nan", "0"]:
                    raise CheckFailure(f"position 0 tail must be 'nan 0': {f.describe()!r}")
                continue
            _table(f, Echo, k, codec.vocab, f"ECHO {f.describe()!r}")
    if not seen_data:
        raise CheckFailure(f"no DATA frames for request {rid}: no logprob tables to check")


def _file(views: Views, exp: dict[str, Any]) -> None:
    """A file the engine wrote into the session's state directory (a case points a variable
    such as STATS there with ``{state_dir}`` in its env): present or absent, and its size."""
    view = _session(views, exp.get("session"))
    relative = Path(exp["path"])
    if relative.is_absolute() or ".." in relative.parts:
        raise CheckFailure(f"file path {exp['path']!r} must stay inside the state directory")
    if view.state_dir is None:
        raise CheckFailure("no state directory for this session")
    path = view.state_dir / relative
    if not exp.get("exists", True):
        if path.exists():
            raise CheckFailure(f"{exp['path']} exists, it must not")
        return
    if not path.is_file():
        raise CheckFailure(f"{exp['path']} missing from the state directory")
    if "size" in exp and path.stat().st_size != exp["size"]:
        raise CheckFailure(
            f"{exp['path']} holds {path.stat().st_size} bytes, expected {exp['size']}"
        )


_USAGE_LINE = re.compile(r"-?[0-9]+ [0-9]+ [0-9]+")


def _state_files(views: Views, exp: dict[str, Any], codec: PromptCodec) -> None:
    """The persistence files of protocol.md §4: where they are and their layouts."""
    view = _session(views, exp.get("session"))
    if view.state_dir is None:
        raise CheckFailure("no state directory for this session")
    kv = view.state_dir / ".coli_kv"
    if not kv.is_file():
        raise CheckFailure(f"{kv.name} missing from COLI_STATE_DIR after a finished turn")
    data = kv.read_bytes()
    if len(data) < 40 or data[:8] != b"COLIKV1\x00":
        raise CheckFailure(f".coli_kv does not start with the COLIKV1 magic: {data[:8]!r}")
    layers, lora, rope, index_hd, nic, vocab, nrec, _tag = struct.unpack("<8i", data[8:40])
    if vocab != codec.vocab:
        raise CheckFailure(f".coli_kv header names vocab {vocab}, the model has {codec.vocab}")
    record = 4 + layers * (lora + rope) * 4 + nic * index_hd * 4
    if nrec < 1 or len(data) < 40 + nrec * record:
        raise CheckFailure(f".coli_kv holds {len(data)} bytes for nrec={nrec} x {record}")
    usage = view.state_dir / ".coli_usage"
    if not usage.is_file():
        raise CheckFailure(".coli_usage missing from COLI_STATE_DIR after a finished turn")
    lines = usage.read_text(encoding="ascii", errors="replace").splitlines()
    if not lines or not lines[0].startswith("-1 "):
        raise CheckFailure(
            f".coli_usage does not start with a '-1 <layers> <experts>' record: {lines[:1]}"
        )
    bad = [line for line in lines if not _USAGE_LINE.fullmatch(line)]
    if bad:
        raise CheckFailure(f".coli_usage line {bad[0]!r} is not '<layer> <expert> <count>'")


def _golden_logprobs(
    view: SessionView,
    rid: int,
    codec: PromptCodec,
    logits_file: str,
    prompt_len: int,
    continuation: list[int],
) -> None:
    """Every ECHO and DATA logprob equals log_softmax of the oracle's teacher-forced logits,
    within the model's kind-(b) tolerance for a printed logprob (spec/model.md §15).

    Row t of the oracle predicts full_ids[t + 1]; ECHO position p carries the logprob of
    prompt token p (row p - 1), the i-th DATA that of continuation token i (row P - 1 + i).
    """
    import numpy as np

    if codec.model_dir is None or not (codec.model_dir / logits_file).is_file():
        raise NotApplicable(f"the model has no {logits_file}")
    logits = np.load(codec.model_dir / logits_file).astype(np.float64)
    rule = Tolerance.for_model_dir(codec.model_dir, positions=logits.shape[0] + 1)
    tolerance = printed(rule.logprob, 6)
    top = logits.max(axis=1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    full = codec.oracle_ids("full_ids")
    worst = 0.0
    checked = 0
    data_index = 0
    for frame in view.frames:
        if frame.request_id != rid or frame.kind not in ("ECHO", "DATA"):
            continue
        if frame.kind == "ECHO":
            echo = read(frame, Echo)
            if echo.pos == 0:
                continue
            got, row, token = echo.logprobs.logprob, echo.pos - 1, full[echo.pos]
        else:
            if data_index >= len(continuation):
                break
            logprobs = read(frame, Data).logprobs
            if logprobs is None:
                raise CheckFailure(f"DATA without a logprob tail: {frame.describe()!r}")
            got, row = logprobs.logprob, prompt_len - 1 + data_index
            token = full[prompt_len + data_index]
            data_index += 1
        want = float(log_softmax[row, token])
        worst = max(worst, abs(got - want))
        checked += 1
        if abs(got - want) > tolerance:
            raise CheckFailure(
                f"{frame.kind} logprob {got} at row {row} differs from the oracle's "
                f"{want:.6f} by {abs(got - want):.3g}, more than the model's tolerance "
                f"{tolerance:.3g} (spec/model.md §15)"
            )
    if checked < prompt_len - 1:
        raise CheckFailure(f"only {checked} logprobs to compare")
