"""Which experts one request's generated tokens were routed to, so ENTROPY describes one turn.

Every step returns its rows' routing (``Step.routes``); the engine credits a row to the request
that owns it. Only rows that forward a generated token are credited (prefill rows depend on how
much of the prompt was cached; draft rows on whether MTP drafting ran), so a turn's entropy is
the same batched or alone, cold or warm, with or without drafting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import Routes
from colibri.engine.expert_usage import add_selections

#: Rows a turn buffers before tallying them in one call.
FOLD_ROWS = 64


class TurnRoutes:
    def __init__(self, rows: Sequence[int], routed_layers: Sequence[int], n_experts: int) -> None:
        """``rows``: the EMAP rows (decoder layers); ``routed_layers``: the layers a step's
        routes cover, in their order (a subset of ``rows``)."""
        row_of = {layer: i for i, layer in enumerate(rows)}
        self._row_index = np.asarray([row_of[layer] for layer in routed_layers], np.intp)
        self.n_rows = len(rows)
        self.n_experts = n_experts
        #: owner -> (counts [rows, experts], rows credited since the last fold). Rows are
        #: tallied FOLD_ROWS at a time, so a decode step pays a list append per row rather
        #: than a bincount (~13 µs) per row.
        self._turns: dict[int, tuple[npt.NDArray[np.int64], list[Routes]]] = {}

    def credit(self, owner: int, routes: Routes) -> None:
        """Add one row's routing ([routed layers, k]) to the owner's turn."""
        turn = self._turns.get(owner)
        if turn is None:
            turn = (np.zeros((self.n_rows, self.n_experts), np.int64), [])
            self._turns[owner] = turn
        counts, pending = turn
        pending.append(np.array(routes, np.int32))  # a copy: the step's buffer may be reused
        if len(pending) >= FOLD_ROWS:
            self._fold(counts, pending)

    def _fold(self, counts: npt.NDArray[np.int64], pending: list[Routes]) -> None:
        if pending:
            add_selections(counts, self._row_index, np.stack(pending))
            pending.clear()

    def take_entropy(self, owner: int) -> list[float]:
        """Per routed layer: entropy (bits) of the owner's selections; forgets them."""
        turn = self._turns.pop(owner, None)
        if turn is None:
            return [0.0] * self.n_rows
        counts, pending = turn
        self._fold(counts, pending)
        out = []
        for row in counts:
            total = int(row.sum())
            h = 0.0
            for c in row:
                if c:
                    p = int(c) / total
                    h -= p * math.log2(p)
            out.append(abs(h))
        return out

    def forget(self, owner: int) -> None:
        self._turns.pop(owner, None)
