"""fmt6 super-blocks decode bit-exactly like gguf-py's IQ3_XXS dequantizer.

Mapping colibri's block onto ggml's ``block_iq3_xxs``: move the fp16 ``d`` from the end to the
front, read colibri's subnormal ``d`` the way its engine does (as the normal half with exponent
field 1), and halve ggml's value (colibri's extra x0.5).
"""

from __future__ import annotations

import numpy as np
from colibri.reference.quant.e8_iq3 import decode_blocks, grid_bytes
from gguf import GGMLQuantizationType
from gguf.quants import IQ3_XXS
from gguf.quants import dequantize as gguf_dequantize
from hypothesis import given
from hypothesis import strategies as st

finite_half = st.integers(0, 0xFFFF).filter(lambda h: (h >> 10) & 0x1F != 0x1F)
block = st.tuples(
    st.binary(min_size=64, max_size=64),
    st.lists(st.integers(0, 2**32 - 1), min_size=8, max_size=8),
    finite_half,
)


def colibri_block(indices: bytes, words: list[int], half: int) -> bytes:
    return indices + np.array(words, dtype="<u4").tobytes() + np.array([half], "<u2").tobytes()


def as_ggml(block_bytes: bytes) -> bytes:
    half = int.from_bytes(block_bytes[96:98], "little")
    if (half >> 10) & 0x1F == 0 and half & 0x3FF:
        half |= 1 << 10  # the engine reads a subnormal d as 2^-14 * (1 + man/1024)
    return half.to_bytes(2, "little") + block_bytes[:96]


@given(st.lists(block, min_size=1, max_size=8))
def test_decode_matches_gguf_iq3_xxs(blocks: list[tuple[bytes, list[int], int]]) -> None:
    ours_bytes = b"".join(colibri_block(*b) for b in blocks)
    ours = decode_blocks(np.frombuffer(ours_bytes, dtype=np.uint8))
    theirs_in = np.frombuffer(
        b"".join(as_ggml(colibri_block(*b)) for b in blocks), dtype=np.uint8
    ).reshape(len(blocks), 98)
    theirs = gguf_dequantize(theirs_in, GGMLQuantizationType.IQ3_XXS).reshape(len(blocks), 256)
    expected = (theirs * np.float32(0.5)).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32))


def test_grid_matches_gguf() -> None:
    gguf_dequantize(np.zeros((1, 98), dtype=np.uint8), GGMLQuantizationType.IQ3_XXS)  # builds grid
    assert IQ3_XXS.grid is not None
    theirs = np.asarray(IQ3_XXS.grid).reshape(256, 4)
    np.testing.assert_array_equal(grid_bytes().astype(np.float64), theirs)
