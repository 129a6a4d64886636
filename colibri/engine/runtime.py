"""What the mux and legacy loops share: the model, its tokenizer, the slots' KV states and
their files, expert usage and tiers, and the telemetry lines built from them."""

from __future__ import annotations

import fcntl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO

import numpy as np

from colibri.engine import usage_file
from colibri.engine.backend import (
    Backend,
    Logits,
    ModelShape,
    Step,
    StepRow,
    sparse_layers,
    usage_rows,
)
from colibri.engine.expert_usage import ExpertUsage
from colibri.engine.kv_persist import KvFile, KvLayout, KvWriter, slot_file
from colibri.engine.settings import DEFAULT_CTX, EngineSettings
from colibri.engine.turn_routes import TurnRoutes
from colibri.protocol.records import Emap, Entropy, Hits, NodeResidency, Nodes, Tiers

#: NODES's byte for an expert no expert worker holds.
NO_NODE = 0xFF

class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def token_bytes(self, token_id: int) -> bytes: ...
    def token_to_id(self, token: str) -> int | None: ...
    @property
    def special_ids(self) -> frozenset[int]: ...


@dataclass
class Slot:
    """One KV slot: the backend's state, the tokens its KV holds (the engine's history; the
    backend only knows how many positions it holds), and its file."""

    index: int
    state: Any
    history: list[int] = field(default_factory=list)
    kv_file: KvFile | None = None


