"""The fmt6 encoder writes valid super-blocks that decode close to their input."""

from __future__ import annotations

import numpy as np
from colibri.reference.quant.e8_iq3 import decode_blocks, encode_blocks, split_blocks
from hypothesis import given
from hypothesis import strategies as st


@given(st.integers(0, 2**32 - 1), st.floats(1e-3, 10.0), st.integers(1, 4))
def test_encoded_blocks_decode_near_the_input(seed: int, scale: float, blocks: int) -> None:
    w = (np.random.default_rng(seed).normal(size=(blocks, 256)) * scale).astype(np.float32)
    payload = encode_blocks(w)
    assert payload.size == blocks * 98
    assert np.array_equal(payload, encode_blocks(w))  # deterministic
    back = decode_blocks(payload)
    negatives = (back < 0).reshape(-1, 8).sum(axis=1)
    assert np.all(negatives % 2 == 0)  # the implied eighth sign keeps every 8-group even
    rel = np.sqrt(np.mean((back - w) ** 2)) / np.sqrt(np.mean(w**2))
    assert rel < 0.3  # ~3 bits per weight on Gaussian data
    _, _, halves = split_blocks(payload)
    assert np.all(np.isfinite(halves.view(np.float16)))


def test_signs_follow_the_input_except_parity_fixes() -> None:
    w = np.linspace(-1, 1, 256, dtype=np.float32)[None] + np.float32(0.001)
    back = decode_blocks(encode_blocks(w))[0]
    flipped = np.sign(back) != np.sign(w[0])
    # at most one flip per 8-group, and only where the group had an odd count of negatives
    assert flipped.reshape(-1, 8).sum(axis=1).max() <= 1
    odd = (w[0] < 0).reshape(-1, 8).sum(axis=1) % 2 == 1
    assert np.array_equal(flipped.reshape(-1, 8).any(axis=1), odd)
