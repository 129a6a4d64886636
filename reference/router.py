"""The ``noaux_tc`` router (DeepSeek-V3, GLM-5): which routed experts a token uses, and weights.

Per token x (post-attention-normed), with E experts in G groups:

    s_e      = sigmoid(x . gate_e)                       the expert's affinity
    c_e      = s_e + bias_e                              e_score_correction_bias: selection only
    group g  = sum of the two largest c_e in the group   (only when G > 1)
    keep the topk_group best groups; c_e = -inf outside them
    chosen   = the K largest c_e
    w_k      = s_{chosen_k}                              (the bias never weighs)
    w_k     /= sum_k w_k + 1e-20                         (when norm_topk_prob)
    w_k     *= routed_scaling_factor

Tie rule (HF's top-k order is implementation-defined): larger value first, equal values go to
the lower expert id (lower group id for groups). ``chosen`` is returned in ascending expert id
order, and every sum over the chosen experts (the normaliser here, the weighted expert sum in
the MoE) runs in that order: the bias decides the set, and nothing about the order of the
choice can leak into a weight or an output bit.

Spec: spec/model.md §7.1.
"""

from __future__ import annotations

import numpy as np
from colibri.reference.activations import sigmoid
from colibri.reference.config import ModelConfig
from colibri.reference.tensors import F32, I64


def top_k_desc(values: F32, k: int) -> I64:
    """Indices of the k largest values, largest first, ties to the lower index."""
    order: I64 = np.argsort(-values, kind="stable")[:k].astype(np.int64)
    return order


def select_experts(logits: F32, bias: F32, cfg: ModelConfig) -> tuple[I64, F32]:
    """Route one token from its router logits [E] -> (expert ids [K], weights [K])."""
    scores = sigmoid(logits)
    choice = (scores + bias).astype(np.float32)
    if cfg.n_group > 1:
        per = cfg.n_routed_experts // cfg.n_group
        grouped = choice.reshape(cfg.n_group, per)
        top2 = -np.sort(-grouped, axis=-1)[:, :2]
        group_scores = (top2[:, 0] + top2[:, 1]).astype(np.float32)
        keep = top_k_desc(group_scores, cfg.topk_group)
        mask = np.zeros(cfg.n_group, dtype=bool)
        mask[keep] = True
        choice = np.where(np.repeat(mask, per), choice, np.float32(-np.inf)).astype(np.float32)
    chosen = np.sort(top_k_desc(choice, cfg.num_experts_per_tok))
    weights = scores[chosen]
    if cfg.norm_topk_prob:
        weights = weights / (np.sum(weights, dtype=np.float32) + np.float32(1e-20))
    weights = (weights * np.float32(cfg.routed_scaling_factor)).astype(np.float32)
    return chosen, weights
