"""Where a step's time goes: the phase clock PERF and PROF report (spec/protocol.md 2.6).

The clock is read around calls to the math, a few ``perf_counter`` calls per layer, never per
element and never inside the math: the expert products of each MoE layer (routed and shared,
without the expert reads, which the expert store times as disk), the attention of each layer
(projections, indexer, scores, output projection) and the final norm plus lm_head. The step
wrapper (``layer_steps.py``) and the row driver (``row_driver.py``) add to it for the
reference; the accelerated engine adds around its kernel calls.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PhaseClock:
    """Seconds per phase, accumulated until ``reset``."""

    matmul_s: float = 0.0
    attention_s: float = 0.0
    head_s: float = 0.0

    def reset(self) -> None:
        self.matmul_s = self.attention_s = self.head_s = 0.0
