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
        self._turns: dict[int, npt.NDArray[np.int64]] = {}
        #: Rows credited since the owner's last fold: tallied FOLD_ROWS at a time, so a decode
        #: step pays a list append per row rather than a bincount (~13 µs) per row.
        self._pending: dict[int, list[Routes]] = {}

    def credit(self, owner: int, routes: Routes) -> None:
        """Add one row's routing ([routed layers, k]) to the owner's turn."""
        if owner not in self._turns:
            self._turns[owner] = np.zeros((self.n_rows, self.n_experts), np.int64)
            self._pending[owner] = []
        pending = self._pending[owner]
        pending.append(np.array(routes, np.int32))  # a copy: the step's buffer may be reused
        if len(pending) >= FOLD_ROWS:
            self._fold(owner)

    def _fold(self, owner: int) -> None:
        pending = self._pending[owner]
        if pending:
            add_selections(self._turns[owner], self._row_index, np.stack(pending))
            pending.clear()

    def take_entropy(self, owner: int) -> list[float]:
        """Per routed layer: entropy (bits) of the owner's selections; forgets them."""
        if owner not in self._turns:
            return [0.0] * self.n_rows
        self._fold(owner)
        counts = self._turns.pop(owner)
        del self._pending[owner]
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
        self._pending.pop(owner, None)
