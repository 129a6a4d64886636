"""Rotary position embedding in the DeepSeek/GLM interleaved layout.

The rotary slice of a query or key holds pairs ``(v[2j], v[2j+1])``, pair j rotated by the
angle ``pos * theta^(-2j/d)``. Like HF's ``apply_rotary_pos_emb_interleave`` (and colibri), the
rotated pairs are written out de-interleaved, first all rotated evens then all rotated odds:

    out[j]       = v[2j] cos - v[2j+1] sin
    out[d/2 + j] = v[2j+1] cos + v[2j] sin

Queries and keys get the same layout, so their dot products equal those of the plain pairwise
rotation. With ``rope_interleave=false`` (DeepSeek-V3 option) the input is already split in
halves and the classic rotate-half form is used.

Angles follow HF exactly in float32: ``inv_freq = 1 / theta^(arange(0, d, 2) / d)`` and
``angle = float32(pos) * inv_freq``; cos and sin are taken of the float32 angle.

Spec: spec/model.md §4.
"""

from __future__ import annotations

import numpy as np
from colibri.reference.tensors import F32


def inv_freq(dim: int, theta: float) -> F32:
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    out: F32 = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)
    return out


def cos_sin(positions: np.ndarray, dim: int, theta: float) -> tuple[F32, F32]:
    """cos and sin of every (position, pair) angle: two [len(positions), dim/2] arrays."""
    angles = positions.astype(np.float32)[:, None] * inv_freq(dim, theta)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: F32, cos: F32, sin: F32, interleaved: bool = True) -> F32:
    """Rotate the last axis of x [T, ..., d]; cos/sin are [T, d/2] and broadcast over the middle."""
    extra = x.ndim - 2
    c = cos.reshape(cos.shape[0], *([1] * extra), cos.shape[1])
    s = sin.reshape(sin.shape[0], *([1] * extra), sin.shape[1])
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
    out: F32 = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    return out
