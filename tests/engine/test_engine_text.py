"""Text payloads through a tokenizer: UTF-8 rules, token bytes in DATA, mux stop tokens."""

from __future__ import annotations

from support.engine_fakes import ByteTokenizer, FakeBackend, FakeConfig
from support.engine_harness import run_engine, submit

VOCAB = 256 + len(ByteTokenizer.ADDED)


def _model(**kw: object) -> FakeBackend:
    eos = kw.pop("eos", ())
    bias = kw.pop("bias", 0.0)
    return FakeBackend(FakeConfig(vocab_size=VOCAB, eos_token_ids=eos), eos_bias=bias)  # type: ignore[arg-type]


def test_text_prompt_is_tokenized_and_data_carries_token_bytes() -> None:
    payload = "[gMASK]<sop>héllo".encode()
    run = run_engine([submit(1, 0, payload, 6)], model=_model(), tokenizer=ByteTokenizer())
    accept = run.for_id(1)[0]
    assert accept.line == b"ACCEPT 1 8\n"  # 2 added tokens + 6 bytes (é is two)
    data = [f for f in run.for_id(1) if f.kind == "DATA"]
    assert len(data) == 6
    for frame in data:
        assert frame.parsed is not None
        n = frame.parsed.get_int("n")
        assert frame.payload is not None and len(frame.payload) == n and 1 <= n <= 13


def test_invalid_utf8_and_nul_are_bad_requests() -> None:
    run = run_engine(
        [submit(1, 0, b"\xff\xfe"), submit(2, 0, b"a\x00b")],
        model=_model(),
        tokenizer=ByteTokenizer(),
    )
    assert [f.line for f in run.frames if f.kind == "ERROR"] == [
        b"ERROR 1 BAD_REQUEST\n",
        b"ERROR 2 BAD_REQUEST\n",
    ]


def test_ids_payload_with_a_tokenizer_still_gives_token_text() -> None:
    run = run_engine(
        [submit(1, 0, b"104 105", 2, ext="ids=1")], model=_model(), tokenizer=ByteTokenizer()
    )
    assert run.for_id(1)[0].line == b"ACCEPT 1 2\n"
    assert all(len(f.payload or b"") >= 1 for f in run.for_id(1) if f.kind == "DATA")


def test_mux_stops_only_on_endoftext_unless_all_stops() -> None:
    user = 257  # <|user|>: an eos id of the model, but not <|endoftext|>
    model = _model(eos=(user,), bias=50.0)
    run = run_engine([submit(1, 0, b"hi", 3)], model=model, tokenizer=ByteTokenizer())
    payloads = [f.payload for f in run.for_id(1) if f.kind == "DATA"]
    assert payloads == [b"<|user|>"] * 3
    model = _model(eos=(user,), bias=50.0)
    run = run_engine(
        [submit(1, 0, b"hi", 3)],
        model=model,
        tokenizer=ByteTokenizer(),
        env={"COLI_SERVE_ALL_STOPS": "1"},
    )
    assert [f.kind for f in run.for_id(1)][-1] == "DONE"
    assert not [f for f in run.for_id(1) if f.kind == "DATA"]


def test_empty_text_prompt() -> None:
    run = run_engine([submit(1, 0, b"")], model=_model(), tokenizer=ByteTokenizer())
    assert [f.line for f in run.frames if f.kind == "ERROR"] == [b"ERROR 1 EMPTY_PROMPT\n"]
