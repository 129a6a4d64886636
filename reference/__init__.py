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
6. The incremental path: ``Model``'s row hooks run the same layers as rows over a KV cache
   (§10); the bookkeeping around them (``forward_rows`` and its shorthands ``prefill``/
   ``decode``/``decode_batch``, the ``KVState``) is the backend kit's row driver
   (``colibri/backend_kit/``), shared with the accelerated engine; ``mtp.py`` and
   ``mtp_draft`` are the draft head (§9).
7. Around the math: ``quant/`` (§14, quantized containers), ``safetensors.py``,
   ``expert_lru.py`` (the decoded-expert cache), ``phase_times.py`` (what the PERF phases
   are added to), and ``backend.py``: ``ReferenceModel`` (the math on the kit's row driver,
   what ``load_model`` returns) and the numpy backend behind ``colibri.engine``'s seam.
"""

from colibri.reference.backend import ReferenceModel, load_model
from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.experts import ExpertStore, ExpertWeights, MappedExpertStore
from colibri.reference.model import Model

from colibri.text.tokenizer import Tokenizer

__all__ = [
    "CheckpointError",
    "ExpertStore",
    "ExpertWeights",
    "MappedExpertStore",
    "Model",
    "ModelConfig",
    "ReferenceModel",
    "Tokenizer",
    "load_model",
]
