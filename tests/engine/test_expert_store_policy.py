"""The RAM tiers' policy under a budget: a layer's lookups made together leave the store as
the same lookups one at a time, one true LRU per layer, colibri's RSS guard and AUTOPIN."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertWeights
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine_harness import ids, run_engine, submit

from colibri import resources
from colibri.backend_kit.tiered_expert_store import TieredExpertStore
from colibri.engine import usage_file
from colibri.engine.backend import usage_rows

TINY = resources.fixture_model_dir("glm5-tiny")
CFG = ModelConfig.from_dir(TINY)
ROWS = usage_rows(CFG)
EXPERT = 3 * CFG.hidden_size * CFG.moe_intermediate_size * 4
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]


def _weights(layer: int, e: int) -> ExpertWeights:
    d, inter = CFG.hidden_size, CFG.moe_intermediate_size
    fill = np.float32(layer * 100 + e)
    return ExpertWeights(np.full((inter, d), fill, np.float32),
                         np.full((inter, d), fill, np.float32),
                         np.full((d, inter), fill, np.float32))


def _store(budget_experts: int, reads: list[tuple[int, int]] | None = None) -> TieredExpertStore:
    def read(layer: int, e: int) -> ExpertWeights:
        if reads is not None:
            reads.append((layer, e))
        return _weights(layer, e)

    return TieredExpertStore(read, CFG, ROWS, budget_experts * EXPERT, lambda _l, _e: EXPERT)


batches = st.lists(
    st.tuples(st.sampled_from(ROWS),
              st.sets(st.integers(0, CFG.n_routed_experts - 1), min_size=1, max_size=6)),
    min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(batches, st.integers(1, 12))
def test_a_layers_lookups_together_equal_the_same_lookups_one_at_a_time(
        steps: Sequence[tuple[int, set[int]]], budget: int) -> None:
    together, alone = _store(budget), _store(budget)
    for layer, chosen in steps:
        experts = sorted(chosen)
        got = together.experts(layer, experts)
        one_by_one = [alone.expert(layer, e) for e in experts]
        assert [w.gate[0, 0] for w in got] == [w.gate[0, 0] for w in one_by_one]
        a, b = together.counters(), alone.counters()
        assert (a.lookups, a.hits, a.disk_bytes) == (b.lookups, b.hits, b.disk_bytes)
        assert np.array_equal(together.tier_matrix(ROWS, CFG.n_routed_experts),
                              alone.tier_matrix(ROWS, CFG.n_routed_experts))


def test_each_layer_has_its_own_lru() -> None:
    store = _store(budget_experts=2 * len(ROWS))  # two experts per layer
    first, second = ROWS[0], ROWS[1]
    store.experts(second, [0, 1])
    for e in range(CFG.n_routed_experts):  # a burst of one layer's traffic
        store.experts(first, [e])
    assert store.is_resident(second, 0) and store.is_resident(second, 1)
    assert sum(store.is_resident(first, e) for e in range(CFG.n_routed_experts)) == 2


def test_the_rss_guard_shrinks_the_lru_and_keeps_the_pins() -> None:
    reads: list[tuple[int, int]] = []
    store = _store(budget_experts=8, reads=reads)
    store.pin([(ROWS[0], 7)], budget_bytes=EXPERT)
    for layer in ROWS:
        store.experts(layer, [0, 1, 2])
    freed = store.trim(3 * EXPERT)
    assert freed >= 3 * EXPERT
    assert store.is_resident(ROWS[0], 7)  # the pin stays
    assert store.guard_trims == 1
    # The LRU's budget stays lower: refilling it does not bring back the trimmed bytes.
    for layer in ROWS:
        store.experts(layer, [3, 4, 5])
    ram = store.tier_counts(ROWS, CFG.n_routed_experts).ram
    assert (ram - 1) * EXPERT <= 7 * EXPERT - 3 * EXPERT


def _usage_with(tmp_path: Path, selections: int) -> None:
    # [layers + 1, experts]: the row after the last layer is the MTP layer's
    counts = np.zeros((CFG.num_hidden_layers + 1, CFG.n_routed_experts), np.uint64)
    for layer in ROWS:  # a skewed history: expert 0 hottest, then 1, ...
        counts[layer] = [selections // len(ROWS) >> (e + 1) for e in range(CFG.n_routed_experts)]
    counts[ROWS[0], 0] += selections - int(counts.sum())
    usage_file.save(tmp_path / ".coli_usage", counts)


@pytest.mark.usefixtures("no_runtime")  # the budget must not depend on this process's heap
@pytest.mark.parametrize(("selections", "pinned"), [(4_999, False), (200_000, True)])
def test_autopin_pins_the_hottest_experts_once_the_history_is_long_enough(
        tmp_path: Path, selections: int, pinned: bool) -> None:
    _usage_with(tmp_path, selections)
    budget = 0.5  # GB: the whole model many times over
    run = run_engine([submit(1, 0, ids(*PROMPT), 6, ext="ids=1")], model_dir=TINY,
                     state_dir=tmp_path, env={"RAM_GB": str(budget), "USAGE_SAVE": "0"})
    plain = run_engine([submit(1, 0, ids(*PROMPT), 6, ext="ids=1")], model_dir=TINY)
    tokens = [f.payload for f in run.for_id(1) if f.kind == "DATA"]
    assert tokens == [f.payload for f in plain.for_id(1) if f.kind == "DATA"]
    first_tiers = next(f.line.decode().split() for f in run.frames if f.kind == "TIERS")
    if pinned:
        every = len(ROWS) * CFG.n_routed_experts  # all fit half of the budget
        assert f"[PIN] AUTOPIN: pinned {every} experts" in run.stderr
        assert first_tiers[2] == str(every)  # resident before the first request
    else:
        assert "AUTOPIN" not in run.stderr and first_tiers[2] == "0"


class _HeldReads:
    """A disk tier whose reads end when the test says so (``finish``), in any order."""

    def __init__(self) -> None:
        self.futures: dict[tuple[int, int], Future[ExpertWeights]] = {}

    def submit(self, keys: Sequence[tuple[int, int]]) -> list[Future[ExpertWeights]]:
        for key in keys:
            self.futures[key] = Future()
        return [self.futures[key] for key in keys]

    def finish(self, layer: int, e: int, error: Exception | None = None) -> None:
        future = self.futures[(layer, e)]
        if error is None:
            future.set_result(_weights(layer, e))
        else:
            future.set_exception(error)


def _misses_in_flight(disk: _HeldReads, experts: list[int]
                      ) -> tuple[TieredExpertStore, Iterator[tuple[int, ExpertWeights]]]:
    """A store with room for 8 experts whose first routed layer asked for ``experts``, none
    resident: the store, and the misses as their reads end."""
    store = TieredExpertStore(_weights, CFG, ROWS, 8 * EXPERT, lambda _l, _e: EXPERT,
                              read_submit=disk.submit)
    return store, store.experts_begin(ROWS[0], experts).arrivals()


def test_a_layers_misses_are_handed_over_as_their_reads_end_and_cached_once_all_have() -> None:
    disk, layer = _HeldReads(), ROWS[0]
    store, arrivals = _misses_in_flight(disk, [1, 2, 3])
    disk.finish(layer, 3)  # the last asked for is read first
    assert next(arrivals)[0] == 3
    assert not store.is_resident(layer, 3)  # cached only once the layer's reads have all ended
    disk.finish(layer, 1)
    disk.finish(layer, 2)
    assert sorted(e for e, _ in arrivals) == [1, 2]
    assert all(store.is_resident(layer, e) for e in (1, 2, 3))
    assert store.counters().disk_bytes == 3 * EXPERT


def test_a_failed_read_after_an_arrival_leaves_none_of_the_layers_misses() -> None:
    disk, layer = _HeldReads(), ROWS[0]
    store, arrivals = _misses_in_flight(disk, [1, 2, 3])
    disk.finish(layer, 2)
    assert next(arrivals)[0] == 2
    disk.finish(layer, 1, OSError(5, "Input/output error"))
    disk.finish(layer, 3)
    with pytest.raises(OSError):
        list(arrivals)
    assert not any(store.is_resident(layer, e) for e in (1, 2, 3))
    assert store.counters().disk_bytes == 0
    assert store.trim(1 << 40) == 0
    # The next lookup reads them again (nothing of the failed layer is trusted).
    again = store.experts_begin(layer, [2])
    assert again.waiting


def test_a_caller_that_stops_early_leaves_none_of_the_layers_misses() -> None:
    disk, layer = _HeldReads(), ROWS[0]
    store, arrivals = _misses_in_flight(disk, [4, 5])
    disk.finish(layer, 4)
    next(arrivals)
    disk.finish(layer, 5)
    arrivals.close()  # the layer's compute failed: its reads are not kept
    assert not store.is_resident(layer, 4) and not store.is_resident(layer, 5)
    assert store.trim(1 << 40) == 0  # and no reservation still holds their bytes
