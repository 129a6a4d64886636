"""The two nonlinearities, in float32: sigmoid (router scores) and SiLU (SwiGLU gates).

Spec: spec/model.md §7.1 (sigmoid scores), §7.2 (SiLU).
"""

from __future__ import annotations

import numpy as np
from colibri.reference.tensors import F32


def sigmoid(x: F32) -> F32:
    out: F32 = (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32)
    return out


def silu(x: F32) -> F32:
    out: F32 = (x * sigmoid(x)).astype(np.float32)
    return out


def softmax(x: F32) -> F32:
    """Softmax over the last axis: subtract the max, exponentiate, divide by the sum."""
    shifted = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(shifted)
    out: F32 = (e / np.sum(e, axis=-1, keepdims=True)).astype(np.float32)
    return out
