"""Per-row integer formats: int8-row (fmt1), int4-row (fmt2) and int2-row (fmt3).

One f32 scale per output row. Bit packing (low bits first, so the even column of an int4
pair is the low nibble):

- int8: one signed byte per weight.
- int4: byte ``k`` of a row holds columns ``2k`` (bits 0-3) and ``2k+1`` (bits 4-7), each
  stored as ``u = q + 8``; an odd width pads the last high nibble with ``q = 0`` (``u = 8``).
- int2: byte ``k`` holds columns ``4k+j`` at bits ``2j..2j+1``, stored as ``u = q + 2`` with
  ``q`` in ``[-2, 1]``; missing columns of the last byte are zero bits.

Spec: spec/model.md §14 "Integer formats (1-5)".
"""

from __future__ import annotations

import numpy as np
from colibri.reference.quant.absmax import absmax_scales, quantize_values
from colibri.reference.quant.formats import ceil_div
from colibri.reference.tensors import F32, U8


def pack_nibbles(u: U8) -> U8:
    """``[O, I]`` values 0..15 -> ``[O, ceil(I/2)]`` bytes, even column in the low nibble."""
    rows, cols = u.shape
    padded = np.full((rows, ceil_div(cols, 2) * 2), 8, dtype=np.uint8)
    padded[:, :cols] = u
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: U8, cols: int) -> U8:
    """Inverse of :func:`pack_nibbles`: ``[O, ceil(I/2)]`` bytes -> ``[O, I]`` values 0..15."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = packed & 0x0F
    out[:, 1::2] = packed >> 4
    return out[:, :cols]


def quantize_int8(weights: F32) -> tuple[U8, F32]:
    scales = absmax_scales(weights, 127)
    q = quantize_values(weights, scales[:, None], 127)
    return q.view(np.uint8).reshape(-1), scales


def dequantize_int8(payload: U8, scales: F32, rows: int, cols: int) -> F32:
    q = payload.view(np.int8).reshape(rows, cols)
    return (q.astype(np.float32) * scales[:, None]).astype(np.float32)


def quantize_int4_row(weights: F32) -> tuple[U8, F32]:
    scales = absmax_scales(weights, 7)
    q = quantize_values(weights, scales[:, None], 7)
    return pack_nibbles((q + 8).astype(np.uint8)).reshape(-1), scales


def dequantize_int4_row(payload: U8, scales: F32, rows: int, cols: int) -> F32:
    u = unpack_nibbles(payload.reshape(rows, ceil_div(cols, 2)), cols)
    q = u.astype(np.float32) - np.float32(8)
    return (q * scales[:, None]).astype(np.float32)


_INT2_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)


def quantize_int2(weights: F32) -> tuple[U8, F32]:
    rows, cols = weights.shape
    scales = absmax_scales(weights, 1)
    q = quantize_values(weights, scales[:, None], 1)
    u = np.zeros((rows, ceil_div(cols, 4) * 4), dtype=np.uint8)
    u[:, :cols] = (q + 2).astype(np.uint8)
    quads = u.reshape(rows, -1, 4) << _INT2_SHIFTS
    packed = np.bitwise_or.reduce(quads, axis=2).astype(np.uint8)
    return packed.reshape(-1), scales


def dequantize_int2(payload: U8, scales: F32, rows: int, cols: int) -> F32:
    packed = payload.reshape(rows, ceil_div(cols, 4))
    u = ((packed[:, :, None] >> _INT2_SHIFTS) & 0x03).reshape(rows, -1)[:, :cols]
    q = u.astype(np.float32) - np.float32(2)
    return (q * scales[:, None]).astype(np.float32)
