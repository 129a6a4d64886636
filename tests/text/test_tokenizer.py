"""The reference tokenizer equals HF ``tokenizers`` on random Unicode text.

Two independently trained tokenizers are compared: the committed glm5-chat-tiny fixture
(GLM-5's cl100k-style Split regex, added tokens all ``normalized: false``, pair-form
merges) and one trained here with a different set-up (GPT-2's ByteLevel regex, 300 ids,
``ignore_merges``, overlapping added tokens in both matching passes, merges in the legacy
"a b" string form).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import regex
import tokenizers
from colibri.reference import Tokenizer
from hypothesis import given
from hypothesis import strategies as st

from colibri.resources import fixtures_dir
from colibri.text.byte_level import BYTE_TO_CHAR, CHAR_TO_BYTE, bytes_to_chars
from colibri.text.pretokenize import (
    UnsupportedTokenizerError,
    _class_body,
    pin_unicode_classes,
    pre_tokenize,
)
from colibri.text.tokenizer import TokenizerFileError
from colibri.text.unicode_classes import LETTER_RANGES, NUMBER_RANGES

FIXTURE = fixtures_dir() / "tokenizer" / "tokenizer.json"
GLM5_ADDED = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
    "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<tool_response>", "</tool_response>",
)
# The second tokenizer's added tokens overlap on purpose: "<a>" inside "<ab>" (longest
# wins), and the normalized "<ab>x" vs the raw "<ab>" (the raw pass runs first).
OTHER_SPECIAL = ("<s>", "</s>", "<ab>")
OTHER_PLAIN = ("<a>", "<ab>x", "[[", "[[[")

FRAGMENTS = (
    "\r\n", "\r", "\n\n", "  ", "   \t", "\t", " \n ", "\u3000", "\u00a0", "\u2028", "\x85",
    "\x1c", "\x0b", "\x0c", "e\u0301", "\u0301\u0301", "🐦", "👍🏽", "👨‍👩‍👧", "☀️", "蜂鸟",
    "ハチドリ", "한국어", "'s", "'LL", "'Re", "123456", "٣٤٥", "½", "Ⅻ", "$19.99", "---",
    "...", "Hello", " world", "don't", "\ufeff", "\U0001f600", "\U000e0001",
)
CORPUS_TEXT = "\n".join(
    p.read_text(encoding="utf-8") for p in sorted((fixtures_dir() / "corpus").glob("*.txt"))
)


def texts(added: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Random text: arbitrary code points mixed with tricky fragments and added tokens."""
    chars = st.characters(codec="utf-8")
    parts = st.one_of(
        st.text(chars, max_size=12),
        st.sampled_from(FRAGMENTS),
        st.sampled_from(added),
        st.text(st.sampled_from(" \t\r\n\u3000"), min_size=1, max_size=6),
    )
    return st.lists(parts, max_size=14).map("".join)


def _train_other(directory: Path) -> Path:
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=299 - len(OTHER_SPECIAL) - len(OTHER_PLAIN),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS_TEXT.split("\n"), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in OTHER_SPECIAL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=True) for t in OTHER_PLAIN])
    data = json.loads(tokenizer.to_str())
    merges = data["model"]["merges"]
    assert all(isinstance(m, list) for m in merges)
    data["model"]["merges"] = [" ".join(m) for m in merges]
    # A whole-word token that no merge sequence produces: only ignore_merges can emit it.
    # It takes the first added token's id and the added tokens move up by one, because HF
    # numbers added tokens from the vocabulary's length when it loads a file.
    first_added = min(entry["id"] for entry in data["added_tokens"])
    data["model"]["vocab"]["Ġhummingbird"] = first_added
    for entry in data["added_tokens"]:
        entry["id"] += 1
    path = directory / "tokenizer.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def other_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_other(tmp_path_factory.mktemp("other-tokenizer"))


@pytest.fixture(scope="module")
def glm5() -> tuple[Tokenizer, object]:
    return Tokenizer.from_file(FIXTURE), tokenizers.Tokenizer.from_file(str(FIXTURE))


@pytest.fixture(scope="module")
def other(other_path: Path) -> tuple[Tokenizer, object]:
    return Tokenizer.from_file(other_path), tokenizers.Tokenizer.from_file(str(other_path))


