"""The MTP (multi-token prediction) head: a one-layer draft model stored after the main layers.

Stored as layer ``n = num_hidden_layers``: ``eh_proj`` [D, 2D], ``enorm``, ``hnorm``,
``shared_head.norm`` and one full sparse decoder layer. HF does not build it for GLM-5, so the
math is defined here (spec/model.md), following colibri/vLLM:

    h_i   = final-layer hidden (before the final norm) at position i
    e     = rms_norm(embed(t_{i+1}), enorm)
    g     = rms_norm(rms_norm(h_i, model.norm), hnorm)
    z     = eh_proj([e ; g])                         embedding first, hidden second
    z     = decoder_layer_n(z) at rope position i    over the MTP layer's own cache
    draft = lm_head(rms_norm(z, shared_head.norm))   predicts t_{i+2}

The MTP cache starts at the position of the first draft and has an entry for every position
from there on; entries the caller skipped (several tokens accepted at once) are filled lazily
from the hidden states and tokens the main state keeps, so a draft never depends on how the
earlier steps were batched.

Spec: spec/model.md §9.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from colibri.reference.norms import rms_norm
from colibri.reference.tensors import F32
from colibri.reference.weights import LayerWeights


@dataclass(frozen=True)
class MtpWeights:
    eh_proj: F32  # [D, 2D]
    enorm: F32
    hnorm: F32
    head_norm: F32  # shared_head.norm
    layer: LayerWeights


def mtp_input(
    embedding: F32, hidden: F32, final_norm: F32, w: MtpWeights, eps: float
) -> tuple[F32, F32]:
    """The two halves [e ; g] of the eh_proj input for rows of (embedding, hidden)."""
    e = rms_norm(embedding, w.enorm, eps)
    g = rms_norm(rms_norm(hidden, final_norm, eps), w.hnorm, eps)
    return e, g


def concat_halves(e: F32, g: F32) -> F32:
    out: F32 = np.concatenate([e, g], axis=-1)
    return out
