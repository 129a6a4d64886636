"""What the fields of a transcript mean together (spec/protocol.md), not how each is spelled.

The grammar check proves every line matches protocol.json; these checks prove the numbers
agree with each other and with what was sent: payload and table lengths against the
dimensions a header declares, counters against the frames actually sent, the turn-end block
in its order, value ranges, heat that only grows, and the state a turn leaves behind. A case
names one with ``{"type": "invariant", "name": ...}``; each check looks at every instance in
the session (every turn, every EMAP, ...) and fails when it found nothing to look at, so an
engine cannot pass one by sending less. spec/cases/protocol/INVARIANTS.md maps each clause
of the spec to the invariant and the cases that check it.

Only integers, counts, orders, lengths and exact spellings are compared here; numeric values
(logprobs, entropies, timings) are checked for ranges and for agreement between two fields the
same engine wrote for the same row, never against another machine's numbers.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colibri.conformance.engine import expand_env
from colibri.conformance.frames import PREAMBLE, Frame, R, line, read
from colibri.conformance.outcome import CheckFailure, NotApplicable
from colibri.conformance.prompts import PromptCodec
from colibri.conformance.usage_records import read_usage

from colibri.protocol import LIMITS, ProtocolViolation
from colibri.protocol.records import (
    Accept,
    Data,
    Done,
    Echo,
    Emap,
    Entropy,
    Error,
    Gpus,
    Hits,
    HwInfo,
    Perf,
    Prof,
    Tiers,
    Topk,
    f3,
    logprob,
)

if TYPE_CHECKING:
    from colibri.conformance.protocol_checks import SessionView

#: The untagged telemetry written right before each DONE (protocol.md §2.7).
TURN_END_BLOCK = ("HWINFO", "GPUS", "TIERS", "EMAP", "HITS", "ENTROPY", "PERF", "PROF")
#: The seed's telemetry block before each DONE (serve_protocol.md), in no stated order.
SEED_TURN_TELEMETRY = frozenset({"HWINFO", "PERF", "ENTROPY", "GPUS", "TIERS", "EMAP", "HITS"})
#: Lines that may fall between any two frames (§2.7); periodic HITS too, outside a block.
ANYWHERE = frozenset({"REPIN"})
TOPK_COUNT = LIMITS["topk_count"]
#: `.coli_usage` engine id: FNV-1a-32("glm_moe_dsa") (§4.2).
USAGE_ENGINE_ID = 3815245270


@dataclass(frozen=True)
class Turn:
    """One accepted request: its ACCEPT, its tagged frames up to DONE/ERROR, and where they
    sit in the session's frame list."""

    rid: int
    accept: Frame
    frames: list[Frame]
    end: Frame | None
    end_index: int  # index of `end` in the session frames (len(frames) when unfinished)

    @property
    def prompt_tokens(self) -> int:
        return read(self.accept, Accept).prompt_tokens

    def of(self, kind: str) -> list[Frame]:
        return [f for f in self.frames if f.kind == kind]

    @property
    def done(self) -> Frame | None:
        return self.end if self.end is not None and self.end.kind == "DONE" else None

    def done_record(self) -> Done:
        assert self.done is not None
        return read(self.done, Done)


def _frames(view: SessionView) -> list[Frame]:
    return [f for f in view.frames if f.kind != PREAMBLE]


def turns(view: SessionView) -> list[Turn]:
    """Every ACCEPTed request of the session, in ACCEPT order; an id reused after its turn
    ended starts a new turn."""
    frames = _frames(view)
    out: list[Turn] = []
    open_turns: dict[int, tuple[Frame, list[Frame]]] = {}
    for index, frame in enumerate(frames):
        rid = frame.request_id
        if rid is None:
            continue
        if frame.kind == "ACCEPT":
            open_turns[rid] = (frame, [frame])
            continue
        if rid not in open_turns:
            continue
        accept, tagged = open_turns[rid]
        tagged.append(frame)
        if frame.kind in ("DONE", "ERROR"):
            out.append(Turn(rid, accept, tagged, frame, index))
            del open_turns[rid]
    for rid, (accept, tagged) in open_turns.items():
        out.append(Turn(rid, accept, tagged, None, len(frames)))
    return sorted(out, key=lambda t: t.accept.index)


def _finished(view: SessionView) -> list[Turn]:
    done = [t for t in turns(view) if t.done is not None]
    if not done:
        raise CheckFailure("no finished turn (ACCEPT ... DONE) to check")
    return done


def _submitted_dones(view: SessionView) -> list[tuple[int, Frame]]:
    """(id, DONE) of every request the suite sent that finished, in DONE order. Unlike
    :func:`turns` this needs no ACCEPT, so it also reads a seed-core engine's transcript."""
    done = [(f.request_id, f) for f in _frames(view)
            if f.kind == "DONE" and f.request_id in view.requests]
    if not done:
        raise CheckFailure("no finished turn (DONE of a request the suite sent) to check")
    return [(rid, f) for rid, f in done if rid is not None]


def _before(frames: list[Frame], index: int, count: int) -> list[Frame]:
    """The `count` frames before `index`, not counting lines allowed anywhere."""
    out: list[Frame] = []
    i = index - 1
    while i >= 0 and len(out) < count:
        if frames[i].kind not in ANYWHERE:
            out.append(frames[i])
        i -= 1
    return list(reversed(out))


def _ctx(view: SessionView) -> int:
    if "ctx" in view.caps:
        return view.caps["ctx"]
    env = view.config.get("env", {})
    return int(env.get("CTX", view.config.get("ctx", 256)))


