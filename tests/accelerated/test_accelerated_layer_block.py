"""A step's decoder layers in one C call (accelerated/decoder_stack.py), a layer in one
(accelerated/layer_block.py, csrc/layer.c), against the per-kernel path.

All paths call the same kernels in the same order, so within one machine their logits must
be the same bytes (sameness kind (c), spec/model.md §15): on every fixture, for a prefill,
single decodes, a batched decode and an MTP draft; and the DSA fixture, whose prompt runs
past index_topk, mixes them (a step where a layer selects runs layer by layer, and the
selecting layers on the per-kernel path).
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


def run(name: str, fused: bool, stack: bool = True) -> tuple[list[np.ndarray], Any]:
    from colibri.accelerated import load_model

    m = load_model(fixture_model_dir(name), threads=2)
    m.fused_layers, m.fused_stack = fused, stack
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
def test_one_call_steps_and_layers_give_the_per_kernel_bytes(name: str) -> None:
    stacked, model = run(name, True)
    layered, per_layer = run(name, True, stack=False)
    kernel, _ = run(name, False)
    assert model._stack is not None, "the one-call step never ran"
    assert per_layer._blocks and per_layer._stack is None
    assert len(stacked) == len(layered) == len(kernel)
    for a, b, c in zip(stacked, layered, kernel, strict=True):
        assert a.tobytes() == c.tobytes()
        assert b.tobytes() == c.tobytes()


def test_selecting_layers_fall_back_to_the_per_kernel_path() -> None:
    from colibri.accelerated import load_model

    m = load_model(fixture_model_dir("glm5-tiny-dsa"), threads=1)
    assert m.config.index_topk < len(PROMPTS[0])
    calls: list[str] = []
    fused, kernel = m._fused_layer, m._kernel_layer

    def spy_fused(*a: Any) -> Any:
        calls.append("fused")
        return fused(*a)

    def spy_kernel(*a: Any) -> Any:
        calls.append("kernel")
        return kernel(*a)

    m._fused_layer, m._kernel_layer = spy_fused, spy_kernel  # type: ignore[method-assign]
    m.prefill(m.new_state(), PROMPTS[0][: m.config.index_topk])
    assert calls == [] and m._stack is not None  # no row sees past index_topk: one call
    m.prefill(m.new_state(), PROMPTS[0])
    assert "kernel" in calls


@pytest.mark.sanitize
def test_malformed_tables_are_refused_by_the_c_side() -> None:
    from colibri.accelerated import load_model
    from colibri.accelerated.kernels import KernelInvalidArgument

    m = load_model(fixture_model_dir("glm5-tiny"), threads=1)
    lw = m.layers[0]
    assert lw.dense is not None
    x = np.ones((2, m.config.hidden_size), np.float32)
    start = np.array([0, 2], np.int64)
    rows = np.array([0, 1], np.int64)
    with pytest.raises(KernelInvalidArgument):  # a routed slot past the experts' outputs
        m.kernels.moe_residual(x, x.copy(), lw.dense.desc, start, rows,
                               np.array([[0], [2]], np.int64), np.ones((2, 1), np.float32),
                               None)
    before = x.copy()
    with pytest.raises(KernelInvalidArgument):  # a shared row outside the outputs
        m.kernels.moe_residual(x, x.copy(), lw.dense.desc, start, rows, None, None,
                               np.array([0, -1], np.int64))
    assert x.tobytes() == before.tobytes()  # refused before anything was written

    from colibri.accelerated.layer_block import LayerBlock

    block = LayerBlock(m.config, lw, False)
    block.record["kvl"] = 0  # a record whose sizes fit no layer
    s = m.new_state()
    s.reserve(1)
    cos = np.ones((2, m.config.qk_rope_head_dim // 2), np.float32)
    with pytest.raises(KernelInvalidArgument):
        block.step(m.kernels, x, cos, cos, [s.layers[0]] * 2, [0, 0], np.zeros(2))
