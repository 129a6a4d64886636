"""fp8-e4m3-b128 (fmt8): raw OCP e4m3fn bytes with one f32 scale per 128x128 block.

The payload is ``[O, I]`` e4m3 bytes (bias 7, no infinities, ``0x7f``/``0xff`` are NaN). The
scales are ``[ceil(O/128), ceil(I/128)]`` f32 and multiply (HF's ``weight_scale_inv`` is
already the multiplier). A UE8M0 (power-of-two byte) scale grid is refused for GLM.

Spec: spec/model.md §14 "fp8-e4m3-b128 (8)".
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from colibri.reference.quant.formats import FP8_BLOCK, ceil_div
from colibri.reference.tensors import F32, U8

#: Largest finite e4m3fn magnitude.
E4M3_MAX = np.float32(448.0)
#: Every byte decoded once; ``lut[byte]`` is the weight before its block scale.
E4M3_LUT: F32 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def block_scale_grid(scales: F32, rows: int, cols: int) -> F32:
    """Expand ``[ceil(O/128), ceil(I/128)]`` block scales to one scale per weight."""
    grid = scales.reshape(ceil_div(rows, FP8_BLOCK), ceil_div(cols, FP8_BLOCK))
    full = np.repeat(np.repeat(grid, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)
    return full[:rows, :cols]


def quantize_fp8(weights: F32) -> tuple[U8, F32]:
    """Per 128x128 block: ``s = amax / 448``, ``q = e4m3(w / s)`` rounded to nearest even."""
    rows, cols = weights.shape
    brows, bcols = ceil_div(rows, FP8_BLOCK), ceil_div(cols, FP8_BLOCK)
    padded = np.zeros((brows * FP8_BLOCK, bcols * FP8_BLOCK), dtype=np.float32)
    padded[:rows, :cols] = np.abs(weights)
    amax = padded.reshape(brows, FP8_BLOCK, bcols, FP8_BLOCK).max(axis=(1, 3))
    # An all-zero block still needs a positive finite multiplier.
    scales = np.where(amax > 0, amax / E4M3_MAX, np.float32(1.0)).astype(np.float32)
    scaled = weights / block_scale_grid(scales, rows, cols)
    scaled = np.clip(scaled, -E4M3_MAX, E4M3_MAX)
    q = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return q.reshape(-1), scales.reshape(-1)


def dequantize_fp8(payload: U8, scales: F32, rows: int, cols: int) -> F32:
    values = E4M3_LUT[payload.reshape(rows, cols)]
    return (values * block_scale_grid(scales, rows, cols)).astype(np.float32)


def has_nan_codes(payload: U8) -> bool:
    """True when any byte is an e4m3fn NaN (``0x7f`` or ``0xff``)."""
    return bool(np.any((payload & 0x7F) == 0x7F))
