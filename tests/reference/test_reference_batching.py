"""Batch invariance: a row's logits are the same bytes alone, in any batch, or in a prefill."""

from __future__ import annotations

import copy

import numpy as np
from colibri.reference import ReferenceModel
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reference_support import model, oracle

from colibri.backend_kit.kv_state import KVState

NAMES = ("glm5-tiny", "glm5-tiny-dsa", "deepseek3-tiny", "olmoe-tiny", "qwen3moe-tiny",
         "kimi-tiny")

compositions = st.lists(
    st.tuples(
        st.lists(st.integers(0, 255), min_size=1, max_size=12),  # the sequence so far
        st.integers(0, 255),  # the token to decode
    ),
    min_size=1,
    max_size=5,
)


def _state_after(m: ReferenceModel, ids: list[int]) -> KVState:
    state = m.new_state()
    m.prefill(state, ids)
    return state


@settings(max_examples=25)
@given(name=st.sampled_from(NAMES), batch=compositions)
def test_decode_batch_rows_are_bit_identical_to_decoding_alone(
    name: str, batch: list[tuple[list[int], int]]
) -> None:
    m = model(name)
    states = [_state_after(m, ids) for ids, _ in batch]
    alone = [m.decode(copy.deepcopy(s), tok) for s, (_, tok) in zip(states, batch, strict=True)]
    together = m.decode_batch(states, [tok for _, tok in batch])
    for i, row in enumerate(alone):
        assert together[i].tobytes() == row.tobytes()
    # The batched step advanced every state like a lone decode would.
    assert [s.length for s in states] == [len(ids) + 1 for ids, _ in batch]


@settings(max_examples=10)
@given(
    name=st.sampled_from(NAMES),
    ids=st.lists(st.integers(0, 255), min_size=2, max_size=20),
    data=st.data(),
)
def test_prefill_equals_decoding_token_by_token_bitwise(
    name: str, ids: list[int], data: st.DataObject
) -> None:
    m = model(name)
    cut = data.draw(st.integers(1, len(ids)))
    chunked = m.new_state()
    first = m.prefill(chunked, ids[:cut])
    rest = m.prefill(chunked, ids[cut:])
    stepwise = m.new_state()
    steps = np.stack([m.decode(stepwise, t) for t in ids])
    assert np.concatenate([first, rest]).tobytes() == steps.tobytes()


def test_truncated_prefix_reuse_gives_the_cold_bytes() -> None:
    m = model("glm5-tiny-dsa")
    ids = oracle("glm5-tiny-dsa")["full_ids"]
    cold = m.prefill(m.new_state(), ids)
    state = m.new_state()
    m.prefill(state, ids[:20] + [1, 2, 3])
    state.truncate(20)
    assert state.length == 20
    warm = m.prefill(state, ids[20:])
    assert warm.tobytes() == cold[20:].tobytes()


def test_decode_batch_refuses_a_repeated_state_and_mismatched_lengths() -> None:
    m = model("glm5-tiny")
    s = _state_after(m, [1, 2])
    try:
        m.decode_batch([s, s], [3, 4])
    except ValueError as exc:
        assert "distinct" in str(exc)
    else:
        raise AssertionError("a repeated state was accepted")
    try:
        m.decode_batch([s], [3, 4])
    except ValueError as exc:
        assert "tokens" in str(exc)
    else:
        raise AssertionError("mismatched lengths were accepted")


def test_out_of_vocabulary_token_is_refused() -> None:
    m = model("glm5-tiny")
    try:
        m.decode(m.new_state(), 256)
    except ValueError as exc:
        assert "256" in str(exc)
    else:
        raise AssertionError("token 256 accepted by a 256-token vocabulary")


def test_kv_arrays_are_reachable_for_persistence() -> None:
    m = model("glm5-tiny")
    s = _state_after(m, [5, 6, 7])
    arrays = s.layer_arrays(0)
    assert arrays["latent"].shape == (3, m.config.kv_lora_rank)
    assert arrays["rope_key"].shape == (3, m.config.qk_rope_head_dim)
    assert arrays["index_key"].shape == (3, m.config.index_head_dim)


def test_exported_state_resumes_to_the_same_bytes() -> None:
    m = model("glm5-tiny-dsa")
    ids = oracle("glm5-tiny-dsa")["full_ids"]
    original = _state_after(m, ids[:20])
    arrays = original.export_arrays()
    resumed = m.new_state()
    resumed.import_arrays(arrays)
    assert resumed.length == 20 and resumed.tokens == ids[:20]
    assert m.decode(resumed, ids[20]).tobytes() == m.decode(original, ids[20]).tobytes()


def test_import_refuses_arrays_of_another_layout() -> None:
    m = model("glm5-tiny")
    arrays = _state_after(m, [1, 2, 3]).export_arrays()
    bad = dict(arrays)
    bad["layers.2.latent"] = bad["layers.2.latent"][:, :-1]
    fresh = m.new_state()
    try:
        fresh.import_arrays(bad)
    except ValueError as exc:
        assert "layers.2.latent" in str(exc)
    else:
        raise AssertionError("a misshapen cache array was accepted")
    assert fresh.length == 0
