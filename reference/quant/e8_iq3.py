"""e8-iq3-lattice (fmt6): colibri's IQ3_XXS-style super-blocks of 256 weights in 98 bytes.

Super-block layout (weights are stored pre-rotated, see :mod:`.hadamard`):

- bytes 0..63: grid indices; byte ``8*ib + 2*l`` covers weights ``32*ib + 8*l + 0..3`` and
  byte ``8*ib + 2*l + 1`` covers ``32*ib + 8*l + 4..7`` (``ib`` the 32-weight sub-block).
- bytes 64..95: eight little-endian u32 words, one per sub-block ``ib``: bits ``7l..7l+6``
  are the signs of weights ``8l + 0..6`` of group ``l`` (set = negative), the eighth sign is
  the XOR of those seven (even count of negatives), bits 28..31 are the sub-scale ``code``.
- bytes 96..97: the fp16 super-scale ``d`` (little-endian).

``w = +-(grid[idx][j] * 0.5) * db`` with ``db = d * (0.5 + code) * 0.5`` in float32 -- half of
llama.cpp's IQ3_XXS value. ``d`` is decoded as colibri's engine does: normal and
non-finite halves exactly, subnormal halves as ``2^-14 * (1 + man/1024)``.

Spec: spec/model.md §14 "e8-iq3-lattice (6)".
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np
import numpy.typing as npt
from colibri.reference.quant.formats import E8_BLOCK, E8_BLOCK_BYTES, E8_SUB_BLOCK
from colibri.reference.tensors import F32, U8

GROUPS_PER_BLOCK = E8_BLOCK // 4
SUB_BLOCKS = E8_BLOCK // E8_SUB_BLOCK
SMALLEST_NORMAL_HALF = 2.0**-14
#: Super-blocks encoded per vectorised batch: small enough that the [batch, 8, 8, 256] score
#: array stays in cache (16 measured fastest, ~0.2 ms per block).
_ENCODE_BATCH = 16


@lru_cache(maxsize=1)
def grid_bytes() -> npt.NDArray[np.uint8]:
    """The 256x4 "doubled" magnitude grid (values 4, 12, ..., 52, 62) from iq3xxs_grid.json."""
    text = resources.files("colibri.reference.quant").joinpath("iq3xxs_grid.json").read_text()
    grid = np.array(json.loads(text), dtype=np.uint8)
    if grid.shape != (256, 4):
        raise RuntimeError(f"iq3xxs_grid.json must be 256 rows of 4 bytes, got {grid.shape}")
    grid.setflags(write=False)
    return grid


@lru_cache(maxsize=1)
def grid_weights() -> F32:
    """The grid in weight units (halved), as the encoder searches it."""
    grid = grid_bytes().astype(np.float32) * np.float32(0.5)
    grid.setflags(write=False)
    return grid


def decode_half(bits: npt.NDArray[np.uint16]) -> F32:
    """colibri's ``e8_fp16_to_f32``: exact except subnormals, read as ``2^-14 (1 + m/1024)``."""
    h = bits.astype(np.uint32)
    sign = (h >> 15) << 31
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    normal = sign | ((exp + 112) << 23) | (man << 13)
    special = sign | np.uint32(0x7F800000) | (man << 13)
    subnormal = np.where(man != 0, sign | np.uint32(113 << 23) | (man << 13), sign)
    out = np.where(exp == 0, subnormal, np.where(exp == 0x1F, special, normal))
    return out.astype(np.uint32).view(np.float32)


def split_blocks(payload: U8) -> tuple[U8, npt.NDArray[np.uint32], npt.NDArray[np.uint16]]:
    """``[n*98]`` bytes -> (indices ``[n, 64]``, words ``[n, 8]``, fp16 bits ``[n]``)."""
    blocks = payload.reshape(-1, E8_BLOCK_BYTES)
    indices = blocks[:, :64]
    words = np.ascontiguousarray(blocks[:, 64:96]).view("<u4").astype(np.uint32)
    halves = np.ascontiguousarray(blocks[:, 96:98]).view("<u2").astype(np.uint16).reshape(-1)
    return indices, words, halves


@lru_cache(maxsize=1)
def _sign_table() -> F32:
    """``[128, 8]`` of +-1: the seven stored sign bits of a group and the implied eighth."""
    seven = np.arange(128, dtype=np.uint32)
    bits = (seven[:, None] >> np.arange(7, dtype=np.uint32)) & 1
    parity = np.bitwise_xor.reduce(bits, axis=1)[:, None]
    negative = np.concatenate([bits, parity], axis=1).astype(bool)
    table = np.where(negative, np.float32(-1.0), np.float32(1.0)).astype(np.float32)
    table.setflags(write=False)
    return table