def _maximum(view: SessionView, turn: Turn) -> int | None:
    asked = view.requests.get(turn.rid)
    if asked is None:
        return None
    return min(int(asked["max_tokens"]), _ctx(view) - turn.prompt_tokens - 1)


def _logprobs_k(view: SessionView, rid: int) -> int:
    asked = view.requests.get(rid, {})
    return int(asked.get("ext", {}).get("logprobs", 0))


def _echo_at(view: SessionView, rid: int) -> int:
    asked = view.requests.get(rid, {})
    return int(asked.get("ext", {}).get("echo_at", 0))


# -- §2.6: telemetry dimensions ------------------------------------------------------------
def heats(emap: Emap) -> list[int]:
    """One byte per expert, row-major: (tier << 6) | heat."""
    return [b & 0x3F for b in emap.map]


def _dimensions(exc: ProtocolViolation) -> tuple[int, int] | None:
    """The rows and cols a line declared before its hex broke (None if it broke earlier)."""
    rows, cols = exc.values.get("rows"), exc.values.get("cols")
    return (rows, cols) if isinstance(rows, int) and isinstance(cols, int) else None


def _emap(frame: Frame) -> Emap:
    try:
        return read(frame, Emap)
    except ProtocolViolation as exc:
        shape = _dimensions(exc) if exc.field == "map" else None
        if shape is None:
            if exc.field == "" and exc.values:  # a whole line with fields after its hex
                raise CheckFailure(
                    f"EMAP has {len(frame.fields)} fields: {frame.describe()!r}"
                ) from None
            raise
        rows, cols = shape
        if len(exc.token) != 2 * rows * cols:
            raise CheckFailure(
                f"EMAP {rows}x{cols} declares {rows * cols} experts but carries "
                f"{len(exc.token) / 2:g} bytes of hex"
            ) from None
        raise CheckFailure(f"EMAP hex is not hex: {exc.token[:40]!r}") from None


