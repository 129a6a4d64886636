"""The legacy serve protocol (spec/protocol.md section 3): one conversation, raw text replies.

Used by ``colibri chat``: every input line is a chat turn wrapped in the GLM template and
answered with streamed text, the END sentinel and a STAT line; ``\\x02RESET``, ``\\x02MORE``
and the ``\\x02PROMPT`` API frame are the control lines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import StepRow
from colibri.engine.host_info import peak_rss_gb
from colibri.engine.mux import common_prefix
from colibri.engine.request_sampling import pick, request_rng
from colibri.engine.rng import Rng
from colibri.engine.runtime import EngineRuntime, Slot
from colibri.engine.submit_parse import (
    MAX_PAYLOAD,
    parse_id_payload,
)
from colibri.engine.turn_report import hit_percent
from colibri.engine.wire_input import Source
from colibri.engine.wire_output import END, READY, FrameWriter
from colibri.protocol import OVERLONG, TRUNCATED, CommandHeader, FrameParser, FrameReader
from colibri.protocol.records import Stat
from colibri.text import chat_format

DEFAULT_TEMPERATURE = 0.7
DEFAULT_NUCLEUS = 0.9


@dataclass(frozen=True)
class PromptHeader:
    """The fields of a ``\\x02PROMPT`` header (spec/protocol.md section 3)."""

    nbytes: int
    max_tokens: int
    temperature: float
    top_p: float
    slot: int

    @classmethod
    def of(cls, header: CommandHeader) -> PromptHeader:
        """The fields of a header the command parser framed, so already checked against
        every range of the spec (a refused header is not framed, its payload not read)."""
        fields = header.fields
        slot = fields.get("kv_slot")
        return cls(int(fields["bytes"]), int(fields["max_tokens"]),
                   float(fields["temperature"]), float(fields["top_p"]),
                   int(slot) if slot is not None else 0)


class LegacyEngine:
    def __init__(
        self,
        runtime: EngineRuntime,
        source: Source,
        out: FrameWriter,
        *,
        temperature: float = DEFAULT_TEMPERATURE,
        top_p: float = DEFAULT_NUCLEUS,
    ) -> None:
        self.rt = runtime
        self.out = out
        self.slots: list[Slot] = [runtime.open_slot(i) for i in range(runtime.settings.kv_slots)]
        parser = FrameParser.for_commands("legacy", MAX_PAYLOAD, len(self.slots))
        self.commands = FrameReader(source, parser)
        # The token emitted last in each slot, not yet forwarded (None after a stop token).
        self.pending: list[int | None] = [None] * len(self.slots)
        self.temperature = temperature
        self.top_p = top_p
        self.rng: Rng = request_rng(None, runtime.settings.seed)

    def run(self) -> int:
        self.out.raw(READY)
        self.out.frame(Stat(0, 0.0, 0.0, peak_rss_gb()))
        self.out.frame(self.rt.tiers_record())
        while (frame := self.commands.next()) is not None:
            if frame.kind == TRUNCATED:
                continue  # EOF inside a PROMPT's payload: no reply
            if frame.kind == OVERLONG:
                self.fail(six=True)
                continue
            line = frame.header
            if line == b"\x02RESET":
                self.reset()
            elif line == b"\x02MORE":
                self.more()
            elif line.startswith(b"\x02PROMPT"):
                self.api_prompt(frame.framed, frame.payload)
            else:
                self.chat(line)
        self.rt.save_usage()
        self.rt.close()
        return 0

    # --- replies -------------------------------------------------------------------------

    def stat(
        self,
        produced: int,
        tok_s: float,
        hit_pct: float,
        turn: tuple[int, bool] | None = None,
    ) -> None:
        """STAT after END; ``turn`` is (prompt tokens, length limited) where the reply has them."""
        rss = peak_rss_gb()
        if turn is None:
            self.out.frame(Stat(produced, tok_s, hit_pct, rss))
        else:
            self.out.frame(Stat(produced, tok_s, hit_pct, rss, turn[0], turn[1]))

    def fail(self, *, six: bool) -> None:
        self.out.raw(END)
        self.stat(0, 0.0, 0.0, (0, False) if six else None)

    # --- control lines -----------------------------------------------------------------

    def reset(self) -> None:
        slot = self.slots[0]
        self.rt.truncate_slot(slot, 0)
        self.pending[0] = None
        self.out.raw(END)
        self.stat(0, 0.0, 0.0)

    def more(self) -> None:
        slot = self.slots[0]
        if self.rt.length(slot) < 1:
            self.out.raw(END)
            self.stat(0, 0.0, 0.0)
            return
        pending = self.pending[0]
        # The length once the token to re-forward is off the cache (see below).
        start = self.rt.length(slot) - (1 if pending is None else 0)
        budget = min(self.rt.settings.ngen, self.rt.ctx - start - 2)
        if budget <= 0:
            # A full context: nothing can be forwarded. Reply before touching the pending
            # token, which the user has already seen and a later turn must still forward.
            self.out.raw(END)
            self.stat(0, 0.0, 0.0)
            return
        if pending is None:
            # The last answer ended on a stop token (not kept): re-forward the last position.
            last = slot.history[-1]
            self.rt.truncate_slot(slot, start)
            pending = last
        produced, tok_s, hit, _ = self.generate(slot, 0, pending, None, budget)
        self.out.raw(b"\n" + END)
        self.stat(produced, tok_s, hit)

    def api_prompt(self, framed: CommandHeader | None, payload: bytes | None) -> None:
        if framed is None or payload is None:
            self.fail(six=True)
            return
        header = PromptHeader.of(framed)
        max_tokens, temperature, top_p = header.max_tokens, header.temperature, header.top_p
        slot_index = header.slot
        if b"\0" in payload:
            self.fail(six=True)
            return
        tokens = self.tokenize(payload)
        if not tokens:
            self.fail(six=True)
            return
        tokens = tokens[: self.rt.ctx - 8]
        slot = self.slots[slot_index]
        keep = min(common_prefix(slot.history, tokens), len(tokens) - 1)
        self.rt.truncate_slot(slot, keep)
        logits = self.rt.prefill(slot, tokens[keep:])
        budget = min(max_tokens, self.rt.settings.ngen, self.rt.ctx - len(tokens) - 1)
        produced, tok_s, hit, limited = self.generate(
            slot, slot_index, None, logits[-1], budget, temperature, top_p
        )
        self.out.raw(END)
        self.stat(produced, tok_s, hit, (len(tokens), limited))

    # --- chat turns ------------------------------------------------------------------------

    def template(self, text: bytes, first: bool) -> list[int] | None:
        tokenizer = self.rt.tokenizer
        if tokenizer is None:
            return parse_id_payload(text, self.rt.vocab)
        try:
            body = text.decode("utf-8")
        except UnicodeDecodeError:
            body = text.decode("utf-8", errors="replace")
        if self.rt.settings.chat_template:
            turn = chat_format.user_turn(body, thinking=self.rt.settings.think)
            body = (chat_format.PREFIX if first else "") + turn
        return tokenizer.encode(body)

    def tokenize(self, payload: bytes) -> list[int] | None:
        if self.rt.tokenizer is None:
            return parse_id_payload(payload, self.rt.vocab)
        try:
            return self.rt.tokenizer.encode(payload.decode("utf-8"))
        except UnicodeDecodeError:
            return None

    def chat(self, line: bytes) -> None:
        slot = self.slots[0]
        carried = [] if self.pending[0] is None else [self.pending[0]]
        turn = self.template(line, first=self.rt.length(slot) == 0)
        if not turn:
            self.fail(six=True)
            return
        prompt = slot.history + carried + turn
        if len(prompt) + 8 > self.rt.ctx:
            # colibri resets the conversation rather than overflow the context.
            self.rt.truncate_slot(slot, 0)
            self.pending[0] = None
            turn = (self.template(line, first=True) or [])[: self.rt.ctx - 8]
            prompt = turn
        keep = min(common_prefix(slot.history, prompt), len(prompt) - 1)
        self.rt.truncate_slot(slot, keep)
        logits = self.rt.prefill(slot, prompt[keep:])
        budget = min(self.rt.settings.ngen, self.rt.ctx - len(prompt) - 1)
        produced, tok_s, hit, limited = self.generate(slot, 0, None, logits[-1], budget)
        self.out.raw(b"\n" + END)
        self.stat(produced, tok_s, hit, (len(prompt), limited))

    # --- generation ----------------------------------------------------------------------

    def generate(
        self,
        slot: Slot,
        slot_index: int,
        forward: int | None,
        row: npt.NDArray[np.float32] | None,
        budget: int,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> tuple[int, float, float, bool]:
        """Stream up to `budget` tokens; (produced, tok/s, hit %, length_limited)."""
        temp = self.temperature if temperature is None else temperature
        nucleus = self.top_p if top_p is None else top_p
        counters = self.rt.tiers.counters()
        started = time.perf_counter()
        produced = 0
        limited = False
        self.pending[slot_index] = None
        while produced < budget:
            if forward is not None:
                row = self.rt.forward([StepRow(slot.state, forward, True)]).logits[0]
                slot.history.append(forward)
                self.pending[slot_index] = None
                forward = None
            assert row is not None
            token = pick(row, temp, nucleus, self.rng)
            if token in self.rt.all_stops:
                break
            self.out.raw(self.rt.token_payload(token))
            produced += 1
            self.pending[slot_index] = token
            forward = token
        else:
            limited = budget >= 0 and produced >= budget
        elapsed = time.perf_counter() - started
        after = self.rt.tiers.counters()
        hit = hit_percent(after.lookups - counters.lookups, after.hits - counters.hits)
        self.rt.save_usage()
        self.rt.persist_slot(slot)
        return produced, (produced / elapsed if produced and elapsed > 0 else 0.0), hit, limited

