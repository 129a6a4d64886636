"""int3-g64 (fmt5): 3-bit weights in 64-column groups of 24 bytes, one f32 scale per group.

Per group: a 16-byte low plane (bits 0-1 of element ``k`` at byte ``k >> 2``, shift
``(k & 3) * 2``) then an 8-byte high plane (bit 2 of element ``k`` at byte ``16 + (k >> 3)``,
bit ``k & 7``). Stored ``u = q + 4`` with ``q`` in ``[-4, 3]`` and ``s = amax / 3``. Columns
past the end of a short last group are zero bits, as colibri's packer leaves them.

Spec: spec/model.md §14 "Integer formats (1-5)".
"""

from __future__ import annotations

import numpy as np
from colibri.reference.quant.absmax import absmax_scales, quantize_values
from colibri.reference.quant.formats import INT3_GROUP, INT3_GROUP_BYTES, ceil_div
from colibri.reference.tensors import F32, U8

_LOW_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)


def quantize_int3_g64(weights: F32) -> tuple[U8, F32]:
    rows, cols = weights.shape
    groups = ceil_div(cols, INT3_GROUP)
    padded = np.zeros((rows, groups * INT3_GROUP), dtype=np.float32)
    padded[:, :cols] = weights
    grouped = padded.reshape(rows, groups, INT3_GROUP)
    scales = absmax_scales(grouped, 3, axis=2)
    q = quantize_values(grouped, scales[:, :, None], 3).astype(np.int16)
    u = (q + 4).astype(np.uint8)
    # Padding columns hold no element: their bits stay zero, not the code of q = 0.
    valid = (np.arange(groups * INT3_GROUP) < cols).reshape(groups, INT3_GROUP)
    u = np.where(valid[None], u, 0).astype(np.uint8)
    low = np.bitwise_or.reduce((u & 3).reshape(rows, groups, 16, 4) << _LOW_SHIFTS, axis=3)
    high = np.packbits((u >> 2) & 1, axis=2, bitorder="little")
    blob = np.concatenate([low.astype(np.uint8), high], axis=2)
    return blob.reshape(-1), scales.reshape(-1)


def dequantize_int3_g64(payload: U8, scales: F32, rows: int, cols: int) -> F32:
    groups = ceil_div(cols, INT3_GROUP)
    blob = payload.reshape(rows, groups, INT3_GROUP_BYTES)
    low = ((blob[:, :, :16, None] >> _LOW_SHIFTS) & 3).reshape(rows, groups, INT3_GROUP)
    high = np.unpackbits(blob[:, :, 16:], axis=2, bitorder="little")
    u = low | (high << 2)
    q = u.astype(np.float32) - np.float32(4)
    w = q * scales.reshape(rows, groups)[:, :, None]
    return w.reshape(rows, -1)[:, :cols].astype(np.float32)
