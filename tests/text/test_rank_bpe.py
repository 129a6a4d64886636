"""Kimi's tiktoken-style rank BPE (colibri/text/rank_bpe.py) against the ``tiktoken`` library:
the kimi-tiny fixture's ``tiktoken.model`` and special tokens, Kimi's pre-tokenizer regex, on
held-out strings and random text, plus the file format's refusals."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from colibri.reference import Tokenizer
from hypothesis import given
from hypothesis import strategies as st

from colibri.resources import fixture_model_dir
from colibri.text.rank_bpe import KIMI_PATTERN, NUM_SPECIAL, read_ranks
from colibri.text.tokenizer import TokenizerFileError

tiktoken = pytest.importorskip("tiktoken")

KIMI = fixture_model_dir("kimi-tiny")
#: None of these is in the corpus the fixture's ranks were trained on: Han runs beside Latin
#: (their own pre-tokens), cased words with contractions, digit runs (split in threes),
#: punctuation with trailing newlines, special tokens inside text, whitespace runs.
HELD_OUT = (
    "Order #31415926 costs $27.18 (2025-06-30)", "WE'LL see; they'd've KNOWN it's FooBar",
    "\u8702\u9e1f hummingbird\u98de\u884c 3\u500b", "Caf\u00e9 cr\u00e8me \u0410\u0411\u0432",
    "<|im_user|>user<|im_middle|>Hi!<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "  indented\tcode();\r\n\n  \n", "\U0001f426 emoji;\n\n\nend[EOS]",
    "<|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>{\"a\": 1}",
    "<|reserved_token_400|> and <|not_a_token|>",
)
ALPHABET = ("abcXYZ019 '\t\r\n.,;:!?-#$()\u00e9\u00c9\u00df\u0301\u0410\u044f"
            "\u4e2d\u6587\u8702\u3002\u3000\u30ab\U0001f426")


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_file(KIMI)


@pytest.fixture(scope="module")
def reference() -> object:
    ranks = read_ranks(KIMI / "tiktoken.model")
    decoder = json.loads((KIMI / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    named = {int(i): entry["content"] for i, entry in decoder.items()}
    specials = {named.get(i, f"<|reserved_token_{i}|>"): i
                for i in range(len(ranks), len(ranks) + NUM_SPECIAL)}
    return tiktoken.Encoding("kimi-tiny", pat_str=KIMI_PATTERN, mergeable_ranks=ranks,
                             special_tokens=specials)


def _theirs(reference: object, text: str) -> list[int]:
    return list(reference.encode(text, allowed_special="all"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", HELD_OUT)
def test_equals_tiktoken_on_held_out_strings(ours: Tokenizer, reference: object,
                                             text: str) -> None:
    ids = ours.encode(text)
    assert ids == _theirs(reference, text)
    assert ours.decode(ids) == text
    assert ours.decode(ids) == reference.decode(ids)  # type: ignore[attr-defined]


@given(text=st.lists(st.one_of(st.text(st.sampled_from(ALPHABET), max_size=16),
                               st.sampled_from(["<|im_end|>", "[BOS]", "<|im_user|>"])),
                     max_size=8).map("".join))
def test_equals_tiktoken_on_random_text(ours: Tokenizer, reference: object, text: str) -> None:
    assert ours.encode(text) == _theirs(reference, text)


def test_the_fixture_prompt_and_specials(ours: Tokenizer) -> None:
    """The generator's own encoder (fixtures/make_kimi.py) gave the oracle prompt; the 256
    ids after the ranks are special, named where tokenizer_config.json names them."""
    oracle = json.loads((KIMI / "oracle.json").read_text())
    assert oracle["prompt_ids"] == [ours.token_to_id("[BOS]"), *ours.encode(oracle["prompt_text"])]
    ranks = len(read_ranks(KIMI / "tiktoken.model"))
    assert ours.vocab_size == ranks + NUM_SPECIAL == json.loads(
        (KIMI / "config.json").read_text())["text_config"]["vocab_size"]
    assert ours.special_ids == frozenset(range(ranks, ranks + NUM_SPECIAL))
    assert ours.encode("[EOS]<|reserved_token_389|>") == [ranks + 1, ranks + 5]


def _ranks_file(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "tiktoken.model"
    path.write_text("".join(line + "\n" for line in lines), encoding="ascii")
    return path


def _byte_lines() -> list[str]:
    return [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]


@pytest.mark.parametrize(("lines", "message"), [
    (["QQ== 0 extra"], "expected '<base64 token> <rank>'"),
    (["not*base64 0"], "token is not base64"),
    ([*_byte_lines(), "QQ== 256"], "token or rank 256 repeats"),
    (["QUI= 0", *_byte_lines()[1:]], "byte 0x00 is not a token"),
    ([*_byte_lines(), "QUI= 300"], "ranks are not 0..256"),
])
def test_malformed_rank_files_are_refused_by_line(tmp_path: Path, lines: list[str],
                                                  message: str) -> None:
    with pytest.raises(TokenizerFileError, match=message.replace(".", r"\.")):
        read_ranks(_ranks_file(tmp_path, lines))


def test_a_named_special_outside_the_special_ids_is_refused(tmp_path: Path) -> None:
    _ranks_file(tmp_path, _byte_lines())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {"3": {"content": "[BOS]"}}}))
    with pytest.raises(ValueError, match="added token 3 is outside the special ids 256..511"):
        Tokenizer.from_file(tmp_path)
