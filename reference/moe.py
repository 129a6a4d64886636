"""The sparse MLP of a MoE layer: routed experts weighted by the router, plus shared experts.

    out_t = sum_k w_t,k * expert_{e_t,k}(x_t)  +  shared(x_t)

Its steps, in order: ``route`` chooses each token's experts and their weights (§7.1);
``routed_experts`` applies every chosen expert to its tokens, reading the expert's weights
from the expert store the caller passes in (§7.2); ``shared_expert`` applies the shared
expert; ``expert_sum`` adds them up. ``moe`` is the four in a row; the incremental path runs
them one by one (the backend kit's step wrapper times the products without the reads).

Each token's routed sum runs over its chosen experts in ascending id order, then the shared
expert is added, so a token's result depends on no other token. Each expert chosen by several
tokens is still applied to all of them in one product (its weights are read once per step).

Spec: spec/model.md §7.
"""

from __future__ import annotations

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertStore
from colibri.reference.mlp import Matmul, swiglu
from colibri.reference.router import select_experts
from colibri.reference.softmax_router import select_experts_softmax
from colibri.reference.tensors import F32, I32
from colibri.reference.weights import LayerWeights


def route(x: F32, lw: LayerWeights, cfg: ModelConfig, mm: Matmul) -> tuple[I32, F32]:
    """(the experts each token chose [T, k], ascending ids; their weights [T, k]), by the
    family's router: noaux_tc (§7.1) or softmax top-k (§7.1.1)."""
    assert lw.router is not None
    logits = mm(x, lw.router.gate)
    t, k = x.shape[0], cfg.num_experts_per_tok
    chosen = np.empty((t, k), np.int32)
    weights = np.empty((t, k), np.float32)
    bias = lw.router.bias
    for row in range(t):
        if cfg.router == "softmax":
            chosen[row], weights[row] = select_experts_softmax(logits[row], cfg)
        else:
            assert bias is not None  # the noaux_tc layout loads it
            chosen[row], weights[row] = select_experts(logits[row], bias, cfg)
    return chosen, weights


def routed_experts(
    x: F32, chosen: I32, layer: int, experts: ExpertStore, cfg: ModelConfig, mm: Matmul
) -> F32:
    """Each token's chosen experts applied to it, [T, k, D] in the slots of ``chosen`` (§7.2).

    Every expert is read from ``experts`` once and applied to all its tokens in one product."""
    t = x.shape[0]
    outputs = np.empty((t, chosen.shape[1], cfg.hidden_size), dtype=np.float32)
    users: dict[int, list[tuple[int, int]]] = {}
    for row in range(t):
        for slot, e in enumerate(chosen[row]):
            users.setdefault(int(e), []).append((row, slot))
    for e in sorted(users):
        ew = experts.expert(layer, e)
        y = swiglu(x[[r for r, _ in users[e]]], ew.gate, ew.up, ew.down, mm)
        for i, (r, slot) in enumerate(users[e]):
            outputs[r, slot] = y[i]
    return outputs


def shared_expert(x: F32, lw: LayerWeights, mm: Matmul) -> F32 | None:
    """The shared expert's SwiGLU of every token [T, D]; None where the layer has none (§7.2)."""
    if lw.shared is None:
        return None
    return swiglu(x, lw.shared.gate, lw.shared.up, lw.shared.down, mm)


def expert_sum(outputs: F32, weights: F32, shared: F32 | None) -> F32:
    """Each token's router-weighted sum of its experts' outputs, from 0 in slot (ascending
    expert id) order, then the shared expert added (§7.2): the MoE output [T, D]."""
    t, k, d = outputs.shape
    out = np.zeros((t, d), dtype=np.float32)
    for row in range(t):
        acc = np.zeros(d, dtype=np.float32)
        for slot in range(k):
            acc = acc + weights[row][slot] * outputs[row, slot]
        out[row] = acc
    if shared is not None:
        out = out + shared
    return out


def moe(
    x: F32, lw: LayerWeights, experts: ExpertStore, cfg: ModelConfig, mm: Matmul
) -> tuple[F32, I32]:
    """(y [T, D], the experts each token chose [T, k] in the router's order)."""
    chosen, weights = route(x, lw, cfg, mm)
    outputs = routed_experts(x, chosen, lw.index, experts, cfg, mm)
    return expert_sum(outputs, weights, shared_expert(x, lw, mm)), chosen
