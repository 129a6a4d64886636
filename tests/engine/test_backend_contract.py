"""The Backend contract (colibri.engine.backend), for every backend: the fake the engine tests
use, the numpy reference and, once `make build` has built its C library, the accelerated one."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.accelerated_support import needs_library
from support.engine_fakes import FakeBackend

from colibri import resources
from colibri.engine.backend import Backend, StepRow, sparse_layers
from colibri.engine.registry import (
    BACKENDS,
    BackendOptions,
    BackendUnavailable,
    check_available,
    open_backend,
)

PROMPT = [3, 14, 15, 9, 26, 5]


def _reference() -> Backend:
    return open_backend(
        "reference", resources.fixture_model_dir("glm5-tiny"), BackendOptions(), io.StringIO()
    )


def _accelerated() -> Backend:
    return open_backend(
        "accelerated", resources.fixture_model_dir("glm5-tiny"), BackendOptions(), io.StringIO()
    )


FACTORIES: dict[str, Callable[[], Backend]] = {
    "fake": FakeBackend, "reference": _reference, "accelerated": _accelerated,
}


@pytest.fixture(params=[
    pytest.param(name, marks=needs_library) if name == "accelerated" else name
    for name in sorted(FACTORIES)
])
def make(request: pytest.FixtureRequest) -> Callable[[], Backend]:
    return FACTORIES[request.param]


def prefill(backend: Backend, state: Any, tokens: list[int]) -> Any:
    return backend.step([StepRow(state, t, True) for t in tokens])


def test_step_shapes_and_routes(make: Callable[[], Backend]) -> None:
    backend = make()
    shape = backend.shape
    state = backend.new_state()
    rows = [StepRow(state, t, i == len(PROMPT) - 1) for i, t in enumerate(PROMPT)]
    step = backend.step(rows)
    assert backend.length(state) == len(PROMPT)
    assert step.logits.shape == (1, shape.vocab_size) and step.logits.dtype == np.float32
    k = shape.num_experts_per_tok
    assert step.routes.shape == (len(PROMPT), len(sparse_layers(shape)), k)
    # k distinct expert ids per row and layer
    flat = step.routes.reshape(-1, k)
    assert ((flat >= 0) & (flat < shape.n_routed_experts)).all()
    assert all(len(set(r.tolist())) == k for r in flat)


def test_only_rows_that_want_logits_get_them_with_the_same_bytes(
    make: Callable[[], Backend],
) -> None:
    backend = make()
    every = prefill(backend, backend.new_state(), PROMPT)
    wants = [i % 2 == 0 for i in range(len(PROMPT))]
    state = backend.new_state()
    some = backend.step([StepRow(state, t, w) for t, w in zip(PROMPT, wants, strict=True)])
    assert some.logits.tobytes() == every.logits[np.asarray(wants)].tobytes()
    assert some.routes.tobytes() == every.routes.tobytes()


def test_batch_invariance_byte_exact(make: Callable[[], Backend]) -> None:
    backend = make()
    prompts = [PROMPT, PROMPT[:3] + [7], [11, 12]]
    alone = []
    for p in prompts:
        s = backend.new_state()
        prefill(backend, s, p)
        alone.append(backend.step([StepRow(s, 4, True)]))
    states = [backend.new_state() for _ in prompts]
    for s, p in zip(states, prompts, strict=True):
        prefill(backend, s, p)
    batched = backend.step([StepRow(s, 4, True) for s in states])
    for i, one in enumerate(alone):
        assert batched.logits[i].tobytes() == one.logits[0].tobytes()
        assert batched.routes[i].tobytes() == one.routes[0].tobytes()


def test_prefill_rows_equal_decode_rows(make: Callable[[], Backend]) -> None:
    backend = make()
    whole = prefill(backend, backend.new_state(), PROMPT)
    s = backend.new_state()
    rows = [backend.step([StepRow(s, t, True)]) for t in PROMPT]
    assert np.concatenate([r.logits for r in rows]).tobytes() == whole.logits.tobytes()


def test_truncate_then_reforward_is_the_same(make: Callable[[], Backend]) -> None:
    backend = make()
    s = backend.new_state()
    first = prefill(backend, s, PROMPT)
    backend.truncate(s, 2)
    assert backend.length(s) == 2
    again = prefill(backend, s, PROMPT[2:])
    assert again.logits.tobytes() == first.logits[2:].tobytes()
    with pytest.raises(ValueError):
        backend.truncate(s, backend.length(s) + 1)


def test_kv_export_import_round_trip(make: Callable[[], Backend]) -> None:
    backend = make()
    s = backend.new_state()
    prefill(backend, s, PROMPT)
    rows = backend.export_kv(s, 0, len(PROMPT))
    assert rows.shape == (len(PROMPT), backend.kv_record.record_floats)
    assert rows.dtype == np.float32
    restored = backend.new_state()
    backend.import_kv(restored, PROMPT, rows)
    assert backend.length(restored) == len(PROMPT)
    assert backend.export_kv(restored, 0, len(PROMPT)).tobytes() == rows.tobytes()
    after = backend.step([StepRow(restored, 4, True)])
    assert after.logits.tobytes() == backend.step([StepRow(s, 4, True)]).logits.tobytes()


def test_determinism_across_instances(make: Callable[[], Backend]) -> None:
    a, b = make(), make()
    sa, sb = a.new_state(), b.new_state()
    assert prefill(a, sa, PROMPT).logits.tobytes() == prefill(b, sb, PROMPT).logits.tobytes()
    assert a.model_tag == b.model_tag != 0


def test_cpu_backends_report_no_devices(make: Callable[[], Backend]) -> None:
    assert make().devices() == []


def test_the_registry_names_accelerated_and_says_when_it_is_not_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(BACKENDS) >= {"reference", "accelerated"}
    check_available("accelerated")
    from colibri.accelerated import model as accelerated_model
    from colibri.accelerated.native import LibraryNotBuilt

    def unbuilt(*_: object) -> None:
        raise LibraryNotBuilt("the C library is missing: run `make build`")

    monkeypatch.setattr(accelerated_model, "Kernels", unbuilt)
    with pytest.raises(BackendUnavailable, match="not available in this build.*make build"):
        open_backend("accelerated", resources.fixture_model_dir("glm5-tiny"), BackendOptions(),
                     io.StringIO())
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        check_available("nope")
    check_available("reference")


def test_step_timing_is_consistent(make: Callable[[], Backend]) -> None:
    """Phases are disjoint parts of the step: none negative, together at most its wall time."""
    backend = make()
    state = backend.new_state()
    for step in (prefill(backend, state, PROMPT), backend.step([StepRow(state, 7, False)])):
        t = step.timing
        assert min(t.total_s, t.matmul_s, t.attention_s, t.head_s) >= 0.0
        assert t.matmul_s + t.attention_s + t.head_s <= t.total_s


def test_reference_measures_its_phases() -> None:
    """The numpy backend times attention, expert products and lm_head; a step whose rows want
    no logits runs no lm_head."""
    backend = _reference()
    state = backend.new_state()
    timing = prefill(backend, state, PROMPT).timing
    assert timing.total_s > 0 and timing.matmul_s > 0
    assert timing.attention_s > 0 and timing.head_s > 0
    assert backend.step([StepRow(state, 7, False)]).timing.head_s == 0.0


@pytest.mark.parametrize("name", ["reference", pytest.param("accelerated", marks=needs_library)])
def test_model_backends_measure_their_phases(name: str) -> None:
    """PERF's t_emm, t_attn and t_head come from the backend's own clock (spec/protocol.md
    2.6, "Measured or zero"): a step with attention, a MoE layer and the lm_head has each
    phase above zero and, the clock restarting with every step, inside that step's wall time."""
    backend = FACTORIES[name]()
    state = backend.new_state()
    first = backend.step([StepRow(state, t, i == len(PROMPT) - 1) for i, t in enumerate(PROMPT)])
    second = backend.step([StepRow(state, PROMPT[0], True)])
    for timing in (first.timing, second.timing):
        phases = (timing.matmul_s, timing.attention_s, timing.head_s)
        assert all(p > 0 for p in phases), timing
        assert sum(phases) <= timing.total_s, timing
