"""colibri's random number generator: xorshift64 (13, 7, 17) and its uniform doubles.

Bit-exact with the C engine (``sample.h``): the same seed gives the same uniforms, so a
sampled run can be replayed against colibri. The state is a Python int kept in 64 bits
(no numpy), so the module compiles with mypyc.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1

#: The initial state when no seed is given, and the multiplier seeds are scrambled with
#: (the 64-bit golden ratio, 2^64 / phi).
GOLDEN = 0x9E3779B97F4A7C15

#: 2^-53: ``(x >> 11) * 2^-53`` maps the top 53 bits onto a double in [0, 1).
_INV_2_53 = 1.0 / 9007199254740992.0


def seed_state(seed: int) -> int:
    """The state ``SEED=n`` gives: ``n * 0x9E3779B97F4A7C15 + 1 (mod 2^64)``.

    Negative seeds wrap modulo 2^64 like C's unsigned arithmetic. One seed (the one that
    makes the state 0) is degenerate, as in colibri: xorshift never leaves 0, so every
    uniform is 0.0 (see spec/model.md).
    """
    return (seed * GOLDEN + 1) & MASK64


class Rng:
    """One xorshift64 stream. The engine holds one per process and one per seeded request."""

    __slots__ = ("state",)

    def __init__(self, state: int = GOLDEN) -> None:
        self.state = state & MASK64

    @classmethod
    def from_seed(cls, seed: int) -> Rng:
        return cls(seed_state(seed))

    def next_u64(self) -> int:
        """Advance the state and return it."""
        x = self.state
        x ^= (x << 13) & MASK64
        x ^= x >> 7
        x ^= (x << 17) & MASK64
        self.state = x
        return x

    def uniform(self) -> float:
        """A double in [0, 1): the top 53 bits of the next state, times 2^-53."""
        return (self.next_u64() >> 11) * _INV_2_53
