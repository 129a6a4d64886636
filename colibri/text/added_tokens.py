"""Added tokens (special and not): found in the raw text before any pre-tokenization.

Matching is leftmost-longest: the earliest position where any added token starts wins, and
at that position the longest token. HF ``tokenizers`` does this in two passes, first with
the tokens marked ``normalized: false`` (by default the special ones) over the whole text,
then with the ``normalized: true`` ones inside the stretches left between those matches,
after the tokenizer's normalizer (NFC, where the file has one) has run on those stretches;
we do the same, so overlapping tokens across the two groups split identically.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

import regex


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    special: bool
    normalized: bool


#: A piece of input: plain text to pre-tokenize (``token is None``) or one added token.
Segment = tuple[str, AddedToken | None]


class AddedTokenMatcher:
    """Leftmost-longest search for a fixed set of literal strings."""

    def __init__(self, tokens: Iterable[AddedToken]) -> None:
        self._by_content = {token.content: token for token in tokens if token.content}
        # Regex alternation is leftmost-first; listing longer strings first makes the
        # alternative tried first at each position the longest one, i.e. leftmost-longest.
        ordered = sorted(self._by_content, key=lambda content: (-len(content), content))
        self._pattern = (
            regex.compile("|".join(regex.escape(content) for content in ordered))
            if ordered
            else None
        )

    def split(self, text: str) -> list[Segment]:
        if self._pattern is None or not text:
            return [(text, None)] if text else []
        segments: list[Segment] = []
        end = 0
        for match in self._pattern.finditer(text):
            start, stop = match.span()
            if start > end:
                segments.append((text[end:start], None))
            segments.append((match.group(), self._by_content[match.group()]))
            end = stop
        if end < len(text):
            segments.append((text[end:], None))
        return segments


class AddedVocabulary:
    """The two-pass split of HF's AddedVocabulary (see the module docstring)."""

    def __init__(self, tokens: Iterable[AddedToken]) -> None:
        token_list = list(tokens)
        self.tokens = token_list
        self._raw = AddedTokenMatcher([t for t in token_list if not t.normalized])
        self._normalized = AddedTokenMatcher([t for t in token_list if t.normalized])

    def split(self, text: str, nfc: bool = False) -> list[Segment]:
        """The segments of ``text``; with ``nfc`` the plain stretches come out NFC-normalized
        (the tokenizer's normalizer), as the normalized tokens are matched in them."""
        segments: list[Segment] = []
        for piece, token in self._raw.split(text):
            if token is not None:
                segments.append((piece, token))
            else:
                normalized = unicodedata.normalize("NFC", piece) if nfc else piece
                segments.extend(self._normalized.split(normalized))
        return segments
