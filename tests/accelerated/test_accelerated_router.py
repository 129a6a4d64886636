"""The router and the expert table of the one-call layer (csrc/route.c, accelerated/layer_block.py).

``col_route`` against the reference's ``select_experts`` (spec/model.md §7.1): the same experts
wherever the reference's choice is not within rounding of a tie, ties to the lower id (and
lower group), weights within the rounding of the few float32 operations that make them (C's
expf and numpy's exp may differ in the last bit). The one-call layer must leave the expert
store with the counts the per-kernel path leaves (TIERS/EMAP/HITS read them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from colibri.conformance.sameness import SAFETY_FACTOR, UNIT_ROUNDOFF
from colibri.reference.router import select_experts
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.accelerated_support import BUILT, NOT_BUILT_REASON

from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)


def kernels() -> Any:
    from colibri.accelerated.kernels import Kernels

    return Kernels(1)


def config(n_exp: int, n_group: int, topk_group: int, k: int, norm: bool) -> Any:
    class Cfg:  # the fields select_experts reads
        n_routed_experts, num_experts_per_tok = n_exp, k
        routed_scaling_factor = 2.5

    cfg: Any = Cfg()
    cfg.n_group, cfg.topk_group, cfg.norm_topk_prob = n_group, topk_group, norm
    return cfg


def margin(values: np.ndarray, k: int) -> float:
    """Gap between the k-th and (k+1)-th largest finite values (inf: no competitor)."""
    top = np.sort(values[np.isfinite(values)])[::-1]
    return float(top[k - 1] - top[k]) if top.shape[0] > k else float("inf")


#: A few float32 roundings of values near 1 (sigmoid, bias add, a group's top-2 sum).
CLOSE = SAFETY_FACTOR * UNIT_ROUNDOFF * 4


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(8, 1, 1), (16, 4, 2), (32, 1, 1), (32, 8, 3), (64, 8, 4)]),
       st.integers(1, 8), st.booleans(), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_route_matches_the_reference(groups: tuple[int, int, int], k: int, norm: bool,
                                     rows: int, seed: int) -> None:
    n_exp, n_group, topk_group = groups
    cfg = config(n_exp, n_group, topk_group, k, norm)
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (rows, n_exp)).astype(np.float32)
    bias = rng.normal(0.0, 0.1, n_exp).astype(np.float32)
    chosen, weights = kernels().route(logits, bias, n_group, topk_group, k, norm, 2.5)
    for r in range(rows):
        scores = (1.0 / (1.0 + np.exp(-logits[r].astype(np.float64)))).astype(np.float32)
        choice = scores + bias
        if n_group > 1:
            g = np.sort(choice.reshape(n_group, -1), axis=1)[:, -2:].sum(axis=1)
            assume(margin(g, topk_group) > CLOSE)
            kept = np.argsort(-g, kind="stable")[:topk_group]
            choice = np.where(np.isin(np.arange(n_exp) // (n_exp // n_group), kept), choice,
                              -np.inf)
        assume(margin(choice, k) > CLOSE)
        want_ids, want_w = select_experts(logits[r], bias, cfg)
        assert chosen[r].tolist() == want_ids.tolist()
        bound = SAFETY_FACTOR * UNIT_ROUNDOFF * (k + 4) * np.abs(want_w)
        assert np.all(np.abs(weights[r] - want_w) <= bound)


def test_ties_go_to_the_lower_expert_and_group() -> None:
    k = kernels()
    flat = np.zeros((1, 8), np.float32)
    chosen, weights = k.route(flat, np.zeros(8, np.float32), 1, 1, 3, True, 1.0)
    assert chosen.tolist() == [[0, 1, 2]]
    half = np.float32(0.5)  # sigmoid(0), exactly
    assert weights[0].tolist() == [half / (half + half + half + np.float32(1e-20))] * 3
    # Four groups of two, all tied: groups 0 and 1 are kept, so experts 0..3 compete.
    chosen, _ = k.route(flat, np.zeros(8, np.float32), 4, 2, 4, False, 1.0)
    assert chosen.tolist() == [[0, 1, 2, 3]]
    # A bias that lifts group 3 above the tie.
    bias = np.zeros(8, np.float32)
    bias[7] = 0.5
    chosen, weights = k.route(flat, bias, 4, 1, 2, False, 2.0)
    assert chosen.tolist() == [[6, 7]]
    assert weights.tolist() == [[1.0, 1.0]]  # sigmoid(0) * 2: the bias never weighs


def test_bad_router_arguments_are_refused() -> None:
    from colibri.accelerated.kernels import KernelInvalidArgument

    k = kernels()
    logits = np.zeros((2, 8), np.float32)
    for args in ((3, 1, 2), (1, 1, 9), (4, 5, 2), (8, 1, 1)):  # groups do not split, k > E, ...
        with pytest.raises(KernelInvalidArgument):
            k.route(logits, np.zeros(8, np.float32), args[0], args[1], args[2], False, 1.0)


def run_with_store(fused: bool, budget: int) -> tuple[Any, list[np.ndarray]]:
    from colibri.accelerated import load_model
    from colibri.accelerated.model import Model
    from colibri.reference.experts import stored_expert_bytes

    from colibri.backend_kit.tiered_expert_store import TieredExpertStore
    from colibri.engine.backend import usage_rows

    m = load_model(fixture_model_dir("glm5-tiny"), threads=1)
    assert isinstance(m, Model)
    m.fused_layers = fused
    store = TieredExpertStore(m.read_expert, m.config, usage_rows(m.config), budget,
                              stored_expert_bytes(m.checkpoint))
    m.store = store
    states = [m.new_state(), m.new_state()]
    outs = [m.prefill(states[0], [3, 14, 15, 92, 65]), m.prefill(states[1], [7, 8])]
    tokens = [1, 2]
    for _ in range(4):
        outs.append(m.decode_batch(states, tokens))
        tokens = [int(np.argmax(row)) for row in outs[-1]]
    return store, outs


@pytest.mark.parametrize("budget_bytes", [0, 128, 4 * 3 * 128 * 32 * 4])
def test_the_store_counts_what_the_per_kernel_path_counts(budget_bytes: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Lookups, hits, disk bytes, heat, residency and bytes equal, with an unbounded store,
    one whose budget holds no expert (every lookup re-reads) and one holding four (a layer's
    experts partly resident: they run while the others are read). Layers meeting an expert for the
    first time finish outside the one call (``combine``, after the resident experts ran while
    the others were read), the others in the one call."""
    from colibri.accelerated.layer_block import LayerBlock

    finished = []
    combine = LayerBlock.combine

    def spy(self: LayerBlock, *args: Any) -> None:
        finished.append(self.layer.index)
        combine(self, *args)

    monkeypatch.setattr(LayerBlock, "combine", spy)
    fused_store, fused = run_with_store(True, budget_bytes)
    steps = 2 + 4  # two prefills, four batched decodes
    assert 0 < len(finished) < steps * len(fused_store.layers)
    kernel_store, kernel = run_with_store(False, budget_bytes)
    a, b = fused_store.counters(), kernel_store.counters()
    assert (a.lookups, a.hits, a.disk_bytes) == (b.lookups, b.hits, b.disk_bytes)
    assert a.lookups > 0
    assert fused_store._heat == kernel_store._heat
    rows, n = fused_store.layers, fused_store.cfg.n_routed_experts
    assert (fused_store.tier_matrix(rows, n) == kernel_store.tier_matrix(rows, n)).all()
    for x, y in zip(fused, kernel, strict=True):
        assert x.tobytes() == y.tobytes()


def test_only_mapped_experts_stay_in_the_table() -> None:
    from colibri.accelerated import load_model
    from colibri.accelerated.kernels import Weight
    from colibri.accelerated.layer_block import LayerBlock
    from colibri.accelerated.weights import Expert

    m = load_model(fixture_model_dir("glm5-tiny"), threads=1)
    layer = m.sparse_layers[0]
    block = LayerBlock(m.config, m.layers[layer], False)
    mapped = m.read_expert(layer, 0)
    owned = Expert(*(Weight(np.array(w.array, copy=True), 0)  # converted: process memory
                     for w in (mapped.gate, mapped.up, mapped.down)))
    block.hold(0, mapped)
    block.hold(1, owned)
    block.release()
    assert block.held[0] is mapped and block.experts[0]["data"] != 0
    assert block.held[1] is None and (block.experts[3:6]["data"] == 0).all()
