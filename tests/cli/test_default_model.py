"""The embedded default model glm5-chat-small: trained here, shipped with its tokenizer, its
oracle (HF transformers on the committed weights) and its training record."""

from __future__ import annotations

import json

import numpy as np
from colibri.reference import Tokenizer, load_model

from colibri.resources import DEFAULT_MODEL_NAME, default_model_dir, fixtures_dir


def test_default_model_is_glm5_chat_small_with_the_fixture_tokenizer() -> None:
    model_dir = default_model_dir()
    assert model_dir.name == DEFAULT_MODEL_NAME == "glm5-chat-small"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shipped = (fixtures_dir() / "tokenizer" / name).read_bytes()
        assert (model_dir / name).read_bytes() == shipped, name
    config = json.loads((model_dir / "config.json").read_text())
    generation = json.loads((model_dir / "generation_config.json").read_text())
    tokenizer = Tokenizer.from_file(model_dir)
    assert config["vocab_size"] == tokenizer.vocab_size == 512
    stops = [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    assert generation["eos_token_id"] == config["eos_token_id"] == stops


def test_the_glm5_architecture_is_all_there() -> None:
    """MLA, a pruning DSA indexer, noaux_tc routing with a learned bias, a shared expert, a
    dense first layer and an MTP head: the GLM-5 architecture, small."""
    model = load_model(default_model_dir())
    cfg = model.config
    assert cfg.first_k_dense_replace >= 1 and cfg.num_hidden_layers > cfg.first_k_dense_replace
    assert cfg.indexer_types is not None and cfg.n_shared_experts == 1
    oracle = json.loads((default_model_dir() / "oracle.json").read_text())
    # The oracle's sequence is longer than index_topk, so its last positions were pruned.
    assert cfg.index_topk < len(oracle["full_ids"])
    assert model.mtp is not None and model.mtp_indexer_mode == "full"
    from colibri.reference.safetensors import read_all

    biases = [v for k, v in read_all(default_model_dir() / "model.safetensors").items()
              if k.endswith("e_score_correction_bias")]
    assert len(biases) == cfg.num_hidden_layers - cfg.first_k_dense_replace + 1  # + MTP layer
    assert all(float(np.ptp(b)) > 0 for b in biases)  # balancing moved every router's bias


def test_oracle_prompt_is_our_encoding_of_its_text() -> None:
    model_dir = default_model_dir()
    oracle = json.loads((model_dir / "oracle.json").read_text())
    assert Tokenizer.from_file(model_dir).encode(oracle["prompt_text"]) == oracle["prompt_ids"]


def test_greedy_answer_matches_transformers_and_is_text() -> None:
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
    tokenizer = Tokenizer.from_file(model_dir)
    assert reply[-1] in model.config.eos_token_ids
    text = tokenizer.decode(reply[:-1])
    assert "\ufffd" not in text and text.isprintable()
    # A question with thinking on: a reasoning block, then the answer.
    assert oracle["prompt_text"].endswith("<|assistant|><think>") and text.count("</think>") == 1


def test_training_record_is_in_the_model_folder() -> None:
    record = json.loads((default_model_dir() / "training.json").read_text())
    assert record["model"] == DEFAULT_MODEL_NAME and record["final"] is True
    assert record["data"]["train_seed"] != record["data"]["heldout_seed"]
    curve = record["curve"]
    assert len(curve) >= 10 and curve[-1]["step"] == max(row["step"] for row in curve)
    first, last = curve[0]["loss"], curve[-1]["loss"]
    assert last < first / 3, (first, last)
    log = (default_model_dir() / "train_log.txt").read_text().splitlines()
    assert [json.loads(line) for line in log] == curve
