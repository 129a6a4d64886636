"""OLMoE (standard multi-head attention, softmax router) behind the engine protocol: the
transformers oracle's greedy ids, the chat prompt as text through the model's own tokenizer,
and a conversation resumed from its COLIKV1 file (a key and a value per layer and position)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from colibri.reference import Tokenizer
from support.engine_harness import ids, run_engine, submit

from colibri import resources
from colibri.engine.kv_persist import HEADER_SIZE

OLMOE = resources.fixture_model_dir("olmoe-tiny")
ORACLE: dict[str, Any] = json.loads((OLMOE / "oracle.json").read_text())
PROMPT: list[int] = ORACLE["prompt_ids"]
CONTINUATION: list[int] = ORACLE["full_ids"][len(PROMPT):]


def test_greedy_over_the_protocol_matches_transformers() -> None:
    run = run_engine([submit(1, 0, ids(*PROMPT), len(CONTINUATION), ext="ids=1 logprobs=1")],
                     model_dir=OLMOE)
    assert run.greedy_ids(1) == CONTINUATION


def test_the_chat_prompt_as_text_gives_the_oracles_reply() -> None:
    """The engine tokenizes the rendered chat prompt itself (tokenizer.json, NFC normalizer
    and GPT-2 regex); the reply's bytes are the oracle's continuation's."""
    text = ORACLE["prompt_text"].encode()
    run = run_engine([submit(1, 0, text, len(CONTINUATION))], model_dir=OLMOE)
    tokenizer = Tokenizer.from_file(OLMOE)
    assert b"".join(run.payloads(1)) == b"".join(tokenizer.token_bytes(t)
                                                for t in CONTINUATION)


def test_a_resumed_conversation_continues_byte_identically(tmp_path: Path) -> None:
    first = submit(1, 0, ids(*PROMPT), 5, ext="ids=1 logprobs=1")
    a = run_engine([first], model_dir=OLMOE, state_dir=tmp_path)
    answer = a.greedy_ids(1)
    follow = submit(2, 0, ids(*PROMPT, *answer[:-1], 7, 8), 6, ext="ids=1")
    resumed = run_engine([follow], model_dir=OLMOE, state_dir=tmp_path)
    assert "resumed conversation from disk" in resumed.stderr
    uninterrupted = run_engine([first, follow], model_dir=OLMOE)
    assert resumed.payloads(2) == uninterrupted.payloads(2)
    header = (tmp_path / ".coli_kv").read_bytes()[:HEADER_SIZE]
    n_layers, kv_lora, qk_rope, index_hd, nic = struct.unpack_from("<5i", header, 8)
    config = json.loads((OLMOE / "config.json").read_text())
    key_width = config["num_key_value_heads"] * config["hidden_size"] // config[
        "num_attention_heads"]
    # No latent: the key and the value fill the record (spec/DEVIATIONS.md).
    assert (n_layers, kv_lora, qk_rope, index_hd, nic) == (2, 0, 2 * key_width, 0, 0)