def _hf_ids(hf: object, text: str) -> list[int]:
    return list(hf.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]


@given(text=texts(GLM5_ADDED))
def test_fixture_tokenizer_equals_hf(glm5: tuple[Tokenizer, object], text: str) -> None:
    ours, hf = glm5
    ids = ours.encode(text)
    assert ids == _hf_ids(hf, text)
    assert ours.decode(ids) == text


@given(text=texts(OTHER_SPECIAL + OTHER_PLAIN))
def test_second_tokenizer_equals_hf(other: tuple[Tokenizer, object], text: str) -> None:
    ours, hf = other
    ids = ours.encode(text)
    assert ids == _hf_ids(hf, text)
    assert ours.decode(ids) == text


@given(ids=st.lists(st.integers(0, 511), max_size=24))
def test_decode_of_any_ids_equals_hf(glm5: tuple[Tokenizer, object], ids: list[int]) -> None:
    """Arbitrary id sequences (cut multi-byte characters included) decode as HF does."""
    ours, hf = glm5
    expected = hf.decode(ids, skip_special_tokens=False)  # type: ignore[attr-defined]
    assert ours.decode(ids) == expected
    assert b"".join(ours.token_bytes(i) for i in ids).decode("utf-8", "replace") == expected


def test_corpus_round_trips_and_matches_hf(glm5: tuple[Tokenizer, object]) -> None:
    ours, hf = glm5
    ids = ours.encode(CORPUS_TEXT)
    assert ids == _hf_ids(hf, CORPUS_TEXT)
    assert ours.decode(ids) == CORPUS_TEXT
    assert len(ids) < len(CORPUS_TEXT.encode()) / 2  # the merges really compress


OLMOE_FIXTURE = fixtures_dir() / "models" / "olmoe-tiny" / "tokenizer.json"
OLMOE_ADDED = ("<|endoftext|>", "<|padding|>")
#: Strings none of which is in the corpus the OLMoE fixture's BPE was trained on, with
#: characters that NFC changes (a decomposed accent, the Angstrom sign, a Hangul jamo run).
OLMOE_HELD_OUT = (
    "Cafe\u0301 au lait, s'il vous pla\u00eet", "\u212b ngstr\u00f6m", "\u1100\u1161\u11a8",
    "<|endoftext|><|user|>\nWhat's 12+30?\n<|assistant|>\n", "  indented\tcode();\n\n",
    "Zw\u00f6lf Boxk\u00e4mpfer jagen Viktor", "\U0001f426 hummingbird<|padding|>",
)


@pytest.fixture(scope="module")
def olmoe() -> tuple[Tokenizer, object]:
    return Tokenizer.from_file(OLMOE_FIXTURE), tokenizers.Tokenizer.from_file(str(OLMOE_FIXTURE))


@pytest.mark.parametrize("text", OLMOE_HELD_OUT)
def test_olmoe_tokenizer_equals_hf_on_held_out_strings(
    olmoe: tuple[Tokenizer, object], text: str
) -> None:
    """OLMoE's GPT-NeoX-style tokenizer (NFC normalizer, GPT-2 regex ByteLevel) as HF has it."""
    ours, hf = olmoe
    ids = ours.encode(text)
    assert ids == _hf_ids(hf, text)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)  # type: ignore[attr-defined]
    assert ours.decode(ids) == unicodedata.normalize("NFC", text)


@given(text=texts(OLMOE_ADDED))
def test_olmoe_tokenizer_equals_hf(olmoe: tuple[Tokenizer, object], text: str) -> None:
    ours, hf = olmoe
    assert ours.encode(text) == _hf_ids(hf, text)


QWEN3_FIXTURE = fixtures_dir() / "models" / "qwen3moe-tiny" / "tokenizer.json"
QWEN3_ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>", "<think>", "</think>")
#: Strings none of which is in the corpus the Qwen3 fixture's BPE was trained on: digit runs
#: (Qwen2's regex splits every digit, GLM-5's keeps runs of three), contractions, a decomposed
#: accent (NFC), a ChatML turn with a thinking block and a tool call.
QWEN3_HELD_OUT = (
    "Order #31415926 costs $27.18 (2025-06-30)", "WE'LL see; they'd've known",
    "Cafe\u0301 cr\u00e8me br\u00fbl\u00e9e", "\u212b ngstr\u00f6m 42\u00b0C",
    "<|im_start|>user\nWhat's 12+30?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    '<tool_call>\n{"name": "sum", "arguments": {"a": 12}}\n</tool_call><|im_end|>',
    "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n",
    "  indented\tcode();\r\n\n", "\U0001f426 hummingbird<|endoftext|>",
)


