"""SwiGLU feed-forward: the dense MLP of the first layers, each routed expert, the shared expert.

    y = down( silu(gate x) * up x )

Spec: spec/model.md §7.2, §7.3.
"""

from __future__ import annotations

from collections.abc import Callable

from colibri.reference.activations import silu
from colibri.reference.tensors import F32

Matmul = Callable[[F32, F32], F32]


def swiglu(x: F32, gate: F32, up: F32, down: F32, mm: Matmul) -> F32:
    return mm(silu(mm(x, gate)) * mm(x, up), down)
