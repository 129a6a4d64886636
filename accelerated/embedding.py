"""The token embedding of the accelerated engine: a lookup that reads only the looked-up rows.

A float embedding stays a memory-mapped view in its stored dtype and a lookup converts the
rows it gathers. An int8-row (fmt1) embedding -- ``colibri convert --io int8``, colibri's
real containers (spec/model.md §14) -- stays in the container's bytes: a lookup decodes the
gathered rows as ``q * s`` in float32, the same single rounding as the reference's
dequantize-at-load, so both engines embed a token to the same bytes. Any other quantized
format is dequantized once at load (no converter writes one; colibri's ``--io-bits`` below
8 would), which is correct but holds a float32 copy.

``head`` is the same weight as a product operand, for ``tie_word_embeddings``: the int8
table is then also the lm_head, read by the fused kernels in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from colibri.accelerated.kernels import F32, QuantWeight, Weight
from colibri.accelerated.quant_kernels import QuantMatrix
from colibri.accelerated.weights import WeightLoader
from colibri.reference.quant.formats import Fmt

EMBED_TENSOR = "model.embed_tokens.weight"


class Embedding:
    """``rows(ids)`` -> float32 ``[len(ids), hidden]``; ids are checked against the vocabulary."""

    __slots__ = ("weight", "vocab", "_q", "_scales")

    def __init__(self, weight: Weight | QuantWeight) -> None:
        self.weight = weight
        self.vocab = weight.rows
        self._q: np.ndarray | None = None
        self._scales: F32 | None = None
        if isinstance(weight, QuantWeight):
            m: QuantMatrix = weight.matrix
            if m.fmt != Fmt.INT8_ROW:
                raise ValueError(f"{m.name}: only an int8-row embedding is looked up in place")
            self._q = m.payload.view(np.int8).reshape(m.out_features, m.in_features)
            self._scales = m.scales

    @property
    def head(self) -> Weight | QuantWeight:
        return self.weight

    @property
    def quantized(self) -> bool:
        return self._q is not None

    def rows(self, ids: Sequence[int]) -> F32:
        for tok in ids:
            if not 0 <= int(tok) < self.vocab:
                raise ValueError(f"token id {tok} is outside the vocabulary [0, {self.vocab})")
        index = np.asarray(ids, dtype=np.int64)
        if self._q is None:
            assert isinstance(self.weight, Weight)
            out: F32 = np.ascontiguousarray(self.weight.array[index].astype(np.float32))
            return out
        assert self._scales is not None
        decoded: F32 = np.ascontiguousarray(
            self._q[index].astype(np.float32) * self._scales[index][:, None], dtype=np.float32)
        return decoded


def load_embedding(t: WeightLoader, shape: tuple[int, int]) -> Embedding:
    """The model's embedding: float in place, int8-row in place, any other format dequantized
    once (``WeightLoader.matrix``). Sizes and scales are checked here, at load."""
    weight = t.product(EMBED_TENSOR, shape)
    if isinstance(weight, QuantWeight) and weight.matrix.fmt != Fmt.INT8_ROW:
        weight = t.matrix(EMBED_TENSOR, shape)
    return Embedding(weight)
