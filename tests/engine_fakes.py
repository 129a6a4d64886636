"""A small deterministic model with the engine-facing surface of colibri.reference models.

Logits at a position are a pseudo-random function of the bytes of every KV row so far, so
prefix reuse, persistence and batching are all observable: a wrong KV row changes the output.
Rows are computed one position at a time, which makes prefill, decode and decode_batch
bit-identical by construction (the real model must earn that property; this one only lets the
engine's protocol machinery be tested on its own).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import RouteObserver


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
    tokens: list[int] = field(default_factory=list)
    rows: list[npt.NDArray[np.float32]] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]
        del self.rows[n:]
        del self.crcs[n:]


class FakeModel:
    def __init__(self, config: FakeConfig | None = None, eos_bias: float = 0.0) -> None:
        self.config = config or FakeConfig()
        self.route_observer: RouteObserver | None = None
        self.eos_bias = eos_bias
        self.forward_rows = 0

    @property
    def record_floats(self) -> int:
        c = self.config
        return c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim)

    def new_state(self) -> FakeState:
        return FakeState()

    def _kv_row(self, state: FakeState, token: int) -> npt.NDArray[np.float32]:
        prev = state.crcs[-1] if state.crcs else 0
        rng = np.random.default_rng([prev, token, len(state.tokens)])
        return rng.standard_normal(self.record_floats).astype(np.float32)

    def _append(self, state: FakeState, token: int, row: npt.NDArray[np.float32]) -> None:
        prev = state.crcs[-1] if state.crcs else 0
        state.tokens.append(token)
        state.rows.append(row)
        state.crcs.append(zlib.crc32(row.tobytes(), prev))

    def _logits(self, state: FakeState) -> npt.NDArray[np.float32]:
        crc = state.crcs[-1]
        rng = np.random.default_rng([crc, 7])
        logits = (rng.standard_normal(self.config.vocab_size) * 3.0).astype(np.float32)
        for eos in self.config.eos_token_ids:
            logits[eos] += np.float32(self.eos_bias)
        if self.route_observer is not None:
            c = self.config
            for layer in range(c.num_hidden_layers):
                if c.is_sparse(layer):
                    experts = rng.choice(c.n_routed_experts, c.num_experts_per_tok, replace=False)
                    self.route_observer(layer, tuple(int(e) for e in sorted(experts)))
        self.forward_rows += 1
        return logits

    def _forward_one(self, state: FakeState, token: int) -> npt.NDArray[np.float32]:
        self._append(state, token, self._kv_row(state, token))
        return self._logits(state)

    def prefill(self, state: FakeState, ids: Sequence[int]) -> npt.NDArray[np.float32]:
        return np.stack([self._forward_one(state, t) for t in ids])

    def decode(self, state: FakeState, token: int) -> npt.NDArray[np.float32]:
        return self._forward_one(state, token)

    def decode_batch(
        self, states: Sequence[FakeState], tokens: Sequence[int]
    ) -> npt.NDArray[np.float32]:
        return np.stack([self._forward_one(s, t) for s, t in zip(states, tokens, strict=True)])


class FakeCodec:
    """KV rows of FakeState <-> COLIKV1 records."""

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.record_floats = model.record_floats
        self.indexer_layers = 0

    def export_rows(self, state: FakeState, start: int, stop: int) -> npt.NDArray[np.float32]:
        return np.stack(state.rows[start:stop]).astype(np.float32)

    def restore(
        self, state: FakeState, tokens: Sequence[int], rows: npt.NDArray[np.float32]
    ) -> None:
        state.truncate(0)
        for token, row in zip(tokens, rows, strict=True):
            self.model._append(state, int(token), np.asarray(row, np.float32))


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
