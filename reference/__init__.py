"""colibri.reference: the plain-numpy engine that defines correct behaviour.

Reading order (each module cites its spec/model.md section):

1. ``config.py`` (§2): the config.json keys that change the math; ``weights.py`` names and
   shape-checks the tensors of each layer; ``tensors.py`` holds the array aliases and the two
   products (``dense_matmul``; the batch-invariant ``row_matmul``, §10).
2. The full-sequence path, the textbook one that the oracle fixtures check: ``model.py``'s
   ``Model.forward(ids)`` is the whole pass top to bottom (§3): ``_embed``, ``_rope`` (§4),
   every decoder layer (``layer.py``'s ``full_sequence_layer``: ``input_norm``, naive MLA and
   the DSA mask, ``post_attention_norm``, dense MLP or MoE), final norm and lm_head (§8).
   Read it first.
3. Attention: ``norms.py`` (§3.1-3.2), ``rope.py`` (§4), ``mla.py`` (§5, naive and absorbed
   forms), ``dsa.py`` (§6, the indexer that narrows the keys a query sees).
4. Feed-forward: ``mlp.py`` (SwiGLU, §7.3), ``moe.py`` (§7: ``route``, ``routed_experts``,
   ``shared_expert``, ``expert_sum``), ``router.py`` (§7.1), ``experts.py`` (§7.2, where
   expert weights come from), ``activations.py``.
5. The incremental path, what the engine runs (absorbed MLA over a KV cache, row-by-row
   products, batch-invariant, §10): one token's steps, in order, are ``model.py``'s methods
   under "incremental": ``_embed`` (§3), ``_rope`` (§4), then per layer ``_input_norm``
   (§3.1), ``_attention_rows`` (§5, §6: the rows' KV entries written, then attended),
   ``_post_attention_norm``, ``_route`` (§7.1), ``_routed_experts`` and ``_shared_expert``
   (§7.2), ``_moe_residual`` (or ``_dense_residual``, §7.3), then ``_head`` (final norm and
   lm_head, §8); with an MTP head, ``_mtp_input`` and the same layer steps for layer
   ``num_hidden_layers`` (``mtp.py``, §9). The backend kit calls them: its row driver
   (``colibri/backend_kit/row_driver.py``, ``forward_rows`` and the shorthands ``prefill``,
   ``decode``, ``decode_batch``, ``mtp_draft``) keeps the KV states, positions and routes, and
   its step wrapper (``layer_steps.py``) runs a layer's steps in the order above, reading the
   phase clock around them.
6. Around the math: ``quant/`` (§14, quantized containers), ``safetensors.py``,
   ``expert_lru.py`` (the decoded-expert cache), ``layer_trace.py`` (per-layer dumps, §16),
   and ``backend.py``: ``ReferenceModel`` (the math on the kit's row driver and step wrapper,
   what ``load_model`` returns) and the numpy backend behind ``colibri.engine``'s seam.
"""

from typing import TYPE_CHECKING, Any

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.experts import ExpertStore, ExpertWeights, MappedExpertStore
from colibri.reference.model import Model

from colibri.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from colibri.reference.backend import ReferenceModel, load_model


def __getattr__(name: str) -> Any:
    # The numpy backend is built on the backend kit, whose modules import this package's
    # data modules: importing it on first use (not here) lets a kit module be imported first.
    if name in ("ReferenceModel", "load_model"):
        from colibri.reference import backend

        return getattr(backend, name)
    raise AttributeError(f"module 'colibri.reference' has no attribute {name!r}")

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
