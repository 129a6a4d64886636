"""The row driver: the incremental half of a model's API, written once for both engines
(spec/model.md §9, §10).

``prefill``, ``decode`` and ``decode_batch`` are shorthands of ``forward_rows``: append one
token per row to its KV state in a single forward, every row's bytes independent of the
others, and pay for the lm_head only on the rows that want logits. ``mtp_draft`` forwards the
MTP layer over the positions its cache still lacks. A forward reads top to bottom:
``_embed``, ``_rope``, every decoder layer (``_decoder_layers``, ``_decoder_rows``), then
``_head`` on the rows that want logits.

What is shared here is the bookkeeping — argument checks, positions, writing rows back into
the states, routes, the head's timing; what differs between the numpy reference and the
accelerated engine (how a layer, the final norm and the head are computed) is each subclass's
hooks: the math stays in the backend. A backend whose layers are steps of plain math gets
``_decoder_rows`` and ``_mtp_rows`` from ``layer_steps.SteppedRowModel``, which runs the steps
and times their phases; the accelerated engine times its own kernel calls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from colibri.backend_kit.kv_state import (
    KVLayer,
    KVState,
    MtpCache,
    cache_widths,
    mtp_rows,
    step_positions,
)
from colibri.backend_kit.phase_clock import PhaseClock
from colibri.reference.config import ModelConfig
from colibri.reference.tensors import F32, I32, I64

#: What a layer hook returns: the rows' new hidden states, each row's DSA keep-set for the
#: next shared layer (None: dense), and the experts each row chose ([rows, k]; None: dense).
LayerRows = tuple[F32, list[I64 | None], I32 | None]


class RowModel:
    config: ModelConfig
    #: Each decoder layer's DSA indexer type (None: no indexer), and the MTP layer's.
    indexer_modes: list[str | None]
    mtp_indexer_mode: str | None
    #: Seconds of attention, expert products and lm_head since the last reset (PERF/PROF).
    clock: PhaseClock
    #: The most rows one forward takes (a RAM budget's bound, ``expert_tiers``); None: any.
    max_step_rows: int | None = None

    # --- the hooks ---------------------------------------------------------------------------

    def _embed(self, ids: Sequence[int]) -> F32:
        raise NotImplementedError

    def _rope(self, positions: Sequence[int]) -> tuple[F32, F32]:
        raise NotImplementedError

    def _decoder_rows(self, layer: int, x: F32, positions: list[int], caches: list[KVLayer],
                      keeps: list[I64 | None], rope: tuple[F32, F32]) -> LayerRows:
        """Decoder layer ``layer`` over the rows (their positions are also their cache slots)."""
        raise NotImplementedError

    def _head(self, x: F32, mtp: bool) -> F32:
        """Final norm (the MTP head's own with ``mtp``) and lm_head: logits [rows, vocab]."""
        raise NotImplementedError

    @property
    def has_mtp(self) -> bool:
        raise NotImplementedError

    def _mtp_input(self, next_tokens: Sequence[int], hidden: F32) -> F32:
        """eh_proj of [enorm(embed(next token)); hnorm(final_norm(hidden))] (§9)."""
        raise NotImplementedError

    def _mtp_rows(self, z: F32, positions: list[int], caches: list[KVLayer], slots: list[int],
                  rope: tuple[F32, F32]) -> LayerRows:
        raise NotImplementedError

    # --- the API -----------------------------------------------------------------------------

    def new_state(self) -> KVState:
        """An empty sequence: each layer's cache arrays (``cache_widths``: MLA's latent and
        indexer keys, or a standard-attention family's keys and values), and the MTP's."""
        layers = [KVLayer(cache_widths(self.config, mode)) for mode in self.indexer_modes]
        mtp = None
        if self.has_mtp:
            mtp = MtpCache(KVLayer(cache_widths(self.config, self.mtp_indexer_mode)))
        return KVState(layers=layers, hidden_size=self.config.hidden_size, mtp=mtp)

    def prefill(self, state: KVState, ids: Sequence[int]) -> F32:
        """Append ``ids`` to the state; logits [len(ids), vocab] for each appended position."""
        return self.forward_rows([state] * len(ids), list(ids), [True] * len(ids))[0]

    def decode(self, state: KVState, token: int) -> F32:
        """Append one token; its logits [vocab]."""
        logits: F32 = self.forward_rows([state], [token], [True])[0][0]
        return logits

    def decode_batch(self, states: Sequence[KVState], tokens: Sequence[int]) -> F32:
        """One token for each of several sequences: logits [B, vocab], row i bit-identical to
        ``decode(states[i], tokens[i])`` run alone."""
        if len(states) != len(tokens):
            raise ValueError(f"{len(states)} states but {len(tokens)} tokens")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("decode_batch needs distinct states (use prefill for one sequence)")
        return self.forward_rows(states, tokens, [True] * len(states))[0]

    def forward_rows(
        self, states: Sequence[KVState], tokens: Sequence[int], wants_logits: Sequence[bool]
    ) -> tuple[F32, I32]:
        """Append ``tokens[r]`` to ``states[r]`` for every row r, in one forward.

        Rows of one state are consecutive positions of it, in row order (a prefill); rows of
        different states are independent (a batched decode). Returns (the logits of the rows
        with ``wants_logits``, [wanting rows, vocab]; the experts every row chose at every
        sparse decoder layer, [rows, sparse layers, k]). Each row's bytes are the same whatever
        else is in the forward (spec/model.md §10), and only the rows that want
        logits pay for the lm_head.
        """
        cfg = self.config
        m = len(tokens)
        if len(states) != m or len(wants_logits) != m:
            raise ValueError(f"{len(states)} states, {m} tokens, {len(wants_logits)} flags")
        size = self.max_step_rows
        if size and m > size:
            # A RAM budget bounds one layer's experts for a forward's rows: a longer one goes
            # in chunks, in row order (a row's bytes do not depend on its neighbours).
            parts = [self.forward_rows(states[i : i + size], tokens[i : i + size],
                                       wants_logits[i : i + size]) for i in range(0, m, size)]
            return (np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]))
        no_logits = np.zeros((0, cfg.vocab_size), np.float32)
        if m == 0:
            return no_logits, np.zeros((0, 0, cfg.num_experts_per_tok), np.int32)
        positions = step_positions(list(states))
        x, routes = self._decoder_layers(states, positions, self._embed(tokens),
                                         self._rope(positions))
        for s, tok, pos, hid in zip(states, tokens, positions, x, strict=True):
            s.hidden[pos] = hid
            if pos == len(s.tokens):
                s.tokens.append(int(tok))
            else:  # a prefill row of the same state appended earlier in this call
                s.tokens[pos] = int(tok)
        routed: I32 = (np.stack(routes, axis=1) if routes
                       else np.zeros((m, 0, cfg.num_experts_per_tok), np.int32))
        wanted = [r for r in range(m) if wants_logits[r]]
        if not wanted:
            return no_logits, routed
        return self._timed_head(np.ascontiguousarray(x[wanted]), mtp=False), routed

    def mtp_draft(self, state: KVState, token: int) -> F32:
        """Draft logits [vocab] for the token after ``token``, where ``token`` follows the last
        position of ``state`` (it is not appended to the state)."""
        return self.mtp_draft_routed(state, token)[0]

    def mtp_draft_routed(self, state: KVState, token: int) -> tuple[F32, I32]:
        """``mtp_draft`` and the experts the MTP layer chose for every position it forwarded
        ([positions, k]: the MTP cache fills lazily, so a draft may forward several)."""
        if not self.has_mtp:
            raise ValueError("this model has no MTP head")
        positions, next_tokens, slots = mtp_rows(state, token)
        cache = state.mtp
        assert cache is not None
        z = self._mtp_input(next_tokens, np.ascontiguousarray(state.hidden[positions]))
        z, _, chosen = self._mtp_rows(z, positions, [cache.layer] * len(positions), slots,
                                      self._rope(positions))
        cache.length = slots[-1] + 1
        draft: F32 = self._timed_head(np.ascontiguousarray(z[-1:]), mtp=True)[0]
        assert chosen is not None  # the MTP layer is always sparse
        return draft, chosen

    def _decoder_layers(self, states: Sequence[KVState], positions: list[int], x: F32,
                        rope: tuple[F32, F32]) -> tuple[F32, list[I32]]:
        """Every decoder layer over the rows (``_decoder_rows`` one after the other; an engine
        may run them together): the last hidden states and each sparse layer's choices."""
        keeps: list[I64 | None] = [None] * len(positions)
        routes: list[I32] = []
        for i in range(self.config.num_hidden_layers):
            caches = [s.layers[i] for s in states]
            x, keeps, chosen = self._decoder_rows(i, x, positions, caches, keeps, rope)
            if chosen is not None:
                routes.append(chosen)
        return x, routes

    def _timed_head(self, x: F32, mtp: bool) -> F32:
        started = time.perf_counter()
        logits = self._head(x, mtp)
        self.clock.head_s += time.perf_counter() - started
        return logits