def decode_blocks(payload: U8) -> F32:
    """Dequantize super-blocks to ``[n, 256]`` weights in the rotated (stored) domain."""
    indices, words, halves = split_blocks(payload)
    n = indices.shape[0]
    d = decode_half(halves)
    code = (words >> 28).astype(np.float32)
    db = (d[:, None] * (np.float32(0.5) + code)) * np.float32(0.5)  # [n, 8]
    magnitude = grid_weights()[indices].reshape(n, SUB_BLOCKS, 4, 8)  # [n, ib, l, j]
    seven = (words[:, :, None] >> (np.arange(4, dtype=np.uint32) * 7)) & 0x7F  # [n, ib, l]
    # Negating a product is exact, so multiplying by -1 gives colibri's -(mag * db) bits.
    values: F32 = (magnitude * db[:, :, None, None]) * _sign_table()[seven]
    return values.reshape(n, E8_BLOCK)


def _parity_fixed_signs(magnitude: F32, negative: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Flip the smallest magnitude of every 8-group holding an odd count of negatives."""
    groups = negative.reshape(-1, 8).copy()
    odd = (groups.sum(axis=1) & 1) == 1
    smallest = np.argmin(magnitude.reshape(-1, 8), axis=1)  # first minimum on ties
    rows = np.nonzero(odd)[0]
    groups[rows, smallest[rows]] ^= True
    return groups.reshape(negative.shape)


def _super_scale(magnitude: F32) -> tuple[npt.NDArray[np.uint16], F32]:
    """``d = sqrt(mean(w^2)) / 20 + 1e-12`` per block, stored fp16 and read back exactly."""
    mean_sq = np.sum(magnitude.astype(np.float64) ** 2, axis=1) / E8_BLOCK
    d = np.sqrt(mean_sq.astype(np.float32)) / np.float32(20.0) + np.float32(1e-12)
    # colibri's engine misreads subnormal halves (as 2^-14 (1 + m/1024)), so a block whose d
    # would be subnormal gets the smallest normal half instead: then every reader decodes the
    # value the search below assumed.
    d = np.maximum(d, np.float32(SMALLEST_NORMAL_HALF))
    half = d.astype(np.float16)
    return half.view(np.uint16), half.astype(np.float32)


def _encode_batch(block: F32) -> U8:
    n = block.shape[0]
    grid = grid_weights()
    grid_sq = np.sum(grid * grid, axis=1)  # [256]
    negative = block < 0  # -0.0 counts as positive
    magnitude = np.abs(block)
    negative = _parity_fixed_signs(magnitude, negative)
    halves, d = _super_scale(magnitude)

    groups = magnitude.reshape(n, SUB_BLOCKS, 8, 4)
    # argmin_g ||m - db g||^2 == argmin_g db*|g|^2 - 2 m.g  (db > 0), shared by all codes.
    # Four explicit products in a fixed order, not a BLAS matmul: the bytes must not depend on
    # the machine's BLAS kernel (committed fixtures are regenerated byte for byte).
    g = grid.T  # [4, 256]
    dot = groups[..., 0:1] * g[0] + groups[..., 1:2] * g[1]
    dot = dot + groups[..., 2:3] * g[2]
    dot = dot + groups[..., 3:4] * g[3]
    cross = np.float32(-2.0) * dot  # [n, ib, 8, 256]
    best_err = np.full((n, SUB_BLOCKS), np.inf, dtype=np.float32)
    best_code = np.zeros((n, SUB_BLOCKS), dtype=np.uint32)
    for code in range(16):
        db = (d * np.float32(0.5 + code)) * np.float32(0.5)
        db = np.maximum(db, np.float32(1e-20))
        scores = db[:, None, None, None] * grid_sq + cross
        err = db[:, None] * scores.min(axis=3).sum(axis=2)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_code = np.where(better, np.uint32(code), best_code)
    db_best = np.maximum((d[:, None] * (np.float32(0.5) + best_code)) * np.float32(0.5), 1e-20)
    scores = db_best.astype(np.float32)[:, :, None, None] * grid_sq + cross
    indices = np.argmin(scores, axis=3).astype(np.uint8).reshape(n, 64)

    sign_bits = negative.reshape(n, SUB_BLOCKS, 4, 8)[..., :7].astype(np.uint32)
    seven = np.sum(sign_bits << np.arange(7, dtype=np.uint32), axis=-1)  # [n, ib, l]
    words = np.sum(seven << (np.arange(4, dtype=np.uint32) * 7), axis=-1).astype(np.uint32)
    words |= best_code << 28
    out = np.empty((n, E8_BLOCK_BYTES), dtype=np.uint8)
    out[:, :64] = indices
    out[:, 64:96] = words.astype("<u4").view(np.uint8).reshape(n, 32)
    out[:, 96:98] = halves.astype("<u2").view(np.uint8).reshape(n, 2)
    return out


def encode_blocks(blocks: F32) -> U8:
    """Encode ``[n, 256]`` (already rotated) weights to ``n`` 98-byte super-blocks."""
    flat = np.ascontiguousarray(blocks, dtype=np.float32).reshape(-1, E8_BLOCK)
    parts = [
        _encode_batch(flat[start : start + _ENCODE_BATCH])
        for start in range(0, flat.shape[0], _ENCODE_BATCH)
    ]
    if not parts:
        return np.zeros(0, dtype=np.uint8)
    return np.concatenate(parts).reshape(-1)
