"""Grouped int4 (fmt4): fmt2's nibble layout with one f32 scale per ``gs`` columns.

Scales are laid out ``[O, ceil(I/gs)]``; the last group of a row may be short. The group
size is not stored: a reader derives it from the scale count (finest candidate first).

Spec: spec/model.md §14 "Integer formats (1-5)".
"""

from __future__ import annotations

import numpy as np
from colibri.reference.quant.absmax import absmax_scales, quantize_values
from colibri.reference.quant.formats import ceil_div
from colibri.reference.quant.int_row import pack_nibbles, unpack_nibbles
from colibri.reference.tensors import F32, U8


def _grouped(weights: F32, group_size: int) -> F32:
    """``[O, I]`` -> ``[O, G, gs]`` zero-padded, so short last groups share the vector path."""
    rows, cols = weights.shape
    groups = ceil_div(cols, group_size)
    padded = np.zeros((rows, groups * group_size), dtype=np.float32)
    padded[:, :cols] = weights
    return padded.reshape(rows, groups, group_size)


def quantize_int4_grouped(weights: F32, group_size: int) -> tuple[U8, F32]:
    if group_size <= 0:
        raise ValueError(f"int4-grouped group size must be positive, got {group_size}")
    rows, cols = weights.shape
    grouped = _grouped(weights, group_size)
    # Zero padding never raises a group's absmax, so the padded groups' scales are exact.
    scales = absmax_scales(grouped, 7, axis=2)
    q = quantize_values(grouped, scales[:, :, None], 7).reshape(rows, -1)[:, :cols]
    return pack_nibbles((q + 8).astype(np.uint8)).reshape(-1), scales.reshape(-1)


def dequantize_int4_grouped(
    payload: U8, scales: F32, rows: int, cols: int, group_size: int
) -> F32:
    groups = ceil_div(cols, group_size)
    u = unpack_nibbles(payload.reshape(rows, ceil_div(cols, 2)), cols)
    q = u.astype(np.float32) - np.float32(8)
    per_col = np.repeat(scales.reshape(rows, groups), group_size, axis=1)[:, :cols]
    return (q * per_col).astype(np.float32)
