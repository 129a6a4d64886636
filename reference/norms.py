"""RMSNorm (every norm of the model) and LayerNorm (the DSA indexer's key norm).

Statistics are accumulated in float64, as colibri does, then applied in float32: the result is
the float32 rounding of a nearly exact normalisation, independent of summation order.

Spec: spec/model.md §3.1, §3.2.
"""

from __future__ import annotations

import numpy as np
from colibri.reference.tensors import F32


def rms_norm(x: F32, weight: F32, eps: float) -> F32:
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    x64 = x.astype(np.float64)
    mean_sq = np.mean(x64 * x64, axis=-1, keepdims=True)
    scale = (1.0 / np.sqrt(mean_sq + eps)).astype(np.float32)
    out: F32 = (x * scale) * weight
    return out


def layer_norm(x: F32, weight: F32, bias: F32, eps: float) -> F32:
    """y = (x - mean) / sqrt(var + eps) * weight + bias, over the last axis (biased variance)."""
    x64 = x.astype(np.float64)
    mean = np.mean(x64, axis=-1, keepdims=True)
    centred = x64 - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    normed = (centred / np.sqrt(var + eps)).astype(np.float32)
    out: F32 = normed * weight + bias
    return out
