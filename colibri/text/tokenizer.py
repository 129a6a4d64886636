"""Byte-level BPE tokenizer read from a HF ``tokenizer.json`` (GLM-5, GPT-2, cl100k style).

``encode`` gives the same ids as HF ``tokenizers`` with ``add_special_tokens=False`` (no
post-processor template: colibri's chat template supplies ``[gMASK]<sop>`` itself):

1. added tokens are cut out of the raw text first (leftmost-longest; see added_tokens.py),
   the text between them NFC-normalized where the file's normalizer is ``NFC`` (GPT-NeoX,
   OLMoE; Python's ``unicodedata`` decides, whose Unicode version may trail HF's for
   characters assigned since);
2. the text between them is split by the file's pre-tokenizer (``Split`` regex, then
   ``ByteLevel``), each piece's UTF-8 bytes are mapped onto the byte-level alphabet;
3. each piece is merged by BPE (see bpe.py), honouring ``ignore_merges``.

``decode`` concatenates the tokens' bytes (added tokens as their literal content) and reads
them as UTF-8, with U+FFFD for invalid sequences. For streaming, ``token_bytes`` gives one
token's raw bytes: a multi-byte character may span tokens and the consumer reassembles.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from colibri.text.added_tokens import AddedToken, AddedVocabulary
from colibri.text.bpe import BpeModel
from colibri.text.byte_level import BYTE_TO_CHAR, bytes_to_chars, chars_to_bytes
from colibri.text.pretokenize import (
    Splitter,
    UnsupportedTokenizerError,
    build_pre_tokenizer,
    pre_tokenize,
)

__all__ = ["Tokenizer", "TokenizerFileError", "UnsupportedTokenizerError"]

_WORD_CACHE_LIMIT = 50_000


class TokenizerFileError(ValueError):
    """A tokenizer.json that is malformed or inconsistent (e.g. a merge outside the vocab)."""


def _kind(component: object) -> object:
    """The ``type`` of a tokenizer.json component (normalizer, decoder, ...)."""
    return component.get("type") if isinstance(component, dict) else component


def _parse_merges(raw: Iterable[Any]) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    for index, merge in enumerate(raw):
        if isinstance(merge, str):
            parts = merge.split(" ")
        elif isinstance(merge, list):
            parts = merge
        else:
            raise TokenizerFileError(f"merge {index} is neither 'a b' nor [a, b]: {merge!r}")
        if len(parts) != 2 or not all(isinstance(part, str) for part in parts):
            raise TokenizerFileError(f"merge {index} does not have two parts: {merge!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _check_bpe_options(model: Mapping[str, Any], vocab: Mapping[str, int]) -> None:
    if model.get("type", "BPE") != "BPE":
        raise UnsupportedTokenizerError(f"model type {model.get('type')!r} (only BPE)")
    if model.get("dropout") not in (None, 0, 0.0):
        raise UnsupportedTokenizerError("BPE dropout (it makes encoding random)")
    if model.get("byte_fallback"):
        raise UnsupportedTokenizerError("BPE byte_fallback")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise UnsupportedTokenizerError(f"BPE {key}={model[key]!r}")
    # An unk token only ever stands in for a character missing from the vocabulary; with
    # all 256 byte characters present it can never be emitted, so it is safe to ignore.
    if model.get("unk_token") is not None and not all(c in vocab for c in BYTE_TO_CHAR):
        raise UnsupportedTokenizerError("unk_token with an incomplete byte alphabet")


def _parse_added_tokens(raw: Iterable[Any]) -> list[AddedToken]:
    tokens: list[AddedToken] = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise TokenizerFileError(f"added token without string content: {entry!r}")
        for option in ("lstrip", "rstrip", "single_word"):
            if entry.get(option):
                raise UnsupportedTokenizerError(
                    f"added token {entry['content']!r} with {option}=true"
                )
        token_id = entry.get("id")
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise TokenizerFileError(
                f"added token {entry['content']!r} has no non-negative integer id: {token_id!r}"
            )
        special = bool(entry.get("special", False))
        tokens.append(
            AddedToken(
                id=token_id,
                content=entry["content"],
                special=special,
                # HF's default: special tokens match the raw text, the others normalized.
                normalized=bool(entry.get("normalized", not special)),
            )
        )
    return tokens


class Tokenizer:
    """Byte-level BPE with added tokens; see the module docstring for the algorithm."""

    def __init__(
        self,
        model: BpeModel,
        added_tokens: Sequence[AddedToken],
        splitters: list[Splitter],
        nfc: bool = False,
    ) -> None:
        self._model = model
        self._added = AddedVocabulary(added_tokens)
        self._splitters = splitters
        #: The file's normalizer is NFC (the only one supported).
        self._nfc = nfc
        self._id_to_token: dict[int, str] = {i: t for t, i in model.vocab.items()}
        self._token_bytes: dict[int, bytes] = {
            i: chars_to_bytes(t) for t, i in model.vocab.items()
        }
        for token in added_tokens:
            self._id_to_token[token.id] = token.content
            self._token_bytes[token.id] = token.content.encode("utf-8")
        self._added_by_content = {token.content: token for token in added_tokens}
        self._word_cache: dict[str, list[int]] = {}
        #: One more than the largest id, i.e. the smallest model vocab_size that fits.
        self.vocab_size = max(self._id_to_token) + 1 if self._id_to_token else 0

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json``, or a model directory holding one or, failing that, a
        tiktoken ``tiktoken.model`` (rank_bpe.py: Kimi's format)."""
        file = Path(path)
        if file.is_dir():
            if not (file / "tokenizer.json").exists() and (file / "tiktoken.model").exists():
                from colibri.text.rank_bpe import load_rank_bpe

                return load_rank_bpe(file)
            file = file / "tokenizer.json"
        try:
            text = file.read_text(encoding="utf-8")
        # One name per except clause: mypyc gives a name one type per function.
        except FileNotFoundError as missing:
            raise TokenizerFileError(f"{file}: no such file") from missing
        except OSError as unreadable:
            raise TokenizerFileError(
                f"{file}: cannot be read: {unreadable.strerror or unreadable}"
            ) from unreadable
        except UnicodeDecodeError as bad_utf8:
            raise TokenizerFileError(f"{file}: not UTF-8 text ({bad_utf8.reason})") from bad_utf8
        try:
            data = json.loads(text)
        except json.JSONDecodeError as not_json:
            raise TokenizerFileError(f"{file}: not JSON: {not_json}") from not_json
        if not isinstance(data, dict):
            raise TokenizerFileError(f"{file}: top level is not an object")
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tokenizer:
        normalizer = data.get("normalizer")
        if normalizer is not None and _kind(normalizer) != "NFC":
            raise UnsupportedTokenizerError(f"normalizer {_kind(normalizer)!r} (only NFC)")
        decoder = data.get("decoder")
        if decoder is not None and _kind(decoder) != "ByteLevel":
            raise UnsupportedTokenizerError(f"decoder {_kind(decoder)!r} (only ByteLevel)")
        if not isinstance(data.get("pre_tokenizer"), dict | None):
            raise TokenizerFileError("pre_tokenizer is not an object")
        model = data.get("model")
        if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict):
            raise TokenizerFileError("tokenizer.json has no model.vocab")
        vocab: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
        _check_bpe_options(model, vocab)
        ranks: dict[tuple[str, str], int] = {}
        for rank, (left, right) in enumerate(_parse_merges(model.get("merges", []))):
            for part in (left, right, left + right):
                if part not in vocab:
                    raise TokenizerFileError(f"merge {rank} ({left!r} {right!r}): "
                                             f"{part!r} is not in the vocabulary")
            ranks[(left, right)] = rank  # a repeated pair keeps its last rank, as in HF
        bpe = BpeModel(vocab, ranks, ignore_merges=bool(model.get("ignore_merges", False)))
        added = _parse_added_tokens(data.get("added_tokens") or [])
        return cls(bpe, added, build_pre_tokenizer(data.get("pre_tokenizer")),
                   nfc=normalizer is not None)

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; added tokens in it are recognised as such."""
        ids: list[int] = []
        for piece, token in self._added.split(text, self._nfc):
            if token is not None:
                ids.append(token.id)
                continue
            for word in pre_tokenize(piece, self._splitters):
                ids.extend(self._encode_word(word))
        return ids

    def _encode_word(self, word: str) -> list[int]:
        cached = self._word_cache.get(word)
        if cached is None:
            cached = self._model.tokenize(bytes_to_chars(word.encode("utf-8")))
            if len(self._word_cache) >= _WORD_CACHE_LIMIT:
                self._word_cache.clear()
            self._word_cache[word] = cached
        return cached

    # ------------------------------------------------------------------ decoding
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (literal UTF-8 content for added tokens)."""
        try:
            return self._token_bytes[token_id]
        except KeyError:
            raise ValueError(f"token id {token_id} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; invalid UTF-8 (e.g. a cut multi-byte character) gives U+FFFD."""
        return b"".join([self.token_bytes(i) for i in ids]).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ lookups
    def token_to_id(self, token: str) -> int | None:
        """Id of an added token's content or of a vocabulary entry (byte-level spelling)."""
        added = self._added_by_content.get(token)
        if added is not None:
            return added.id
        return self._model.vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._id_to_token.get(token_id)

    @property
    def added_tokens(self) -> list[AddedToken]:
        return list(self._added.tokens)

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of added tokens marked special (colibri's ``id_special``)."""
        return frozenset(token.id for token in self._added.tokens if token.special)
