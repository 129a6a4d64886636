"""`colibri serve` with no model serves the trained default and answers a sum.

Greedy decoding is deterministic (spec/model.md §15 kind (a)), so the served answer is pinned
through the official OpenAI SDK, end to end (the console script, the embedded model, the
engine process, the chat template), against the reference engine's own greedy decoding of the
prompt the chat template renders -- and it must be right: the default model is held to
`make serve` answering this question with 42. How often the model is right on held-out sums
is measured, not asserted, by ``colibri bench --section default-model`` (the model card's numbers).
"""

from __future__ import annotations

import os
from pathlib import Path

from support.server_harness import interrupt, serve_process

from colibri.resources import DEFAULT_MODEL_NAME

# The official SDKs are imported inside the tests that use them: their pydantic types take
# seconds to import, and every pytest worker imports every test module when it collects.

ROOT = Path(__file__).resolve().parents[2]


def reference_greedy_reply(question: str) -> str:
    """The reference engine's greedy reply to one user turn, thinking off (the server's
    default), up to the first end-of-turn or special token."""
    import numpy as np
    from colibri.reference import Tokenizer, load_model

    from colibri.resources import default_model_dir
    from colibri.text.chat_format import chat_prompt

    model = load_model(default_model_dir())
    tokenizer = Tokenizer.from_file(default_model_dir())
    stops = set(model.config.eos_token_ids) | tokenizer.special_ids
    state = model.new_state()
    logits = model.prefill(state, tokenizer.encode(chat_prompt(question)))[-1]
    out: list[int] = []
    while (token := int(np.argmax(logits))) not in stops and len(out) < 64:
        out.append(token)
        logits = model.decode(state, token)
    return str(tokenizer.decode(out)).strip()


def test_make_serve_default_answers_27_plus_15_through_the_openai_sdk() -> None:
    import openai
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLI_MODEL", "COLI_MODEL_ID", "COLIBRI_DEFAULT_MODEL", "COLI_THINK")}
    with serve_process([], env, ROOT) as (proc, line, url):
        # The served id names the model that answers (not GLM-5.2).
        assert line.startswith(f"colibri serving {DEFAULT_MODEL_NAME} on http://127.0.0.1:")
        assert proc.stdout is not None
        root = url.removesuffix("/v1")
        assert proc.stdout.readline().strip() == f"dashboard: {root}/  (open it in a browser)"
        assert proc.stdout.readline().startswith(f"try: colibri chat --attach {root}  ")
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == [DEFAULT_MODEL_NAME]
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL_NAME, temperature=0, max_tokens=64,
            messages=[{"role": "user", "content": "What is 27 + 15?"}])
        assert reply.choices[0].finish_reason == "stop"
        content = reply.choices[0].message.content
        assert content == reference_greedy_reply("What is 27 + 15?")
        assert content is not None and "42" in content, content
        assert interrupt(proc) == 0
