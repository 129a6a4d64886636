"""Per-request grammar constraints for the mux loop (spec/protocol.md 2.7, "Constrained
decoding"): the engine's grammar vocabulary, and a SUBMIT's grammar section turned into a
matcher. The matcher masks a logit row before greedy or seeded sampling, in the control
plane, so every backend samples from the same masked rows."""

from __future__ import annotations

from collections.abc import Iterable

from colibri.engine.runtime import TextTokenizer
from colibri.text.grammar import GrammarError, GrammarVocabulary, Matcher
from colibri.text.tokenizer import Tokenizer

__all__ = ["GrammarError", "Matcher", "build_vocabulary"]


def _bytes_of(tokenizer: TextTokenizer, token: int) -> bytes:
    try:
        return tokenizer.token_bytes(token)
    except ValueError:
        return b""


def build_vocabulary(
    tokenizer: TextTokenizer, vocab: int, stops: Iterable[int]
) -> GrammarVocabulary:
    """The matcher's view of ``tokenizer`` over a model vocabulary of ``vocab`` ids."""
    tokens = [_bytes_of(tokenizer, i) for i in range(vocab)]
    if isinstance(tokenizer, Tokenizer):
        added = [token.id for token in tokenizer.added_tokens if token.id < vocab]
    else:
        added = sorted(i for i in tokenizer.special_ids if i < vocab)

    def encode(text: bytes) -> list[int]:
        return tokenizer.encode(text.decode("utf-8", errors="replace"))

    return GrammarVocabulary(tokens, added, sorted(stops), vocab, encode)
