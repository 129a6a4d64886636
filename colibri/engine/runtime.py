"""What the mux and legacy loops share: the model, its tokenizer, the slots' KV states and
their files, expert usage and tiers, and the telemetry lines built from them."""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO

import numpy as np
import numpy.typing as npt

from colibri.engine import usage_file
from colibri.engine.backend import (
    EngineModel,
    KvCodec,
    KVState,
    TextTokenizer,
    stop_tokens,
    token_payload,
    usage_rows,
)
from colibri.engine.expert_usage import ExpertUsage
from colibri.engine.kv_persist import KvFile, KvLayout, slot_file
from colibri.engine.route_attribution import RouteAttribution
from colibri.engine.settings import DEFAULT_CTX, EngineSettings
from colibri.engine.tiers import Repin, ResidentExperts, TierReport
from colibri.engine.wire_output import f2, f3


class Drafter(Protocol):
    """A model with an MTP head: draft logits for the token after ``token``."""

    def mtp_draft(self, state: Any, token: int) -> npt.NDArray[np.float32]: ...


@dataclass
class Slot:
    """One KV slot: its state, the tokens its KV holds, and its file."""

    index: int
    state: KVState
    history: list[int] = field(default_factory=list)
    kv_file: KvFile | None = None


class EngineRuntime:
    def __init__(
        self,
        model: EngineModel,
        tokenizer: TextTokenizer | None,
        settings: EngineSettings,
        log: TextIO,
        *,
        state_dir: Path | None,
        codec: KvCodec | None = None,
        tiers: TierReport | None = None,
        model_tag: int = 0,
        max_positions: int = DEFAULT_CTX,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.log = log
        self.shape = model.config
        self.vocab = self.shape.vocab_size
        self.ctx = settings.ctx if settings.ctx is not None else min(DEFAULT_CTX, max_positions)
        self.mux_stops = stop_tokens(self.shape, tokenizer, all_stops=settings.serve_all_stops)
        self.all_stops = stop_tokens(self.shape, tokenizer, all_stops=True)
        self.rows = usage_rows(self.shape)
        self.n_experts = self.shape.n_routed_experts
        self.usage = ExpertUsage(self.shape.num_hidden_layers, self.n_experts, self.rows)
        self.routes = RouteAttribution(self.rows, self.n_experts, log)
        resident = ResidentExperts()
        self.resident = resident if tiers is None else None
        self.tiers: TierReport = tiers if tiers is not None else resident
        self.codec = codec
        self.persist = settings.persist and state_dir is not None
        self.state_dir = state_dir if self.persist else None
        self.kv_enabled = self.persist and settings.kv_save and codec is not None
        self.model_tag = model_tag
        #: Set when the model has an MTP head and DRAFT allows it (single-slot drafting).
        self.drafter: Drafter | None = None
        #: Set with REPIN=n: one live re-pin pass, returning the swaps it made.
        self.repinner: Callable[[], list[Repin]] | None = None
        model.route_observer = self._observe
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
        """Release the state directory (the loops call this when they end)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # --- usage -------------------------------------------------------------------------

    def _observe(self, layer: int, experts: tuple[int, ...]) -> None:
        self.usage.observe(layer, experts)
        self.routes.observe(layer, experts)
        if self.resident is not None:
            self.resident.note_lookups(len(experts))

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
        assert self.codec is not None
        shape = self.shape
        indexer = shape.index_head_dim if shape.indexer_types else 0
        return KvLayout(
            n_layers=shape.num_hidden_layers,
            kv_lora=shape.kv_lora_rank,
            qk_rope=shape.qk_rope_head_dim,
            index_hd=indexer,
            nic=self.codec.indexer_layers,
            vocab=self.vocab,
            tag=self.model_tag,
        )

    def open_slot(self, index: int) -> Slot:
        slot = Slot(index, self.model.new_state())
        if not self.kv_enabled or self.state_dir is None or self.codec is None:
            return slot
        slot.kv_file = KvFile(slot_file(self.state_dir, index), self.kv_layout())
        loaded = slot.kv_file.load(self.ctx - 8, self.log)
        if loaded is not None:
            self.codec.restore(slot.state, loaded.tokens, loaded.rows)
            slot.history = list(loaded.tokens)
            print(
                f"[KV] slot {index}: resumed conversation from disk: {len(loaded.tokens)} tokens",
                file=self.log,
            )
        return slot

    def truncate_slot(self, slot: Slot, keep: int) -> None:
        if keep < slot.state.length:
            slot.state.truncate(keep)
        del slot.history[keep:]
        if slot.kv_file is not None:
            slot.kv_file.truncate(keep)

    def persist_slot(self, slot: Slot) -> None:
        """Append the slot's positions that are not on disk yet (records first, count last)."""
        kv = slot.kv_file
        if kv is None or self.codec is None or slot.state.length <= kv.nrec:
            return
        start, stop = kv.nrec, slot.state.length
        try:
            kv.append(slot.history[start:stop], self.codec.export_rows(slot.state, start, stop))
        except OSError as exc:
            print(f"[KV] could not save slot {slot.index}: {exc}", file=self.log)

    # --- tokens ----------------------------------------------------------------------------

    def token_payload(self, token: int) -> bytes:
        return token_payload(self.tokenizer, token)

    # --- telemetry lines -------------------------------------------------------------------

    def tiers_line(self) -> str:
        c = self.tiers.tier_counts(self.rows, self.n_experts)
        return f"TIERS {c.vram} {c.ram} {c.disk} {f2(c.vram_bytes / 1e9)} {f2(c.ram_bytes / 1e9)}"

    def emap_line(self) -> str:
        tiers = self.tiers.tier_matrix(self.rows, self.n_experts)
        return f"EMAP {len(self.rows)} {self.n_experts} {self.usage.emap_hex(tiers)}"

    def hits_line(self) -> str:
        return f"HITS {len(self.rows)} {self.n_experts} {self.usage.take_hits_hex()}"

    def entropy_line(self, owner: int) -> str:
        """The turn's routing entropy per EMAP row (this request's own selections)."""
        return "ENTROPY" + "".join(f" {f3(h)}" for h in self.routes.take_entropy(owner))
