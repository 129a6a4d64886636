"""The embedded default model glm5-chat-tiny: the tokenizer and the oracle agree end to end."""

from __future__ import annotations

import json

import numpy as np
from colibri.reference import Tokenizer, load_model

from colibri.resources import DEFAULT_MODEL_NAME, default_model_dir, fixtures_dir

CHAT_PROMPT_TEXT = "[gMASK]<sop><|user|>Hello<|assistant|><think></think>"


def test_default_model_is_glm5_chat_tiny_with_the_fixture_tokenizer() -> None:
    model_dir = default_model_dir()
    assert model_dir.name == DEFAULT_MODEL_NAME == "glm5-chat-tiny"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shipped = (fixtures_dir() / "tokenizer" / name).read_bytes()
        assert (model_dir / name).read_bytes() == shipped, name
    config = json.loads((model_dir / "config.json").read_text())
    generation = json.loads((model_dir / "generation_config.json").read_text())
    tokenizer = Tokenizer.from_file(model_dir)
    assert config["vocab_size"] == tokenizer.vocab_size == 512
    stops = [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    assert generation["eos_token_id"] == config["eos_token_id"] == stops


def test_oracle_prompt_is_our_encoding_of_the_chat_text() -> None:
    model_dir = default_model_dir()
    oracle = json.loads((model_dir / "oracle.json").read_text())
    assert Tokenizer.from_file(model_dir).encode(CHAT_PROMPT_TEXT) == oracle["prompt_ids"]


def test_greedy_reply_to_hello_matches_transformers_and_is_text() -> None:
    model_dir = default_model_dir()
    oracle = json.loads((model_dir / "oracle.json").read_text())
    model = load_model(model_dir)
    state = model.new_state()
    logits = model.prefill(state, oracle["prompt_ids"])[-1]
    reply: list[int] = []
    for _ in range(len(oracle["full_ids"]) - len(oracle["prompt_ids"])):
        reply.append(int(np.argmax(logits)))
        logits = model.decode(state, reply[-1])
    assert oracle["prompt_ids"] + reply == oracle["full_ids"]
    text = Tokenizer.from_file(model_dir).decode(reply)
    assert text.strip() and "\ufffd" not in text and text.isprintable()
