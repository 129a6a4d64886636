"""Per-request token choice: greedy at temperature 0, else colibri's temperature + nucleus
sampler driven by the request's own xorshift64 stream (spec/protocol.md 2.7)."""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def seed_state(seed: int) -> int:
    return (seed * GOLDEN + 1) & MASK64


class XorShift64:
    """colibri's RNG: xorshift64 (13, 7, 17), uniforms from the top 53 bits."""

    def __init__(self, state: int) -> None:
        self.state = state & MASK64

    def uniform(self) -> float:
        x = self.state
        x ^= (x << 13) & MASK64
        x ^= x >> 7
        x ^= (x << 17) & MASK64
        self.state = x
        return (x >> 11) * (1.0 / 9007199254740992.0)


def request_rng(seed: int | None, process_seed: int | None) -> XorShift64:
    """seed= wins; else SEED (restarted per request); else a random per-request stream."""
    if seed is not None:
        return XorShift64(seed_state(seed))
    if process_seed is not None:
        return XorShift64(seed_state(process_seed))
    return XorShift64(int.from_bytes(os.urandom(8), "little") | 1)


def greedy(row: npt.NDArray[np.float32]) -> int:
    """The first maximum, NaN skipped."""
    keyed = np.where(np.isnan(row), -np.inf, row)
    return int(np.argmax(keyed))


def distribution(
    row: npt.NDArray[np.float32], temperature: float, top_p: float
) -> npt.NDArray[np.float64]:
    """colibri's dist_build: softmax at the temperature, then the nucleus, renormalized."""
    finite = np.isfinite(row)
    top = float(row[finite].max()) if finite.any() else 0.0
    scale = np.float32(1.0 / max(temperature, 1e-4))
    p = np.where(finite, np.exp((row - np.float32(top)) * scale), np.float32(0.0)).astype(
        np.float32
    )
    total = float(p.astype(np.float64).sum())
    probs = p.astype(np.float64) / total
    if 0.0 < top_p < 1.0:
        order = np.lexsort((np.arange(probs.size), -probs))
        cumulative = np.cumsum(probs[order])
        keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
        kept = order[: max(1, min(keep, probs.size))]
        nucleus = np.zeros_like(probs)
        nucleus[kept] = probs[kept]
        probs = nucleus / nucleus.sum()
    return probs


def pick(row: npt.NDArray[np.float32], temperature: float, top_p: float, rng: XorShift64) -> int:
    if temperature <= 0.0:
        return greedy(row)
    probs = distribution(row, temperature, top_p)
    u = rng.uniform()
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, u, side="left"))
    if index >= probs.size:
        index = int(np.nonzero(probs)[0][-1])
    return index
