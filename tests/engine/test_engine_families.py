"""Every non-GLM family behind the engine protocol (OLMoE: standard attention and a softmax
router; Qwen3-MoE: per-head q/k norms, a dense layer among MoE layers; Kimi K2.5: a
DeepSeek-V3 text model behind a vision wrapper, with Kimi's tiktoken rank BPE): the
transformers oracle's greedy ids, the chat prompt as text through the model's own tokenizer
(special tokens as single ids), and for the standard-attention families a conversation
resumed from its COLIKV1 file (a key and a value per layer and position)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from colibri.reference import Tokenizer
from support.engine_harness import ids, run_engine, submit

from colibri import resources
from colibri.engine.kv_persist import HEADER_SIZE

#: fixture -> what its oracle's rendered prompt lacks as text (Kimi's template leaves the
#: ``[BOS]`` special token to the tokenizer call).
FAMILIES = {"olmoe-tiny": "", "qwen3moe-tiny": "", "kimi-tiny": "[BOS]"}
#: The standard-attention families, whose KV file holds keys and values (no latent).
STANDARD_ATTENTION = ["olmoe-tiny", "qwen3moe-tiny"]


def _oracle(fixture: str) -> tuple[Path, dict[str, Any], list[int], list[int]]:
    model = resources.fixture_model_dir(fixture)
    oracle: dict[str, Any] = json.loads((model / "oracle.json").read_text())
    prompt: list[int] = oracle["prompt_ids"]
    return model, oracle, prompt, oracle["full_ids"][len(prompt):]


@pytest.mark.parametrize("fixture", FAMILIES)
def test_greedy_over_the_protocol_matches_transformers(fixture: str) -> None:
    model, _, prompt, continuation = _oracle(fixture)
    run = run_engine([submit(1, 0, ids(*prompt), len(continuation), ext="ids=1 logprobs=1")],
                     model_dir=model)
    assert run.greedy_ids(1) == continuation


@pytest.mark.parametrize(("fixture", "prefix"), FAMILIES.items())
def test_the_chat_prompt_as_text_gives_the_oracles_reply(fixture: str, prefix: str) -> None:
    """The engine tokenizes the rendered prompt itself (tokenizer.json or tiktoken.model,
    added tokens, the family's pre-tokenizer); the reply's bytes are the oracle's
    continuation's."""
    model, oracle, prompt, continuation = _oracle(fixture)
    text = prefix + oracle["prompt_text"]
    tokenizer = Tokenizer.from_file(model)
    assert tokenizer.encode(text) == prompt
    run = run_engine([submit(1, 0, text.encode(), len(continuation))], model_dir=model)
    assert b"".join(run.payloads(1)) == b"".join(tokenizer.token_bytes(t)
                                                for t in continuation)


@pytest.mark.parametrize("fixture", STANDARD_ATTENTION)
def test_a_resumed_conversation_continues_byte_identically(fixture: str,
                                                           tmp_path: Path) -> None:
    model, _, prompt, _ = _oracle(fixture)
    first = submit(1, 0, ids(*prompt), 5, ext="ids=1 logprobs=1")
    a = run_engine([first], model_dir=model, state_dir=tmp_path)
    answer = a.greedy_ids(1)
    follow = submit(2, 0, ids(*prompt, *answer[:-1], 7, 8), 6, ext="ids=1")
    resumed = run_engine([follow], model_dir=model, state_dir=tmp_path)
    assert "resumed conversation from disk" in resumed.stderr
    uninterrupted = run_engine([first, follow], model_dir=model)
    assert resumed.payloads(2) == uninterrupted.payloads(2)
    header = (tmp_path / ".coli_kv").read_bytes()[:HEADER_SIZE]
    n_layers, kv_lora, qk_rope, index_hd, nic = struct.unpack_from("<5i", header, 8)
    config = json.loads((model / "config.json").read_text())
    # A declared head_dim (Qwen3's differs from hidden_size / heads) sizes each key and value.
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    key_width = config["num_key_value_heads"] * head_dim
    # No latent: the key and the value fill the record (spec/DEVIATIONS.md).
    assert (n_layers, kv_lora, qk_rope, index_hd, nic) == (
        config["num_hidden_layers"], 0, 2 * key_width, 0, 0)


def test_the_qwen3_fixture_declares_a_head_dim_apart_from_hidden_over_heads() -> None:
    """What makes the resume test above tell the two ways of sizing a key apart."""
    config = json.loads((resources.fixture_model_dir("qwen3moe-tiny") / "config.json")
                        .read_text())
    assert config["head_dim"] != config["hidden_size"] // config["num_attention_heads"]
