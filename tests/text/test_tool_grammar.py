"""The grammars the server composes (colibri.text.tool_grammar, spec/http.md 4.3.1) read
through the real matcher over the embedded tokenizer: what each allows at each point."""

from __future__ import annotations

import json
from functools import cache

from colibri import resources
from colibri.engine.constraint import build_vocabulary
from colibri.text.grammar import GrammarVocabulary, Matcher
from colibri.text.tokenizer import Tokenizer
from colibri.text.tool_grammar import after_reasoning, tool_envelope

GBNF = 'root ::= "answer: " ("yes" | "no")'
PERSON = json.dumps({"type": "object", "properties": {"age": {"type": "integer"}},
                     "required": ["age"], "additionalProperties": False})
TOOL = {"name": "f", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["n"]}}


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(resources.default_model_dir() / "tokenizer.json")


@cache
def vocabulary() -> GrammarVocabulary:
    tok = tokenizer()
    stop = tok.token_to_id("<|endoftext|>")
    assert stop is not None
    return build_vocabulary(tok, 512, [stop])


def special(name: str) -> int:
    token = tokenizer().token_to_id(name)
    assert token is not None
    return token


def allows(matcher: Matcher, text: str) -> bool:
    """Whether ``text``'s tokens may come next, in order (the matcher is left unchanged)."""
    probe = matcher.fork()
    for token in tokenizer().encode(text):
        if not probe.allowed()[token]:
            return False
        probe.consume(token)
    return True


def feed(matcher: Matcher, text: str) -> None:
    for token in tokenizer().encode(text):
        assert matcher.allowed()[token], (text, token)
        matcher.consume(token)


def test_after_reasoning_gbnf_frees_the_reasoning_and_constrains_the_answer() -> None:
    matcher = vocabulary().matcher(after_reasoning(GBNF))
    stop = special("<|endoftext|>")
    assert allows(matcher, "whatever {not the grammar}") and not matcher.allowed()[stop]
    assert not matcher.allowed()[special("<think>")]
    feed(matcher, "let me see")
    assert matcher.allowed()[special("</think>")]
    matcher.consume(special("</think>"))
    assert not allows(matcher, "whatever") and allows(matcher, "answer: no")
    feed(matcher, "answer: yes")
    assert matcher.complete()


def test_after_reasoning_json_is_compact() -> None:
    matcher = vocabulary().matcher(after_reasoning(PERSON))
    matcher.consume(special("</think>"))
    feed(matcher, "{")
    assert not allows(matcher, ' "age"') and allows(matcher, '"age":1}')


def test_union_of_a_response_format_and_strict_tools() -> None:
    grammar = tool_envelope([TOOL], required=False, answer=PERSON)
    matcher = vocabulary().matcher(grammar)
    assert allows(matcher, '{"age":3}')
    assert matcher.allowed()[special("<tool_call>")]
    assert not allows(matcher, "Sure, ")  # no free text in the union
    call = vocabulary().matcher(grammar)
    call.consume(special("<tool_call>"))
    feed(call, "f")
    assert not allows(call, "x")


def test_required_call_ignores_the_response_format() -> None:
    matcher = vocabulary().matcher(tool_envelope([TOOL], required=True, answer=PERSON))
    assert not allows(matcher, "{") and matcher.allowed()[special("<tool_call>")]


def test_union_after_reasoning() -> None:
    matcher = vocabulary().matcher(tool_envelope([TOOL], False, reasoning=True, answer=GBNF))
    assert allows(matcher, "thinking aloud") and not matcher.allowed()[special("<tool_call>")]
    matcher.consume(special("</think>"))
    assert allows(matcher, "answer: yes") and matcher.allowed()[special("<tool_call>")]
