"""Per-layer dumps: what the full-sequence forward computed at every layer (spec/model.md §16).

``trace(model, ids)`` runs the textbook forward of ``Model.forward_hidden`` one half-layer at
a time and keeps, per decoder layer L, the residual stream after the layer (``hidden.L``), on
sparse layers the chosen experts and their weights (``experts.L``, ``expert_weights.L``), on
layers with a DSA indexer the key positions each query attended to (``dsa_keys.L``), and
the final ``logits``. The arrays are the very bytes the forward computes (the same
functions, in the same order), so ``logits`` equals ``model.forward(ids)``.

Another engine writes the same names to an ``.npz`` file; ``colibri conformance diff``
finds the first layer and quantity where it departs from these goldens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from colibri.reference.layer import full_sequence_attention, full_sequence_feed_forward
from colibri.reference.model import Model
from colibri.reference.moe import route
from colibri.reference.norms import rms_norm
from colibri.reference.tensors import dense_matmul

#: Marks an unused slot of a ``dsa_keys`` row (a query that saw fewer keys than index_topk).
NO_KEY = -1


def trace(model: Model, ids: Sequence[int]) -> dict[str, np.ndarray]:
    """The per-layer dump of ``ids`` (teacher forcing from position 0), §16."""
    if len(ids) == 0:
        raise ValueError("a trace needs at least one token")
    cfg = model.config
    out: dict[str, np.ndarray] = {"tokens": np.asarray(ids, dtype=np.int64)}
    x = model._embed(ids)
    rope = model._rope(list(range(len(ids))))
    allowed: np.ndarray | None = None
    for i, lw in enumerate(model.layers):
        mode = model.indexer_modes[i]
        h, allowed = full_sequence_attention(x, lw, cfg, mode, allowed, rope)
        if mode is not None:
            out[f"dsa_keys.{i}"] = _attended(allowed, cfg.index_topk)
        if lw.router is not None:
            normed = rms_norm(h, lw.post_norm, cfg.rms_norm_eps)
            out[f"experts.{i}"], out[f"expert_weights.{i}"] = route(normed, lw, cfg, dense_matmul)
        x = full_sequence_feed_forward(h, lw, cfg, model.experts)
        out[f"hidden.{i}"] = x
    out["logits"] = dense_matmul(rms_norm(x, model.final_norm, cfg.rms_norm_eps), model.lm_head)
    return out


def _attended(allowed: np.ndarray, topk: int) -> np.ndarray:
    """[T, min(topk, T)] int32: each query's attended key positions ascending, NO_KEY
    padded (no query of T tokens attends to more than T keys)."""
    width = min(topk, allowed.shape[0])
    rows = np.full((allowed.shape[0], width), NO_KEY, dtype=np.int32)
    for query, mask in enumerate(allowed):
        kept = np.flatnonzero(mask)
        rows[query, : kept.size] = kept
    return rows


def save(path: Path, dump: dict[str, np.ndarray], reduction_length: int) -> None:
    """Write a golden dump: the arrays plus ``reduction_length`` (the §15 ``n`` of the
    model at this prompt length), which sets the tolerance of the comparison."""
    arrays = {"reduction_length": np.asarray(reduction_length, dtype=np.int64), **dump}
    np.savez_compressed(path, allow_pickle=False, **arrays)
