"""Kimi K2.5 (a DeepSeek-V3 text model behind a vision wrapper, Kimi's tiktoken rank BPE)
behind the engine protocol: the transformers oracle's greedy ids, and the prompt as text
through the model's own ``tiktoken.model`` tokenizer (its special tokens as single ids)."""

from __future__ import annotations

import json
from typing import Any

from colibri.reference import Tokenizer
from support.engine_harness import ids, run_engine, submit

from colibri import resources

KIMI = resources.fixture_model_dir("kimi-tiny")
ORACLE: dict[str, Any] = json.loads((KIMI / "oracle.json").read_text())
PROMPT: list[int] = ORACLE["prompt_ids"]
CONTINUATION: list[int] = ORACLE["full_ids"][len(PROMPT):]


def test_greedy_over_the_protocol_matches_transformers() -> None:
    run = run_engine([submit(1, 0, ids(*PROMPT), len(CONTINUATION), ext="ids=1 logprobs=1")],
                     model_dir=KIMI)
    assert run.greedy_ids(1) == CONTINUATION


def test_the_prompt_as_text_gives_the_oracles_reply() -> None:
    """The engine tokenizes the text itself: ``[BOS]`` is a special token of the rank BPE,
    the rest Kimi's pre-tokenizer and merges; the reply's bytes are the oracle's."""
    text = "[BOS]" + ORACLE["prompt_text"]
    tokenizer = Tokenizer.from_file(KIMI)
    assert tokenizer.encode(text) == PROMPT
    run = run_engine([submit(1, 0, text.encode(), len(CONTINUATION))], model_dir=KIMI)
    assert b"".join(run.payloads(1)) == b"".join(tokenizer.token_bytes(t)
                                                for t in CONTINUATION)
