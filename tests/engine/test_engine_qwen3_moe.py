"""Qwen3-MoE (per-head q/k norms, a dense layer among MoE layers) behind the engine protocol:
the transformers oracle's greedy ids, the ChatML prompt as text through the model's own
tokenizer (its special tokens as single ids), and a conversation resumed from its COLIKV1 file."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from colibri.reference import Tokenizer
from support.engine_harness import ids, run_engine, submit

from colibri import resources
from colibri.engine.kv_persist import HEADER_SIZE

QWEN3 = resources.fixture_model_dir("qwen3moe-tiny")
ORACLE: dict[str, Any] = json.loads((QWEN3 / "oracle.json").read_text())
PROMPT: list[int] = ORACLE["prompt_ids"]
CONTINUATION: list[int] = ORACLE["full_ids"][len(PROMPT):]


def test_greedy_over_the_protocol_matches_transformers() -> None:
    run = run_engine([submit(1, 0, ids(*PROMPT), len(CONTINUATION), ext="ids=1 logprobs=1")],
                     model_dir=QWEN3)
    assert run.greedy_ids(1) == CONTINUATION


def test_the_chat_prompt_as_text_gives_the_oracles_reply() -> None:
    """The engine tokenizes the rendered ChatML prompt itself (tokenizer.json: <|im_start|>,
    <|im_end|>, <think> as added tokens, the Qwen2 regex between them); the reply's bytes are
    the oracle's continuation's."""
    text = ORACLE["prompt_text"]
    assert text.startswith("<|im_start|>user\n") and text.endswith("<think>\n\n</think>\n\n")
    tokenizer = Tokenizer.from_file(QWEN3)
    assert tokenizer.encode(text) == PROMPT
    run = run_engine([submit(1, 0, text.encode(), len(CONTINUATION))], model_dir=QWEN3)
    assert b"".join(run.payloads(1)) == b"".join(tokenizer.token_bytes(t)
                                                for t in CONTINUATION)


def test_a_resumed_conversation_continues_byte_identically(tmp_path: Path) -> None:
    first = submit(1, 0, ids(*PROMPT), 5, ext="ids=1 logprobs=1")
    a = run_engine([first], model_dir=QWEN3, state_dir=tmp_path)
    answer = a.greedy_ids(1)
    follow = submit(2, 0, ids(*PROMPT, *answer[:-1], 7, 8), 6, ext="ids=1")
    resumed = run_engine([follow], model_dir=QWEN3, state_dir=tmp_path)
    assert "resumed conversation from disk" in resumed.stderr
    uninterrupted = run_engine([first, follow], model_dir=QWEN3)
    assert resumed.payloads(2) == uninterrupted.payloads(2)
    header = (tmp_path / ".coli_kv").read_bytes()[:HEADER_SIZE]
    n_layers, kv_lora, qk_rope, index_hd, nic = struct.unpack_from("<5i", header, 8)
    config = json.loads((QWEN3 / "config.json").read_text())
    # The declared head_dim, not hidden_size / heads, sizes each key and value.
    key_width = config["num_key_value_heads"] * config["head_dim"]
    assert config["head_dim"] != config["hidden_size"] // config["num_attention_heads"]
    assert (n_layers, kv_lora, qk_rope, index_hd, nic) == (3, 0, 2 * key_width, 0, 0)
