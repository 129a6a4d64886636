"""Symmetric absmax quantization, the rule every colibri integer format shares.

``s = max(amax / qmax, 1e-8)`` and ``q = clamp(rint(w / s), -qmax - 1, qmax)``, computed in
float32 with round-half-to-even (what C's ``lrintf`` does in the default rounding mode).

Spec: spec/model.md §14 "Integer formats (1-5)".
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from colibri.reference.tensors import F32, I8

#: Scale floor: an all-zero row or group still gets a positive, finite scale.
MIN_SCALE = np.float32(1e-8)


def absmax_scales(weights: F32, qmax: int, axis: int = -1) -> F32:
    """Per-slice scales along ``axis`` (the slice is a row or a group)."""
    amax = np.max(np.abs(weights), axis=axis)
    scales = (amax / np.float32(qmax)).astype(np.float32)
    result: F32 = np.maximum(scales, MIN_SCALE)
    return result


def quantize_values(weights: F32, scales: F32, qmax: int) -> I8:
    """``clamp(rint(w / s), -qmax-1, qmax)`` with ``scales`` broadcast against ``weights``."""
    q = np.rint(weights / scales)
    result: I8 = np.clip(q, -qmax - 1, qmax).astype(np.int8)
    return result


def check_weights(weights: npt.ArrayLike, name: str) -> F32:
    """A finite 2-D float32 matrix, or a ValueError that names the tensor."""
    arr = np.asarray(weights)
    if arr.ndim != 2:
        raise ValueError(f"{name}: quantize needs a 2-D [O, I] matrix, got shape {arr.shape}")
    arr = arr.astype(np.float32, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: weights hold non-finite values; nothing to quantize")
    return arr
