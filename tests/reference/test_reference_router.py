"""noaux_tc routing: the correction bias selects but never weighs; group limits; tie rules."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from colibri.reference.activations import sigmoid
from colibri.reference.config import ModelConfig
from colibri.reference.router import select_experts
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.reference_support import model


def _cfg(experts: int, k: int, groups: int = 1, topk_group: int = 1, norm: bool = True,
         scale: float = 2.5) -> ModelConfig:
    return replace(model("glm5-tiny").config, n_routed_experts=experts, num_experts_per_tok=k,
                   n_group=groups, topk_group=topk_group, norm_topk_prob=norm,
                   routed_scaling_factor=scale)


def _distinct_floats(n: int) -> st.SearchStrategy[np.ndarray]:
    return st.lists(st.integers(-10_000, 10_000), min_size=n, max_size=n, unique=True).map(
        lambda v: (np.asarray(v, dtype=np.float32) / np.float32(2500.0))
    )


@settings(max_examples=60)
@given(data=st.data(), k=st.integers(1, 4), norm=st.booleans())
def test_bias_changes_selection_but_never_weights(data: st.DataObject, k: int, norm: bool) -> None:
    cfg = _cfg(8, k, norm=norm)
    logits = data.draw(_distinct_floats(8))
    bias_a = data.draw(_distinct_floats(8)) * np.float32(0.1)
    bias_b = data.draw(_distinct_floats(8)) * np.float32(0.1)
    for bias in (bias_a, bias_b):
        ids, weights = select_experts(logits, bias, cfg)
        # The weights are a function of the unbiased sigmoid of the chosen experts only.
        raw = sigmoid(logits)[ids]
        if norm:
            raw = raw / (np.sum(raw, dtype=np.float32) + np.float32(1e-20))
        assert weights.tobytes() == (raw * np.float32(cfg.routed_scaling_factor)).tobytes()
    ids_a, w_a = select_experts(logits, bias_a, cfg)
    ids_b, w_b = select_experts(logits, bias_b, cfg)
    assert ids_a.tolist() == sorted(ids_a.tolist())
    if ids_a.tolist() == ids_b.tolist():
        assert w_a.tobytes() == w_b.tobytes()


def test_a_large_bias_forces_its_expert_in_with_its_own_unbiased_weight() -> None:
    cfg = _cfg(8, 2, norm=False, scale=1.0)
    logits = np.linspace(-1, 1, 8).astype(np.float32)
    plain, _ = select_experts(logits, np.zeros(8, np.float32), cfg)
    assert sorted(plain.tolist()) == [6, 7]
    bias = np.zeros(8, np.float32)
    bias[0] = 5.0
    ids, weights = select_experts(logits, bias, cfg)
    assert 0 in ids.tolist()
    assert weights[ids.tolist().index(0)] == sigmoid(logits)[0]


@settings(max_examples=60)
@given(
    data=st.data(),
    shape=st.sampled_from(
        [(8, 2, 2, 3), (8, 4, 2, 2), (12, 3, 2, 4), (16, 4, 3, 4), (16, 2, 1, 2)]
    ),
)
def test_group_limited_routing_equals_brute_force(
    data: st.DataObject, shape: tuple[int, int, int, int]
) -> None:
    experts, groups, topk_group, k = shape
    assume(k <= topk_group * (experts // groups))
    cfg = _cfg(experts, k, groups, topk_group)
    logits = data.draw(_distinct_floats(experts))
    bias = np.zeros(experts, np.float32)
    choice = sigmoid(logits) + bias
    per = experts // groups
    group_score = {g: float(np.float32(sum(sorted(choice[g * per:(g + 1) * per].tolist())[-2:])))
                   for g in range(groups)}
    ordered = sorted(group_score.values())
    # Near-equal group scores are a tie, which the tie-rule test covers; here they must differ.
    assume(all(b - a > 1e-5 for a, b in zip(ordered, ordered[1:], strict=False)))
    # Brute force: the group subset with the largest total, then the best k-subset inside it.
    best_groups = max(itertools.combinations(range(groups), topk_group),
                      key=lambda gs: sum(group_score[g] for g in gs))
    allowed = [e for g in best_groups for e in range(g * per, (g + 1) * per)]
    best = max(itertools.combinations(allowed, k), key=lambda es: sum(choice[e] for e in es))
    ids, _ = select_experts(logits, bias, cfg)
    assert sorted(ids.tolist()) == sorted(best)


def test_ties_go_to_the_lowest_expert_id_and_group() -> None:
    cfg = _cfg(8, 3)
    ids, _ = select_experts(np.zeros(8, np.float32), np.zeros(8, np.float32), cfg)
    assert ids.tolist() == [0, 1, 2]
    grouped = _cfg(8, 2, groups=4, topk_group=1)
    ids, _ = select_experts(np.zeros(8, np.float32), np.zeros(8, np.float32), grouped)
    assert ids.tolist() == [0, 1]


def test_selection_is_listed_in_ascending_expert_id_order() -> None:
    cfg = _cfg(8, 4)
    logits = np.asarray([0.1, 0.9, 0.3, 0.7, 0.5, 0.2, 0.8, 0.4], np.float32)
    ids, _ = select_experts(logits, np.zeros(8, np.float32), cfg)
    assert ids.tolist() == [1, 3, 4, 6]


def test_forward_rows_returns_every_token_routing_at_every_sparse_layer() -> None:
    from support.reference_support import fresh_model

    m = fresh_model("glm5-tiny")
    state = m.new_state()
    _, first = m.forward_rows([state] * 3, [1, 2, 3], [False, False, True])
    _, second = m.forward_rows([state], [4], [True])
    routes = np.concatenate([first, second])
    sparse = [i for i in range(m.config.num_hidden_layers) if m.config.is_sparse(i)]
    assert routes.shape == (4, len(sparse), m.config.num_experts_per_tok)
    assert all(len(set(row.tolist())) == row.size for row in routes.reshape(-1, routes.shape[2]))
    assert all(
        m.experts.is_resident(layer, int(e))
        for j, layer in enumerate(sparse) for e in routes[:, j].reshape(-1)
    )


def test_a_custom_expert_store_is_what_the_moe_reads() -> None:
    from colibri.reference import ExpertWeights, load_model
    from support.reference_support import fresh_model

    from colibri.resources import fixture_model_dir

    base = fresh_model("glm5-tiny")
    asked: list[tuple[int, int]] = []

    class CountingStore:
        def expert(self, layer: int, expert: int) -> ExpertWeights:
            asked.append((layer, expert))
            return base.experts.expert(layer, expert)

        def is_resident(self, layer: int, expert: int) -> bool:
            return (layer, expert) in asked

    class ZeroStore(CountingStore):
        def expert(self, layer: int, expert: int) -> ExpertWeights:
            w = super().expert(layer, expert)
            return ExpertWeights(w.gate, w.up, np.zeros_like(w.down))

    ids = [3, 14, 159, 26]
    counted = load_model(fixture_model_dir("glm5-tiny"), expert_store=CountingStore())
    assert counted.forward(ids).tobytes() == base.forward(ids).tobytes()
    assert {layer for layer, _ in asked} == {3, 4}
    zeroed = load_model(fixture_model_dir("glm5-tiny"), expert_store=ZeroStore())
    assert not np.allclose(zeroed.forward(ids), base.forward(ids))
