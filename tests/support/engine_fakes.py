"""A small deterministic fake Backend (colibri.engine.backend) for the engine's own tests.

Logits at a position are a pseudo-random function of the bytes of every KV row so far, so
prefix reuse, persistence and batching are all observable: a wrong KV row changes the output.
Rows are computed one position at a time, which makes every step's rows independent of the
batch by construction (the real backends must earn that property; this one only lets the
engine's protocol machinery be tested on its own).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import (
    Device,
    Draft,
    KvRecord,
    ResidentExperts,
    Step,
    StepRow,
    StepTiming,
    sparse_layers,
)


@dataclass(frozen=True)
class FakeConfig:
    vocab_size: int = 64
    num_hidden_layers: int = 3
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    kv_lora_rank: int = 4
    qk_rope_head_dim: int = 2
    index_head_dim: int = 0
    indexer_types: tuple[str, ...] | None = None
    num_nextn_predict_layers: int = 0
    eos_token_ids: tuple[int, ...] = (1,)
    first_dense: int = 1

    def is_sparse(self, layer: int) -> bool:
        return layer >= self.first_dense


@dataclass
class FakeState:
    rows: list[npt.NDArray[np.float32]] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.rows)


class FakeBackend:
    has_mtp = False
    model_tag = 0x1234

    def __init__(
        self,
        config: FakeConfig | None = None,
        eos_bias: float = 0.0,
        *,
        timing: StepTiming | None = None,
        devices: Sequence[Device] = (),
        name: str = "fake",
        build: str = "fake 1",
    ) -> None:
        #: Two fakes under different names or builds stand for two backends (persistence).
        self.name = name
        self.build = build
        # Another build computes other KV rows (so mixing would show); the default build
        # keeps the rows the recorded transcripts were made with.
        self._salt = [] if build == "fake 1" else [zlib.crc32(build.encode())]
        self.imported = 0
        self.config = config or FakeConfig()
        self.eos_bias = eos_bias
        #: What every step reports as its timing (the fake measures nothing itself).
        self.timing = timing or StepTiming()
        self._devices = list(devices)
        self.forward_rows = 0
        self.resident = ResidentExperts()

    @property
    def shape(self) -> FakeConfig:
        return self.config

    @property
    def tiers(self) -> ResidentExperts:
        return self.resident

    @property
    def kv_record(self) -> KvRecord:
        return KvRecord(self.record_floats, 0)

    @property
    def record_floats(self) -> int:
        c = self.config
        return c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim)

    def new_state(self) -> FakeState:
        return FakeState()

    def length(self, state: Any) -> int:
        return len(state.rows)

    def truncate(self, state: Any, n: int) -> None:
        if not 0 <= n <= len(state.rows):
            raise ValueError(f"cannot truncate a state of length {len(state.rows)} to {n}")
        del state.rows[n:]
        del state.crcs[n:]

    def _kv_row(self, state: FakeState, token: int) -> npt.NDArray[np.float32]:
        prev = state.crcs[-1] if state.crcs else 0
        rng = np.random.default_rng([prev, token, len(state.rows), *self._salt])
        return rng.standard_normal(self.record_floats).astype(np.float32)

    def _append(self, state: FakeState, row: npt.NDArray[np.float32]) -> None:
        prev = state.crcs[-1] if state.crcs else 0
        state.rows.append(row)
        state.crcs.append(zlib.crc32(row.tobytes(), prev))

    def _forward_one(
        self, state: FakeState, token: int
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
        if not 0 <= token < self.config.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary")
        self._append(state, self._kv_row(state, token))
        rng = np.random.default_rng([state.crcs[-1], 7])
        logits = (rng.standard_normal(self.config.vocab_size) * 3.0).astype(np.float32)
        for eos in self.config.eos_token_ids:
            logits[eos] += np.float32(self.eos_bias)
        c = self.config
        routes = np.stack([
            np.sort(rng.choice(c.n_routed_experts, c.num_experts_per_tok, replace=False))
            for _ in sparse_layers(c)
        ]).astype(np.int32) if sparse_layers(c) else np.zeros((0, c.num_experts_per_tok), np.int32)
        self.forward_rows += 1
        return logits, routes

    def step(self, rows: Sequence[StepRow]) -> Step:
        logits, routes = [], []
        for row in rows:
            row_logits, row_routes = self._forward_one(row.state, row.token)
            if row.wants_logits:
                logits.append(row_logits)
            routes.append(row_routes)
        c = self.config
        self.resident.note_lookups(sum(r.size for r in routes))
        return Step(
            np.stack(logits) if logits else np.zeros((0, c.vocab_size), np.float32),
            np.stack(routes) if routes else np.zeros((0, 0, c.num_experts_per_tok), np.int32),
            self.timing,
        )

    def draft(self, state: Any, token: int) -> Draft:
        raise ValueError("the fake backend has no MTP head")

    def export_kv(self, state: Any, start: int, stop: int) -> npt.NDArray[np.float32]:
        return np.stack(state.rows[start:stop]).astype(np.float32)

    def import_kv(
        self, state: Any, tokens: Sequence[int], rows: npt.NDArray[np.float32]
    ) -> None:
        self.imported += 1
        self.truncate(state, 0)
        for row in rows:
            self._append(state, np.asarray(row, np.float32))

    def devices(self) -> list[Device]:
        return list(self._devices)

    def close(self) -> None:
        pass


class ByteTokenizer:
    """Ids 0..255 are bytes; 256.. are added tokens (special), matched before bytes."""

    ADDED = ("<|endoftext|>", "<|user|>", "<|assistant|>", "[gMASK]", "<sop>")

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for n, token in enumerate(self.ADDED):
                if text.startswith(token, i):
                    out.append(256 + n)
                    i += len(token)
                    break
            else:
                out.extend(text[i].encode("utf-8"))
                i += 1
        return out

    def token_bytes(self, token_id: int) -> bytes:
        if token_id >= 256:
            return self.ADDED[token_id - 256].encode()
        return bytes([token_id])

    def token_to_id(self, token: str) -> int | None:
        return 256 + self.ADDED.index(token) if token in self.ADDED else None

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(range(256, 256 + len(self.ADDED)))
