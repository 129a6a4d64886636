"""Pre-tokenization: cutting text into the pieces BPE merges within.

Supported are the pre-tokenizers byte-level BPE tokenizers use: ``Split`` with a regex or
literal pattern (behaviour ``Isolated``), ``ByteLevel`` (optionally with the GPT-2 regex)
and a ``Sequence`` of those. Patterns run with the ``regex`` module, which knows
``\\p{L}``/``\\p{N}`` like the Oniguruma engine HF uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import regex

#: The pattern HF's ``ByteLevel`` pre-tokenizer uses when ``use_regex`` is true (GPT-2).
GPT2_PATTERN = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)

Splitter = Callable[[str], list[str]]


class UnsupportedTokenizerError(ValueError):
    """A tokenizer.json uses a feature this byte-level BPE does not implement."""


def isolated_splitter(pattern: regex.Pattern[str]) -> Splitter:
    """Matches become pieces, and so do the stretches between them (HF ``Isolated``)."""

    def split(text: str) -> list[str]:
        pieces: list[str] = []
        end = 0
        for match in pattern.finditer(text):
            start, stop = match.span()
            if start == stop:
                continue
            if start > end:
                pieces.append(text[end:start])
            pieces.append(text[start:stop])
            end = stop
        if end < len(text):
            pieces.append(text[end:])
        return pieces

    return split


def _split_step(spec: Mapping[str, Any]) -> Splitter:
    behavior = spec.get("behavior")
    if behavior != "Isolated":
        raise UnsupportedTokenizerError(f"Split behavior {behavior!r} (only 'Isolated')")
    if spec.get("invert"):
        raise UnsupportedTokenizerError("Split with invert=true")
    pattern = spec.get("pattern")
    if not isinstance(pattern, dict) or len(pattern) != 1:
        raise UnsupportedTokenizerError(f"Split pattern {pattern!r}")
    if "Regex" in pattern:
        source = str(pattern["Regex"])
    elif "String" in pattern:
        source = regex.escape(str(pattern["String"]))
    else:
        raise UnsupportedTokenizerError(f"Split pattern {pattern!r}")
    try:
        compiled = regex.compile(source)
    except regex.error as exc:
        raise UnsupportedTokenizerError(f"Split pattern does not compile: {exc}") from exc
    return isolated_splitter(compiled)


def _byte_level_step(spec: Mapping[str, Any]) -> Splitter | None:
    if spec.get("add_prefix_space"):
        # The decoder would give the added space back, so decode(encode(s)) != s.
        raise UnsupportedTokenizerError("ByteLevel with add_prefix_space=true")
    if spec.get("use_regex", True):
        return isolated_splitter(regex.compile(GPT2_PATTERN))
    return None


def build_pre_tokenizer(spec: Mapping[str, Any] | None) -> list[Splitter]:
    """The splitting steps of a tokenizer.json ``pre_tokenizer``, applied in order.

    The chain must end in ``ByteLevel``: that step maps bytes onto the byte-level alphabet,
    so a ``Split`` after it would see mapped text, which no byte-level tokenizer does.
    """
    if spec is None:
        raise UnsupportedTokenizerError("no pre_tokenizer (a byte-level BPE needs ByteLevel)")
    steps: list[Mapping[str, Any]]
    if spec.get("type") == "Sequence":
        steps = list(spec.get("pretokenizers", []))
    else:
        steps = [spec]
    if not steps or steps[-1].get("type") != "ByteLevel":
        raise UnsupportedTokenizerError("the pre_tokenizer must end with ByteLevel")
    splitters: list[Splitter] = []
    for step in steps:
        kind = step.get("type")
        if kind == "Split":
            splitters.append(_split_step(step))
        elif kind == "ByteLevel":
            if step is not steps[-1]:
                raise UnsupportedTokenizerError("ByteLevel must be the last pre-tokenizer")
            splitter = _byte_level_step(step)
            if splitter is not None:
                splitters.append(splitter)
        else:
            raise UnsupportedTokenizerError(f"pre_tokenizer {kind!r}")
    return splitters


def pre_tokenize(text: str, splitters: list[Splitter]) -> list[str]:
    pieces = [text] if text else []
    for split in splitters:
        pieces = [part for piece in pieces for part in split(piece)]
    return pieces
