"""The standard-attention families (OLMoE, Qwen3-MoE) on the accelerated engine: the q/k/v
products, q/k RMSNorm, rotate-half RoPE, attention over a key/value cache, the softmax router
and the routed experts through the expert store (spec/model.md §5.3, §7.1.1).

Kinds (spec/model.md §15): greedy tokens and routes exact against the reference and the
oracle (a); teacher-forced logits within the fixture's tau_logit (b); threads, batching,
prefill chunking and the RAM budget's disk tier byte-exact within the engine (c).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, max_excess
from support.accelerated_support import (
    BUILT,
    NOT_BUILT_REASON,
    accelerated,
    assert_decode_batch_invariant,
    reference,
)

from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)

MHA_FIXTURES = ("olmoe-tiny", "qwen3moe-tiny")


def oracle(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture_model_dir(name) / "oracle.json").read_text())
    return data


@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_teacher_forced_logits_within_tolerance_of_reference_and_oracle(name: str) -> None:
    ids = oracle(name)["full_ids"]
    tolerance = Tolerance.for_model_dir(fixture_model_dir(name), positions=len(ids)).logit
    got = accelerated(name).forward(ids)
    want = reference(name).prefill(reference(name).new_state(), ids)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert max_excess(got, want, tolerance) <= 0
    assert max_excess(got, np.load(fixture_model_dir(name) / "oracle_logits.npy"),
                      tolerance) <= 0


@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_greedy_tokens_equal_the_oracle(name: str) -> None:
    o = oracle(name)
    m = accelerated(name)
    state = m.new_state()
    logits = m.prefill(state, o["prompt_ids"])[-1]
    out = list(o["prompt_ids"])
    while len(out) < len(o["full_ids"]):
        out.append(int(np.argmax(logits)))
        logits = m.decode(state, out[-1])
    assert out == o["full_ids"]


@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_routes_equal_the_reference(name: str) -> None:
    ids = oracle(name)["full_ids"]
    a, r = accelerated(name), reference(name)
    _, routes_a = a.forward_rows([a.new_state()] * len(ids), ids, [False] * len(ids))
    _, routes_r = r.forward_rows([r.new_state()] * len(ids), ids, [False] * len(ids))
    assert routes_a.shape[1] == sum(r.config.is_sparse(i)
                                    for i in range(r.config.num_hidden_layers))
    assert np.array_equal(routes_a, routes_r)


@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_logits_are_byte_identical_for_1_2_and_4_threads(name: str) -> None:
    ids = oracle(name)["full_ids"]
    outs = [accelerated(name, threads=n).forward(ids) for n in (1, 2, 4)]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_a_row_is_byte_identical_alone_and_inside_a_batch(name: str) -> None:
    prompts = [[3, 14, 159, 26, 53, 58], [7, 8, 9], [200, 11, 77, 240, 5, 99, 1, 2]]
    assert_decode_batch_invariant(accelerated(name), prompts)


@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_prefill_chunks_and_a_reused_prefix_are_byte_identical(name: str) -> None:
    m = accelerated(name)
    ids = oracle(name)["full_ids"]
    whole = m.prefill(m.new_state(), ids)
    s = m.new_state()
    parts = [m.prefill(s, ids[:5]), m.prefill(s, ids[5:6]), m.prefill(s, ids[6:])]
    assert np.concatenate(parts).tobytes() == whole.tobytes()
    s.truncate(4)  # a reused prompt prefix: the cache rows past it are rewritten
    assert m.prefill(s, ids[4:]).tobytes() == whole[4:].tobytes()


@pytest.mark.usefixtures("no_runtime")  # the budget must not depend on this process's heap
@pytest.mark.parametrize("name", MHA_FIXTURES)
def test_the_ram_budget_reads_experts_from_disk_to_the_same_bytes(name: str) -> None:
    """``load_model(ram_gb=...)``: experts come through the disk tier's reads and a forward
    goes in chunks of the budget's rows; every logit keeps its all-mapped bytes."""
    from colibri.accelerated import load_model

    ids = oracle(name)["full_ids"]
    bounded = load_model(fixture_model_dir(name), threads=2, ram_gb=1.0)
    assert bounded.max_step_rows is not None and bounded.max_step_rows < len(ids)
    free = accelerated(name)
    a, b = free.new_state(), bounded.new_state()
    assert free.prefill(a, ids).tobytes() == bounded.prefill(b, ids).tobytes()
    assert free.decode(a, 26).tobytes() == bounded.decode(b, 26).tobytes()


def test_the_key_value_cache_holds_every_kv_heads_rotated_key_and_value() -> None:
    """The state's per-layer arrays are the standard attention's (no latent), and a state
    exported from the accelerated engine resumes on the reference to its logits (kind b)."""
    name = "qwen3moe-tiny"
    a, r = accelerated(name), reference(name)
    cfg = a.config
    state = a.new_state()
    width = cfg.num_key_value_heads * cfg.qk_head_dim
    assert all(layer.widths == {"key": width, "value": width} for layer in state.layers)
    ids = oracle(name)["full_ids"]
    a.prefill(state, ids[:-1])
    resumed = r.new_state()
    resumed.import_arrays(state.export_arrays())
    tolerance = Tolerance.for_model_dir(fixture_model_dir(name), positions=len(ids)).logit
    assert max_excess(a.decode(state, ids[-1]), r.decode(resumed, ids[-1]), tolerance) <= 0
