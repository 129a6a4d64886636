"""The fmt6 rotation: a sign-flipped, block-diagonal Walsh-Hadamard transform.

``Q = D H / sqrt(n)`` per block, with ``H`` the unnormalised +-1 butterflies and ``D`` a
diagonal of signs regenerated from colibri's xorshift stream (seed ``417 + n``). fmt6 stores
``W Q``; the engine applies ``Q^T x = H D x / sqrt(n)`` to activations, so
``(W Q)(Q^T x) = W x``. Because ``H`` is symmetric the same routine rotates weight rows.

Widths that are not powers of two tile block-diagonally: each block is the largest power of
two dividing the remaining width (its lowest set bit), halved while above 32768, so
6144 -> 2048 + 4096 and 1536 -> 512 + 1024.

Arithmetic follows colibri's scalar loop in float32 (sign flip, ``u + v`` / ``u - v``
butterflies with growing span, then a multiply by ``1 / sqrtf(n)``), so results are
bit-identical to it.

Spec: spec/model.md §14 "e8-iq3-lattice (6)".
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt
from colibri.reference.tensors import F32

_MASK64 = (1 << 64) - 1
_SIGN_MULTIPLIER = 2685821657736338717
MAX_BLOCK = 32768


@lru_cache(maxsize=64)
def _sign_mask(n: int) -> npt.NDArray[np.bool_]:
    """Which of the ``n`` elements of a block are negated (bit ``i & 7`` of byte ``i >> 3``)."""
    state = 417 + n
    out = bytearray()
    for _ in range((n + 7) // 8):
        state ^= state >> 12
        state ^= (state << 25) & _MASK64
        state ^= state >> 27
        out.append(((state * _SIGN_MULTIPLIER) & _MASK64) >> 56)
    bits = np.unpackbits(np.frombuffer(bytes(out), dtype=np.uint8), bitorder="little")
    mask = bits[:n].astype(bool)
    mask.setflags(write=False)
    return mask


def sign_bytes(n: int) -> bytes:
    """colibri's ``e8_signs``: the packed sign bytes of a block of ``n`` elements."""
    return bytes(np.packbits(_sign_mask(n), bitorder="little"))


def block_tiling(width: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each power-of-two block covering ``width`` columns."""
    if width <= 0:
        raise ValueError(f"rotation width must be positive, got {width}")
    blocks: list[tuple[int, int]] = []
    offset = 0
    while offset < width:
        remaining = width - offset
        size = remaining & -remaining
        while size > MAX_BLOCK:
            size >>= 1
        blocks.append((offset, size))
        offset += size
    return blocks


#: Spans below this run on a transposed copy, so every add reads contiguous memory (the same
#: pairs in the same order: the result is bit-identical, only faster).
_LOW_SPANS = 32


def _stage(a: F32, b: F32, lead: int, span: int, tail: int) -> None:
    """One butterfly stage on ``a`` viewed ``[lead, 2, span, tail]``, written to ``b``."""
    pairs = a.reshape(lead, 2, span, tail)
    out = b.reshape(lead, 2, span, tail)
    np.add(pairs[:, 0], pairs[:, 1], out=out[:, 0])
    np.subtract(pairs[:, 0], pairs[:, 1], out=out[:, 1])


def _butterflies(block: F32) -> F32:
    """colibri's in-place FWHT loop (span 1, 2, 4, ... with ``u + v`` / ``u - v``)."""
    rows, n = block.shape
    low = min(n, _LOW_SPANS)
    # [rows, n/low, low] -> [rows, low, n/low]: the low spans pair whole contiguous rows.
    a = np.ascontiguousarray(block.reshape(rows, n // low, low).transpose(0, 2, 1))
    b = np.empty_like(a)
    span = 1
    while span < low:
        _stage(a, b, rows * (low // (2 * span)), span, n // low)
        a, b = b, a
        span *= 2
    a = np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(rows, n)
    b = np.empty_like(a)
    while span < n:
        _stage(a, b, rows * (n // (2 * span)), span, 1)
        a, b = b, a
        span *= 2
    return a


def _inv_sqrt(n: int) -> np.float32:
    return np.float32(np.float32(1.0) / np.sqrt(np.float32(n)))


def _apply(rows: npt.ArrayLike, inverse: bool) -> F32:
    arr = np.array(rows, dtype=np.float32, copy=True)
    squeeze = arr.ndim == 1
    mat = arr.reshape(1, -1) if squeeze else arr.reshape(-1, arr.shape[-1])
    for offset, size in block_tiling(mat.shape[1]):
        block = mat[:, offset : offset + size]
        mask = _sign_mask(size)
        if not inverse:
            block = np.where(mask, -block, block)
        block = _butterflies(block) * _inv_sqrt(size)
        if inverse:
            block = np.where(mask, -block, block)
        mat[:, offset : offset + size] = block
    return mat.reshape(arr.shape)


def rotate_rows(rows: npt.ArrayLike) -> F32:
    """``H D x / sqrt(n)`` per block along the last axis: weights ``W -> W Q``."""
    return _apply(rows, inverse=False)


def rotate_activations(x: npt.ArrayLike) -> F32:
    """``Q^T x``: what the engine applies to the input of a fmt6 matmul (same transform)."""
    return _apply(x, inverse=False)


def unrotate_rows(rows: npt.ArrayLike) -> F32:
    """Inverse of :func:`rotate_rows`: butterflies, scale, then the sign flip."""
    return _apply(rows, inverse=True)
