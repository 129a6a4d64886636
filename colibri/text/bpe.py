"""Byte-pair merging of one pre-token, the way HF ``tokenizers``' BPE model does it.

Each step merges the adjacent pair with the lowest merge rank; among equal ranks (the same
pair occurring twice) the leftmost goes first. That is exactly the order HF's priority
queue of (rank, position) produces, so the results are identical.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BpeModel:
    """Vocabulary and merge table of a BPE model (strings over the byte-level alphabet)."""

    vocab: dict[str, int]
    #: (left, right) -> rank; the rank is the merge's index in the file's merge list.
    ranks: dict[tuple[str, str], int]
    #: Look the whole pre-token up in the vocabulary before merging (HF ``ignore_merges``).
    ignore_merges: bool
    #: tiktoken's rule (rank_bpe.py): a pair's rank is the vocabulary rank of the token it
    #: merges into, and ``ranks`` is unused.
    merged_ranks: bool = False

    def tokenize(self, word: str) -> list[int]:
        """Token ids of one pre-token given as a string over the byte-level alphabet."""
        if self.ignore_merges:
            whole = self.vocab.get(word)
            if whole is not None:
                return [whole]
        # Characters without a vocabulary entry are dropped (no unk token, no byte
        # fallback): HF does the same, and byte-level vocabularies hold all 256 bytes.
        symbols = [char for char in word if char in self.vocab]
        rank = self._merged_rank if self.merged_ranks else self._pair_rank
        return [self.vocab[symbol] for symbol in merge_symbols(symbols, rank)]

    def _pair_rank(self, left: str, right: str) -> int | None:
        return self.ranks.get((left, right))

    def _merged_rank(self, left: str, right: str) -> int | None:
        return self.vocab.get(left + right)


def merge_symbols(symbols: list[str], rank_of: Callable[[str, str], int | None]) -> list[str]:
    """Apply merges to ``symbols`` until no adjacent pair has a rank (``rank_of``: None).

    A heap of (rank, position) candidates keeps long pre-tokens (whitespace runs, long
    digit-free words) at O(n log n) instead of rescanning all pairs after every merge.
    Positions are indices into the original symbol list; a merged symbol keeps its left
    position, so position order is sequence order and "leftmost" is "smallest position".
    """
    count = len(symbols)
    if count < 2:
        return list(symbols)
    current: list[str | None] = list(symbols)
    following = list(range(1, count + 1))  # index of the next live symbol; count = none
    preceding = list(range(-1, count - 1))  # index of the previous live symbol; -1 = none
    heap: list[tuple[int, int, str, str]] = []
    for at in range(count - 1):
        rank = rank_of(symbols[at], symbols[at + 1])
        if rank is not None:
            heap.append((rank, at, symbols[at], symbols[at + 1]))
    heapq.heapify(heap)
    while heap:
        _rank, at, left, right = heapq.heappop(heap)
        after = following[at]
        # A candidate is stale once either side has been merged into something else.
        if current[at] != left or after >= count or current[after] != right:
            continue
        merged = left + right
        current[at] = merged
        current[after] = None
        following[at] = following[after]
        if following[at] < count:
            preceding[following[at]] = at
        before = preceding[at]
        if before >= 0:
            previous = current[before]
            assert previous is not None
            rank = rank_of(previous, merged)
            if rank is not None:
                heapq.heappush(heap, (rank, before, previous, merged))
        if following[at] < count:
            nxt = current[following[at]]
            assert nxt is not None
            rank = rank_of(merged, nxt)
            if rank is not None:
                heapq.heappush(heap, (rank, at, merged, nxt))
    return [symbol for symbol in current if symbol is not None]
