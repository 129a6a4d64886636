"""Array type aliases and the two matrix-product kernels every layer uses.

``dense_matmul`` is the textbook product (one BLAS gemm), used by the full-sequence forward.

``row_matmul`` is the product the incremental path (prefill/decode/decode_batch) uses. BLAS
gives no promise that a row of a gemm equals the same row computed alone: a 1-row product is
a gemv, a small product may take a "small matrix" kernel, threads split the work by shape.
So ``row_matmul`` never lets the batch shape reach BLAS: the weight is cut into fixed row
blocks (the cut depends only on the weight's shape) and every activation row is multiplied by
every block with its own gemv call. A row's result is therefore a function of that row and
the weight alone, bit for bit, whatever else is in the batch; and because the rows of a batch
take turns on a block while it is in cache, each weight byte still comes from memory once per
batched step.

Spec: spec/model.md §10.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# The array aliases of the whole reference (defined here only).
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
U8 = npt.NDArray[np.uint8]

#: Bytes of weight per row block: small enough to stay in a core's L2 while every row of the
#: batch takes its turn, large enough that the per-call overhead stays small.
ROW_BLOCK_BYTES = 256 * 1024


def dense_matmul(x: F32, weight: F32) -> F32:
    """x [..., K] @ weight[N, K].T -> [..., N] in float32 (one gemm)."""
    out: F32 = np.matmul(x, weight.T)
    return out


def block_rows(weight: F32) -> int:
    """Rows per block of ``weight``: a function of its shape only."""
    k = int(weight.shape[1])
    return max(8, (ROW_BLOCK_BYTES // (4 * k)) // 8 * 8)


def row_matmul(x: F32, weight: F32) -> F32:
    """x [M, K] @ weight[N, K].T -> [M, N], each output row computed independently (gemv)."""
    m = x.shape[0]
    n = weight.shape[0]
    out = np.empty((m, n), dtype=np.float32)
    step = block_rows(weight)
    # Each row is copied to a 64-byte aligned buffer, so every gemv sees the same operand
    # alignment whether the row came alone or inside a batch.
    rows = [aligned_copy(x[i]) for i in range(m)]
    for start in range(0, n, step):
        block = weight[start : start + step]
        for i in range(m):
            out[i, start : start + step] = block @ rows[i]
    return out


def aligned_copy(v: F32) -> F32:
    """A contiguous float32 copy of the 1-D ``v`` whose data starts on a 64-byte boundary."""
    n = v.shape[0]
    raw = np.empty(n + 16, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    out: F32 = raw[skip : skip + n]
    out[:] = v
    return out
