"""A weighted expert sum and its expected value in model.py's order (slots ascending from 0,
then the shared expert's row), shared by the host emulation and the device tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ExpertSumCase:
    y: F32  # [m * top + m, d]: every routed slot's output, then each row's shared output
    weights: F32  # [m, top]
    slot_row: I64  # [m, top]: which row of y holds each slot's output
    extra: I64  # [m]: each row's shared-expert row of y
    resid: F32  # [m, d]: the residual the sum is added to
    summed: F32  # [m, d]: the expected sum


def expert_sum_case(rng: np.random.Generator, m: int, d: int, top: int,
                    shared: bool) -> ExpertSumCase:
    y = rng.standard_normal((m * top + m, d)).astype(np.float32)
    weights = rng.random((m, top)).astype(np.float32)
    slot_row = rng.permutation(m * top).reshape(m, top).astype(np.int64)
    extra = np.arange(m * top, m * top + m, dtype=np.int64)
    resid = rng.standard_normal((m, d)).astype(np.float32)
    summed = np.zeros((m, d), np.float32)
    for s in range(top):
        summed = summed + weights[:, s:s + 1] * y[slot_row[:, s]]
    if shared:
        summed = summed + y[extra]
    return ExpertSumCase(y, weights, slot_row, extra, resid, summed)
