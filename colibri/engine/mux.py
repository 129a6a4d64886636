"""The mux protocol loop: continuous batching over KV slots (spec/protocol.md section 2).

One iteration reads at most one command (prefilling an accepted SUBMIT on the spot), then
runs one batched decode step over every slot that has a token to forward, in slot order.
Every request samples from its own RNG, and batched rows are bit-identical to single
decodes, so a request's frames do not depend on what the other slots are doing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import BackendReadError, StepRow
from colibri.engine.constraint import GrammarError, Matcher, build_vocabulary
from colibri.engine.host_info import gpus_line, hwinfo_line, peak_rss_gb, physical_read_bytes
from colibri.engine.mask_overlap import MaskOverlap
from colibri.engine.mtp_guard import MIN_ACCEPT_PCT, PAUSE_TOKENS, WINDOW, MtpGuard
from colibri.engine.request_sampling import (
    greedy,
    logprob_record,
    pick,
    request_rng,
    row_log_normalizer,
    top_candidates,
)
from colibri.engine.runtime import EngineRuntime, Slot
from colibri.engine.submit_parse import (
    MAX_HEADER,
    MAX_LOGPROBS,
    Control,
    Submission,
    parse_control,
    parse_id_payload,
    submit_frame,
    validate_submit,
)
from colibri.engine.turn_report import Request, perf_record, prof_record, turn_numbers
from colibri.engine.wire_input import Source
from colibri.engine.wire_output import READY, FrameWriter
from colibri.protocol import (
    BROKEN,
    LIMITS,
    OVERLONG,
    SPEC,
    TRUNCATED,
    FrameParser,
    FrameReader,
    WireFrame,
)
from colibri.protocol.records import (
    NO_PREDICTOR,
    Accept,
    Caps,
    Data,
    Done,
    Echo,
    Error,
    Logprobs,
    Repin,
    Stat,
    Topk,
)
from colibri.text.grammar import GrammarVocabulary

HITS_EVERY = LIMITS["hits_every_steps"]
TOPK_COUNT = LIMITS["topk_count"]


@dataclass
class SignalFlags:
    """Set from signal handlers, read by the loop between steps."""

    interrupt: bool = False
    terminate: bool = False


class MuxEngine:
    def __init__(
        self,
        runtime: EngineRuntime,
        source: Source,
        out: FrameWriter,
        signals: SignalFlags | None = None,
    ) -> None:
        self.rt = runtime
        parser = FrameParser.for_commands("mux", MAX_HEADER, runtime.settings.kv_slots)
        self.commands = FrameReader(source, parser)
        self.out = out
        self.signals = signals or SignalFlags()
        self.log = runtime.log
        self.slots: list[Slot] = [runtime.open_slot(i) for i in range(runtime.settings.kv_slots)]
        self.active: dict[int, Request] = {}  # slot index -> request
        self.eof = False
        self.steps = 0
        self.rows = 0
        self.steps_since_hits = 0
        self.steps_since_repin = 0
        self.mtp = MtpGuard()
        #: (rows, seconds) of every decode forward: what `colibri bench` aggregates.
        self.step_log: list[tuple[int, float]] = []
        self.grammar_vocabulary: GrammarVocabulary | None = None
        self.masks = MaskOverlap(runtime.settings.grammar_overlap)
        #: Seconds the loop's own thread spent on grammars (masking, consuming, waiting for
        #: the mask worker): what `colibri bench`'s grammar section reports per token.
        self.grammar_seconds = 0.0

    # --- handshake -------------------------------------------------------------------

    def capabilities(self) -> Caps:
        """CAPS: every key of spec/protocol.json ``capabilities``, in its order."""
        rt = self.rt
        values = {
            "proto": SPEC.revision,
            "accept": 1,
            "stop": 1,
            "logprobs": MAX_LOGPROBS,
            "echo": 1,
            "echo_at": 1,
            "ids": 1,
            "seed": 1,
            "grammar": int(rt.tokenizer is not None),
            "topk": int(rt.settings.serve_topk),
            "hits_every": HITS_EVERY,
            "slots": rt.settings.kv_slots,
            "ctx": rt.ctx,
            "vocab": rt.vocab,
            "tokenizer": int(rt.tokenizer is not None),
            "mtp": int(rt.drafting),
        }
        unknown = sorted(set(values) - set(SPEC.capabilities))
        if unknown:
            raise KeyError(f"CAPS keys not in spec/protocol.json: {unknown}")
        return Caps(tuple((k, values[k]) for k in SPEC.capabilities))

    def handshake(self) -> None:
        self.out.raw(READY)
        self.out.frame(Stat(0, 0.0, 0.0, peak_rss_gb()))
        self.out.frame(self.capabilities())
        devices = self.rt.backend.devices()
        self.out.line(hwinfo_line(devices))
        self.out.line(gpus_line(devices))
        self.out.frame(self.rt.tiers_record())
        self.out.frame(self.rt.emap_record())
        nodes = self.rt.nodes_record()
        if nodes is not None:  # only on a cluster: colibri's handshake stays as it was
            self.out.frame(nodes)

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        self.handshake()
        while True:
            if self.signals.interrupt or self.signals.terminate:
                self.signals.interrupt = False
                for slot_index in sorted(self.active):
                    self.finish(self.active[slot_index], length_limited=False)
                if self.signals.terminate:
                    break
            if not self.eof:
                busy = bool(self.active)
                if self.commands.ready(0.0 if busy else 0.5):
                    self.handle_command()
            elif not self.active:
                break
            self.step()
        self.masks.close()
        self.rt.save_usage()
        self.rt.close()
        print(f"[API] {self.steps} decode steps, {self.rows} rows", file=self.log)
        if self.mtp.drafted:
            print(self.mtp.summary(), file=self.log)
        return 0

    def error(self, rid: int, code: str) -> None:
        self.out.frame(Error(rid, code))

    def read_failed(self, requests: Sequence[Request], exc: BackendReadError) -> None:
        """A step could not read the model's bytes: its requests end with EXPERT_READ (the
        step changed no state), and the engine goes on serving; a later request reads the
        files afresh."""
        print(f"[ERROR] {exc}", file=self.log)
        for request in requests:
            if self.active.get(request.slot) is request:
                del self.active[request.slot]
            self.rt.turns.forget(request.rid)
            self.error(request.rid, "EXPERT_READ")

    def handle_command(self) -> None:
        frame = self.commands.next()
        if frame is None or frame.kind == TRUNCATED:
            self.eof = True  # EOF inside a SUBMIT's frame is EOF (validation step 7)
            return
        if frame.kind == OVERLONG:
            self.error(0, "BAD_REQUEST")
            return
        control = parse_control(frame.header)
        if control == "bad":
            self.error(0, "BAD_REQUEST")
        elif isinstance(control, Control):
            self.control(control)
        else:
            self.submit(frame)

    def find(self, rid: int) -> Request | None:
        for request in self.active.values():
            if request.rid == rid:
                return request
        return None

    def control(self, control: Control) -> None:
        request = self.find(control.rid)
        if request is None:
            self.error(control.rid, "NOT_FOUND")
        elif control.verb == "STOP":
            self.finish(request, length_limited=False)
        else:
            del self.active[request.slot]
            self.rt.turns.forget(request.rid)
            self.rt.persist_slot(self.slots[request.slot])
            self.error(request.rid, "CANCELLED")

    # --- SUBMIT ------------------------------------------------------------------------

    def submit(self, wire: WireFrame) -> None:
        submitted_at = time.perf_counter()
        frame = submit_frame(wire.framed)
        if frame is None or wire.payload is None:
            self.error(0, "BAD_REQUEST")  # not a SUBMIT that can be framed (spec step 6)
            return
        if wire.kind == BROKEN:
            self.error(frame.rid, "BAD_FRAME")
            self.eof = True  # stdin is no longer read (validation step 8)
            return
        payload, grammar = wire.payload[: frame.nbytes], wire.payload[frame.nbytes :]
        request = validate_submit(frame, payload, grammar, self.rt.settings.kv_slots)
        if request is None:
            self.error(frame.rid, "BAD_REQUEST")
            return
        if request.slot in self.active:
            self.error(request.rid, "SLOT_BUSY")
            return
        if self.find(request.rid) is not None:
            self.error(request.rid, "DUPLICATE_ID")
            return
        tokens = self.tokenize(request)
        if tokens is None:
            self.error(request.rid, "BAD_REQUEST")
            return
        if not tokens:
            self.error(request.rid, "EMPTY_PROMPT")
            return
        limit = self.rt.ctx - 2
        if len(tokens) > limit:
            self.out.frame(Error(request.rid, "CONTEXT_EXCEEDED", len(tokens), limit))
            return
        matcher = None
        if request.grammar.strip():
            matcher = self.grammar_matcher(request)
            if matcher is None:
                self.error(request.rid, "BAD_GRAMMAR")
                return
        self.out.frame(Accept(request.rid, len(tokens)))
        self.start(request, tokens, submitted_at, matcher)

    def grammar_matcher(self, request: Submission) -> Matcher | None:
        """The SUBMIT's grammar as a matcher; None (after a log line) when it cannot be one."""
        tokenizer = self.rt.tokenizer
        if tokenizer is None:
            print(f"[GRAMMAR] request {request.rid}: the model has no tokenizer", file=self.log)
            return None
        if self.grammar_vocabulary is None:
            self.grammar_vocabulary = build_vocabulary(tokenizer, self.rt.vocab, self.rt.mux_stops)
        try:
            return self.grammar_vocabulary.matcher(request.grammar.decode("utf-8"))
        except UnicodeDecodeError:
            message = "the grammar is not UTF-8"
        except GrammarError as exc:
            message = str(exc)
        print(f"[GRAMMAR] request {request.rid}: {message}", file=self.log)
        return None

    def tokenize(self, request: Submission) -> list[int] | None:
        if request.ids:
            return parse_id_payload(request.payload, self.rt.vocab)
        if self.rt.tokenizer is None:
            return None
        try:
            text = request.payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return self.rt.tokenizer.encode(text)

    def start(
        self,
        sub: Submission,
        tokens: list[int],
        submitted_at: float,
        matcher: Matcher | None = None,
    ) -> None:
        rt = self.rt
        slot = self.slots[sub.slot]
        nt = len(tokens)
        echo_from = 0
        if sub.logprobs > 0:
            # ECHO at position p needs the logit row of p-1, so the kept prefix ends before
            # the first scored position (spec/protocol.md 2.8); echo_at=0 scores every one.
            echo_from = first_token_at(self.token_ends(tokens), sub.echo_at)
            keep = min(common_prefix(slot.history, tokens), max(echo_from - 1, 0), nt - 1)
        else:
            keep = common_prefix(slot.history, tokens)
            keep = min(keep, nt - 1)  # at least one token is forwarded to get logits
        kv_started = time.perf_counter()
        rt.truncate_slot(slot, keep)
        kv_seconds = time.perf_counter() - kv_started
        if keep:
            print(
                f"[API] KV slot {slot.index} prefix {keep}/{nt} token, prefill {nt - keep}",
                file=self.log,
            )
        request = Request(
            rid=sub.rid,
            slot=sub.slot,
            temperature=sub.temperature,
            top_p=sub.top_p,
            logprobs=sub.logprobs,
            rng=request_rng(sub.seed, rt.settings.seed),
            prompt_tokens=nt,
            maximum=min(sub.max_tokens, rt.ctx - nt - 1),
            submitted_at=submitted_at,
            kv_seconds=kv_seconds,
            matcher=matcher,
        )
        pending_masks = self.masks.start([matcher] if matcher is not None else [])
        try:
            logits = rt.prefill(slot, tokens[keep:], all_logits=sub.logprobs > 0)
        except BackendReadError as exc:
            self.read_failed([request], exc)
            return
        finally:
            self.masks.wait(pending_masks)
        request.forwards += 1
        self.active[slot.index] = request
        if sub.logprobs > 0:
            self.echo(request, tokens, logits, keep, echo_from)
        # DONE's hit % and PERF/PROF's disk numbers cover the decode window (spec 2.5), so
        # the store and I/O baselines are taken here, after the prefill, like the clock.
        counters = rt.tiers.counters()
        request.store_at_start = (counters.lookups, counters.hits, counters.disk_seconds)
        request.physical_at_start = physical_read_bytes()
        request.decode_started = time.perf_counter()
        if request.maximum <= 0:
            self.finish(request, length_limited=True)
            return
        self.advance(request, logits[-1])

    def token_ends(self, tokens: Sequence[int]) -> list[int]:
        """The payload byte offset where each token ends (its bytes concatenated in order)."""
        ends: list[int] = []
        at = 0
        for token in tokens:
            at += len(self.rt.token_payload(token))
            ends.append(at)
        return ends

    def echo(
        self,
        request: Request,
        tokens: Sequence[int],
        logits: npt.NDArray[np.float32],
        keep: int,
        echo_from: int,
    ) -> None:
        """ECHO frames for positions echo_from ... nt-1; `logits` row i is position keep+i."""
        k = min(request.logprobs, self.rt.vocab)
        for pos in range(echo_from, len(tokens)):
            token = tokens[pos]
            if pos == 0:
                record = NO_PREDICTOR
            else:
                record = logprob_record(logits[pos - 1 - keep], token, k)
            self.out.frame(Echo(request.rid, self.rt.token_payload(token), pos, record))

    # --- decoding -----------------------------------------------------------------------

    def advance(self, request: Request, row: npt.NDArray[np.float32]) -> None:
        """Sample the request's next token from `row` and emit it (or finish).

        Under a grammar the token is drawn from the masked row; logprobs stay those of the
        raw row (spec/protocol.md 2.7)."""
        matcher = request.matcher
        if matcher is None:
            token = pick(row, request.temperature, request.top_p, request.rng)
            complete = False
        else:
            started = time.perf_counter()
            masked = matcher.apply(row)
            masked_at = time.perf_counter()
            token = pick(masked, request.temperature, request.top_p, request.rng)
            picked_at = time.perf_counter()
            if token not in self.rt.mux_stops:
                matcher.consume(token)
            complete = matcher.complete()
            self.grammar_seconds += masked_at - started + time.perf_counter() - picked_at
        if token in self.rt.mux_stops:
            self.finish(request, length_limited=False)
            return
        self.emit(request, token, row)
        if request.emitted >= request.maximum:
            self.finish(request, length_limited=True)
        elif complete:
            self.finish(request, length_limited=False)
        else:
            request.pending = token

    def emit(self, request: Request, token: int, row: npt.NDArray[np.float32]) -> None:
        payload = self.rt.token_payload(token)
        logprobs: Logprobs | None = None
        topk = self.rt.settings.serve_topk
        # The full-vocabulary logZ is the costly part of both tables: sum it once per row.
        log_z = row_log_normalizer(row) if request.logprobs > 0 and topk else None
        if request.logprobs > 0:
            logprobs = logprob_record(row, token, min(request.logprobs, self.rt.vocab), log_z)
        self.out.frame(Data(request.rid, payload, logprobs))
        request.emitted += 1
        if request.first_token_at is None:
            request.first_token_at = time.perf_counter()
        if topk:
            self.out.frame(self.topk_record(request.rid, row, log_z))

    def topk_record(
        self, rid: int, row: npt.NDArray[np.float32], log_z: float | None = None
    ) -> Topk:
        top = top_candidates(row, TOPK_COUNT, log_z)
        return Topk(rid, tuple((lp, self.rt.token_payload(token)) for token, lp in top))

    def step(self) -> None:
        ready = [
            (slot_index, request)
            for slot_index, request in sorted(self.active.items())
            if request.pending is not None
        ]
        if not ready:
            return
        if len(ready) == 1 and len(self.active) == 1 and self.rt.drafting:
            slot_index, request = ready[0]
            if request.temperature <= 0.0 and self.mtp.allows():
                self.speculative_step(self.slots[slot_index], request)
                self.after_step()
                return
        rows = []
        for slot_index, request in ready:
            assert request.pending is not None
            rows.append(StepRow(self.slots[slot_index].state, request.pending, True))
        pending_masks = self.masks.start(
            [r.matcher for _, r in ready if r.matcher is not None]
        )
        started = time.perf_counter()
        try:
            step = self.rt.forward(rows, [r.rid for _, r in ready])
        except BackendReadError as exc:
            self.read_failed([r for _, r in ready], exc)
            return
        finally:
            done = time.perf_counter()
            elapsed = done - started
            self.masks.wait(pending_masks)
            self.grammar_seconds += time.perf_counter() - done
        logits = step.logits
        elapsed_ms = elapsed * 1000.0
        self.step_log.append((len(ready), elapsed))
        self.steps += 1
        self.rows += len(ready)
        for row_index, (slot_index, request) in enumerate(ready):
            assert request.pending is not None
            self.slots[slot_index].history.append(request.pending)
            request.pending = None
            request.forwards += 1
            request.forward_ms.append(elapsed_ms)
            request.add_step(step.timing)
            self.advance(request, logits[row_index])
        self.after_step()

    def after_step(self) -> None:
        """Periodic telemetry between steps: HITS every 6 steps, live re-pinning."""
        self.steps_since_hits += 1
        if self.steps_since_hits >= HITS_EVERY:
            self.steps_since_hits = 0
            self.out.frame(self.rt.hits_record())
        if self.rt.settings.repin_every > 0:
            self.steps_since_repin += 1
            if self.steps_since_repin >= self.rt.settings.repin_every:
                self.steps_since_repin = 0
                for swap in self.rt.tiers.repin():
                    self.out.frame(Repin(swap.layer, swap.expert, swap.old_tier, swap.gpu))

    def speculative_step(self, slot: Slot, request: Request) -> None:
        """Depth-1 MTP drafting for a lone greedy request: forward the pending token and the
        head's draft in one prefill; the draft is kept iff greedy decoding picks it, so the
        output is byte-identical to plain decoding (prefill rows equal decode rows)."""
        assert request.pending is not None
        pending = request.pending
        matcher = request.matcher
        # Under a grammar the head drafts from the masked row, and the draft is checked
        # against the masked row of the pending token: it is kept only where plain
        # constrained decoding would pick it.
        pending_masks = self.masks.start([matcher] if matcher is not None else [])
        try:
            draft_row = self.rt.draft(slot.state, pending)
        except BackendReadError as exc:
            self.read_failed([request], exc)
            return
        finally:
            self.masks.wait(pending_masks)
        draft = greedy(draft_row if matcher is None else matcher.apply(draft_row))
        # The mask after the draft is needed only if the draft is kept: a fork that has
        # consumed it computes that mask during the verifying forward.
        after_draft = None
        if matcher is not None and draft not in self.rt.mux_stops and self.masks.enabled:
            after_draft = matcher.fork()
            after_draft.consume(draft)
        pending_masks = self.masks.start([after_draft] if after_draft is not None else [])
        started = time.perf_counter()
        try:
            step = self.rt.backend.step(
                [StepRow(slot.state, pending, True), StepRow(slot.state, draft, True)]
            )
        except BackendReadError as exc:
            self.read_failed([request], exc)
            return
        finally:
            elapsed = time.perf_counter() - started
            self.masks.wait(pending_masks)
        rows = step.logits
        request.forward_ms.append(elapsed * 1000.0)
        request.add_step(step.timing)
        self.step_log.append((2, elapsed))
        request.forwards += 1
        slot.history.extend([pending, draft])
        request.pending = None
        self.steps += 1
        self.rows += 2
        accepted = greedy(rows[0] if matcher is None else matcher.apply(rows[0])) == draft
        # The draft's row counts for the turn only where plain decoding forwards it too.
        if accepted and matcher is not None and draft not in self.rt.mux_stops:
            if after_draft is not None:
                request.matcher = matcher = after_draft
            else:
                matcher.consume(draft)
        grammar_done = accepted and matcher is not None and matcher.complete()
        continues = (
            accepted
            and draft not in self.rt.mux_stops
            and request.emitted + 1 < request.maximum
            and not grammar_done
        )
        self.rt.credit_step(step, [request.rid, request.rid if continues else None])
        if self.mtp.record(accepted):
            print(
                f"[MTP] acceptance under {MIN_ACCEPT_PCT}% over {WINDOW} drafts: "
                f"drafting paused for {PAUSE_TOKENS} tokens",
                file=self.log,
            )
        if not accepted:
            self.rt.truncate_slot(slot, self.rt.length(slot) - 1)
            self.advance(request, rows[0])
            return
        # The draft is the token greedy decoding picks: emit it as advance() would, then
        # the token after it comes from the draft's own row.
        if draft in self.rt.mux_stops:
            self.rt.truncate_slot(slot, self.rt.length(slot) - 1)
            self.finish(request, length_limited=False)
            return
        self.emit(request, draft, rows[0])
        if request.emitted >= request.maximum:
            self.rt.truncate_slot(slot, self.rt.length(slot) - 1)
            self.finish(request, length_limited=True)
            return
        if grammar_done:
            self.rt.truncate_slot(slot, self.rt.length(slot) - 1)
            self.finish(request, length_limited=False)
            return
        self.advance(request, rows[1])

    # --- turn end ----------------------------------------------------------------------

    def finish(self, request: Request, *, length_limited: bool) -> None:
        """The success path: telemetry block, persistence, DONE."""
        rt = self.rt
        slot = self.slots[request.slot]
        del self.active[request.slot]
        numbers = turn_numbers(request, rt.tiers.counters())
        devices = rt.backend.devices()
        self.out.line(hwinfo_line(devices))
        self.out.line(gpus_line(devices))
        kv_started = time.perf_counter()
        rt.save_usage()
        rt.persist_slot(slot)
        request.kv_seconds += time.perf_counter() - kv_started
        self.out.frame(rt.tiers_record())
        self.out.frame(rt.emap_record())
        self.out.frame(rt.hits_record())
        self.steps_since_hits = 0
        self.out.frame(rt.entropy_record(request.rid))
        self.out.frame(perf_record(request, numbers))
        self.out.frame(prof_record(request, numbers))
        self.out.frame(
            Done(
                request.rid,
                request.emitted,
                numbers.tok_s,
                numbers.hit_pct,
                peak_rss_gb(),
                request.prompt_tokens,
                length_limited,
            )
        )


def first_token_at(ends: Sequence[int], byte: int) -> int:
    """Index of the first token whose bytes reach past `byte` (len(ends) when none does):
    the token that covers payload byte `byte`, a token merging across it included."""
    if byte <= 0:
        return 0
    for i, end in enumerate(ends):
        if end > byte:
            return i
    return len(ends)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


__all__ = ["MuxEngine", "SignalFlags", "common_prefix", "first_token_at"]
