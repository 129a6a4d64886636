"""The softmax top-k router (OLMoE; transformers' Qwen2-MoE/OLMoE ``TopKRouter``).

Per token x (post-attention-normed), with E experts:

    p_e     = softmax_e(x . gate_e)                     over all E experts, float32
    chosen  = the K largest p_e
    w_k     = p_{chosen_k}
    w_k    /= sum_k w_k                                 (when norm_topk_prob)

There is no correction bias, no group limit and no scaling factor. Ties and order follow the
noaux_tc router's rule (router.py): equal values go to the lower expert id, ``chosen`` comes
back in ascending id order, and the normaliser sums in that order.

Spec: spec/model.md §7.1.1.
"""

from __future__ import annotations

import numpy as np
from colibri.reference.activations import softmax
from colibri.reference.config import ModelConfig
from colibri.reference.router import top_k_desc
from colibri.reference.tensors import F32, I64


def select_experts_softmax(logits: F32, cfg: ModelConfig) -> tuple[I64, F32]:
    """Route one token from its router logits [E] -> (expert ids [K], weights [K])."""
    probs = softmax(logits.astype(np.float32))
    chosen = np.sort(top_k_desc(probs, cfg.num_experts_per_tok))
    weights: F32 = probs[chosen]
    if cfg.norm_topk_prob:
        weights = (weights / np.sum(weights, dtype=np.float32)).astype(np.float32)
    return chosen, weights
