"""Reading a layer's experts before its routing is known: a guess from the residual stream.

Under a RAM budget a layer's missed experts can only be read once its router has run, so the
disk idles while the layer before computes. The residual stream changes little from one
layer to the next, so the next layers' own routers applied to the residual the step has now
(each with its own post-attention norm) name most of the experts those layers will choose.
``ReadAhead`` asks the expert store to read them ahead (``TieredExpertStore.prefetch``): the
reads queue behind the current layer's misses and run while it computes.

A guess only decides what is read early. The routing that computes is the layer's own, from
its real input, so tokens and bytes never depend on it; a wrong guess costs a read and an LRU
slot. The store counts the experts read ahead and how many of them a lookup then asked for
(``StoreCounters.prefetched`` / ``prefetch_used``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from colibri.reference.tensors import F32

#: Layers read ahead of the current one (``READ_AHEAD``), by default none: on this project's
#: bench models (random weights) a guess names too few of the experts a layer then misses
#: for the extra reads to pay (docs/out-of-core.md gives the measurement); a trained
#: model's residual stream changes less from layer to layer.
DEFAULT_DEPTH = 0


@dataclass(frozen=True)
class RouterGuess:
    """A routed layer's router as a guess: its post-attention RMSNorm weight, its router
    [E, d] and correction bias, ``top_k`` per row."""

    layer: int
    norm: F32
    gate: F32
    bias: F32 | None
    eps: float
    top_k: int

    def experts(self, x: F32) -> list[int]:
        """The distinct experts the rows of ``x`` [m, d] would choose here, ascending."""
        x64 = x.astype(np.float64)
        normed = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.eps)
        scores = 1.0 / (1.0 + np.exp(-(normed * self.norm) @ self.gate.T))
        if self.bias is not None:
            scores = scores + self.bias
        k = min(self.top_k, scores.shape[-1])
        chosen = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
        return sorted({int(e) for e in chosen.reshape(-1)})


#: The store's read-ahead: (layer, experts) -> reads started.
Prefetch = Callable[[int, Iterable[int]], int]


class ReadAhead:
    """The guesses of a run of layers (None for a layer without routed experts, or whose
    router is not float), the store's prefetch, how many routed layers ahead to guess, and
    the most rows a step may have to read ahead (a prefill chunk's rows choose most of a
    layer's experts between them: nothing to guess)."""

    def __init__(self, guesses: Sequence[RouterGuess | None], prefetch: Prefetch,
                 depth: int, max_rows: int) -> None:
        self._guesses = list(guesses)
        self._prefetch = prefetch
        self.depth = depth
        self.max_rows = max_rows

    def __call__(self, after: int, x: F32) -> int:
        """The step is past layer ``after`` (an index into the guesses; -1: before the first)
        with residual ``x``: read ahead for the next ``depth`` routed layers. Returns how
        many reads were started."""
        if self.depth <= 0 or x.shape[0] > self.max_rows:
            return 0
        started = 0
        ahead = [g for g in self._guesses[after + 1 :] if g is not None][: self.depth]
        for guess in ahead:
            started += self._prefetch(guess.layer, guess.experts(x))
        return started