@pytest.fixture(scope="module")
def qwen3() -> tuple[Tokenizer, object]:
    return Tokenizer.from_file(QWEN3_FIXTURE), tokenizers.Tokenizer.from_file(str(QWEN3_FIXTURE))


@pytest.mark.parametrize("text", QWEN3_HELD_OUT)
def test_qwen3_tokenizer_equals_hf_on_held_out_strings(
    qwen3: tuple[Tokenizer, object], text: str
) -> None:
    """Qwen3's Qwen2-style tokenizer (NFC normalizer, Qwen2 Split regex, regex-free ByteLevel,
    added tokens after the trained vocabulary) as HF has it."""
    ours, hf = qwen3
    ids = ours.encode(text)
    assert ids == _hf_ids(hf, text)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)  # type: ignore[attr-defined]
    assert ours.decode(ids) == unicodedata.normalize("NFC", text)


@given(text=texts(QWEN3_ADDED))
def test_qwen3_tokenizer_equals_hf(qwen3: tuple[Tokenizer, object], text: str) -> None:
    ours, hf = qwen3
    assert ours.encode(text) == _hf_ids(hf, text)


def test_qwen3_digits_are_single_tokens_and_only_chatml_markers_are_special() -> None:
    """The Qwen2 regex's bare \\p{N} (GLM-5's is \\p{N}{1,3}): "2025" is four words of one
    digit each. <|endoftext|>, <|im_start|>, <|im_end|> are special (ids 384..386, after the
    trained 384); Qwen marks the tool and think tags as plain added tokens."""
    ours = Tokenizer.from_file(QWEN3_FIXTURE)
    assert [ours.decode([i]) for i in ours.encode("2025")] == ["2", "0", "2", "5"]
    assert [ours.token_to_id(t) for t in QWEN3_ADDED] == list(range(384, 393))
    assert ours.special_ids == frozenset({384, 385, 386})


def test_the_nfc_normalizer_runs_between_raw_added_tokens() -> None:
    """NFC composes "e" + U+0301 into one character, so the BPE sees "é": the ids differ
    from those of the decomposed text, and the special token in between stays one id."""
    ours = Tokenizer.from_file(OLMOE_FIXTURE)
    composed = ours.encode("caf\u00e9<|endoftext|>")
    assert ours.encode("cafe\u0301<|endoftext|>") == composed
    assert composed[-1] == ours.token_to_id("<|endoftext|>") == 0
    data = json.loads(OLMOE_FIXTURE.read_text())
    data["normalizer"] = None
    assert Tokenizer.from_json(data).encode("cafe\u0301<|endoftext|>") != composed


def test_fixture_has_glm5_added_tokens_after_the_trained_vocab() -> None:
    tok = Tokenizer.from_file(FIXTURE)
    ids = [tok.token_to_id(t) for t in GLM5_ADDED]
    assert ids == list(range(492, 512))
    assert tok.vocab_size == 512
    assert tok.special_ids == frozenset(range(492, 502))
    prompt = "[gMASK]<sop><|user|>Hi<|assistant|><think></think>"
    assert tok.encode(prompt)[:3] == [494, 496, 499]
    assert tok.encode(prompt)[-3:] == [500, 502, 503]


def test_added_tokens_split_leftmost_longest_in_two_passes(
    other: tuple[Tokenizer, object],
) -> None:
    ours, hf = other
    ids = {t: ours.token_to_id(t) for t in OTHER_SPECIAL + OTHER_PLAIN}
    # Raw pass first: "<ab>" (special) is taken before the normalized "<ab>x" is tried.
    assert ours.encode("<ab>x")[0] == ids["<ab>"]
    assert ours.encode("[[[[")[:1] == [ids["[[["]]
    assert ours.encode("x<a>y")[1] == ids["<a>"]
    for text in ("<ab>x", "[[[[", "x<a>y", "<s><ab>x</s>"):
        assert ours.encode(text) == _hf_ids(hf, text)


