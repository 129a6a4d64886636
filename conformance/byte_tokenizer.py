"""A byte-level tokenizer for models that ship none: one token id per byte.

With it an engine that cannot take ``ids=1`` payloads (an extension) can still be driven on
the fixtures, and its greedy output judged against the oracle by comparing DATA bytes.
The id -> byte assignment is not the identity: the ids the oracle uses get printable ASCII
bytes (in ascending id order), so the oracle's prompts and continuations are valid UTF-8 text
that every engine accepts (protocol.md §2.3 step 12 refuses invalid UTF-8); the other ids
take the remaining bytes in ascending order. See spec/conformance.md, "byte-level
tokenizer", and DEVIATIONS.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from colibri.text.byte_level import BYTE_TO_CHAR

#: Only a vocabulary of exactly 256 ids maps onto bytes one to one.
VOCAB = 256
_PRINTABLE = range(0x21, 0x7F)


class ByteTokenizerError(ValueError):
    pass


def byte_of_ids(vocab: int, oracle: dict[str, Any]) -> tuple[int, ...]:
    """Entry i is the byte token i stands for."""
    if vocab != VOCAB:
        raise ByteTokenizerError(
            f"a byte-level tokenizer needs a vocabulary of {VOCAB} ids, the model has {vocab}"
        )
    used = sorted({int(v) for key in ("prompt_ids", "full_ids", "tf_pred")
                   for v in _ints(oracle.get(key))} & set(range(vocab)))
    preferred = [b for b in _PRINTABLE][: len(used)]
    rest_ids = [i for i in range(vocab) if i not in set(used)]
    rest_bytes = [b for b in range(256) if b not in set(preferred)]
    table = [0] * vocab
    for token, byte in zip(used + rest_ids, preferred + rest_bytes, strict=True):
        table[token] = byte
    return tuple(table)


def _ints(value: Any) -> Iterable[int]:
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def tokenizer_json(byte_of: tuple[int, ...]) -> dict[str, Any]:
    """A Hugging Face tokenizer.json: byte-level BPE without merges, so every byte of a
    payload is exactly one token and every token's text is exactly one byte."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": level,
        "post_processor": None,
        "decoder": level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {BYTE_TO_CHAR[byte]: token for token, byte in enumerate(byte_of)},
            "merges": [],
        },
    }
