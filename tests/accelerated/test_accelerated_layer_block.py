"""Ranges of decoder layers in one C call (accelerated/decoder_stack.py, layer_block.py,
csrc/layer.c) against the per-kernel path.

Both paths call the same kernels in the same order, so within one machine their logits must
be the same bytes (sameness kind (c), spec/model.md §15): on every fixture, for a prefill,
single decodes, a batched decode and an MTP draft; and the DSA fixture, whose prompt runs
past index_topk, mixes them (a step where a layer selects runs the layers between the
selecting ones as ranges of the one call, the selecting layers on the per-kernel path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.accelerated_support import ALL_FIXTURES, BUILT, NOT_BUILT_REASON

from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)

PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26], [7, 8, 9], [20, 11, 77, 24, 5]]


def run(name: str, fused: bool) -> tuple[list[np.ndarray], Any]:
    from colibri.accelerated import load_model

    m = load_model(fixture_model_dir(name), threads=2)
    m.fused_layers = fused
    return drive(m)


def drive(m: Any) -> tuple[list[np.ndarray], Any]:
    """Prefills, decodes, a batched decode and an MTP draft: every row path of ``m``."""
    vocab = m.config.vocab_size
    prompts = [[t % vocab for t in p] for p in PROMPTS]
    states = [m.new_state() for _ in prompts]
    outs = [m.prefill(s, p) for s, p in zip(states, prompts, strict=True)]
    token = 1
    for _ in range(3):
        outs.append(m.decode(states[0], token))
        token = int(np.argmax(outs[-1]))
    outs.append(m.decode_batch(states, [5, 6, 7]))
    if m.mtp is not None:
        outs.append(m.mtp_draft(states[0], 9))
    return outs, m


#: Run under ASan + UBSan too (`make sanitize-test`): the DSA fixture covers index keys and
#: the fallback, the MTP one a layer whose rows share one cache.
UNDER_SANITIZER = ("glm5-tiny-dsa", "glm5-tiny-mtp")


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.sanitize] if n in UNDER_SANITIZER else [])
    for n in ALL_FIXTURES
])
def test_one_call_ranges_give_the_per_kernel_bytes(name: str) -> None:
    stacked, model = run(name, True)
    kernel, per_kernel = run(name, False)
    assert model._stack is not None, "the one-call step never ran"
    assert (model._mtp_stack is not None) == (model.mtp is not None)
    assert per_kernel._stack is None and per_kernel._mtp_stack is None
    assert len(stacked) == len(kernel)
    for a, c in zip(stacked, kernel, strict=True):
        assert a.tobytes() == c.tobytes()


def test_selecting_layers_fall_back_to_the_per_kernel_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from colibri.accelerated import load_model
    from colibri.accelerated.decoder_stack import DecoderStack

    m = load_model(fixture_model_dir("glm5-tiny-dsa"), threads=1)
    n = m.config.num_hidden_layers
    assert m.config.index_topk < len(PROMPTS[0])
    calls: list[tuple[str, int, int]] = []
    kernel, stack_run = m._kernel_layer, DecoderStack.run

    def spy_kernel(*a: Any) -> Any:
        calls.append(("kernel", a[1].index, a[1].index + 1))
        return kernel(*a)

    def spy_stack(self: DecoderStack, *a: Any, **kw: Any) -> Any:
        calls.append(("stack", a[7], a[8]))
        return stack_run(self, *a, **kw)

    m._kernel_layer = spy_kernel  # type: ignore[method-assign]
    monkeypatch.setattr(DecoderStack, "run", spy_stack)
    m.prefill(m.new_state(), PROMPTS[0][: m.config.index_topk])
    assert calls == [("stack", 0, n)]  # no row sees past index_topk: one call
    assert m._stack is not None
    calls.clear()
    m.prefill(m.new_state(), PROMPTS[0])
    assert any(c[0] == "kernel" for c in calls)
    # The per-kernel layers and the stacked ranges cover the layers once, in order.
    assert [c[1] for c in calls] == [0, *(c[2] for c in calls[:-1])] and calls[-1][2] == n


@pytest.mark.sanitize
def test_malformed_tables_are_refused_by_the_c_side() -> None:
    from colibri.accelerated import load_model
    from colibri.accelerated.decoder_stack import DecoderStack
    from colibri.accelerated.kernels import KernelInvalidArgument
    from colibri.accelerated.layer_block import LayerBlock

    m = load_model(fixture_model_dir("glm5-tiny"), threads=1)
    lw = m.layers[0]
    assert lw.dense is not None
    x = np.ones((2, m.config.hidden_size), np.float32)
    s = m.new_state()
    s.reserve(1)
    cos = np.ones((2, m.config.qk_rope_head_dim // 2), np.float32)
    block = LayerBlock(m.config, lw, False)
    block.record["kvl"] = 0  # a record whose sizes fit no layer
    stack = DecoderStack([block], m.config.num_experts_per_tok)
    before = x.copy()
    with pytest.raises(KernelInvalidArgument):
        stack.run(m.kernels, x, (cos, cos), [[s.layers[0]] * 2], [0, 0], m.experts, m.clock)
    assert x.tobytes() == before.tobytes()  # refused before anything was written
    with pytest.raises(KernelInvalidArgument):  # a range past the layers
        stack.run(m.kernels, x, (cos, cos), [[s.layers[0]] * 2], [0, 0], m.experts, m.clock,
                  0, 2)


class BatchStore:
    """A store that answers a layer's lookups in one call, and records each call."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls: list[tuple[int, list[int]]] = []

    def experts(self, layer: int, ids: list[int]) -> list[Any]:
        self.calls.append((layer, list(ids)))
        return [self.model.read_expert(layer, e) for e in ids]

    def expert(self, layer: int, e: int) -> Any:
        raise AssertionError("a batch store is asked in batches")


class SingleStore(BatchStore):
    """A store that answers one expert at a time."""

    experts = None  # type: ignore[assignment]

    def expert(self, layer: int, e: int) -> Any:
        self.calls.append((layer, [e]))
        return self.model.read_expert(layer, e)


@pytest.mark.parametrize("name", ["glm5-tiny", "glm5-tiny-dsa", "glm5-tiny-mtp"])
def test_the_store_is_asked_once_per_routed_layer_with_its_experts_ascending(name: str) -> None:
    """Both paths make the same lookups: one batch per routed layer per step, that layer's
    distinct chosen experts ascending, layer by layer; a store without batches gets the
    same lookups one by one."""
    from colibri.accelerated import load_model

    seen = {}
    for fused, store_type in ((True, BatchStore), (False, BatchStore), (True, SingleStore)):
        m = load_model(fixture_model_dir(name), threads=1)
        m.fused_layers = fused
        store = store_type(m)
        m.store = store
        outs, _ = drive(m)
        seen[(fused, store_type)] = (store.calls, [o.tobytes() for o in outs])
    batched, kernel = seen[(True, BatchStore)], seen[(False, BatchStore)]
    assert batched == kernel
    calls = batched[0]
    assert calls and all(ids == sorted(set(ids)) for _, ids in calls)
    singles = seen[(True, SingleStore)]
    assert [(layer, e) for layer, ids in calls for e in ids] == [
        (layer, ids[0]) for layer, ids in singles[0]]
    assert singles[1] == batched[1]