def test_ignore_merges_takes_the_whole_word(other_path: Path) -> None:
    data = json.loads(other_path.read_text())
    word_id = data["model"]["vocab"]["Ġhummingbird"]
    assert Tokenizer.from_file(other_path).encode("a hummingbird") [-1] == word_id
    data["model"]["ignore_merges"] = False
    off = Tokenizer.from_json(data)
    hf_off = tokenizers.Tokenizer.from_str(json.dumps(data))
    assert word_id not in off.encode("a hummingbird")
    assert off.encode("a hummingbird") == _hf_ids(hf_off, "a hummingbird")


def test_token_bytes_reassemble_split_characters() -> None:
    tok = Tokenizer.from_file(FIXTURE)
    text = "鸟🐦"
    ids = tok.encode(text)
    pieces = [tok.token_bytes(i) for i in ids]
    assert len(pieces) > 2  # rare characters are spread over byte tokens
    assert b"".join(pieces) == text.encode("utf-8")
    assert tok.token_bytes(tok.token_to_id("<think>") or 0) == b"<think>"


def test_byte_map_is_gpt2s() -> None:
    assert len(set(BYTE_TO_CHAR)) == 256
    assert BYTE_TO_CHAR[ord("!")] == "!" and BYTE_TO_CHAR[255] == "\u00ff"
    assert BYTE_TO_CHAR[ord(" ")] == "\u0120" and BYTE_TO_CHAR[0] == "\u0100"
    assert BYTE_TO_CHAR[173] == "\u0143"  # the soft hyphen is the last byte moved
    assert all(CHAR_TO_BYTE[c] == b for b, c in enumerate(BYTE_TO_CHAR))


def test_bad_files_get_named_errors(tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    broken = json.loads(json.dumps(data))
    broken["model"]["merges"].append(["Ġ", "nonexistent"])
    with pytest.raises(TokenizerFileError, match="not in the vocabulary"):
        Tokenizer.from_json(broken)
    for path, value, message in (
        (("normalizer",), {"type": "NFKC"}, "normalizer"),
        (("model", "dropout"), 0.1, "dropout"),
        (("pre_tokenizer",), {"type": "Whitespace"}, "must end with ByteLevel"),
        (("added_tokens", 0, "lstrip"), True, "lstrip"),
    ):
        changed = json.loads(json.dumps(data))
        target = changed
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(UnsupportedTokenizerError, match=message):
            Tokenizer.from_json(changed)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerFileError, match="not JSON"):
        Tokenizer.from_file(tmp_path)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        Tokenizer.from_file(FIXTURE).decode([100_000])


def test_long_whitespace_run_is_fast_enough_to_finish() -> None:
    tok = Tokenizer.from_file(FIXTURE)
    text = " " * 20_000 + "x"
    assert tok.decode(tok.encode(text)) == text


@given(text=st.text(st.characters(codec="utf-8"), max_size=30)
       | st.lists(st.sampled_from(FRAGMENTS + ("'S", "'ſ", "'ﬅ", "'Ve", "x'D")), max_size=8)
       .map("".join))
def test_pre_tokenization_equals_hf(
    glm5: tuple[Tokenizer, object], other: tuple[Tokenizer, object], text: str
) -> None:
    """Pieces, not just ids: a vocabulary this small could hide a wrong split."""
    for ours, hf in (glm5, other):
        pieces = [bytes_to_chars(p.encode("utf-8")) for p in pre_tokenize(text, ours._splitters)]
        expected = [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(text)]  # type: ignore[attr-defined]
        assert pieces == expected


@pytest.mark.parametrize("text", [":\U0003d000", "a\u0558b", "x\U00011de0y", "\u1c89'S"])
def test_letters_newer_than_hfs_unicode_split_like_hf(
    glm5: tuple[Tokenizer, object], other: tuple[Tokenizer, object], text: str
) -> None:
    """Code points the regex module calls letters/digits but HF's Oniguruma does not yet."""
    for ours, hf in (glm5, other):
        assert ours.encode(text) == _hf_ids(hf, text)
        pieces = [bytes_to_chars(p.encode("utf-8")) for p in pre_tokenize(text, ours._splitters)]
        expected = [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(text)]  # type: ignore[attr-defined]
        assert pieces == expected


