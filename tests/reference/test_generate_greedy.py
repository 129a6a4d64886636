"""greedy_tokens and temperature-0 sampling pick the same token, NaN included."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from colibri.reference import ReferenceModel

from colibri.engine.generate import greedy_tokens, sampled_tokens
from colibri.engine.rng import Rng


class _ScriptedModel:
    """Returns fixed logits rows, one per call, whatever the tokens."""

    def __init__(self, rows: Sequence[Sequence[float]]) -> None:
        self.rows = [np.asarray(r, dtype=np.float32) for r in rows]
        self.calls = 0

    def new_state(self) -> object:
        return object()

    def _next(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        row = self.rows[self.calls]
        self.calls += 1
        return row

    def prefill(self, state: object, ids: Sequence[int]) -> np.ndarray[Any, Any]:
        return self._next()[None, :]

    def decode(self, state: object, token: int) -> np.ndarray[Any, Any]:
        return self._next()


_ROWS = [[np.nan, 1.0, 3.0, 3.0], [2.0, np.nan, 2.0, -np.inf], [np.nan, np.nan, np.nan, np.nan]]


def test_greedy_skips_nan_and_takes_the_first_maximum() -> None:
    ids = list(greedy_tokens(cast(ReferenceModel, _ScriptedModel(_ROWS)), [0], 3))
    assert ids == [2, 0, 0]


def test_greedy_matches_temperature_zero_sampling() -> None:
    greedy = list(greedy_tokens(cast(ReferenceModel, _ScriptedModel(_ROWS)), [0], 3))
    sampled = list(sampled_tokens(cast(ReferenceModel, _ScriptedModel(_ROWS)), [0], 3,
                                  temperature=0.0, top_p=1.0, rng=Rng(1)))
    assert greedy == sampled
