"""A backend whose step costs (almost) nothing: fixed logits and routes from preallocated
arrays. Driving the engine with it leaves only the control plane's own work to time (bench
section ``control-plane``). Import it only after the control plane has been chosen
(``colibri.control_plane.select``): it imports ``colibri.engine.backend``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import (
    Device,
    Draft,
    ExpertNode,
    KvRecord,
    ResidentExperts,
    Step,
    StepRow,
)


@dataclass(frozen=True)
class SyntheticShape:
    """A model shape without a model: what a backend that computes nothing reports as its
    ``shape`` (this zero backend; the engine tests' fake backend builds its own with it)."""

    vocab_size: int
    num_hidden_layers: int
    n_routed_experts: int
    num_experts_per_tok: int
    #: Decoder layers before this one are dense (``first_k_dense_replace``).
    first_dense: int
    kv_lora_rank: int = 4
    qk_rope_head_dim: int = 2
    index_head_dim: int = 0
    indexer_types: tuple[str, ...] | None = None
    num_nextn_predict_layers: int = 0
    eos_token_ids: tuple[int, ...] = (1,)
    model_type: str = "synthetic"

    def is_sparse(self, layer: int) -> bool:
        return layer >= self.first_dense


#: The bench checkpoint's shape (vocab 8192, 8 layers of which 3 dense, 32 experts top-8).
ZERO_SHAPE = SyntheticShape(vocab_size=8192, num_hidden_layers=8, n_routed_experts=32,
                            num_experts_per_tok=8, first_dense=3, model_type="zero")


class SyntheticBackend:
    """What every backend that computes nothing shares: a shape, an expert table where every
    expert is resident, no MTP head, no devices. Subclasses add the states and ``step``."""

    has_mtp = False

    def __init__(self, shape: SyntheticShape, name: str, build: str) -> None:
        self.config = shape
        self.name = name
        self.build = build
        self.resident = ResidentExperts()

    @property
    def shape(self) -> SyntheticShape:
        return self.config

    @property
    def tiers(self) -> ResidentExperts:
        return self.resident

    def draft(self, state: Any, token: int) -> Draft:
        raise ValueError(f"the {self.name} backend has no MTP head")

    def devices(self) -> list[Device]:
        return []

    def expert_nodes(self) -> list[ExpertNode]:
        return []

    def close(self) -> None:
        pass


class ZeroBackend(SyntheticBackend):
    model_tag = 0x2E40

    def __init__(self, max_rows: int = 16) -> None:
        # Computes nothing: any build of it writes the same (zero) KV.
        super().__init__(ZERO_SHAPE, "zero", "zero 1")
        c = self.config
        rng = np.random.default_rng(0)
        self._logits = (rng.standard_normal((max_rows, c.vocab_size)) * 3).astype(np.float32)
        self._routes = np.tile(np.arange(c.num_experts_per_tok, dtype=np.int32),
                               (max_rows, c.num_hidden_layers - 3, 1))
        #: Seconds spent inside step(): what the bench subtracts from the engine's wall time.
        self.step_seconds = 0.0
        self.steps = 0
        #: (entered, left) perf_counter stamps of every step: the gap between one step's
        #: return and the next call is the control plane's time for that step, measured
        #: directly.
        self.stamps: list[tuple[float, float]] = []

    @property
    def kv_record(self) -> KvRecord:
        return KvRecord(self.config.num_hidden_layers * 6, 0)

    def new_state(self) -> list[int]:
        return [0]

    def length(self, state: Any) -> int:
        return int(state[0])

    def truncate(self, state: Any, n: int) -> None:
        state[0] = min(int(state[0]), n)

    def step(self, rows: Sequence[StepRow]) -> Step:
        started = time.perf_counter()
        for row in rows:
            row.state[0] += 1
        n = len(rows)
        step = Step(self._logits[:n], self._routes[:n])
        left = time.perf_counter()
        self.step_seconds += left - started
        self.steps += 1
        self.stamps.append((started, left))
        return step

    def gaps(self, skip: int = 2) -> list[float]:
        """Seconds between consecutive steps (the first ``skip`` steps, prefill, left out)."""
        marks = self.stamps[skip:]
        return [b[0] - a[1] for a, b in zip(marks, marks[1:], strict=False)]

    def export_kv(self, state: Any, start: int, stop: int) -> npt.NDArray[np.float32]:
        return np.zeros((stop - start, self.kv_record.record_floats), np.float32)

    def import_kv(self, state: Any, tokens: Sequence[int], rows: npt.NDArray[np.float32]) -> None:
        state[0] = len(tokens)
