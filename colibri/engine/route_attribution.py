"""Which request each routing selection belongs to, so ENTROPY describes one turn.

The model reports selections as ``route_observer(layer, expert_ids)``, once per row at every
routed layer, rows in order (colibri.reference's MoE loops rows in order). Around a decode
forward the engine names the request of every row; a selection is credited to the row's
request by counting the calls per layer. A forward whose call counts do not match its rows
(a model that reports in another order) credits nothing rather than guess; the first such
forward is reported on the log, since ENTROPY then reads 0 without any other sign.

Only rows that forward a generated token are credited (prefill rows depend on how much of
the prompt was cached; draft rows on whether MTP drafting ran), so a turn's entropy is the
same batched or alone, cold or warm, with or without drafting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TextIO

import numpy as np
import numpy.typing as npt


class RouteAttribution:
    def __init__(self, rows: Sequence[int], n_experts: int, log: TextIO | None = None) -> None:
        self._row_of = {layer: i for i, layer in enumerate(rows)}
        self.n_rows = len(rows)
        self.n_experts = n_experts
        self._owners: list[int] | None = None
        self._pending: list[tuple[int, int, tuple[int, ...]]] = []
        self._calls: dict[int, int] = {}
        self._turns: dict[int, npt.NDArray[np.int64]] = {}
        self.mismatches = 0
        self._log = log

    def begin(self, owners: Sequence[int]) -> None:
        """A forward is about to run; row i belongs to request owners[i]."""
        self._owners = list(owners)
        self._pending.clear()
        self._calls.clear()

    def observe(self, layer: int, experts: tuple[int, ...]) -> None:
        if self._owners is None or layer not in self._row_of:
            return
        row = self._calls.get(layer, 0)
        self._calls[layer] = row + 1
        self._pending.append((layer, row, experts))

    def end(self, keep: Sequence[bool] | None = None) -> None:
        """Credit the forward's selections (only rows with keep[i], when given)."""
        owners = self._owners
        self._owners = None
        if owners is None:
            return
        if any(n != len(owners) for n in self._calls.values()):
            self.mismatches += 1
            if self.mismatches == 1 and self._log is not None:
                print(
                    "[API] routing reports do not match the forward's rows; "
                    "ENTROPY is not attributed (reads 0) for such forwards",
                    file=self._log,
                )
            return
        for layer, row, experts in self._pending:
            if keep is not None and not keep[row]:
                continue
            owner = owners[row]
            counts = self._turns.get(owner)
            if counts is None:
                counts = np.zeros((self.n_rows, self.n_experts), np.int64)
                self._turns[owner] = counts
            np.add.at(counts[self._row_of[layer]], np.asarray(experts, np.intp), 1)
        self._pending.clear()

    def take_entropy(self, owner: int) -> list[float]:
        """Per routed layer: entropy (bits) of the owner's selections; forgets them."""
        counts = self._turns.pop(owner, None)
        if counts is None:
            return [0.0] * self.n_rows
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
