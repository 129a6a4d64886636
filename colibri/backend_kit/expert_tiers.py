"""The expert tiers a backend opens: mapped experts when RAM is not bounded, the disk tier under
a RAM budget.

Without ``RAM_GB`` the model is expected to fit: experts stay memory-mapped (zero-copy, and
the page cache is shared by every engine process on the machine), and the store's LRU is
bookkeeping for TIERS/EMAP. With ``RAM_GB`` the budget covers the whole process
(``memory_budget``): experts that are not resident are read by the disk tier into memory the
store owns and accounts, nothing of them stays in the page cache, and a step's rows are split
so that one layer's experts for one chunk fit what the budget leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TextIO

from colibri.backend_kit.expert_disk import DiskTier, StoredTensors, checkpoint_extents
from colibri.backend_kit.memory_budget import MemoryBudget, kv_bytes, split_budget
from colibri.backend_kit.tiered_expert_store import ExpertReader, StoredBytes, TieredExpertStore
from colibri.reference.config import ModelConfig
from colibri.reference.experts import stored_expert_bytes
from colibri.reference.safetensors import Checkpoint

#: Rows a step may forward at once under a budget (a prefill's chunk), at most.
STEP_ROWS = 8
#: A backend's expert from its stored tensors: (stored, layer, expert) -> what it computes
#: with (``ExpertWeights`` for the reference, the accelerated engine's ``Expert``). It runs
#: on the disk tier's reading threads, so it must be thread-safe and leave the kernels'
#: thread pool alone.
BuildExpert = Callable[[StoredTensors, int, int], Any]


@dataclass(frozen=True)
class ExpertMemory:
    """What the backend holds besides routed experts, and how it holds experts."""

    #: Bytes of every weight that is not a routed expert, as the backend computes with them.
    dense: int
    #: KV floats per position of one sequence (every layer's cache arrays, the MTP's, and
    #: the hidden state the MTP head reads).
    kv_floats_per_position: int
    #: The process's anonymous memory once the model is open, before any expert is read.
    runtime: int
    #: Bytes one read expert occupies (stored bytes for a backend computing on them in place,
    #: float32 for one that converts).
    held_bytes: StoredBytes


@dataclass(frozen=True)
class Tiers:
    store: TieredExpertStore
    #: None: RAM not bounded (mapped experts).
    budget: MemoryBudget | None
    disk: DiskTier | None
    #: The most rows a step may forward at once under the budget (None: no limit).
    max_step_rows: int | None
    #: The RSS guard's threshold (RSS_GUARD_GB, else the budget; 0: none).
    rss_guard_bytes: int = 0


def dense_bytes(checkpoint: Checkpoint, cfg: ModelConfig, rows: Sequence[int]) -> int:
    """The file bytes of every tensor that is not a routed expert."""
    stored = stored_expert_bytes(checkpoint)
    experts = sum(stored(layer, e) for layer in rows for e in range(cfg.n_routed_experts))
    return checkpoint.total_bytes - experts


def open_tiers(checkpoint: Checkpoint, cfg: ModelConfig, rows: Sequence[int],
               mapped: ExpertReader, build: BuildExpert, memory: ExpertMemory, *,
               ram_budget_bytes: int, kv_slots: int, ctx: int, log: TextIO,
               rss_guard_bytes: int = 0) -> Tiers:
    """The store over ``mapped`` experts (no budget) or the disk tier (``ram_budget_bytes``);
    ``BudgetTooSmall`` when the budget cannot hold the model's fixed part."""
    stored = stored_expert_bytes(checkpoint)
    if not ram_budget_bytes:
        return Tiers(TieredExpertStore(mapped, cfg, rows, 0, stored), None, None, None)
    largest = max((memory.held_bytes(layer, 0) for layer in rows), default=0)
    top_k = cfg.num_experts_per_tok
    kv = kv_bytes(kv_slots, ctx, memory.kv_floats_per_position)
    # A step holds one layer's experts for its rows while they compute, beyond what the cache
    # keeps: up to ``rows * top_k`` of them. The reserve is for STEP_ROWS rows, fewer where
    # they would take more than a quarter of what the budget leaves for experts; a longer step
    # (a prefill) is forwarded that many rows at a time.
    per_row = top_k * max(largest, 1)
    left = ram_budget_bytes - memory.runtime - memory.dense - kv
    step_rows = max(1, min(STEP_ROWS, left // (4 * per_row)))
    budget = split_budget(ram_budget_bytes, runtime=memory.runtime, dense=memory.dense, kv=kv,
                          step=step_rows * per_row)
    disk = DiskTier(checkpoint_extents(checkpoint))

    def read(layer: int, expert: int) -> Any:
        return build(disk.read(layer, expert), layer, expert)

    def read_submit(keys: Sequence[tuple[int, int]]) -> list[Future[Any]]:
        # Checked and built on the reading threads, while the caller computes.
        return disk.submit(keys, build)

    # A store's budget of 0 means unbounded: a budget that leaves no expert cache is 1 byte,
    # which holds no expert.
    store = TieredExpertStore(read, cfg, rows, max(1, budget.experts), stored,
                              read_submit=read_submit, held_bytes=memory.held_bytes)
    max_rows = step_rows if rows else None
    # A step of at most half the rows the reserve is for leaves the other half free while
    # its layer computes: the experts of the next layers read ahead live there.
    store.read_ahead_bytes = (step_rows // 2) * per_row
    if rows and memory.held_bytes(rows[0], 0) == stored(rows[0], 0):
        # The cached experts live in their read buffers (a backend that converts them keeps
        # copies instead): those buffers, faulted in before the reads need them.
        per_expert = max(stored(rows[0], 0), 1)
        total = len(rows) * cfg.n_routed_experts
        disk.warm(rows[0], 0, min(total, budget.experts // per_expert))
        # When the RSS guard shrinks the cache, the buffers its experts held go too.
        store.on_trim = lambda lru_bytes: disk.keep_buffers(lru_bytes // per_expert)
    print(f"== {budget.describe()}; experts read from disk "
          f"({'O_DIRECT' if disk.counters.direct else 'buffered'}) ==", file=log)
    return Tiers(store, budget, disk, max_rows, rss_guard_bytes or ram_budget_bytes)