def _hits(frame: Frame, emap: Emap | None) -> set[int]:
    hits: Hits | None
    try:
        hits = read(frame, Hits)
        rows, cols, carried = hits.rows, hits.cols, len(hits.bits)
    except ProtocolViolation as exc:
        shape = _dimensions(exc) if exc.field == "bits" else None
        if shape is None:
            raise
        hits, (rows, cols), carried = None, shape, len(exc.token) // 2
    if emap is not None and (rows, cols) != (emap.rows, emap.cols):
        raise CheckFailure(f"HITS is {rows}x{cols}, EMAP is {emap.rows}x{emap.cols}")
    if hits is None:
        raise CheckFailure(
            f"HITS {rows}x{cols} needs {math.ceil(rows * cols / 8)} bytes, "
            f"carries {carried:g}: {frame.describe()!r}"
        )
    data = hits.bits
    bits = {i for i in range(len(data) * 8) if data[i // 8] >> (i % 8) & 1}
    padding = {b for b in bits if b >= rows * cols}
    if padding:
        raise CheckFailure(f"HITS padding bits {sorted(padding)} are set: {frame.describe()!r}")
    return bits


def telemetry_dimensions(view: SessionView, codec: PromptCodec) -> None:
    """EMAP carries rows*cols bytes; HITS has EMAP's rows and cols and ceil(rows*cols/8)
    bytes with zero padding; ENTROPY has one value per EMAP row; GPUS has three numbers per
    device it declares, as many devices as HWINFO counts."""
    frames = _frames(view)
    emaps = [(i, _emap(f)) for i, f in enumerate(frames) if f.kind == "EMAP"]
    if not emaps:
        raise CheckFailure("no EMAP line to check")
    shapes = {(e.rows, e.cols) for _, e in emaps}
    if len(shapes) != 1:
        raise CheckFailure(f"EMAP dimensions change within one engine: {sorted(shapes)}")
    emap = emaps[0][1]
    ngpu: int | None = None
    for frame in frames:
        if frame.kind == "HITS":
            _hits(frame, emap)
        elif frame.kind == "ENTROPY" and len(read(frame, Entropy).layers) != emap.rows:
            raise CheckFailure(
                f"ENTROPY has {len(read(frame, Entropy).layers)} values for {emap.rows} EMAP "
                f"rows: {frame.describe()!r}"
            )
        elif frame.kind == "HWINFO":
            ngpu = read(frame, HwInfo).ngpu
        elif frame.kind == "GPUS":
            n = _devices(frame)
            if ngpu is not None and n != ngpu:
                raise CheckFailure(f"GPUS lists {n} devices, HWINFO counts {ngpu}")


def _devices(frame: Frame) -> int:
    """How many devices a GPUS line lists: as many as it declares."""
    try:
        return len(read(frame, Gpus).devices)
    except ProtocolViolation as exc:
        declared = exc.values.get("n")
        if not isinstance(declared, int):
            raise
        raise CheckFailure(f"GPUS declares {declared} devices: {frame.describe()!r}") from None


def tiers_match_emap(view: SessionView, codec: PromptCodec) -> None:
    """TIERS' VRAM + RAM + disk counts are the EMAP's rows*cols, tier by tier (§2.6)."""
    frames = _frames(view)
    checked = 0
    for index, frame in enumerate(frames):
        if frame.kind != "EMAP":
            continue
        previous = _before(frames, index, 1)
        if not previous or previous[0].kind != "TIERS":
            continue
        emap = _emap(frame)
        counts = read(previous[0], Tiers)
        vram, ram, disk = counts.vram, counts.ram, counts.disk
        if vram + ram + disk != emap.rows * emap.cols:
            raise CheckFailure(
                f"TIERS {vram}+{ram}+{disk} = {vram + ram + disk} experts, "
                f"EMAP has {emap.rows}x{emap.cols} = {emap.rows * emap.cols}"
            )
        tiers = Counter(b >> 6 for b in emap.map)
        if (tiers[2], tiers[1], tiers[0]) != (vram, ram, disk):
            raise CheckFailure(
                f"TIERS says {vram} VRAM / {ram} RAM / {disk} disk, the EMAP after it has "
                f"{tiers[2]} / {tiers[1]} / {tiers[0]}"
            )
        checked += 1
    if not checked:
        raise CheckFailure("no TIERS line followed by its EMAP")


# -- §2.5, §2.6, §2.7: one turn's counters against its frames --------------------------------
def turn_accounting(view: SessionView, codec: PromptCodec) -> None:
    """DONE's emitted is the number of DATA frames and its prompt count ACCEPT's; PROF's
    prompt and completion tokens agree with them; one PERF per turn; a logprobs request has
    exactly nt ECHO frames, others none; with CAPS topk=1 every DATA has one TOPK."""
    topk = view.caps.get("topk", 0) == 1
    for turn in _finished(view):
        done = turn.done_record()
        nt = turn.prompt_tokens
        emitted = done.emitted
        data = len(turn.of("DATA"))
        if emitted != data:
            raise CheckFailure(f"request {turn.rid}: DONE emitted {emitted}, {data} DATA sent")
        if done.prompt_tokens != nt:
            raise CheckFailure(f"request {turn.rid}: DONE prompt tokens != ACCEPT's {nt}")
        echoes = len(turn.of("ECHO"))
        wanted = nt if _logprobs_k(view, turn.rid) > 0 else 0
        # An echo_at request scores only the option's tokens: invariant echo-at-window.
        if echoes != wanted and _echo_at(view, turn.rid) == 0:
            raise CheckFailure(f"request {turn.rid}: {echoes} ECHO frames, expected {wanted}")
        topks = len(turn.of("TOPK"))
        if topks != (data if topk else 0):
            raise CheckFailure(f"request {turn.rid}: {topks} TOPK frames for {data} DATA")
        if len(turn.of("PERF")) != 1:
            raise CheckFailure(f"request {turn.rid}: {len(turn.of('PERF'))} PERF lines")
        frames = _frames(view)
        prof = next((f for f in _before(frames, turn.end_index, 1) if f.kind == "PROF"), None)
        if prof is None:
            raise CheckFailure(f"request {turn.rid}: no PROF right before its DONE")
        prof_counts = read(prof, Prof)
        prof_prompt, prof_done = prof_counts.prompt_tokens, prof_counts.completion_tokens
        if (prof_prompt, prof_done) != (nt, emitted):
            raise CheckFailure(
                f"request {turn.rid}: PROF counts {prof_prompt} prompt / {prof_done} "
                f"completion tokens, ACCEPT/DONE say {nt} / {emitted}"
            )


def turn_end_block(view: SessionView, codec: PromptCodec) -> None:
    """Right before each DONE: HWINFO GPUS TIERS EMAP HITS ENTROPY PERF PROF, contiguous
    (REPIN aside), PERF tagged with the DONE's id (§2.7)."""
    frames = _frames(view)
    for turn in _finished(view):
        block = _before(frames, turn.end_index, len(TURN_END_BLOCK))
        kinds = tuple(f.kind for f in block)
        if kinds != TURN_END_BLOCK:
            raise CheckFailure(
                f"request {turn.rid}: DONE is preceded by {' '.join(kinds)}, "
                f"not {' '.join(TURN_END_BLOCK)}"
            )
        perf = block[TURN_END_BLOCK.index("PERF")]
        if perf.request_id != turn.rid:
            raise CheckFailure(f"request {turn.rid}: its block's PERF is {perf.describe()!r}")


def seed_turn_telemetry(view: SessionView, codec: PromptCodec) -> None:
    """The seed's rule, order free: "immediately before each DONE the engine emits a
    telemetry block for the finished turn: HWINFO, PERF, ENTROPY, GPUS, TIERS, EMAP, HITS",
    PERF tagged with the DONE's id. The block is what follows the turn's last DATA (TOPK,
    ACCEPT) frame; needs no ACCEPT, so a seed-core engine is judged by it."""
    frames = _frames(view)
    position = {id(f): i for i, f in enumerate(frames)}
    for rid, done in _submitted_dones(view):
        end = position[id(done)]
        start = end
        while start > 0 and not (frames[start - 1].request_id == rid
                                 and frames[start - 1].kind in ("DATA", "TOPK", "ACCEPT")):
            start -= 1
        block = frames[start:end]
        missing = sorted(SEED_TURN_TELEMETRY - {f.kind for f in block})
        if missing:
            shown = " ".join(f.kind for f in block) or "nothing"
            raise CheckFailure(f"request {rid}: its DONE is preceded by {shown}; the seed's "
                               f"telemetry block lacks {' '.join(missing)}")
        for perf in (f for f in block if f.kind == "PERF" and f.request_id != rid):
            raise CheckFailure(f"request {rid}: its block's PERF is {perf.describe()!r}")


def length_limited(view: SessionView, codec: PromptCodec) -> None:
    """emitted <= maximum = min(max_tokens, CTX - nt - 1), and length_limited is 1 exactly
    when emitted reached that maximum (§2.8)."""
    checked = 0
    for turn in _finished(view):
        maximum = _maximum(view, turn)
        if maximum is None:
            continue
        done = turn.done_record()
        emitted = done.emitted
        flag = int(done.length_limited)
        if emitted > max(maximum, 0):
            raise CheckFailure(f"request {turn.rid}: {emitted} tokens, maximum {maximum}")
        if flag != int(emitted >= maximum):
            raise CheckFailure(
                f"request {turn.rid}: length_limited {flag} with {emitted} of {maximum} tokens"
            )
        checked += 1
    if not checked:
        raise CheckFailure("no finished turn whose SUBMIT the suite sent")


# -- §1.1, §2.1, §2.3, §2.5, §2.6: value ranges ------------------------------------------
def _spelled(frame: Frame, name: str) -> str:
    """A field of the frame as the engine spelled it."""
    parsed = line(frame)
    return parsed.spelled.get(name, "") if parsed is not None else ""


def _read_flag(frame: Frame, kind: type[R], flag: str) -> R | str:
    """The frame's record, or what stood in its 0/1 field ``flag`` where that broke it."""
    try:
        return read(frame, kind)
    except ProtocolViolation as exc:
        if exc.field != flag:
            raise
        return exc.token


def value_ranges(view: SessionView, codec: PromptCodec) -> None:
    """Flags are 0/1, percentages within 0..100, tok/s 0.00 without tokens, ACCEPT's nt
    within 1..CTX-2, RAM available <= total, GPU used <= total, EMAP tiers 0..2, entropies
    within 0..log2(experts), TOPK logprobs <= 0, PROF's percentiles ordered, PERF's expert
    matmul, attention and lm_head seconds each within 0..dt (§2.6)."""
    ctx = _ctx(view)
    frames = _frames(view)
    cols = next((_emap(f).cols for f in frames if f.kind == "EMAP"), None)
    for turn in _finished(view):
        nt = turn.prompt_tokens
        if not 1 <= nt <= ctx - 2:
            raise CheckFailure(f"request {turn.rid}: ACCEPT nt {nt} outside 1..{ctx - 2}")
        assert turn.done is not None
        done = _read_flag(turn.done, Done, "length_limited")
        if isinstance(done, str):
            raise CheckFailure(f"DONE length_limited {done!r} is not 0 or 1")
        if not 0.0 <= done.hit_pct <= 100.0:
            raise CheckFailure(f"request {turn.rid}: hit % {done.hit_pct} outside 0..100")
        tok_s = _spelled(turn.done, "tok_s")
        if done.emitted == 0 and tok_s != "0.00":
            raise CheckFailure(f"request {turn.rid}: tok/s {tok_s} with nothing emitted")
    for frame in frames:
        if frame.kind == "HWINFO":
            host = read(frame, HwInfo)
            if host.cores < 1:
                raise CheckFailure(f"HWINFO counts no CPU cores: {frame.describe()!r}")
            if host.ram_avail_gb > host.ram_total_gb:
                raise CheckFailure(f"HWINFO RAM available > total: {frame.describe()!r}")
        elif frame.kind == "GPUS":
            for d, device in enumerate(read(frame, Gpus).devices):
                if device.used_gb > device.total_gb:
                    raise CheckFailure(f"GPU {d} uses more than it has: {frame.describe()!r}")
        elif frame.kind == "EMAP":
            tiers = {b >> 6 for b in _emap(frame).map}
            if not tiers <= {0, 1, 2}:
                raise CheckFailure(f"EMAP tier {max(tiers)} is not 0, 1 or 2")
        elif frame.kind == "ENTROPY" and cols:
            ceiling = math.log2(cols) + 0.0005
            for value in read(frame, Entropy).layers:
                if not 0.0 <= value <= ceiling:
                    raise CheckFailure(f"entropy {f3(value)} bits outside 0..log2({cols})")
        elif frame.kind == "PERF":
            perf = read(frame, Perf)
            for name, seconds in (("t_emm", perf.t_emm), ("t_attn", perf.t_attn),
                                  ("t_head", perf.t_head)):
                if not 0.0 <= seconds <= perf.dt + 0.0000015:
                    raise CheckFailure(f"PERF {name} outside 0..dt: {frame.describe()!r}")
        elif frame.kind == "PROF":
            prof = _read_flag(frame, Prof, "physical_valid")
            if isinstance(prof, str):
                raise CheckFailure(f"PROF physical_valid is not 0 or 1: {frame.describe()!r}")
            p50, p99 = prof.fwd_p50_ms, prof.fwd_p99_ms
            if (p50 == -1.0) != (p99 == -1.0) or p50 > p99:
                raise CheckFailure(f"PROF percentiles p50 {p50} / p99 {p99} out of order")
        elif frame.kind == "ERROR" and read(frame, Error).code == "CONTEXT_EXCEEDED":
            error = read(frame, Error)
            if error.prompt_tokens is None or error.limit is None:
                raise CheckFailure(f"CONTEXT_EXCEEDED without its counts: {frame.describe()!r}")
            nt, limit = error.prompt_tokens, error.limit
            if limit != ctx - 2 or nt <= limit:
                raise CheckFailure(f"CONTEXT_EXCEEDED {nt} {limit} with CTX {ctx}")
    caps = view.caps
    if caps:
        flags = ("accept", "stop", "echo", "ids", "seed", "grammar", "topk", "tokenizer", "mtp")
        bad = [k for k in flags if k in caps and caps[k] not in (0, 1)]
        if bad or caps.get("proto", 1) != 1 or not 0 <= caps.get("logprobs", 0) <= 32:
            raise CheckFailure(f"CAPS values out of range: {caps}")


# -- §2.6 usage and heat: monotonic within a run, restored across runs --------------------
def _runs(view: SessionView) -> list[list[Frame]]:
    """The session's frames split at each READY (one list per engine process)."""
    runs: list[list[Frame]] = [[]]
    for frame in _frames(view):
        if frame.kind == "READY" and runs[-1]:
            runs.append([])
        runs[-1].append(frame)
    return runs


def _no_decay(view: SessionView) -> None:
    if "COLI_USAGE_DECAY" in view.config.get("env", {}):
        raise NotApplicable("COLI_USAGE_DECAY ages the counters")


def heat_monotonic(view: SessionView, codec: PromptCodec) -> None:
    """Usage counters only grow, so within one engine process an expert's EMAP heat never
    decreases, and an expert a HITS line reports routed has heat > 0 from then on."""
    _no_decay(view)
    compared = 0
    for run in _runs(view):
        last: Emap | None = None
        routed: set[int] = set()
        for index, frame in enumerate(run):
            if frame.kind == "EMAP":
                emap = _emap(frame)
                if last is not None and (last.rows, last.cols) != (emap.rows, emap.cols):
                    raise CheckFailure("EMAP dimensions change within one engine process")
                if last is not None:
                    fallen = [
                        i
                        for i, (a, b) in enumerate(zip(heats(last), heats(emap), strict=True))
                        if b < a
                    ]
                    if fallen:
                        raise CheckFailure(
                            f"EMAP heat fell for expert cells {fallen[:6]} "
                            f"({heats(last)[fallen[0]]} -> {heats(emap)[fallen[0]]})"
                        )
                    compared += 1
                cold = sorted(i for i in routed if heats(emap)[i] == 0)
                if cold:
                    raise CheckFailure(f"experts {cold[:6]} were routed (HITS) but have heat 0")
                last = emap
            elif frame.kind == "HITS":
                bits = _hits(frame, last)
                routed |= bits
                previous = _before(run, index, 1)
                if last is not None and previous and previous[0].kind == "EMAP":
                    # In the turn-end block nothing is routed between EMAP and HITS.
                    cold = sorted(i for i in bits if heats(last)[i] == 0)
                    if cold:
                        raise CheckFailure(
                            f"HITS routes experts {cold[:6]} the EMAP before it shows cold"
                        )
    if not compared:
        raise CheckFailure("fewer than two EMAP lines in one engine process")


def heat_restored(view: SessionView, codec: PromptCodec) -> None:
    """With persistence, `.coli_usage` carries the counters across a restart: the handshake
    EMAP of the new process shows the heat of the last EMAP before it (§2.6, §4.2)."""
    _no_decay(view)
    if not view.config.get("persist"):
        raise NotApplicable("the session runs without persistence")
    runs = _runs(view)
    checked = 0
    for before, after in zip(runs, runs[1:], strict=False):
        old = [f for f in before if f.kind == "EMAP"]
        new = [f for f in after if f.kind == "EMAP"]
        if not old or not new:
            continue
        was, now = heats(_emap(old[-1])), heats(_emap(new[0]))
        if was != now:
            diff = next(i for i, (a, b) in enumerate(zip(was, now, strict=False)) if a != b)
            raise CheckFailure(
                f"after the restart expert cell {diff} has heat {now[diff]}, {was[diff]} before it"
            )
        checked += 1
    if not checked:
        raise CheckFailure("no restart with an EMAP on both sides")


# -- §2.5: TOPK, ECHO and DATA agree with each other and with the prompt -------------------
def _payload_id(payload: bytes | None, vocab: int, what: str) -> int:
    text = (payload or b"").decode("ascii", "replace")
    if not (text.startswith(" ") and text[1:].isdigit()) or int(text[1:]) >= vocab:
        raise CheckFailure(f"{what}: payload {payload!r} is not ' <id>' with id < {vocab}")
    return int(text[1:])


def _topk(frame: Frame, expected: int) -> Topk:
    """The TOPK record, holding ``expected`` entries."""
    try:
        topk = read(frame, Topk)
    except ProtocolViolation as exc:
        count = exc.values.get("count", exc.token if exc.field == "count" else None)
        if count is None:
            raise
        raise CheckFailure(f"TOPK holds {count} entries, min(5, vocab) is expected") from None
    if len(topk.candidates) != expected:
        raise CheckFailure(
            f"TOPK holds {len(topk.candidates)} entries, min(5, vocab) is expected"
        )
    return topk


def _no_tokenizer(view: SessionView) -> bool:
    return view.caps.get("tokenizer", 1) == 0


def topk_table(view: SessionView, codec: PromptCodec) -> None:
    """TOPK follows its DATA, holds min(5, vocab) entries by descending logprob, ties by
    ascending id, each logprob <= 0; for a greedy request its first entry is the token the
    DATA carries (the first maximum of the same raw row)."""
    frames = _frames(view)
    checked = 0
    for index, frame in enumerate(frames):
        if frame.kind != "TOPK":
            continue
        rid = frame.request_id
        data = _before(frames, index, 1)
        if not data or data[0].kind != "DATA" or data[0].request_id != rid:
            raise CheckFailure(f"TOPK does not follow its request's DATA: {frame.describe()!r}")
        candidates = _topk(frame, min(TOPK_COUNT, codec.vocab)).candidates
        lps = [lp for lp, _ in candidates]
        texts = [text for _, text in candidates]
        if any(not lp <= 0.0 for lp in lps):
            raise CheckFailure(f"TOPK logprob above 0 or nan: {frame.describe()!r}")
        if any(b > a for a, b in zip(lps, lps[1:], strict=False)):
            raise CheckFailure(f"TOPK is not by descending logprob: {lps}")
        if _no_tokenizer(view):
            ids = [_payload_id(t, codec.vocab, "TOPK entry") for t in texts]
            if len(set(ids)) != len(ids):
                raise CheckFailure(f"TOPK repeats a token: {ids}")
            entries = list(zip(ids, lps, strict=True))
            ties = [
                (a, b)
                for (a, x), (b, y) in zip(entries, entries[1:], strict=False)
                if x == y and b < a
            ]
            if ties:
                raise CheckFailure(f"TOPK ties not by ascending id: {ties}")
        asked = view.requests.get(rid or -1)
        if asked is not None and asked["temperature"] == 0:
            chosen = data[0].payload or b""
            if texts[0] != chosen:
                raise CheckFailure(
                    f"greedy request {rid} sent {chosen.hex() or '-'!r} but TOPK ranks "
                    f"{texts[0].hex() or '-'!r} first"
                )
        checked += 1
    if not checked:
        raise CheckFailure("no TOPK frame to check")


def token_payloads(view: SessionView, codec: PromptCodec) -> None:
    """ECHO position p carries prompt token p: without a tokenizer its payload is ' <id>' of
    the id sent, so the ECHO payloads spell the ids=1 payload; with one, they concatenate
    to the prompt's bytes. Every DATA payload of a model without tokenizer is ' <id>'."""
    checked = 0
    for turn in turns(view):
        if _no_tokenizer(view):
            for frame in turn.of("DATA"):
                _payload_id(frame.payload, codec.vocab, f"DATA of request {turn.rid}")
        echoes = turn.of("ECHO")
        payload = view.submitted.get(turn.rid)
        if not echoes or payload is None or _echo_at(view, turn.rid):
            continue  # an echo_at window spells a suffix: invariant echo-at-window
        spelled = b"".join(f.payload or b"" for f in echoes)
        if _no_tokenizer(view) and payload.ids:
            sent = payload.data.split()
            got = [(f.payload or b"").strip() for f in echoes]
            if got != sent or spelled != b"".join(b" " + t for t in sent):
                raise CheckFailure(
                    f"request {turn.rid}: ECHO payloads {got[:8]} are not the ids sent {sent[:8]}"
                )
        elif not payload.ids and spelled != payload.data:
            raise CheckFailure(
                f"request {turn.rid}: ECHO payloads spell {spelled[:60]!r}, "
                f"the prompt was {payload.data[:60]!r}"
            )
        checked += 1
    if not checked:
        raise CheckFailure("no request with ECHO frames and a known payload")


def echo_at_window(view: SessionView, codec: PromptCodec) -> None:
    """`echo_at=a` scores exactly the tokens that cover payload bytes >= a (§2.2, §2.8): the
    ECHO frames are positions s … nt−1 in order, their payloads spell the prompt's bytes
    from token s's first byte on, token s reaches past byte a and token s−1 does not (so a
    token merging across byte a is scored). a at or past the end: no ECHO at all."""
    checked = 0
    for turn in _finished(view):
        at = _echo_at(view, turn.rid)
        payload = view.submitted.get(turn.rid)
        if at == 0 or payload is None or payload.ids:
            continue
        echoes = turn.of("ECHO")
        nt = turn.prompt_tokens
        prompt = payload.data
        checked += 1
        if at >= len(prompt):
            if echoes:
                raise CheckFailure(
                    f"request {turn.rid}: echo_at={at} is past the {len(prompt)}-byte prompt, "
                    f"yet {len(echoes)} ECHO frame(s) came"
                )
            continue
        if not echoes:
            raise CheckFailure(f"request {turn.rid}: echo_at={at} inside the prompt, no ECHO")
        positions = [read(f, Echo).pos for f in echoes]
        first = nt - len(echoes)
        if positions != list(range(first, nt)):
            raise CheckFailure(
                f"request {turn.rid}: ECHO positions {positions[:8]}… are not s … {nt - 1}"
            )
        spelled = b"".join(f.payload or b"" for f in echoes)
        start = len(prompt) - len(spelled)
        if start < 0 or prompt[start:] != spelled:
            raise CheckFailure(
                f"request {turn.rid}: ECHO payloads {spelled[:40]!r} are not the end of the "
                f"prompt {prompt[-40:]!r}"
            )
        first_bytes = len(echoes[0].payload or b"")
        if not start <= at < start + first_bytes:
            raise CheckFailure(
                f"request {turn.rid}: the first scored token spans bytes {start} … "
                f"{start + first_bytes - 1}, it must be the token covering byte {at}"
            )
    if not checked:
        raise CheckFailure("no finished echo_at request with a text payload")


def chosen_in_table(view: SessionView, codec: PromptCodec) -> None:
    """A token that is both the chosen one and in its frame's logprob table has the same
    spelling twice; a greedy DATA's token is in its table with the table's largest logprob
    (needs token ids on the wire: a model without tokenizer)."""
    if not _no_tokenizer(view):
        raise NotApplicable("token ids are only on the wire without a tokenizer")
    checked = 0
    for turn in turns(view):
        greedy = view.requests.get(turn.rid, {}).get("temperature", 1) == 0
        for frame in turn.frames:
            if frame.kind not in ("DATA", "ECHO"):
                continue
            # Strictly read: the check compares spellings, and a strict logprob is spelled
            # the one way its value prints.
            record: Data | Echo = (read(frame, Data, strict=True) if frame.kind == "DATA"
                                   else read(frame, Echo, strict=True))
            tail = record.logprobs
            if tail is None or (isinstance(record, Echo) and record.pos == 0):
                continue
            chosen = _payload_id(frame.payload, codec.vocab, frame.kind)
            table = {token: logprob(lp) for token, lp in tail.top}
            spelled = table.get(chosen)
            own = logprob(tail.logprob)
            if spelled is not None and spelled != own:
                raise CheckFailure(
                    f"token {chosen} is spelled {own} as chosen and {spelled} in the "
                    f"table: {frame.describe()!r}"
                )
            if greedy and frame.kind == "DATA" and table:
                top = max(table.values(), key=float)
                if spelled is None or float(spelled) != float(top):
                    raise CheckFailure(
                        f"greedy token {chosen} is not the table's best: {frame.describe()!r}"
                    )
            checked += 1
    if not checked:
        raise CheckFailure("no DATA or ECHO frame with a logprob table")


# -- §2.1: the handshake agrees with the configuration -----------------------------------
def caps_agree(view: SessionView, codec: PromptCodec) -> None:
    """CAPS slots, ctx and vocab are the engine's KV_SLOTS, CTX and the model's vocabulary;
    topk is 1 exactly with SERVE_TOPK=1; a model the suite sends text to has a tokenizer."""
    caps = view.caps
    if not caps:
        raise CheckFailure("the engine sent no CAPS line")
    env = view.config.get("env", {})
    wanted = {
        "slots": int(env.get("KV_SLOTS", view.config.get("kv_slots", 2))),
        "ctx": int(env.get("CTX", view.config.get("ctx", 256))),
        "vocab": codec.vocab,
        "topk": int(env.get("SERVE_TOPK", "0") == "1"),
    }
    if not codec.ids_mode:
        wanted["tokenizer"] = 1
    wrong = {k: (caps.get(k), v) for k, v in wanted.items() if caps.get(k) != v}
    if wrong:
        raise CheckFailure(f"CAPS disagrees with the configuration (got, expected): {wrong}")


# -- §2.8, §4.2, §4.3: the state a turn leaves behind ------------------------------------
def state_history(view: SessionView, codec: PromptCodec) -> None:
    """After a length-limited turn on slot 0 the slot's history (and so `.coli_kv`) holds the
    prompt and every emitted token but the last: nrec = nt + emitted - 1, the records'
    tokens are those ids when the wire shows ids; `.coli_usage` holds one record per expert
    that EMAP shows warm, with heat = bit length of its count, layers and experts ascending."""
    if view.state_dir is None or not view.config.get("persist"):
        raise NotApplicable("the session runs without persistence")
    last = [t for t in _finished(view) if view.requests.get(t.rid, {}).get("slot", 0) == 0]
    if not last:
        raise CheckFailure("no finished turn on slot 0")
    turn = last[-1]
    done = turn.done_record()
    emitted = done.emitted
    if not done.length_limited or emitted < 1:
        raise CheckFailure(f"request {turn.rid} must end length-limited with tokens")
    data = (view.state_dir / ".coli_kv").read_bytes()
    if len(data) < 40:
        raise CheckFailure(".coli_kv is shorter than its header")
    layers, lora, rope, index_hd, nic, _vocab, nrec, _tag = struct.unpack("<8i", data[8:40])
    wanted = turn.prompt_tokens + emitted - 1
    if nrec != wanted:
        raise CheckFailure(
            f".coli_kv holds {nrec} records; the slot's history is {turn.prompt_tokens} "
            f"prompt + {emitted} - 1 emitted = {wanted} tokens"
        )
    record = 4 + layers * (lora + rope) * 4 + nic * index_hd * 4
    tokens = [struct.unpack_from("<i", data, 40 + i * record)[0] for i in range(nrec)]
    payload = view.submitted.get(turn.rid)
    if _no_tokenizer(view) and payload is not None and payload.ids:
        sent = [int(t) for t in payload.data.split()]
        emitted_ids = [_payload_id(f.payload, codec.vocab, "DATA") for f in turn.of("DATA")]
        if tokens != sent + emitted_ids[:-1]:
            raise CheckFailure(f".coli_kv tokens {tokens[-8:]} are not the turn's history")
    _usage_matches_emap(view, view.state_dir / ".coli_usage")


def _usage_matches_emap(
    view: SessionView, path: Path, header: bool = True
) -> dict[tuple[int, int], int]:
    """The usage file at `path` is in the `.coli_usage` layout (§4.2; without its header
    records when `header` is false) and its counts give exactly the heats of the session's
    last EMAP; returns the counts."""
    emaps = [f for f in _frames(view) if f.kind == "EMAP"]
    if not emaps:
        raise CheckFailure(f"no EMAP line to compare with {path.name}")
    emap = _emap(emaps[-1])
    counts = read_usage(path, emap.cols, USAGE_ENGINE_ID, header)
    if len({layer for layer, _ in counts}) > emap.rows:
        raise CheckFailure(f"{path.name} names more layers than EMAP's {emap.rows} rows")
    saved = sorted(min(count.bit_length(), 63) for count in counts.values())
    shown = sorted(h for h in heats(emap) if h)
    if saved != shown:
        raise CheckFailure(
            f"{path.name} counts give heats {saved[:10]}..., the last EMAP shows {shown[:10]}..."
        )
    return counts


# -- §4.2 "STATS dump": the counters an expert atlas reads ---------------------------------
def _stats_file(view: SessionView) -> Path:
    """The STATS dump of an engine that exited cleanly under the atlas' controls."""
    env = view.config.get("env", {})
    if "STATS" not in env or view.state_dir is None:
        raise CheckFailure("the case sets no STATS path for this session")
    if env.get("DRAFT") != "0" or view.config.get("persist"):
        raise CheckFailure("a STATS measurement needs DRAFT=0 and no persistence (§4.2)")
    if view.alive or view.exit_codes[-1:] != [0]:
        raise CheckFailure("the engine must have exited with status 0 before its dump is read")
    path = Path(expand_env(str(env["STATS"]), view.state_dir))
    if not path.is_file():
        raise CheckFailure(f"no STATS dump at {path.name} after the engine exited")
    return path


def stats_dump_header(view: SessionView, codec: PromptCodec) -> None:
    """The STATS dump carries the `.coli_usage` header records (§4.2: `-1 <layers>
    <experts>`, `-2 1 <engine id>`) before counts that give the last EMAP's heats."""
    del codec
    _usage_matches_emap(view, _stats_file(view), header=True)


def stats_dump(view: SessionView, codec: PromptCodec) -> None:
    """With `STATS=<path>`, `COLI_PERSIST=0` and `DRAFT=0` (the atlas' controls), the file
    written at exit holds this process's routing and nothing else: the `.coli_usage` layout,
    the heats of the last EMAP, and in every routed layer top-k selections per forwarded
    token. A turn forwards its nt prompt tokens and every emitted token but a last one that
    ended it length-limited; each slot is used once, so no prefix is reused. The header
    records are not required here (colibri's glm.c writes bare triples): stats-dump-header
    checks them where the engine has the state_layout extension."""
    path = _stats_file(view)
    top_k = _config_int(codec, "num_experts_per_tok")
    finished = _submitted_dones(view)
    slots = [view.requests.get(rid, {}).get("slot", 0) for rid, _ in finished]
    if len(set(slots)) != len(slots) or len(_runs(view)) != 1:
        raise CheckFailure("the case must use each slot once in one engine process")
    forwarded = 0
    for rid, done in finished:
        done_counts = read(done, Done)
        emitted = done_counts.emitted
        # DONE's own prompt_tokens (a seed field), not ACCEPT's nt: the dump is a seed-era
        # feature, so an engine without the ACCEPT extension is judged by it too.
        prompt = done_counts.prompt_tokens
        # A turn that reached its limit never forwards its last token. The limit is read
        # from what was asked as well as from length_limited: glm.c sets that flag only for
        # the context clamp, and whether the flag is right is length-limited's question.
        asked = view.requests.get(rid, {}).get("max_tokens")
        at_limit = done_counts.length_limited or (isinstance(asked, int) and emitted >= asked)
        forwarded += prompt + emitted - (1 if emitted and at_limit else 0)
    # The header records are the state_layout extension (stats-dump-header checks them);
    # the counts are what every STATS dump, colibri's glm.c included, is for.
    counts = _usage_matches_emap(view, path, header=False)
    per_layer: Counter[int] = Counter()
    for (layer, _expert), count in counts.items():
        per_layer[layer] += count
    if not per_layer:
        raise CheckFailure(f"{path.name} is empty after {forwarded} forwarded token(s)")
    wrong = {layer: n for layer, n in per_layer.items() if n != top_k * forwarded}
    if wrong:
        raise CheckFailure(
            f"{path.name}: layer selections {dict(sorted(wrong.items()))} != top-{top_k} x "
            f"{forwarded} forwarded tokens = {top_k * forwarded}"
        )


def _config_int(codec: PromptCodec, key: str) -> int:
    if codec.model_dir is None or not (codec.model_dir / "config.json").is_file():
        raise NotApplicable("the model's config.json is not available")
    value = json.loads((codec.model_dir / "config.json").read_text(encoding="utf-8")).get(key)
    if not isinstance(value, int):
        raise NotApplicable(f"config.json has no integer {key}")
    return value


Check = Callable[["SessionView", PromptCodec], None]

#: name -> the check (its docstring says what it proves).
INVARIANTS: dict[str, Check] = {
    "telemetry-dimensions": telemetry_dimensions,
    "tiers-match-emap": tiers_match_emap,
    "turn-accounting": turn_accounting,
    "turn-end-block": turn_end_block,
    "seed-turn-telemetry": seed_turn_telemetry,
    "length-limited": length_limited,
    "value-ranges": value_ranges,
    "heat-monotonic": heat_monotonic,
    "heat-restored": heat_restored,
    "topk-table": topk_table,
    "token-payloads": token_payloads,
    "chosen-in-table": chosen_in_table,
    "caps-agree": caps_agree,
    "state-history": state_history,
    "echo-at-window": echo_at_window,
    "stats-dump": stats_dump,
    "stats-dump-header": stats_dump_header,
}


def check_invariant(view: SessionView, exp: dict[str, Any], codec: PromptCodec) -> None:
    name = exp.get("name")
    check = INVARIANTS.get(str(name))
    if check is None:
        raise CheckFailure(f"unknown invariant {name!r}")
    try:
        check(view, codec)
    except (IndexError, ValueError, struct.error) as exc:
        # A frame too malformed to read the fields an invariant relates (the grammar
        # expectation names it) cannot satisfy the invariant either.
        raise CheckFailure(f"{name}: a frame it relates is malformed ({exc})") from None
