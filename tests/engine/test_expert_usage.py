"""Routing counters (EMAP heat, HITS, per-turn ENTROPY) against a per-selection model.

The counters tally every expert selection of every row at every routed layer, repeats
included; these tests hold the vectorised bookkeeping to a plain loop over selections.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colibri.engine.expert_usage import ExpertUsage, add_selections
from colibri.engine.turn_routes import FOLD_ROWS, TurnRoutes


@st.composite
def routing(draw: st.DrawFn) -> tuple[int, int, list[int], list[int], np.ndarray]:
    """A model shape, its EMAP rows, the layers a step routes (some without a row) and one
    step's routes [rows, layers, k] (repeated experts allowed)."""
    n_layers = draw(st.integers(1, 6))
    n_experts = draw(st.integers(1, 9))
    rows = sorted(draw(st.sets(st.integers(0, n_layers), min_size=1)))
    layers = draw(st.lists(st.integers(0, n_layers), min_size=1, max_size=n_layers + 1,
                           unique=True))
    n_rows = draw(st.integers(0, 5))
    k = draw(st.integers(1, 4))
    flat = draw(st.lists(st.integers(0, n_experts - 1), min_size=n_rows * len(layers) * k,
                         max_size=n_rows * len(layers) * k))
    routes = np.asarray(flat, np.int32).reshape(n_rows, len(layers), k)
    return n_layers, n_experts, rows, layers, routes


@settings(max_examples=200, deadline=None)
@given(routing(), st.integers(1, 3))
def test_observe_routes_counts_every_selection(case: tuple[int, int, list[int], list[int],
                                                           np.ndarray], steps: int) -> None:
    n_layers, n_experts, rows, layers, routes = case
    usage = ExpertUsage(n_layers, n_experts, rows)
    want = np.zeros((n_layers + 1, n_experts), np.uint64)
    want_hits = np.zeros((len(rows), n_experts), np.bool_)
    for _ in range(steps):
        usage.observe_routes(layers, routes)
        for r in range(routes.shape[0]):
            for j, layer in enumerate(layers):
                if layer not in rows:
                    continue
                for e in routes[r, j]:
                    want[layer, e] += 1
                    want_hits[rows.index(layer), e] = True
    np.testing.assert_array_equal(usage.counts, want)
    bits = want_hits.reshape(-1)
    expected = bytearray((bits.size + 7) // 8)
    for i in np.nonzero(bits)[0]:
        expected[i >> 3] |= 1 << (i & 7)
    assert usage.take_hits_hex() == expected.hex()
    assert usage.take_hits_hex() == bytes(len(expected)).hex()  # reset after taking


def test_observe_counts_a_repeated_expert_twice() -> None:
    usage = ExpertUsage(2, 4, [0, 1, 2])
    usage.observe(2, [3, 3, 1])
    assert usage.counts[2].tolist() == [0, 1, 0, 2]
    usage.observe(5, [0])  # a layer without a row: not counted
    assert int(usage.counts.sum()) == 3


@settings(max_examples=100, deadline=None)
@given(routing())
def test_turn_entropy_matches_a_loop(case: tuple[int, int, list[int], list[int],
                                                 np.ndarray]) -> None:
    _, n_experts, rows, layers, routes = case
    routed = [layer for layer in layers if layer in rows]
    step = routes[:, [j for j, layer in enumerate(layers) if layer in rows], :]
    turns = TurnRoutes(rows, routed, n_experts)
    tally = np.zeros((len(rows), n_experts), np.int64)
    for r in range(step.shape[0]):
        turns.credit(7, step[r])
        for j, layer in enumerate(routed):
            for e in step[r, j]:
                tally[rows.index(layer), e] += 1
    want = []
    for row in tally:
        total = int(row.sum())
        want.append(abs(-sum(int(c) / total * math.log2(int(c) / total) for c in row if c)))
    got = turns.take_entropy(7)
    if step.shape[0] == 0:
        assert got == [0.0] * len(rows)
    else:
        assert got == want


def test_add_selections_broadcasts_rows_over_batches() -> None:
    counts = np.zeros((3, 5), np.int64)
    routes = np.asarray([[[4, 4], [0, 1]], [[2, 4], [1, 1]]], np.int32)  # [rows, layers, k]
    add_selections(counts, np.asarray([2, 0], np.intp), routes)
    assert counts.tolist() == [[1, 3, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 3]]


@pytest.mark.parametrize("bad", [4, -1])
def test_an_expert_id_out_of_range_is_refused_before_counting(bad: int) -> None:
    usage = ExpertUsage(1, 4, [0, 1])
    with pytest.raises(IndexError, match="outside 0..3"):
        usage.observe_routes([0, 1], np.asarray([[[1], [bad]]], np.int32))
    assert int(usage.counts.sum()) == 0


def test_turn_entropy_over_more_rows_than_one_fold() -> None:
    """Rows are tallied FOLD_ROWS at a time: a turn longer than that (and not a multiple of
    it) must count every row once, and forgetting an owner drops its buffered rows."""
    rng = np.random.default_rng(5)
    n_experts, rows = 6, [0, 1, 2]
    turns = TurnRoutes(rows, [1, 2], n_experts)
    every = rng.integers(0, n_experts, (2 * FOLD_ROWS + 7, 2, 3)).astype(np.int32)
    for routes in every:
        turns.credit(3, routes)
        turns.credit(4, routes)
    turns.forget(4)
    assert turns.take_entropy(4) == [0.0] * 3
    got = turns.take_entropy(3)
    tally = np.zeros((3, n_experts), np.int64)
    for j, row in enumerate([1, 2]):
        for e in every[:, j, :].reshape(-1):
            tally[row, e] += 1
    probs = [r[r > 0] / r.sum() for r in tally[1:]]
    assert got[0] == 0.0
    assert got[1:] == pytest.approx([float(-(p * np.log2(p)).sum()) for p in probs], abs=1e-12)
