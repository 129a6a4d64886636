"""The grammar section of a SUBMIT: what its bytes mean and how they become a matcher
(spec/protocol.md 2.3, "Grammar"; spec/DEVIATIONS.md, "Constrained decoding").

The bytes are one of three forms, told apart by their first non-blank bytes:

- ``{`` ... — a JSON Schema (colibri's convention); the output is one JSON value valid
  against it, written compactly (no whitespace between tokens: a random-weight model could
  otherwise pad forever);
- ``%llguidance`` ... — an llguidance Lark grammar, which may embed JSON Schemas with
  ``%json {...}``; the server's tool-call envelope (colibri.text.tool_grammar) is one;
- anything else — a llama.cpp GBNF grammar (``root ::= ...``).

Every added token of the tokenizer (``<tool_call>``, ``<think>``, ...) is a *special* token
for the matcher: text rules never produce one, a grammar names it as ``<[id]>``. That keeps a
JSON string from writing ``<tool_call>`` and lets the envelope grammar place the GLM tags.

Compiling never needs the model: ``check`` validates a grammar without a vocabulary, which
is what the HTTP server does to answer a bad schema with a 400 before it reaches an engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    # Imported where used: every engine process imports this module, few ever compile a
    # grammar, and llguidance (with the importlib.metadata it loads) is 40 ms of a start-up.
    import llguidance

__all__ = [
    "GrammarError", "GrammarVocabulary", "Matcher", "check", "compile_grammar", "gbnf_to_lark",
]

LARK_PREFIX = "%llguidance"
Encoder = Callable[[bytes], list[int]]


class GrammarError(ValueError):
    """A grammar section that is malformed or uses a feature the matcher does not support."""


def grammar_kind(text: str) -> str:
    """``json_schema``, ``lark`` or ``gbnf`` (see the module docstring)."""
    head = text.lstrip()
    if head.startswith("{"):
        return "json_schema"
    if head.startswith(LARK_PREFIX):
        return "lark"
    return "gbnf"


def compile_grammar(text: str) -> str:
    """The llguidance grammar for a grammar section, or GrammarError."""
    import llguidance

    kind = grammar_kind(text)
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise GrammarError(f"the JSON Schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise GrammarError("the JSON Schema is not an object")
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(text)
    return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(text))


def gbnf_to_lark(text: str) -> str:
    """A GBNF grammar as llguidance Lark, or GrammarError."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(text)
    except Exception as exc:  # the converter raises bare Exceptions for user errors
        raise GrammarError(f"the GBNF grammar is invalid: {exc}") from None


def check(text: str) -> str:
    """The llguidance grammar for ``text`` after validation; GrammarError names the problem
    (for a JSON Schema, e.g. ``Unimplemented keys: ["not"]``)."""
    import llguidance

    grammar = compile_grammar(text)
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message:
        raise GrammarError(message.strip().splitlines()[0])
    return grammar


class _TokenTable:
    """What llguidance's TokenizerWrapper reads: every id's bytes and the special ids."""

    def __init__(
        self, tokens: list[bytes], special: list[int], eos: int, encode: Encoder
    ) -> None:
        self.tokens = tokens
        self._encode = encode
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = None

    def __call__(self, text: bytes) -> list[int]:
        return self._encode(text)


class GrammarVocabulary:
    """The tokenizer as the matcher sees it, built once per engine.

    ``tokens[i]`` are id i's bytes (b"" for ids the tokenizer does not define, which the
    matcher never allows); ``added`` ids are special; ``stops`` are the engine's stop ids,
    allowed only where the grammar accepts (llguidance's EOS is the first of them).
    """

    def __init__(
        self,
        tokens: Sequence[bytes],
        added: Sequence[int],
        stops: Sequence[int],
        vocab: int,
        encode: Encoder,
    ) -> None:
        import llguidance

        table = list(tokens) + [b""] * max(0, vocab - len(tokens))
        eos = min(stops) if stops else len(table) - 1
        wrapper = llguidance.TokenizerWrapper(_TokenTable(table, sorted(added), eos, encode))
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=len(table))
        self.vocab = vocab
        self.stops = np.zeros(vocab, dtype=bool)
        for stop in stops:
            if 0 <= stop < vocab:
                self.stops[stop] = True
        self._bit = np.arange(32, dtype=np.uint32)

    def matcher(self, text: str) -> Matcher:
        import llguidance

        grammar = compile_grammar(text)
        message = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if message:
            raise GrammarError(message.strip().splitlines()[0])
        return Matcher(self, llguidance.LLMatcher(self.tokenizer, grammar, log_level=0))

    def unpack(self, bitmask: bytes) -> npt.NDArray[np.bool_]:
        words = np.frombuffer(bitmask, dtype=np.uint32)
        bits = ((words[:, None] >> self._bit) & 1).astype(bool).reshape(-1)
        return bits[: self.vocab]


class Matcher:
    """One request's grammar state: the allowed-token mask and the tokens consumed so far."""

    def __init__(self, vocabulary: GrammarVocabulary, matcher: llguidance.LLMatcher) -> None:
        self._vocabulary = vocabulary
        self._matcher = matcher
        self._mask: npt.NDArray[np.bool_] | None = None

    def allowed(self) -> npt.NDArray[np.bool_]:
        """Boolean mask over the model vocabulary of the tokens that may come next; a stop
        token is allowed iff the grammar accepts the output so far."""
        if self._mask is None:
            if self._matcher.is_error():
                mask = np.zeros(self._vocabulary.vocab, dtype=bool)
            else:
                mask = self._vocabulary.unpack(self._matcher.compute_bitmask())
                mask = mask & ~self._vocabulary.stops
            if self.accepting():
                mask = mask | self._vocabulary.stops
            self._mask = mask
        return self._mask

    def apply(self, row: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``row`` with every forbidden token's logit set to -inf (a copy)."""
        allowed = self.allowed()
        masked = np.full(row.shape, -np.inf, dtype=np.float32)
        n = min(row.size, allowed.size)
        masked[:n] = np.where(allowed[:n], row[:n], np.float32(-np.inf))
        return masked

    def fork(self) -> Matcher:
        """An independent copy of this state (its cached mask included)."""
        copy = Matcher(self._vocabulary, self._matcher.deep_copy())
        copy._mask = self._mask
        return copy

    def consume(self, token: int) -> None:
        self._mask = None
        self._matcher.consume_token(token)

    def accepting(self) -> bool:
        return self._matcher.is_accepting()

    def complete(self) -> bool:
        """True when nothing but a stop can follow: the reply is finished."""
        return self._matcher.is_stopped() and self._matcher.is_accepting()
