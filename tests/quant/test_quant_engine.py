"""``colibri engine`` (the reference behind the wire protocol) on quantized containers."""

from __future__ import annotations

import json

import pytest
from support.engine_harness import ids, run_engine, submit

from colibri import resources


@pytest.mark.parametrize("name", ["glm5-tiny-e8", "glm5-tiny-int4g64"])
def test_engine_greedy_on_a_container_matches_the_oracle(name: str) -> None:
    model_dir = resources.fixture_model_dir(name)
    oracle = json.loads((model_dir / "oracle.json").read_text())
    prompt, full = oracle["prompt_ids"], oracle["full_ids"]
    run = run_engine(
        [submit(1, 0, ids(*prompt), len(full) - len(prompt), ext="ids=1")], model_dir=model_dir
    )
    out = [int(f.payload or b"") for f in run.for_id(1) if f.kind == "DATA"]
    assert out and prompt + out == full[: len(prompt) + len(out)]
    if len(prompt) + len(out) < len(full):
        # the engine stops at an end-of-sequence id; the oracle greedy run went on past it
        eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
        eos_ids = eos if isinstance(eos, list) else [eos]
        assert full[len(prompt) + len(out)] in eos_ids
