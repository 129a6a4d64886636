"""The model: embedding, decoder layers, final norm, lm_head; full-sequence and incremental.

``forward(ids)`` is the textbook full-sequence pass (naive MLA, gemm products) that the oracle
fixtures check. The incremental path (absorbed MLA over the latent cache, row-by-row
products) is this class's row hooks: embed, rope, a decoder layer over rows, the head, the
MTP input and layer. The bookkeeping around them (KV states, positions, routes; ``prefill`` /
``decode`` / ``decode_batch``) is the backend kit's row driver, shared with the accelerated
engine; ``reference/backend.py``'s ``ReferenceModel`` joins the two. The incremental path is
batch-invariant by construction: a row's logits are the same bytes whether it is decoded alone,
inside any batch, or as one position of a prefill.

Spec: spec/model.md §3, §8, §10.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertStore, MappedExpertStore
from colibri.reference.indexer_presence import mtp_indexer_mode, resolve_indexer
from colibri.reference.layer import (
    LayerCache,
    LayerContext,
    RowLayerResult,
    full_sequence_layer,
    row_layer,
)
from colibri.reference.mtp import MtpWeights, concat_halves, mtp_input
from colibri.reference.norms import rms_norm
from colibri.reference.phase_times import PhaseTimes
from colibri.reference.rope import cos_sin
from colibri.reference.safetensors import Checkpoint
from colibri.reference.tensors import F32, I64, dense_matmul, row_matmul
from colibri.reference.weights import TensorLoader, load_layer


class Model:
    def __init__(
        self,
        config: ModelConfig,
        checkpoint: Checkpoint,
        times: PhaseTimes,
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
        self.experts: ExpertStore = expert_store
        #: Attention, expert products and lm_head add their seconds here.
        self.times = times

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
    # helpers

    def _context(self, layer: int) -> LayerContext:
        return LayerContext(self.config, self.experts, self.indexer_modes[layer], self.times)

    def _rope(self, positions: Sequence[int]) -> tuple[F32, F32]:
        """RoPE cos/sin of ``positions``, computed once per forward and shared by every layer."""
        return cos_sin(np.asarray(positions), self.config.qk_rope_head_dim, self.config.rope_theta)

    def _embed(self, ids: Sequence[int]) -> F32:
        for t in ids:
            if not 0 <= int(t) < self.config.vocab_size:
                raise ValueError(
                    f"token id {t} is outside the vocabulary [0, {self.config.vocab_size})"
                )
        out: F32 = self.embed[np.asarray(ids, dtype=np.int64)].astype(np.float32)
        return out

    # -----------------------------------------------------------------------------------------
    # full sequence

    def forward(self, ids: Sequence[int]) -> F32:
        """Logits [T, vocab] for every position of ``ids`` (teacher forcing, from position 0)."""
        return self.forward_hidden(ids)[1]

    def forward_hidden(self, ids: Sequence[int]) -> tuple[F32, F32]:
        """(pre-final-norm hidden [T, D], logits [T, vocab])."""
        if len(ids) == 0:
            raise ValueError("forward needs at least one token")
        x = self._embed(ids)
        rope = self._rope(list(range(len(ids))))
        allowed: np.ndarray | None = None
        for i, lw in enumerate(self.layers):
            x, allowed = full_sequence_layer(x, lw, self._context(i), allowed, rope)
        started = time.perf_counter()
        logits = dense_matmul(rms_norm(x, self.final_norm, self.config.rms_norm_eps), self.lm_head)
        self.times.head_s += time.perf_counter() - started
        return x, logits

    # -----------------------------------------------------------------------------------------
    # the row hooks of the kit's row driver (backend_kit/row_driver.py)

    def _decoder_rows(self, layer: int, x: F32, positions: list[int],
                      caches: Sequence[LayerCache], keeps: list[I64 | None],
                      rope: tuple[F32, F32]) -> RowLayerResult:
        return row_layer(x, self.layers[layer], self._context(layer), positions, caches,
                         positions, keeps, rope)

    def _head(self, x: F32, mtp: bool) -> F32:
        norm = self.final_norm if self.mtp is None or not mtp else self.mtp.head_norm
        return row_matmul(rms_norm(x, norm, self.config.rms_norm_eps), self.lm_head)

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def _mtp_input(self, next_tokens: Sequence[int], hidden: F32) -> F32:
        assert self.mtp is not None
        e, g = mtp_input(self._embed(next_tokens), hidden, self.final_norm, self.mtp,
                         self.config.rms_norm_eps)
        return row_matmul(concat_halves(e, g), self.mtp.eh_proj)

    def _mtp_rows(self, z: F32, positions: list[int], caches: Sequence[LayerCache],
                  slots: list[int], rope: tuple[F32, F32]) -> RowLayerResult:
        assert self.mtp is not None
        ctx = LayerContext(self.config, self.experts, self.mtp_indexer_mode, self.times)
        return row_layer(z, self.mtp.layer, ctx, positions, caches, slots,
                         [None] * len(positions), rope)

