"""The fmt6 rotation: block tiling, orthogonality, and the product property at GLM widths."""

from __future__ import annotations

import numpy as np
import pytest
from colibri.reference.quant import rotate_activations, rotate_rows, unrotate_rows
from colibri.reference.quant.hadamard import block_tiling, sign_bytes
from hypothesis import given
from hypothesis import strategies as st


def xorshift_sign_bytes(n: int) -> bytes:
    """A direct transcription of colibri's e8_signs, written independently of the module."""
    s = 417 + n
    out = []
    for _ in range((n + 7) // 8):
        s ^= s >> 12
        s = (s ^ (s << 25)) % 2**64
        s ^= s >> 27
        out.append((s * 2685821657736338717 % 2**64) >> 56)
    return bytes(out)


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize(
    ("width", "tiles"),
    [
        (6144, [(0, 2048), (2048, 4096)]),
        (2048, [(0, 2048)]),
        (256, [(0, 256)]),
        (1536, [(0, 512), (512, 1024)]),
        (65536, [(0, 32768), (32768, 32768)]),
    ],
)
def test_block_tiling(width: int, tiles: list[tuple[int, int]]) -> None:
    assert block_tiling(width) == tiles


@pytest.mark.parametrize("n", [8, 256, 2048, 4096])
def test_sign_stream_is_colibris_xorshift(n: int) -> None:
    assert sign_bytes(n) == xorshift_sign_bytes(n)


def test_rotation_is_the_sign_flipped_hadamard_matrix() -> None:
    n = 256
    bits = np.unpackbits(np.frombuffer(sign_bytes(n), np.uint8), bitorder="little")[:n]
    d = np.where(bits == 1, -1.0, 1.0)
    q = (d[:, None] * sylvester(n)) / np.sqrt(n)  # Q = D H / sqrt(n)
    # rotate_rows(e_i) = Q^T e_i = row i of Q
    np.testing.assert_allclose(rotate_rows(np.eye(n, dtype=np.float32)), q, atol=1e-6)


@pytest.mark.parametrize("width", [6144, 2048, 256])
def test_rotated_weights_times_rotated_activations_is_the_product(width: int) -> None:
    rng = np.random.default_rng(width)
    w = rng.normal(0, 0.05, (4, width)).astype(np.float32)
    x = rng.normal(0, 1.0, (3, width)).astype(np.float32)
    plain = w.astype(np.float64) @ x.T.astype(np.float64)
    rotated = rotate_rows(w).astype(np.float64) @ rotate_activations(x).T.astype(np.float64)
    np.testing.assert_allclose(rotated, plain, rtol=0, atol=1e-5 * np.sqrt(width))
    np.testing.assert_allclose(unrotate_rows(rotate_rows(w)), w, atol=1e-6)


@given(st.sampled_from([256, 512, 768, 1536]), st.integers(0, 2**32 - 1))
def test_rotation_preserves_norms(width: int, seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=(2, width)).astype(np.float32)
    np.testing.assert_allclose(
        np.linalg.norm(rotate_activations(x), axis=1), np.linalg.norm(x, axis=1), rtol=1e-5
    )


def test_one_dimensional_input_rotates_like_a_row() -> None:
    x = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(rotate_activations(x), rotate_activations(x[None])[0])


def test_e8_stored_weights_with_rotated_activations_give_the_plain_product() -> None:
    from colibri.reference.quant import dequantize, dequantize_stored, quantize

    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.05, (8, 512)).astype(np.float32)
    x = rng.normal(0, 1.0, (2, 512)).astype(np.float32)
    payload, tag = quantize(6, w)
    colibri_path = dequantize_stored(6, payload, tag, w.shape) @ rotate_activations(x).T
    reference_path = dequantize(6, payload, tag, w.shape) @ x.T
    np.testing.assert_allclose(colibri_path, reference_path, rtol=0, atol=2e-5)
