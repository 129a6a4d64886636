"""How far a seeded draw is from changing (spec/model.md §13, §15).

A sampled token is kind (a), exact on every CPU, only while no decision of the sampler sits
within reach of a kind-(b) perturbation of the logits. If every logit moves by at most
``tau`` (``Tolerance.logit``), ``log p_i = l_i / T - log sum_j exp(l_j / T)`` moves by at most
``2 tau / T``, so every probability, and every partial sum of probabilities, moves by at most
the relative ``eps = expm1(2 tau / T)``; a renormalised partial sum (the nucleus divides by
its own mass) by ``2 eps``. The decisions, and the slack each must keep:

- the nucleus size: the running mass before the last kept token stays below ``top_p`` and
  the mass with it reaches ``top_p``, each by more than ``eps``;
- the nucleus set: the last kept token's probability exceeds the first dropped one's by more
  than ``2 eps`` relative (each may move by ``eps``);
- the draw: ``u`` lies inside the chosen token's cumulative interval by more than ``2 eps``
  on both sides.

``SLACK`` covers float32 rounding of the probabilities themselves (a few 2**-24 relative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from colibri.engine.sampling import distribution

SLACK = 1e-6


@dataclass(frozen=True)
class DrawMargin:
    """The smallest ratio slack / required over a draw's decisions (> 1: exact)."""

    ratio: float
    decision: str


def draw_margin(
    row: npt.NDArray[np.float32], temperature: float, top_p: float, u: float, tau_logit: float
) -> DrawMargin:
    t = max(float(np.float32(temperature)), 1e-4)
    eps = math.expm1(2.0 * tau_logit / t)
    worst = DrawMargin(math.inf, "none")

    def need(slack: float, required: float, decision: str) -> None:
        nonlocal worst
        ratio = float(slack / required)
        if ratio < worst.ratio:
            worst = DrawMargin(ratio, decision)

    nucleus = float(np.float32(top_p))
    if 0.0 < nucleus < 1.0:
        full = distribution(row, temperature, 1.0).astype(np.float64)
        order = np.argsort(-full, kind="stable")
        running = np.cumsum(full[order])
        reached = np.flatnonzero(running >= nucleus)
        kept = int(reached[0]) + 1 if reached.size else full.size
        need(running[kept - 1] - nucleus, eps + SLACK, "nucleus reaches top_p")
        if kept >= 2:
            need(nucleus - running[kept - 2], eps + SLACK, "nucleus not reached earlier")
        if kept < full.size:
            last, first_out = full[order[kept - 1]], full[order[kept]]
            need((last - first_out) / last, 2 * eps + SLACK, "nucleus set")
    probs = distribution(row, temperature, top_p).astype(np.float64)
    cumulative = np.cumsum(probs)
    chosen = int(np.flatnonzero(cumulative >= u)[0])
    below = float(cumulative[chosen - 1]) if chosen else 0.0
    need(u - below, 2 * eps + SLACK, "draw above the previous boundary")
    need(float(cumulative[chosen]) - u, 2 * eps + SLACK, "draw below the next boundary")
    return worst
