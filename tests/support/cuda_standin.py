"""A stand-in for ``CudaDevice`` that computes every "device" product with the CPU kernels and
holds ``capacity`` bytes of "VRAM": a test double of the *device*, so the ``--device cuda``
placement logic and the VRAM tier's books run on a machine without a GPU (nothing about the
CUDA kernels themselves is tested through it). It counts its calls, so a test cannot pass by
never reaching the device path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from colibri.accelerated.cuda_native import CudaOutOfMemory, DeviceInfo, GpuWeight
from colibri.accelerated.kernels import Kernels, QuantWeight, Weight, mat_descriptors
from colibri.accelerated.quant_kernels import QuantMatrix
from colibri.reference.quant.formats import Fmt


class CpuStandIn:
    """CudaDevice's interface, computing with the CPU kernels; ``capacity`` bytes of "VRAM"."""

    def __init__(self, kernels: Kernels, capacity: int | None = None) -> None:
        self.kernels, self.capacity = kernels, capacity
        self.held: dict[int, tuple[GpuWeight, Any]] = {}
        self.calls = {"matmul": 0, "expert_mlp": 0}
        self._next = 1

    @property
    def used_bytes(self) -> int:
        return sum(gw.nbytes for gw, _ in self.held.values())

    def _keep(self, obj: Any, rows: int, cols: int, nbytes: int, quantized: bool) -> GpuWeight:
        if self.capacity is not None and self.used_bytes + nbytes > self.capacity:
            raise CudaOutOfMemory("stand-in device full")
        gw = GpuWeight(self._next, rows, cols, nbytes, quantized)
        self._next += 1
        self.held[gw.handle] = (gw, obj)
        return gw

    def upload_float(self, array: np.ndarray, code: int) -> GpuWeight:
        w = Weight(array, code)
        return self._keep(w, w.rows, w.cols, w.nbytes, False)

    def upload_quant(self, fmt: int, group_size: int, payload: np.ndarray, scales: np.ndarray,
                     rows: int, cols: int) -> GpuWeight:
        m = QuantMatrix(name="stand-in", fmt=Fmt(fmt), group_size=group_size, out_features=rows,
                        in_features=cols, payload=payload, scales=scales)
        return self._keep(QuantWeight(m), rows, cols, m.nbytes, True)

    def free(self, gw: GpuWeight) -> None:
        del self.held[gw.handle]

    def close(self) -> None:
        self.held.clear()

    def matmul(self, x: np.ndarray, gw: GpuWeight, flags: int = 0) -> np.ndarray:
        self.calls["matmul"] += 1
        return Kernels.matmul(self.kernels, x, self.held[gw.handle][1])

    def matmul_many(self, x: np.ndarray, weights: list[GpuWeight], flags: int = 0
                    ) -> list[np.ndarray]:
        return [self.matmul(x, w, flags) for w in weights]

    def expert_mlp(self, gate: GpuWeight, up: GpuWeight, down: GpuWeight, x: np.ndarray,
                   flags: int = 0) -> np.ndarray:
        self.calls["expert_mlp"] += 1
        desc = mat_descriptors([self.held[g.handle][1] for g in (gate, up, down)])
        n = x.shape[0]
        return Kernels.moe(self.kernels, x, desc, np.array([0, n], np.int64),
                           np.arange(n, dtype=np.int64))

    # What the backend reads of a device beyond the products (HWINFO/GPUS, the VRAM budget).
    index = 0

    def mem_info(self) -> tuple[int, int]:
        total = self.capacity if self.capacity is not None else 1 << 40
        return total - self.used_bytes, total

    def info(self) -> DeviceInfo:
        total = self.capacity if self.capacity is not None else 1 << 40
        return DeviceInfo(self.index, "CPU stand-in", total, 0, 0, 0)