def test_pinning_rewrites_only_real_class_escapes() -> None:
    pinned = pin_unicode_classes(r"[^\r\n\p{L}\p{N}]?\p{L}+|\\p{L}|[]\p{N}]")
    assert r"\p{" not in pinned.replace(r"\\p{L}", "")
    assert r"|\\p{L}|" in pinned  # an escaped backslash followed by "p{L}" is literal text
    assert pinned.startswith(r"[^\r\n" + "A-Za-z")
    assert "]?[A-Za-z" in pinned  # outside a class the ranges get their own brackets
    assert pinned.endswith("]") and "[]0-9" in pinned


@pytest.mark.parametrize(("name", "spans"), [("L", LETTER_RANGES), ("N", NUMBER_RANGES)])
def test_a_pinned_class_matches_exactly_its_code_points(
    name: str, spans: tuple[tuple[int, int], ...]
) -> None:
    # Membership only changes at a span's ends, so the code points at and beside every end
    # (surrogates aside: not valid in text) decide whether the class, written with the
    # characters themselves, holds exactly HF's spans.
    probes = sorted({c + d for lo, hi in spans for c in (lo, hi) for d in (-1, 0, 1)}
                    - set(range(0xD800, 0xE000)) - {-1, 0x110000})
    inside = {c for c in probes if any(lo <= c <= hi for lo, hi in spans)}
    text = "".join(map(chr, probes))
    matched = regex.findall(pin_unicode_classes("\\p{" + name + "}"), text)
    assert matched == [chr(c) for c in probes if c in inside]


def test_class_special_characters_in_a_span_stay_literal() -> None:
    # No letter or number is special inside a class, but the body must not rely on it:
    # "-", "[" to "^" (with "\\" and "]") and "a" to "c" as spans, then every ASCII byte.
    body = _class_body(((0x2D, 0x2D), (0x5B, 0x5E), (0x61, 0x63)))
    ascii_text = "".join(chr(c) for c in range(128))
    inside = "-[\\]^abc"
    assert regex.findall(f"[{body}]", ascii_text) == list(inside)
    assert regex.findall(f"[^{body}]", ascii_text) == [c for c in ascii_text if c not in inside]


@pytest.mark.parametrize(
    "pre_tokenizer",
    [
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "e "}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True},
    ],
    ids=["split-literal", "bytelevel-no-regex", "bytelevel-gpt2-regex"],
)
def test_other_pre_tokenizer_shapes_equal_hf(pre_tokenizer: dict[str, object]) -> None:
    """Literal Split patterns and ByteLevel alone (whole stretches become one BPE word)."""
    data = json.loads(FIXTURE.read_text())
    data["pre_tokenizer"] = pre_tokenizer
    ours = Tokenizer.from_json(data)
    hf = tokenizers.Tokenizer.from_str(json.dumps(data))
    for text in (CORPUS_TEXT[:3000], "the tree e e  e\r\n", "<|user|>Hi there<think>", ""):
        assert ours.encode(text) == _hf_ids(hf, text)


def test_unreadable_files_get_named_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerFileError, match="no such file"):
        Tokenizer.from_file(tmp_path / "missing.json")
    with pytest.raises(TokenizerFileError, match="no such file"):
        Tokenizer.from_file(tmp_path)  # a directory without tokenizer.json
    (tmp_path / "odd" / "tokenizer.json").mkdir(parents=True)
    with pytest.raises(TokenizerFileError, match="cannot be read"):
        Tokenizer.from_file(tmp_path / "odd")  # its tokenizer.json is a directory
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"x": "\xe9"}')
    with pytest.raises(TokenizerFileError, match="not UTF-8"):
        Tokenizer.from_file(latin)


@pytest.mark.parametrize("bad_id", [None, "7", 1.5, True, -1])
def test_added_token_without_a_valid_id_is_a_named_error(bad_id: object) -> None:
    data = json.loads(FIXTURE.read_text())
    entry = data["added_tokens"][0]
    if bad_id is None:
        del entry["id"]
    else:
        entry["id"] = bad_id
    with pytest.raises(TokenizerFileError, match=f"added token {entry['content']!r} has no"):
        Tokenizer.from_json(data)
