"""The engine seam: the one interface between the control plane and a backend.

A backend owns KV memory and expert storage and computes steps; the control plane
(``colibri.engine``) owns token history, slots, sampling, pin policy, persistence files and
telemetry. One call carries a whole engine step:

    step(rows) -> Step(logits, routes, timing)

``rows`` are ``StepRow(state, token, wants_logits)``: a prefill is rows of one state (its
consecutive positions), a batched decode one row per state. Each row's bytes are independent
of the batch (sameness kind (c), spec/model.md §15). Only the rows that want logits pay for
the lm_head. ``routes`` says which routed experts every row chose at every sparse decoder
layer, so usage telemetry needs no callback from inside the model.

Backends are found by name in ``colibri.engine.registry``; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]
#: Expert ids, int32: [rows, sparse layers, k] for a step, [positions, k] for a draft.
Routes = npt.NDArray[np.int32]

TIER_DISK = 0
TIER_RAM = 1
TIER_VRAM = 2


class BackendReadError(Exception):
    """A step could not read model data it needed (a routed expert's bytes: a short read, an
    I/O error, a file truncated under the engine). The step changed no state; the engine ends
    the requests it carried with ``ERROR <id> EXPERT_READ`` and keeps serving."""


class ModelShape(Protocol):
    """The config fields the engine reads (names as in colibri.reference.config)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def n_routed_experts(self) -> int: ...
    @property
    def num_experts_per_tok(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def index_head_dim(self) -> int: ...
    @property
    def indexer_types(self) -> tuple[str, ...] | None: ...
    @property
    def num_nextn_predict_layers(self) -> int: ...
    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...
    def is_sparse(self, layer: int) -> bool: ...


class StepRow(NamedTuple):
    state: Any
    token: int
    wants_logits: bool


@dataclass(frozen=True)
class StepTiming:
    """Seconds spent in one step: its wall time and, inside it, the backend's expert products
    (``matmul_s``), attention and lm_head (PERF's t_emm, t_attn, t_head; spec/protocol.md
    2.6). A phase a backend cannot time is 0, which PERF and PROF then report as 0."""

    total_s: float = 0.0
    matmul_s: float = 0.0
    attention_s: float = 0.0
    head_s: float = 0.0


@dataclass(frozen=True)
class Step:
    #: [rows with wants_logits, vocab], in row order.
    logits: Logits
    #: [rows, sparse decoder layers (ascending), k]: every row's routed experts.
    routes: Routes
    timing: StepTiming = field(default_factory=StepTiming)


@dataclass(frozen=True)
class Draft:
    """An MTP draft: logits [vocab] for the token after the drafted one, and the experts the
    MTP layer chose for every position the draft forwarded ([positions, k])."""

    logits: Logits
    routes: Routes


@dataclass(frozen=True)
class KvRecord:
    """The shape of one position's COLIKV1 record (spec/protocol.md 4.3)."""

    record_floats: int
    indexer_layers: int


@dataclass(frozen=True)
class Device:
    """An accelerator a backend computes on (HWINFO/GPUS); CPU backends report none.

    ``memory_bytes`` is the device's total memory, ``used_bytes`` what the process holds on
    it, ``experts`` how many routed experts are resident there (GPUS's three numbers)."""

    index: int
    name: str
    memory_bytes: int
    used_bytes: int = 0
    experts: int = 0


@dataclass(frozen=True)
class ExpertNode:
    """One expert worker of a cluster (``--cluster``): which routed experts it holds, as
    ``owned`` (layer, expert) pairs, and the bytes it reported holding once loaded (the NODES
    line)."""

    owned: tuple[tuple[int, int], ...]
    resident_bytes: int


@dataclass(frozen=True)
class TierCounts:
    vram: int
    ram: int
    disk: int
    vram_bytes: int
    ram_bytes: int


@dataclass
class StoreCounters:
    """Monotonic counters; the engine takes differences over a window."""

    lookups: int = 0
    hits: int = 0
    disk_seconds: float = 0.0
    disk_bytes: int = 0
    #: Experts read ahead of their layer's routing (a prediction), and how many of them a
    #: lookup then asked for: useful / prefetched is the prediction's worth.
    prefetched: int = 0
    prefetch_used: int = 0


@dataclass(frozen=True)
class Repin:
    layer: int
    expert: int
    old_tier: int
    gpu: int = -1


class VramTier(Protocol):
    """A device's expert slots (tier 2), driven by the expert store: ``upload`` when the store
    admits an expert to VRAM (False when the device or its budget refuses: the expert then
    stays where it was, in RAM or on disk), ``release`` when it evicts one. The backend that
    computes on the device implements it and reads the expert's bytes itself; the store keeps
    the books (which experts, how many bytes, the budget)."""

    def upload(self, layer: int, expert: int) -> bool: ...
    def release(self, layer: int, expert: int) -> None: ...


class Tiers(Protocol):
    """Where each routed expert lives (EMAP tier bits, TIERS, DONE's hit %, PERF's disk
    time) and the pinned hot set. Which experts to pin is the engine's policy."""

    def tier_matrix(self, rows: Sequence[int], n_experts: int) -> npt.NDArray[np.uint8]: ...
    def tier_counts(self, rows: Sequence[int], n_experts: int) -> TierCounts: ...
    def counters(self) -> StoreCounters: ...
    def pin(self, ranked: Sequence[tuple[int, int]], budget_bytes: int) -> int: ...
    def repin(self) -> list[Repin]: ...

    @property
    def expert_cache_bytes(self) -> int:
        """The RAM tiers' byte budget under RAM_GB (pins + LRU); 0 when RAM is not bounded
        (AUTOPIN then has nothing to share out)."""
        ...


class Backend(Protocol):
    """States are each backend's own type (``Any`` here: a backend takes only states it made)."""

    @property
    def name(self) -> str: ...
    @property
    def build(self) -> str:
        """What besides the weights decides the bytes of a step (versions, kernel variant):
        KV written under one build is resumed only under the same (spec/protocol.md 4.3)."""
        ...
    @property
    def shape(self) -> ModelShape: ...
    @property
    def model_tag(self) -> int:
        """A non-zero int32 naming the model's weights (the ``.coli_kv`` model tag)."""
        ...
    @property
    def has_mtp(self) -> bool: ...
    @property
    def kv_record(self) -> KvRecord: ...
    @property
    def tiers(self) -> Tiers: ...

    def new_state(self) -> Any: ...
    def length(self, state: Any) -> int: ...
    def truncate(self, state: Any, n: int) -> None: ...
    def step(self, rows: Sequence[StepRow]) -> Step: ...
    def draft(self, state: Any, token: int) -> Draft: ...
    def export_kv(self, state: Any, start: int, stop: int) -> npt.NDArray[np.float32]: ...
    def import_kv(
        self, state: Any, tokens: Sequence[int], rows: npt.NDArray[np.float32]
    ) -> None: ...
    def devices(self) -> list[Device]: ...
    def expert_nodes(self) -> list[ExpertNode]:
        """The expert workers holding the routed experts, in owner order; [] when the
        backend computes them itself (no ``--cluster``)."""
        ...
    def close(self) -> None: ...


class ResidentExperts:
    """Tiers of a backend that holds every expert in RAM: tier 1, every lookup a hit, nothing
    to pin. The backend calls ``note_lookups`` for the experts each step routed."""

    def __init__(self, bytes_per_expert: int = 0) -> None:
        self.bytes_per_expert = bytes_per_expert
        self._counters = StoreCounters()

    def note_lookups(self, n: int) -> None:
        self._counters.lookups += n
        self._counters.hits += n

    def tier_matrix(self, rows: Sequence[int], n_experts: int) -> npt.NDArray[np.uint8]:
        return np.full((len(rows), n_experts), TIER_RAM, np.uint8)

    def tier_counts(self, rows: Sequence[int], n_experts: int) -> TierCounts:
        total = len(rows) * n_experts
        return TierCounts(0, total, 0, 0, total * self.bytes_per_expert)

    def counters(self) -> StoreCounters:
        return replace(self._counters)  # a snapshot (vars() needs a __dict__; mypyc has none)

    def pin(self, ranked: Sequence[tuple[int, int]], budget_bytes: int) -> int:
        return 0

    def repin(self) -> list[Repin]:
        return []

    @property
    def expert_cache_bytes(self) -> int:
        return 0


def sparse_layers(shape: ModelShape) -> list[int]:
    return [i for i in range(shape.num_hidden_layers) if shape.is_sparse(i)]


def usage_rows(shape: ModelShape) -> list[int]:
    """Decoder layers with routed experts, in EMAP row order (the MTP layer last)."""
    rows = sparse_layers(shape)
    if shape.num_nextn_predict_layers:
        rows.append(shape.num_hidden_layers)
    return rows
