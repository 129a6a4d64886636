"""Greedy generation over the incremental interface (first maximum, NaN skipped)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from colibri.engine.rng import Rng
from colibri.engine.sampling import argmax, sample


class IncrementalModel(Protocol):
    """The model API's incremental surface (colibri.reference.Model has it)."""

    def new_state(self) -> Any: ...
    def prefill(self, state: Any, ids: Sequence[int]) -> npt.NDArray[np.float32]: ...
    def decode(self, state: Any, token: int) -> npt.NDArray[np.float32]: ...


def _tokens(
    model: IncrementalModel,
    prompt: Sequence[int],
    max_tokens: int,
    stop_ids: Sequence[int],
    choose: Callable[[npt.NDArray[np.float32]], int],
) -> Iterator[int]:
    """Up to ``max_tokens`` tokens after ``prompt``, each ``choose``-n from the last logits; a
    stop id is yielded, then it ends (no decode is run for the last token)."""
    if not prompt:
        raise ValueError("the prompt needs at least one token")
    if max_tokens <= 0:
        return
    state = model.new_state()
    logits = model.prefill(state, prompt)[-1]
    for produced in range(max_tokens):
        token = choose(logits)
        yield token
        if token in stop_ids or produced + 1 == max_tokens:
            return
        logits = model.decode(state, token)


def greedy_tokens(
    model: IncrementalModel, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int] = ()
) -> Iterator[int]:
    """Up to ``max_tokens`` greedy tokens after ``prompt``; a stop id is yielded, then it ends."""
    # colibri's argmax (first maximum, NaN never wins), the same rule as sampling at
    # temperature 0, so both greedy paths choose the same token on any logits.
    return _tokens(model, prompt, max_tokens, stop_ids, argmax)


def sampled_tokens(
    model: IncrementalModel,
    prompt: Sequence[int],
    max_tokens: int,
    stop_ids: Sequence[int] = (),
    *,
    temperature: float,
    top_p: float,
    rng: Rng,
) -> Iterator[int]:
    """Like :func:`greedy_tokens`, choosing each token with colibri's sampler.

    ``temperature <= 0`` is greedy (the first maximum, NaN skipped) and draws nothing from
    ``rng``; otherwise each token costs exactly one uniform from ``rng``.
    """
    return _tokens(
        model, prompt, max_tokens, stop_ids, lambda logits: sample(logits, temperature, top_p, rng)
    )
