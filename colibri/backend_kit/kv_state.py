"""The incremental state of one sequence: its tokens and the latent KV cache of every layer.

Per layer and position the cache holds what MLA needs (the normed latent [kv_lora] and the
rotated shared rope key [rope]) and, on DSA layers that run an indexer, the indexer key
[index_head_dim]. The state also keeps the final pre-norm hidden state of every position (the
MTP head's input). Arrays grow by doubling; ``truncate(n)`` forgets positions >= n, which is how
a reused prompt prefix is kept.

Both backends keep their sequences in these states, so the COLIKV1 codec and ``.coli_kv``
files are shared. ``cache_widths`` says which arrays a layer keeps.

Spec: spec/model.md §10.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from colibri.reference.config import ModelConfig
from colibri.reference.tensors import F32


def cache_widths(cfg: ModelConfig, indexer_mode: str | None) -> dict[str, int]:
    """The cache arrays of one layer and their widths: the latent and the rope key, plus the
    indexer key on a layer that runs its DSA indexer ("full"); for a standard-attention family
    (OLMoE, Qwen3-MoE: §5.3) each position's rotated key and its value, every KV head's."""
    if cfg.attention == "mha":
        width = cfg.num_key_value_heads * cfg.qk_head_dim
        return {"key": width, "value": width}
    widths = {"latent": cfg.kv_lora_rank, "rope_key": cfg.qk_rope_head_dim}
    if indexer_mode == "full":
        widths["index_key"] = cfg.index_head_dim
    return widths


class KVLayer:
    """Growable per-layer cache arrays; rows [0, length) of the owning state are valid."""

    def __init__(self, widths: dict[str, int]) -> None:
        self.widths = dict(widths)
        self.arrays: dict[str, F32] = {k: np.zeros((0, w), np.float32) for k, w in widths.items()}

    def reserve(self, capacity: int) -> None:
        for name, array in self.arrays.items():
            if array.shape[0] < capacity:
                grown = np.zeros((max(capacity, 2 * array.shape[0], 16), self.widths[name]),
                                 np.float32)
                grown[: array.shape[0]] = array
                self.arrays[name] = grown

    def __getitem__(self, name: str) -> F32:
        return self.arrays[name]


@dataclass
class MtpCache:
    """The MTP layer's own cache: entry i is position ``start + i``."""

    layer: KVLayer
    start: int | None = None
    length: int = 0


