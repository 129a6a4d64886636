"""The sparse MLP of a MoE layer: routed experts weighted by the router, plus shared experts.

    out_t = sum_k w_t,k * expert_{e_t,k}(x_t)  +  shared(x_t)

Each token's routed sum runs over its chosen experts in ascending id order, then the shared
expert is added, so a token's result depends on no other token. Each expert chosen by several
tokens is still applied to all of them in one product (its weights are read once per step).

Spec: spec/model.md §7.
"""

from __future__ import annotations

import time

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertStore
from colibri.reference.mlp import Matmul, swiglu
from colibri.reference.phase_times import PhaseTimes
from colibri.reference.router import select_experts
from colibri.reference.tensors import F32, I32
from colibri.reference.weights import LayerWeights


def route(x: F32, lw: LayerWeights, cfg: ModelConfig, mm: Matmul) -> tuple[I32, F32]:
    """(the experts each token chose [T, k], ascending ids; their weights [T, k]), §7.1."""
    assert lw.router is not None
    logits = mm(x, lw.router.gate)
    t, k = x.shape[0], cfg.num_experts_per_tok
    chosen = np.empty((t, k), np.int32)
    weights = np.empty((t, k), np.float32)
    for row in range(t):
        chosen[row], weights[row] = select_experts(logits[row], lw.router.bias, cfg)
    return chosen, weights


def moe(
    x: F32, lw: LayerWeights, store: ExpertStore, cfg: ModelConfig, mm: Matmul, clock: PhaseTimes
) -> tuple[F32, I32]:
    """(y [T, D], the experts each token chose [T, k] in the router's order). The expert
    products add to ``clock.matmul_s``; reading an expert's weights does not."""
    layer_id = lw.index
    t = x.shape[0]
    k = cfg.num_experts_per_tok
    chosen, weights = route(x, lw, cfg, mm)
    outputs = np.empty((t, k, cfg.hidden_size), dtype=np.float32)
    users: dict[int, list[tuple[int, int]]] = {}
    for row in range(t):
        for slot, e in enumerate(chosen[row]):
            users.setdefault(int(e), []).append((row, slot))
    for e in sorted(users):
        ew = store.expert(layer_id, e)
        rows = [r for r, _ in users[e]]
        started = time.perf_counter()
        y = swiglu(x[rows], ew.gate, ew.up, ew.down, mm)
        clock.matmul_s += time.perf_counter() - started
        for i, (r, slot) in enumerate(users[e]):
            outputs[r, slot] = y[i]
    out = np.zeros((t, cfg.hidden_size), dtype=np.float32)
    for row in range(t):
        acc = np.zeros(cfg.hidden_size, dtype=np.float32)
        for slot in range(k):
            acc = acc + weights[row][slot] * outputs[row, slot]
        out[row] = acc
    if lw.shared is not None:
        started = time.perf_counter()
        out = out + swiglu(x, lw.shared.gate, lw.shared.up, lw.shared.down, mm)
        clock.matmul_s += time.perf_counter() - started
    return out, chosen
