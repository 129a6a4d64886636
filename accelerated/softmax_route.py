"""The softmax top-k router (OLMoE, Qwen3-MoE; spec/model.md §7.1.1) on the accelerated engine.

    p_e = softmax_e(logits)  (float32);  chosen = the K largest p_e, ties to the lower id,
    ascending;  w = p[chosen];  w /= sum(w)  when norm_topk_prob

Each row is routed on its own 1-D arrays, so a row's choices and weights are the same bytes
whatever rows share its step (§15 kind (c)); the operations are the reference's, in its
order, so the weights agree with it wherever the logits do. Kept in numpy: a router row is
E values, too little work for a C kernel to pay (``col_route`` is the sigmoid noaux_tc one).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from colibri.accelerated.kernels import F32

I32 = npt.NDArray[np.int32]


def route_softmax(logits: F32, top_k: int, norm: bool) -> tuple[I32, F32]:
    """Router logits [m, E] -> (chosen experts [m, top_k] ascending, their weights)."""
    m = logits.shape[0]
    chosen = np.empty((m, top_k), np.int32)
    weights = np.empty((m, top_k), np.float32)
    for r in range(m):
        row = logits[r]
        e = np.exp(row - np.max(row))
        p = (e / np.sum(e)).astype(np.float32)
        ids = np.sort(np.argsort(-p, kind="stable")[:top_k])
        w = p[ids]
        if norm:
            w = (w / np.sum(w, dtype=np.float32)).astype(np.float32)
        chosen[r], weights[r] = ids, w
    return chosen, weights
