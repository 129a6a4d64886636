"""What the engine needs from a model, tokenizer and KV state, as structural types.

The engine drives any model with this surface (the reference model, the accelerated one, or
a test double): ``prefill`` appends prompt tokens to a KV state and returns their logits,
``decode_batch`` advances several states by one token each in one forward whose rows are
bit-identical to separate ``decode`` calls, and ``route_observer`` reports every routed-expert
selection for the usage telemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Logits = npt.NDArray[np.float32]
RouteObserver = Callable[[int, tuple[int, ...]], None]


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


class KVState(Protocol):
    @property
    def length(self) -> int: ...
    def truncate(self, n: int) -> None: ...


class EngineModel(Protocol):
    """States are the model's own type (Any here: each model takes only states it made)."""

    @property
    def config(self) -> ModelShape: ...

    route_observer: RouteObserver | None

    def new_state(self) -> KVState: ...
    def prefill(self, state: Any, ids: Sequence[int]) -> Logits: ...
    def decode(self, state: Any, token: int) -> Logits: ...
    def decode_batch(self, states: Sequence[Any], tokens: Sequence[int]) -> Logits: ...


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def token_bytes(self, token_id: int) -> bytes: ...
    def token_to_id(self, token: str) -> int | None: ...
    @property
    def special_ids(self) -> frozenset[int]: ...


class KvCodec(Protocol):
    """Moves a state's KV rows to and from COLIKV1 records (the MTP row is never saved)."""

    @property
    def record_floats(self) -> int: ...
    @property
    def indexer_layers(self) -> int: ...
    def export_rows(self, state: Any, start: int, stop: int) -> npt.NDArray[np.float32]: ...
    def restore(self, state: Any, tokens: Sequence[int], rows: npt.NDArray[np.float32]) -> None: ...


def sparse_layers(shape: ModelShape) -> list[int]:
    return [i for i in range(shape.num_hidden_layers) if shape.is_sparse(i)]


def usage_rows(shape: ModelShape) -> list[int]:
    """Decoder layers with routed experts, in EMAP row order (the MTP layer last)."""
    rows = sparse_layers(shape)
    if shape.num_nextn_predict_layers:
        rows.append(shape.num_hidden_layers)
    return rows


def token_payload(tokenizer: TextTokenizer | None, token: int) -> bytes:
    """DATA/ECHO payload of one token: its bytes, or ' <id>' for a model without tokenizer."""
    if tokenizer is None:
        return f" {token}".encode("ascii")
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