@dataclass
class KVState:
    layers: list[KVLayer]
    hidden_size: int
    tokens: list[int] = field(default_factory=list)
    hidden: F32 = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    mtp: MtpCache | None = None

    def __post_init__(self) -> None:
        if self.hidden.shape[1] != self.hidden_size:
            self.hidden = np.zeros((0, self.hidden_size), np.float32)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reserve(self, capacity: int) -> None:
        for layer in self.layers:
            layer.reserve(capacity)
        if self.hidden.shape[0] < capacity:
            grown = np.zeros((max(capacity, 2 * self.hidden.shape[0], 16), self.hidden_size),
                             np.float32)
            grown[: self.hidden.shape[0]] = self.hidden
            self.hidden = grown

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` positions (0 <= n <= length)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a state of length {self.length} to {n}")
        del self.tokens[n:]
        if self.mtp is not None and self.mtp.start is not None:
            # An MTP entry at position i used hidden[i] and token i+1: both must survive.
            keep = max(0, min(self.mtp.length, n - 1 - self.mtp.start))
            self.mtp.length = keep
            if keep == 0:
                self.mtp.start = None

    @property
    def floats_per_position(self) -> int:
        """The floats one position takes: every layer's cache rows, the MTP layer's and the
        hidden state the MTP head reads."""
        mtp = [] if self.mtp is None else [self.mtp.layer]
        return self.hidden_size + sum(sum(layer.widths.values())
                                      for layer in [*self.layers, *mtp])

    def layer_arrays(self, layer: int) -> dict[str, F32]:
        """The valid cache rows of one layer, by name (views; for persistence)."""
        kv = self.layers[layer]
        return {name: array[: self.length] for name, array in kv.arrays.items()}

    def export_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume this sequence, as named arrays (copies).

        ``tokens`` [n] int64, ``hidden`` [n, D], and ``layers.L.<name>`` for every cache array
        of layer L. The MTP cache is not included: it refills itself at the next draft.
        """
        out: dict[str, np.ndarray] = {
            "tokens": np.asarray(self.tokens, dtype=np.int64),
            "hidden": self.hidden[: self.length].copy(),
        }
        for i in range(len(self.layers)):
            for name, array in self.layer_arrays(i).items():
                out[f"layers.{i}.{name}"] = array.copy()
        return out

    def import_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Replace this (fresh or used) state's contents with ``export_arrays`` output.

        Every array is checked against this state's layout; a mismatch raises ValueError
        naming the array, and leaves the state unchanged.
        """
        tokens = arrays.get("tokens")
        if tokens is None or tokens.ndim != 1:
            raise ValueError("state arrays: 'tokens' missing or not one-dimensional")
        n = int(tokens.shape[0])
        expected = {"hidden": (n, self.hidden_size)}
        for i, layer in enumerate(self.layers):
            for name, width in layer.widths.items():
                expected[f"layers.{i}.{name}"] = (n, width)
        for key, shape in expected.items():
            got = arrays.get(key)
            if got is None:
                raise ValueError(f"state arrays: '{key}' is missing")
            if tuple(got.shape) != shape:
                raise ValueError(f"state arrays: '{key}' has shape {list(got.shape)}, "
                                 f"expected {list(shape)}")
            if not np.isfinite(got).all():
                raise ValueError(f"state arrays: '{key}' holds non-finite values")
        extra = set(arrays) - set(expected) - {"tokens"}
        if extra:
            raise ValueError(f"state arrays: unexpected {', '.join(sorted(extra))}")
        self.truncate(0)
        self.reserve(n)
        self.hidden[:n] = arrays["hidden"]
        for i, layer in enumerate(self.layers):
            for name in layer.widths:
                layer.arrays[name][:n] = arrays[f"layers.{i}.{name}"]
        self.tokens.extend(int(t) for t in tokens)


def step_positions(states: list[KVState]) -> list[int]:
    """The position of every row of one engine step, with room reserved for it (spec §10).

    A state may appear in several rows (a prefill is rows of one state): its rows take its
    next positions in row order. Every state's cache grows once, to its last row's position.
    """
    ahead: dict[int, int] = {}
    positions: list[int] = []
    for s in states:
        offset = ahead.get(id(s), 0)
        positions.append(s.length + offset)
        ahead[id(s)] = offset + 1
    needed: dict[int, tuple[KVState, int]] = {}
    for s, p in zip(states, positions, strict=True):
        needed[id(s)] = (s, max(p + 1, needed.get(id(s), (s, 0))[1]))
    for s, capacity in needed.values():
        s.reserve(capacity)
    return positions


def mtp_rows(state: KVState, token: int) -> tuple[list[int], list[int], list[int]]:
    """What an MTP draft forwards (spec §9): the positions, the next token of each, and each
    one's slot in the MTP cache, whose room is reserved here.

    The MTP cache fills lazily from the first position drafted at: it is rebuilt from its
    first missing entry, and the entry for the last position is always recomputed because
    its token may differ from an earlier draft at the same position.
    """
    cache = state.mtp
    if cache is None:
        raise ValueError("this model has no MTP head")
    if state.length == 0:
        raise ValueError("mtp_draft needs a state with at least one position")
    last = state.length - 1
    if cache.start is None:
        cache.start = last
        cache.length = 0
    first = cache.start + min(cache.length, last - cache.start)
    positions = list(range(first, last + 1))
    next_tokens = [state.tokens[i + 1] for i in positions[:-1]] + [int(token)]
    slots = [p - cache.start for p in positions]
    cache.layer.reserve(slots[-1] + 1)
    return positions, next_tokens, slots
