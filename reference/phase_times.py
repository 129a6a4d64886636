"""Where the math adds the seconds of its phases (PERF/PROF, spec/protocol.md 2.6).

The model is handed an object with these three fields (the backend kit's ``PhaseClock``) and
adds to it around whole phases, a few ``perf_counter`` calls per layer: the expert products of
each MoE layer (routed and shared, without the expert reads), the attention of each layer
(projections, indexer, scores, output projection) and the final norm plus lm_head.
"""

from __future__ import annotations

from typing import Protocol


class PhaseTimes(Protocol):
    matmul_s: float
    attention_s: float
    head_s: float