class EngineRuntime:
    """Built by ``colibri.engine.main.build_runtime`` only."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: TextTokenizer | None,
        settings: EngineSettings,
        log: TextIO,
        *,
        state_dir: Path | None,
        max_positions: int = DEFAULT_CTX,
        ignore_stops: bool = False,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.settings = settings
        self.log = log
        self.shape: ModelShape = backend.shape
        self.vocab = self.shape.vocab_size
        self.ctx = settings.ctx if settings.ctx is not None else min(DEFAULT_CTX, max_positions)
        self.mux_stops = (
            frozenset()
            if ignore_stops
            else stop_tokens(self.shape, tokenizer, all_stops=settings.serve_all_stops)
        )
        self.all_stops = stop_tokens(self.shape, tokenizer, all_stops=True)
        self.rows = usage_rows(self.shape)
        self.routed_layers = sparse_layers(self.shape)
        self.n_experts = self.shape.n_routed_experts
        self.usage = ExpertUsage(self.shape.num_hidden_layers, self.n_experts, self.rows)
        self.turns = TurnRoutes(self.rows, self.routed_layers, self.n_experts)
        self.tiers = backend.tiers
        self.persist = settings.persist and state_dir is not None
        self.state_dir = state_dir if self.persist else None
        self.kv_enabled = self.persist and settings.kv_save
        self.model_tag = backend.model_tag
        self.writer = KvWriter(backend.name, backend.build)
        #: Single-slot MTP drafting: the model has an MTP head and DRAFT allows it.
        self.drafting = backend.has_mtp and settings.draft != 0
        self._lock: BinaryIO | None = None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if self._take_state_lock(self.state_dir):
                self._load_usage()
            else:
                self.persist = False
                self.kv_enabled = False
                self.state_dir = None

    def _take_state_lock(self, state_dir: Path) -> bool:
        """One engine per state directory: two writers appending the same `.coli_kv` would
        interleave records of different conversations. A second engine runs without
        persistence (and says so) rather than share the files."""
        handle = open(state_dir / ".lock", "ab")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            print(
                f"[KV] {state_dir} is in use by another engine: persistence is off for this one",
                file=self.log,
            )
            return False
        self._lock = handle
        return True

    def close(self) -> None:
        """Release the state directory and the backend (the loops call this when they end)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        self.backend.close()

    # --- steps -----------------------------------------------------------------------------

    def forward(
        self, rows: Sequence[StepRow], owners: Sequence[int | None] | None = None
    ) -> Step:
        """One backend step; its routing goes to the usage counters and, for rows with an
        owner (``owners[r]``, a request id), to that request's turn."""
        step = self.backend.step(rows)
        self.credit_step(step, owners)
        return step

    def credit_step(self, step: Step, owners: Sequence[int | None] | None) -> None:
        """Count a step's routing (for a step whose owners are known only after it ran)."""
        self.usage.observe_routes(self.routed_layers, step.routes)
        if owners is not None:
            for r, owner in enumerate(owners):
                if owner is not None:
                    self.turns.credit(owner, step.routes[r])

    def prefill(self, slot: Slot, tokens: Sequence[int], *, all_logits: bool = False) -> Logits:
        """Forward ``tokens`` after the slot's history; the last row's logits (every row's
        with ``all_logits``), [rows, vocab]."""
        n = len(tokens)
        rows = [StepRow(slot.state, t, all_logits or i == n - 1) for i, t in enumerate(tokens)]
        logits = self.forward(rows).logits
        slot.history.extend(tokens)
        return logits

    def draft(self, state: Any, token: int) -> Logits:
        """The MTP head's logits for the token after ``token`` (usage counts its routing)."""
        drafted = self.backend.draft(state, token)
        self.usage.observe(self.shape.num_hidden_layers, drafted.routes.reshape(-1))
        return drafted.logits

    def length(self, slot: Slot) -> int:
        return self.backend.length(slot.state)

    @property
    def usage_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / ".coli_usage"

    def _load_usage(self) -> None:
        path = self.usage_path
        if path is None or not path.exists():
            return
        routed = set(self.rows)
        try:
            counts = usage_file.parse(
                path.read_bytes(), self.shape.num_hidden_layers, self.n_experts, routed
            )
        except (OSError, usage_file.UsageFileError) as exc:
            print(f"[USAGE] ignoring {path}: {exc}", file=self.log)
            return
        self.usage.add_history(counts)

    def save_usage(self) -> None:
        path = self.usage_path
        if path is None or not self.settings.usage_save:
            return
        decay = self.settings.usage_decay
        if decay < 1.0:
            # colibri: every count is multiplied by the decay, rounding half up, before a save.
            self.usage.counts[:] = np.floor(self.usage.counts * decay + 0.5).astype(np.uint64)
        try:
            usage_file.save(path, self.usage.counts)
        except OSError as exc:
            print(f"[USAGE] could not save {path}: {exc}", file=self.log)

    # --- slots and their files -----------------------------------------------------------

    def kv_layout(self) -> KvLayout:
        shape = self.shape
        indexer = shape.index_head_dim if shape.indexer_types else 0
        record = self.backend.kv_record
        # A layer's cache per position: MLA's latent and rope key (kv_lora + qk_rope), or a
        # standard-attention family's key and value, which have no latent: kv_lora 0 and the
        # whole width in qk_rope (spec/DEVIATIONS.md, "COLIKV1 for standard attention").
        per_layer = ((record.record_floats - record.indexer_layers * indexer)
                     // shape.num_hidden_layers)
        return KvLayout(
            n_layers=shape.num_hidden_layers,
            kv_lora=shape.kv_lora_rank,
            qk_rope=per_layer - shape.kv_lora_rank,
            index_hd=indexer,
            nic=self.backend.kv_record.indexer_layers,
            vocab=self.vocab,
            tag=self.model_tag,
        )

    def open_slot(self, index: int) -> Slot:
        slot = Slot(index, self.backend.new_state())
        if not self.kv_enabled or self.state_dir is None:
            return slot
        slot.kv_file = KvFile(slot_file(self.state_dir, index), self.kv_layout(), self.writer)
        loaded = slot.kv_file.load(self.ctx - 8, self.log)
        if loaded is None:
            return slot
        if loaded.writer == self.writer:
            self.backend.import_kv(slot.state, loaded.tokens, loaded.rows)
        else:
            # Another backend's (or build's) rows would mix two computations in one slot:
            # keep the conversation, recompute its KV here, and make the file ours.
            writer = loaded.writer.describe() if loaded.writer else "an unknown writer"
            print(
                f"[KV] slot {index}: written by {writer}, re-prefilling {len(loaded.tokens)} "
                f"tokens on {self.writer.describe()}",
                file=self.log,
            )
            self.backend.step([StepRow(slot.state, t, False) for t in loaded.tokens])
            slot.kv_file.start_over()
        slot.history = list(loaded.tokens)
        self.persist_slot(slot)
        print(
            f"[KV] slot {index}: resumed conversation from disk: {len(loaded.tokens)} tokens",
            file=self.log,
        )
        return slot

    def truncate_slot(self, slot: Slot, keep: int) -> None:
        if keep < self.backend.length(slot.state):
            self.backend.truncate(slot.state, keep)
        del slot.history[keep:]
        if slot.kv_file is not None:
            slot.kv_file.truncate(keep)

    def persist_slot(self, slot: Slot) -> None:
        """Append the slot's positions that are not on disk yet (records first, count last)."""
        kv = slot.kv_file
        length = self.backend.length(slot.state)
        if kv is None or length <= kv.nrec:
            return
        start, stop = kv.nrec, length
        try:
            kv.append(slot.history[start:stop], self.backend.export_kv(slot.state, start, stop))
        except OSError as exc:
            print(f"[KV] could not save slot {slot.index}: {exc}", file=self.log)

    # --- tokens ----------------------------------------------------------------------------

    def token_payload(self, token: int) -> bytes:
        return token_payload(self.tokenizer, token)

    # --- telemetry lines -------------------------------------------------------------------

    def tiers_record(self) -> Tiers:
        c = self.tiers.tier_counts(self.rows, self.n_experts)
        return Tiers(c.vram, c.ram, c.disk, c.vram_bytes / 1e9, c.ram_bytes / 1e9)

    def emap_record(self) -> Emap:
        tiers = self.tiers.tier_matrix(self.rows, self.n_experts)
        return Emap(len(self.rows), self.n_experts, self.usage.emap_bytes(tiers))

    def nodes_record(self) -> Nodes | None:
        """Which expert worker holds each routed expert (the NODES extension); None when the
        backend computes its experts itself."""
        nodes = self.backend.expert_nodes()
        if not nodes:
            return None
        owners = np.full((len(self.rows), self.n_experts), NO_NODE, np.uint8)
        row_of = {layer: row for row, layer in enumerate(self.rows)}
        for index, node in enumerate(nodes):
            for layer, expert in node.owned:
                row = row_of.get(layer)
                if row is not None and expert < self.n_experts:
                    owners[row, expert] = index
        return Nodes(len(self.rows), self.n_experts, owners.tobytes(),
                     tuple(NodeResidency(len(n.owned), n.resident_bytes / 1e9) for n in nodes))

    def hits_record(self) -> Hits:
        return Hits(len(self.rows), self.n_experts, self.usage.take_hits_bytes())

    def entropy_record(self, owner: int) -> Entropy:
        """The turn's routing entropy per EMAP row (this request's own selections)."""
        return Entropy(tuple(self.turns.take_entropy(owner)))


def token_payload(tokenizer: TextTokenizer | None, token: int) -> bytes:
    """DATA/ECHO payload of one token: its bytes, or ' <id>' for a model without tokenizer."""
    if tokenizer is None:
        return b" %d" % token
    return tokenizer.token_bytes(token)


def stop_tokens(
    shape: ModelShape, tokenizer: TextTokenizer | None, *, all_stops: bool
) -> frozenset[int]:
    """Mux keeps only <|endoftext|> (colibri's batched server); legacy keeps every stop."""
    if not all_stops and tokenizer is not None:
        eot = tokenizer.token_to_id("<|endoftext|>")
        if eot is not None:
            return frozenset({eot})
    stops = set(shape.eos_token_ids)
    if all_stops and tokenizer is not None:
        stops |= tokenizer.special_ids
    return frozenset(stops)
