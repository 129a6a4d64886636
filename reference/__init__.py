"""colibri.reference: the plain-numpy engine that defines correct behaviour.

Reading order of the forward pass (each module cites its spec/model.md section):

1. ``config.py`` (§2): the config.json keys that change the math; ``weights.py`` names and
   shape-checks the tensors of each layer; ``tensors.py`` holds the array aliases and the two
   products (``dense_matmul``; the batch-invariant ``row_matmul``, §10).
2. ``model.py`` (§3): ``Model.forward(ids)`` is the whole pass top to bottom: embed, every
   decoder layer, final norm, lm_head (§8). Read it first.
3. ``layer.py`` (§3): one decoder layer, ``h = x + attention(norm(x))``,
   ``y = h + mlp(norm(h))``, in its full-sequence form and its row form.
4. Attention: ``norms.py`` (§3.1-3.2), ``rope.py`` (§4), ``mla.py`` (§5, naive and absorbed
   forms), ``dsa.py`` (§6, the indexer that narrows the keys a query sees).
5. Feed-forward: ``mlp.py`` (SwiGLU, §7.3), ``moe.py`` (§7), ``router.py`` (§7.1),
   ``experts.py`` (§7.2, where expert weights come from), ``activations.py``.
6. The incremental path: ``forward_rows`` (``row_model.py``, shared with the accelerated
   engine) runs the same layers as rows over a ``kv_cache.KVState`` (§10), through
   ``Model``'s layer and head hooks; ``prefill``/``decode``/``decode_batch`` are its
   shorthands, ``mtp.py`` and ``mtp_draft`` the draft head (§9).
7. Around the math: ``quant/`` (§14, quantized containers), ``safetensors.py``,
   ``expert_store.py`` / ``expert_lru.py`` (tiers), ``timing.py`` (the PERF phase clock),
   ``kv_codec.py`` and ``backend.py`` (the numpy backend behind ``colibri.engine``'s seam).
"""

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.experts import ExpertStore, ExpertWeights, MappedExpertStore
from colibri.reference.kv_cache import KVState
from colibri.reference.model import Model, load_model

from colibri.text.tokenizer import Tokenizer

__all__ = [
    "CheckpointError",
    "ExpertStore",
    "ExpertWeights",
    "KVState",
    "MappedExpertStore",
    "Model",
    "ModelConfig",
    "Tokenizer",
    "load_model",
]
