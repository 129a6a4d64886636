"""Greedy generation over the incremental interface (argmax takes the first maximum)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from colibri.reference.model import Model
from colibri.reference.rng import Rng
from colibri.reference.sampling import sample


def greedy_tokens(
    model: Model, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int] = ()
) -> Iterator[int]:
    """Up to ``max_tokens`` greedy tokens after ``prompt``; a stop id is yielded, then it ends."""
    if not prompt:
        raise ValueError("the prompt needs at least one token")
    if max_tokens <= 0:
        return
    state = model.new_state()
    logits = model.prefill(state, prompt)[-1]
    for produced in range(max_tokens):
        token = int(np.argmax(logits))  # numpy's argmax returns the first maximum
        yield token
        if token in stop_ids or produced + 1 == max_tokens:
            return
        logits = model.decode(state, token)


def sampled_tokens(
    model: Model,
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
    if not prompt:
        raise ValueError("the prompt needs at least one token")
    if max_tokens <= 0:
        return
    state = model.new_state()
    logits = model.prefill(state, prompt)[-1]
    for produced in range(max_tokens):
        token = sample(logits, temperature, top_p, rng)
        yield token
        if token in stop_ids or produced + 1 == max_tokens:
            return
        logits = model.decode(state, token)
