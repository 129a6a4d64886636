"""Pre-tokenization: cutting text into the pieces BPE merges within.

Supported are the pre-tokenizers byte-level BPE tokenizers use: ``Split`` with a regex or
literal pattern (behaviour ``Isolated``), ``ByteLevel`` (optionally with the GPT-2 regex)
and a ``Sequence`` of those.

Patterns run with the ``regex`` module. Its Unicode tables are newer than those of the
Oniguruma engine HF uses, so a recently assigned letter would be ``\\p{L}`` for one and not
the other and the text would split differently. ``\\p{L}`` and ``\\p{N}`` are therefore
rewritten into explicit classes pinned to HF's (unicode_classes.py). ``\\s`` needs no pin:
both engines match the same 25 White_Space code points.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import regex

from colibri.text.unicode_classes import LETTER_RANGES, NUMBER_RANGES

#: The pattern HF's ``ByteLevel`` pre-tokenizer uses when ``use_regex`` is true (GPT-2).
GPT2_PATTERN = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)

Splitter = Callable[[str], list[str]]


#: The characters that mean something inside a character class. No letter or number is one,
#: but a class body must not depend on that.
_CLASS_SPECIAL = frozenset("\\]^-[")


def _class_char(code: int) -> str:
    char = chr(code)
    return "\\" + char if char in _CLASS_SPECIAL else char


def _class_body(spans: tuple[tuple[int, int], ...]) -> str:
    # The characters themselves, not \U escapes: the regex module parses a class in Python,
    # and a literal costs half an escape, which is most of an engine's start-up on a model
    # with a tokenizer (the 821 spans are parsed once per \p{L}/\p{N} in each pattern).
    return "".join(
        _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"
        for lo, hi in spans
    )


_PINNED_CLASSES = {"L": _class_body(LETTER_RANGES), "N": _class_body(NUMBER_RANGES)}


def pin_unicode_classes(pattern: str) -> str:
    """``pattern`` with ``\\p{L}``/``\\p{N}`` replaced by HF's exact code point sets.

    Inside a character class the ranges are spliced in; outside one they are wrapped in
    brackets. Escapes are skipped whole, so ``\\\\p{L}`` (a literal backslash) is untouched.
    """
    out: list[str] = []
    in_class = False
    at = 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            for name, body in _PINNED_CLASSES.items():
                token = "\\p{" + name + "}"
                if pattern.startswith(token, at):
                    out.append(body if in_class else f"[{body}]")
                    at += len(token)
                    break
            else:
                out.append(pattern[at : at + 2])
                at += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            at += 1
            # A "]" right after "[" or "[^" is a literal, not the end of the class.
            if pattern.startswith("^", at):
                out.append("^")
                at += 1
            if pattern.startswith("]", at):
                out.append("]")
                at += 1
            continue
        if char == "]" and in_class:
            in_class = False
        out.append(char)
        at += 1
    return "".join(out)


def compile_pattern(source: str) -> regex.Pattern[str]:
    try:
        return regex.compile(pin_unicode_classes(source))
    except regex.error as exc:
        raise UnsupportedTokenizerError(f"pre-tokenizer pattern does not compile: {exc}") from exc


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
    return isolated_splitter(compile_pattern(source))


def _byte_level_step(spec: Mapping[str, Any]) -> Splitter | None:
    if spec.get("add_prefix_space"):
        # The decoder would give the added space back, so decode(encode(s)) != s.
        raise UnsupportedTokenizerError("ByteLevel with add_prefix_space=true")
    if spec.get("use_regex", True):
        return isolated_splitter(compile_pattern(GPT2_PATTERN))
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
    if not all(isinstance(step, dict) for step in steps):
        raise UnsupportedTokenizerError("a pre_tokenizer step is not an object")
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
