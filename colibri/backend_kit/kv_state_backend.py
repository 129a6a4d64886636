"""The engine seam's bookkeeping for a backend whose sequences are ``KVState``s.

Both backends keep their states in :class:`~colibri.backend_kit.kv_state.KVState`, so they
share everything here: shape, model tag, the COLIKV1 record layout and codec, tiers, state
length and truncation, MTP drafts, and the step wrapper that reads the phase clock around one
``forward_rows`` call (PERF/PROF). A backend adds ``name``, ``build``, ``close`` and its model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from colibri.backend_kit.kv_codec import KvRecordCodec
from colibri.backend_kit.kv_state import KVState
from colibri.backend_kit.memory_budget import resident_bytes
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.backend_kit.remote_experts import RemoteExperts
from colibri.backend_kit.tiered_expert_store import TieredExpertStore
from colibri.engine.backend import (
    BackendReadError,
    Device,
    Draft,
    ExpertNode,
    KvRecord,
    Step,
    StepRow,
    StepTiming,
)
from colibri.reference.config import ModelConfig

#: Steps between two checks of the RSS guard (colibri checks every 16 tokens).
GUARD_EVERY = 16


class KVStateModel(Protocol):
    """What :class:`KVStateBackend` needs of a model: any model that keeps its cache in
    :class:`KVState` and its phase times in a :class:`PhaseClock` (both engines' do)."""

    @property
    def config(self) -> ModelConfig: ...
    @property
    def mtp(self) -> object | None: ...
    @property
    def clock(self) -> PhaseClock: ...
    #: On a cluster, the expert workers that compute the routed experts.
    remote_experts: RemoteExperts | None
    def new_state(self) -> KVState: ...
    def forward_rows(
        self, states: Sequence[KVState], tokens: Sequence[int], wants_logits: Sequence[bool]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]: ...
    def mtp_draft_routed(
        self, state: KVState, token: int
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]: ...


class KVStateBackend:
    """The seam's bookkeeping for a backend whose states are :class:`KVState`: shape, model
    tag, KV record layout and codec, tiers, state length/truncation, the step with its phase
    clock, MTP drafts, no devices. A backend adds ``name``, ``build`` and ``close``."""

    def __init__(self, model: KVStateModel, store: TieredExpertStore, model_tag: int) -> None:
        self._kv_model = model
        self.store = store
        self._tag = model_tag
        self._codec = KvRecordCodec(model.new_state())

    @property
    def shape(self) -> ModelConfig:
        return self._kv_model.config

    @property
    def model_tag(self) -> int:
        return self._tag

    @property
    def has_mtp(self) -> bool:
        return self._kv_model.mtp is not None

    @property
    def kv_record(self) -> KvRecord:
        return KvRecord(self._codec.record_floats, self._codec.indexer_layers)

    @property
    def tiers(self) -> TieredExpertStore:
        return self.store

    def new_state(self) -> KVState:
        return self._kv_model.new_state()

    #: colibri's RSS guard: every ``GUARD_EVERY`` steps, resident memory above this many
    #: bytes shrinks the expert LRU by the excess (0: no guard).
    rss_guard_bytes: int = 0
    _steps = 0


    def step(self, rows: Sequence[StepRow]) -> Step:
        clock = self._kv_model.clock
        clock.reset()
        started = time.perf_counter()
        before = {id(r.state): (r.state, r.state.length) for r in rows}
        try:
            logits, routes = self._kv_model.forward_rows(
                [r.state for r in rows], [r.token for r in rows], [r.wants_logits for r in rows])
        except BackendReadError:
            # An earlier chunk of a long step may have appended rows: the failed step leaves
            # no trace.
            for state, length in before.values():
                state.truncate(length)
            raise
        total = time.perf_counter() - started
        self._steps += 1
        if self.rss_guard_bytes and self._steps % GUARD_EVERY == 0:
            excess = resident_bytes() - self.rss_guard_bytes
            if excess > 0:
                self.store.trim(excess)
        return Step(
            logits, routes, StepTiming(total, clock.matmul_s, clock.attention_s, clock.head_s)
        )

    def length(self, state: Any) -> int:
        assert isinstance(state, KVState)
        return state.length

    def truncate(self, state: Any, n: int) -> None:
        assert isinstance(state, KVState)
        state.truncate(n)

    def draft(self, state: Any, token: int) -> Draft:
        assert isinstance(state, KVState)
        logits, routes = self._kv_model.mtp_draft_routed(state, token)
        return Draft(logits, routes)

    def export_kv(self, state: Any, start: int, stop: int) -> npt.NDArray[np.float32]:
        return self._codec.export_rows(state, start, stop)

    def import_kv(self, state: Any, tokens: Sequence[int], rows: npt.NDArray[np.float32]) -> None:
        self._codec.restore(state, tokens, rows)

    def devices(self) -> list[Device]:
        return []  # both compute on the CPU: HWINFO counts no devices, GPUS is `GPUS 0`

    def expert_nodes(self) -> list[ExpertNode]:
        remote = self._kv_model.remote_experts
        return [] if remote is None else remote.nodes()
