"""The model: embedding, decoder layers, final norm, lm_head; full-sequence and incremental.

``forward(ids)`` is the textbook full-sequence pass (naive MLA, gemm products) that the oracle
fixtures check. The incremental path (absorbed MLA over the latent cache, row-by-row
products) is this class's row steps, one method per step of a token, in the order they run:
embed, rope, then per layer the input norm, attention over the KV rows, the post-attention
norm, the router, the routed and shared experts and the residual (or the dense MLP), then the
final norm and lm_head, and the MTP input and layer where the model has them. The backend
kit's row driver (KV states, positions, routes; ``prefill`` / ``decode`` / ``decode_batch``)
and its step wrapper, which calls these steps in that order and reads the phase clock
between them, are shared with the accelerated engine; ``reference/backend.py``'s
``ReferenceModel`` joins the two. The incremental path is batch-invariant by construction: a
row's logits are the same bytes whether it is decoded alone, inside any batch, or as one
position of a prefill.

Spec: spec/model.md §3, §8, §9, §10.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertStore, MappedExpertStore
from colibri.reference.indexer_presence import mtp_indexer_mode, resolve_indexer
from colibri.reference.layer import (
    attention_rows,
    dense_residual,
    full_sequence_layer,
    input_norm,
    moe_residual,
    post_attention_norm,
)
from colibri.reference.layer_cache import LayerCache
from colibri.reference.moe import route, routed_experts, shared_expert
from colibri.reference.mtp import MtpWeights, concat_halves, mtp_input
from colibri.reference.norms import rms_norm
from colibri.reference.rope import cos_sin
from colibri.reference.safetensors import Checkpoint
from colibri.reference.tensors import F32, I32, I64, dense_matmul, row_matmul
from colibri.reference.weights import LayerWeights, TensorLoader, load_layer


class Model:
    def __init__(
        self,
        config: ModelConfig,
        checkpoint: Checkpoint,
        expert_store: ExpertStore | None = None,
        loader: TensorLoader | None = None,
    ) -> None:
        #: A config whose indexer the checkpoint does not store runs without it.
        self.config, self.indexer = resolve_indexer(config, checkpoint.tensors)
        cfg = self.config
        self.checkpoint = checkpoint
        # A quantisation-aware loader (same interface) can replace the plain float one.
        loader = loader or TensorLoader(checkpoint)
        d, v = cfg.hidden_size, cfg.vocab_size
        self.embed = loader.get("model.embed_tokens.weight", (v, d))
        self.final_norm = loader.get("model.norm.weight", (d,))
        if cfg.tie_word_embeddings:
            # HF ties the head to the embedding after loading, whatever lm_head.weight holds.
            self.lm_head = self.embed
        else:
            self.lm_head = loader.get("lm_head.weight", (v, d))
        self.indexer_modes: list[str | None] = [
            cfg.indexer_types[i] if cfg.indexer_types else None
            for i in range(cfg.num_hidden_layers)
        ]
        self.layers = [
            load_layer(loader, cfg, i, cfg.is_sparse(i), self.indexer_modes[i] == "full")
            for i in range(cfg.num_hidden_layers)
        ]
        sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
        self.mtp: MtpWeights | None = None
        self.mtp_indexer_mode: str | None = None
        # Like colibri, the MTP head is used when its tensors are there (configs often declare
        # one that a checkpoint does not ship).
        if loader.has(f"model.layers.{cfg.num_hidden_layers}.eh_proj.weight"):
            self.mtp = self._load_mtp(loader)
            sparse.append(cfg.num_hidden_layers)
        if expert_store is None:
            mapped = MappedExpertStore(loader, cfg, sparse)
            mapped.check_present()
            expert_store = mapped
        #: Where routed experts come from: the data source the MoE steps read.
        self.experts: ExpertStore = expert_store

    def _load_mtp(self, loader: TensorLoader) -> MtpWeights:
        cfg = self.config
        n, d = cfg.num_hidden_layers, cfg.hidden_size
        p = f"model.layers.{n}."
        self.mtp_indexer_mode = mtp_indexer_mode(cfg, self.checkpoint.tensors)
        return MtpWeights(
            eh_proj=loader.get(p + "eh_proj.weight", (d, 2 * d)),
            enorm=loader.get(p + "enorm.weight", (d,)),
            hnorm=loader.get(p + "hnorm.weight", (d,)),
            head_norm=loader.get(p + "shared_head.norm.weight", (d,)),
            layer=load_layer(loader, cfg, n, True, self.mtp_indexer_mode == "full"),
        )

    # -----------------------------------------------------------------------------------------
    # the first steps of both paths

    def _embed(self, ids: Sequence[int]) -> F32:
        """x_i = embed[t_i], an id outside the vocabulary refused (§3)."""
        for t in ids:
            if not 0 <= int(t) < self.config.vocab_size:
                raise ValueError(
                    f"token id {t} is outside the vocabulary [0, {self.config.vocab_size})"
                )
        out: F32 = self.embed[np.asarray(ids, dtype=np.int64)].astype(np.float32)
        return out

    def _rope(self, positions: Sequence[int]) -> tuple[F32, F32]:
        """RoPE cos/sin of ``positions`` (§4), computed once per forward and shared by every
        layer."""
        return cos_sin(np.asarray(positions), self.config.qk_rope_head_dim, self.config.rope_theta)

    # -----------------------------------------------------------------------------------------
    # full sequence

    def forward(self, ids: Sequence[int]) -> F32:
        """Logits [T, vocab] for every position of ``ids`` (teacher forcing, from position 0)."""
        return self.forward_hidden(ids)[1]

    def forward_hidden(self, ids: Sequence[int]) -> tuple[F32, F32]:
        """(pre-final-norm hidden [T, D], logits [T, vocab]): embed, every layer, final norm
        and lm_head (§3, §8)."""
        if len(ids) == 0:
            raise ValueError("forward needs at least one token")
        x = self._embed(ids)
        rope = self._rope(list(range(len(ids))))
        allowed: np.ndarray | None = None
        for i, lw in enumerate(self.layers):
            x, allowed = full_sequence_layer(x, lw, self.config, self.indexer_modes[i],
                                             self.experts, allowed, rope)
        logits = dense_matmul(rms_norm(x, self.final_norm, self.config.rms_norm_eps), self.lm_head)
        return x, logits

    # -----------------------------------------------------------------------------------------
    # incremental: a token's steps after _embed and _rope, in the order the kit's step wrapper
    # (colibri/backend_kit/layer_steps.py) runs them. ``layer`` num_hidden_layers is the MTP's.

    def _layer(self, layer: int) -> tuple[LayerWeights, str | None]:
        """A layer's weights and DSA indexer mode (the MTP layer's at num_hidden_layers)."""
        if layer < self.config.num_hidden_layers:
            return self.layers[layer], self.indexer_modes[layer]
        assert self.mtp is not None
        return self.mtp.layer, self.mtp_indexer_mode

    def _input_norm(self, layer: int, x: F32) -> F32:
        """rms_norm(x, input_layernorm), the attention's input (§3, §3.1)."""
        return input_norm(x, self._layer(layer)[0], self.config)

    def _attention_rows(self, layer: int, x: F32, xn: F32, caches: Sequence[LayerCache],
                        slots: list[int], keeps: list[I64 | None],
                        rope: tuple[F32, F32]) -> tuple[F32, list[I64 | None]]:
        """h = x + attention(xn) over each row's KV cache, absorbed MLA (§5) with the DSA
        indexer's key selection (§6); the rows' entries written at ``slots`` (§10)."""
        lw, mode = self._layer(layer)
        return attention_rows(x, xn, lw, self.config, mode, caches, slots, keeps, rope)

    def _post_attention_norm(self, layer: int, h: F32) -> F32:
        """rms_norm(h, post_attention_layernorm), the feed-forward's input (§3, §3.1)."""
        return post_attention_norm(h, self._layer(layer)[0], self.config)

    def _route(self, layer: int, xn: F32) -> tuple[I32, F32] | None:
        """The router: each row's experts and weights (§7.1); None on a dense layer."""
        lw = self._layer(layer)[0]
        return None if lw.router is None else route(xn, lw, self.config, row_matmul)

    def _dense_residual(self, layer: int, h: F32, xn: F32) -> F32:
        """A dense layer's output h + SwiGLU(xn) (§7.3)."""
        return dense_residual(h, xn, self._layer(layer)[0], row_matmul)

    def _routed_experts(self, layer: int, xn: F32, chosen: I32, experts: ExpertStore) -> F32:
        """Each row's chosen experts applied to it [rows, k, D], read from ``experts`` (§7.2)."""
        return routed_experts(xn, chosen, layer, experts, self.config, row_matmul)

    def _shared_expert(self, layer: int, xn: F32) -> F32 | None:
        """The shared expert's SwiGLU of every row (§7.2)."""
        return shared_expert(xn, self._layer(layer)[0], row_matmul)

    def _moe_residual(self, h: F32, outputs: F32, weights: F32, shared: F32 | None) -> F32:
        """A sparse layer's output: h + the weighted routed sum + the shared expert (§7.2)."""
        return moe_residual(h, outputs, weights, shared)

    def _head(self, x: F32, mtp: bool) -> F32:
        """Final norm (the MTP head's shared_head.norm with ``mtp``) and lm_head (§8, §9)."""
        norm = self.final_norm if self.mtp is None or not mtp else self.mtp.head_norm
        return row_matmul(rms_norm(x, norm, self.config.rms_norm_eps), self.lm_head)

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def _mtp_input(self, next_tokens: Sequence[int], hidden: F32) -> F32:
        """The MTP layer's input, eh_proj of [enorm(embed(next)); hnorm(final_norm(h))] (§9)."""
        assert self.mtp is not None
        e, g = mtp_input(self._embed(next_tokens), hidden, self.final_norm, self.mtp,
                         self.config.rms_norm_eps)
        return row_matmul(concat_halves(e, g), self.mtp.eh_proj)
