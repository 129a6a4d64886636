"""The accelerated engine against the reference and the oracle, on every committed fixture.

Kinds (spec/model.md §15): greedy tokens and routes exact (a); logits within the fixture's
tau_logit of the reference and of oracle_logits.npy (b); threads, batching and prefill
chunking byte-exact within the accelerated engine (c).
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, max_excess
from support.accelerated_support import (
    ALL_FIXTURES,
    BUILT,
    NOT_BUILT_REASON,
    accelerated,
    assert_decode_batch_invariant,
    assert_mtp_drafts_match,
    reference,
)

from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)


def oracle(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture_model_dir(name) / "oracle.json").read_text())
    return data


def tolerance(name: str) -> float:
    positions = len(oracle(name)["full_ids"])
    return Tolerance.for_model_dir(fixture_model_dir(name), positions=positions).logit


def greedy(m: Any, prompt: list[int], new: int) -> list[int]:
    state = m.new_state()
    logits = m.prefill(state, prompt)[-1]
    ids = list(prompt)
    for _ in range(new):
        token = int(np.argmax(logits))
        ids.append(token)
        logits = m.decode(state, token)
    return ids


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_teacher_forced_logits_within_tolerance_of_reference_and_oracle(name: str) -> None:
    ids = oracle(name)["full_ids"]
    got = accelerated(name).forward(ids)
    assert got.dtype == np.float32
    ref_state = reference(name).new_state()
    want = reference(name).prefill(ref_state, ids)
    assert got.shape == want.shape
    assert max_excess(got, want, tolerance(name)) <= 0
    expected = np.load(fixture_model_dir(name) / "oracle_logits.npy")
    assert max_excess(got, expected, tolerance(name)) <= 0


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_greedy_tokens_equal_the_reference_and_oracle(name: str) -> None:
    o = oracle(name)
    new = len(o["full_ids"]) - len(o["prompt_ids"])
    assert greedy(accelerated(name), o["prompt_ids"], new) == o["full_ids"]


@pytest.mark.parametrize("name", ["glm5-tiny", "glm5-tiny-dsa", "deepseek3-tiny"])
def test_routes_equal_the_reference(name: str) -> None:
    ids = oracle(name)["full_ids"]
    a, r = accelerated(name), reference(name)
    sa, sr = a.new_state(), r.new_state()
    _, routes_a = a.forward_rows([sa] * len(ids), ids, [False] * len(ids))
    _, routes_r = r.forward_rows([sr] * len(ids), ids, [False] * len(ids))
    assert np.array_equal(routes_a, routes_r)


@pytest.mark.parametrize("name", ["glm5-tiny-dsa", "deepseek3-tiny"])
def test_logits_are_byte_identical_for_1_2_and_4_threads(name: str) -> None:
    ids = oracle(name)["full_ids"]
    outs = [accelerated(name, threads=n).forward(ids) for n in (1, 2, 4)]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


@pytest.mark.parametrize("name", ["glm5-tiny-dsa", "glm5-tiny"])
def test_a_row_is_byte_identical_alone_and_inside_a_batch(name: str) -> None:
    m = accelerated(name)
    prompts = [[3, 14, 159, 26, 53, 58], [7, 8, 9], [200, 11, 77, 240, 5, 99, 1, 2]]
    assert_decode_batch_invariant(m, prompts)


def test_prefill_chunking_is_byte_identical() -> None:
    m = accelerated("glm5-tiny-dsa")
    ids = oracle("glm5-tiny-dsa")["full_ids"]
    whole = m.prefill(m.new_state(), ids)
    s = m.new_state()
    parts = [m.prefill(s, ids[:5]), m.prefill(s, ids[5:6]), m.prefill(s, ids[6:])]
    assert np.concatenate(parts).tobytes() == whole.tobytes()


def test_mtp_draft_matches_the_reference() -> None:
    name = "glm5-tiny-mtp"
    ids = oracle(name)["full_ids"][:12]
    assert_mtp_drafts_match(accelerated(name), reference(name), ids, tolerance(name))


def test_generic_and_avx2_variants_agree_within_tolerance() -> None:
    from colibri.accelerated.kernels import Kernels
    from colibri.accelerated.model import open_model
    from colibri.accelerated.native import library_path, supported_variants

    if "avx2" not in supported_variants():
        pytest.skip("this CPU runs only the generic variant")
    name = "glm5-tiny-dsa"
    ids = oracle(name)["full_ids"]
    outs = []
    for variant in ("generic", "avx2"):
        path = library_path().parent.parent / variant / library_path().name
        m = open_model(fixture_model_dir(name), threads=2)
        m.kernels = Kernels(2, ctypes.CDLL(str(path)))
        assert m.kernels.isa == ("generic" if variant == "generic" else "avx2+fma")
        outs.append(m.forward(ids))
    assert max_excess(outs[0], outs[1], tolerance(name)) <= 0


def test_f16_weights_match_the_reference_on_the_same_checkpoint(tmp_path: Any) -> None:
    from colibri.accelerated import load_model
    from colibri.reference import load_model as load_reference
    from support.reference_support import copy_fixture, rewrite_tensors

    target = copy_fixture("glm5-tiny", tmp_path)

    def to_f16(tensors: dict[str, np.ndarray]) -> None:
        for key, value in tensors.items():
            if value.ndim == 2:
                tensors[key] = value.astype(np.float16)

    rewrite_tensors(target, to_f16)
    ids = oracle("glm5-tiny")["full_ids"]
    r = load_reference(target)
    want = r.prefill(r.new_state(), ids)
    got = load_model(target, threads=2).forward(ids)
    assert max_excess(got, want, tolerance("glm5-tiny")) <= 0
    assert [int(i) for i in got.argmax(-1)] == [int(i) for i in want.argmax(-1)]
