"""tiktoken-style rank BPE, as Kimi ships it: a ``tiktoken.model`` file and special tokens in
``tokenizer_config.json`` (no HF ``tokenizer.json``).

``tiktoken.model`` holds one token a line, ``<base64 of its bytes> <rank>``. The rank is the
token id and also its merge priority: a pre-token is split into bytes and the adjacent pair
whose concatenation has the lowest rank is merged first (leftmost among equals), until no
concatenation is a token; a pre-token that is itself a token is taken whole. That is the
byte-level BPE of bpe.py with the pair rank read from the merged token (``merged_ranks``), so
the tokenizer is :class:`colibri.text.tokenizer.Tokenizer` over the byte-level spelling of the
ranks, with Kimi's pre-tokenizer regex and special tokens.

Kimi's special tokens take the 256 ids after the ranks; ``tokenizer_config.json``'s
``added_tokens_decoder`` names some, the rest are ``<|reserved_token_{id}|>`` (Kimi's
``tokenization_kimi.py``). All are matched in the text before pre-tokenization, as tiktoken's
``encode(text, allowed_special="all")`` does.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any

import regex

from colibri.text.added_tokens import AddedToken
from colibri.text.bpe import BpeModel
from colibri.text.byte_level import bytes_to_chars
from colibri.text.pretokenize import UnsupportedTokenizerError, isolated_splitter
from colibri.text.tokenizer import Tokenizer, TokenizerFileError

RANKS_FILE = "tiktoken.model"
CONFIG_FILE = "tokenizer_config.json"

#: Kimi's ``pat_str``: Han runs apart from other letters, cased words with English
#: contractions, digits in threes, then GPT-4's punctuation and whitespace rules. ``&&`` is
#: class intersection, which the ``regex`` module reads in its version-1 syntax only.
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

#: How many ids after the ranks are special tokens (Kimi's ``num_reserved_special_tokens``).
NUM_SPECIAL = 256


def read_ranks(path: Path) -> dict[bytes, int]:
    """The ``tiktoken.model`` file's tokens and ranks; every one of the 256 bytes must be a
    token (else some text has no encoding) and no rank may repeat (it is the token id)."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as unreadable:
        raise TokenizerFileError(f"{path}: cannot be read: {unreadable}") from unreadable
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit():
            raise TokenizerFileError(f"{path}:{number}: expected '<base64 token> <rank>'")
        try:
            token = base64.b64decode(fields[0], validate=True)
        except binascii.Error:
            raise TokenizerFileError(f"{path}:{number}: token is not base64") from None
        rank = int(fields[1])
        if token in ranks or rank in seen:
            raise TokenizerFileError(f"{path}:{number}: token or rank {rank} repeats")
        ranks[token] = rank
        seen.add(rank)
    if seen and max(seen) != len(seen) - 1:
        raise TokenizerFileError(f"{path}: ranks are not 0..{len(seen) - 1} (the ids after "
                                 "them are the special tokens)")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerFileError(f"{path}: byte {missing[0]:#04x} is not a token "
                                 f"({len(missing)} of the 256 bytes are missing)")
    return ranks


def special_tokens(first_id: int, config: dict[str, Any], path: Path) -> list[AddedToken]:
    """The ``NUM_SPECIAL`` special tokens from ``first_id``, named by ``added_tokens_decoder``
    where it names them."""
    named = config.get("added_tokens_decoder", {})
    if not isinstance(named, dict):
        raise TokenizerFileError(f"{path}: added_tokens_decoder is not an object")
    contents: dict[int, str] = {}
    for key, entry in named.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not key.isdigit() or not isinstance(content, str):
            raise TokenizerFileError(f"{path}: added token {key!r} needs an integer id and "
                                     "a string content")
        token_id = int(key)
        if not first_id <= token_id < first_id + NUM_SPECIAL:
            raise UnsupportedTokenizerError(
                f"{path}: added token {token_id} is outside the special ids "
                f"{first_id}..{first_id + NUM_SPECIAL - 1} a tiktoken tokenizer has")
        contents[token_id] = content
    return [AddedToken(i, contents.get(i, f"<|reserved_token_{i}|>"), True, False)
            for i in range(first_id, first_id + NUM_SPECIAL)]


def load_rank_bpe(model_dir: Path) -> Tokenizer:
    """The tokenizer of a model directory holding ``tiktoken.model``."""
    ranks = read_ranks(model_dir / RANKS_FILE)
    config_path = model_dir / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        config = {}  # no special tokens named: all are reserved
    except (OSError, ValueError) as unreadable:
        raise TokenizerFileError(f"{config_path}: cannot be read: {unreadable}") from None
    if not isinstance(config, dict):
        raise TokenizerFileError(f"{config_path}: top level is not an object")
    vocab = {bytes_to_chars(token): rank for token, rank in ranks.items()}
    model = BpeModel(vocab, {}, ignore_merges=True, merged_ranks=True)
    splitter = isolated_splitter(regex.compile(KIMI_PATTERN, regex.V1))
    return Tokenizer(model, special_tokens(len(ranks), config, config_path), [splitter])
