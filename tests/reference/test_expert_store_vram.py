"""The expert store's VRAM tier (tier 2) over a device double (support/vram_double.py): the
pin ranking's prefix goes to VRAM within its byte budget, refusals leave experts in RAM, EMAP
bits and TIERS agree, REPIN swaps VRAM slots live; and without a VramTier nothing changes."""

from __future__ import annotations

import numpy as np
import pytest
from colibri.reference.config import ModelConfig
from colibri.reference.experts import ExpertWeights
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.vram_double import InMemoryVram

from colibri import resources
from colibri.backend_kit.tiered_expert_store import TieredExpertStore
from colibri.engine.backend import TIER_DISK, TIER_RAM, TIER_VRAM, Repin, usage_rows

CFG = ModelConfig.from_dir(resources.fixture_model_dir("glm5-tiny"))
ROWS = usage_rows(CFG)
N = CFG.n_routed_experts
KEYS = [(layer, e) for layer in ROWS for e in range(N)]


def stored(layer: int, expert: int) -> int:
    """Unequal stored sizes, so the byte budget is not a count in disguise."""
    return 1000 + 250 * ((layer + expert) % 3)


def read(layer: int, expert: int) -> ExpertWeights:
    d, i = CFG.hidden_size, CFG.moe_intermediate_size
    return ExpertWeights(np.full((i, d), layer, np.float32), np.full((i, d), expert, np.float32),
                         np.zeros((d, i), np.float32))


def make_store(vram: InMemoryVram | None, budget: int, ram: int = 0) -> TieredExpertStore:
    return TieredExpertStore(read, CFG, ROWS, ram, stored, vram=vram, vram_budget_bytes=budget,
                             gpu=3)


def check_books(store: TieredExpertStore, device: InMemoryVram | None) -> None:
    """The invariants the telemetry relies on."""
    counts = store.tier_counts(ROWS, N)
    matrix = store.tier_matrix(ROWS, N)
    assert counts.vram + counts.ram + counts.disk == len(ROWS) * N
    assert int((matrix == TIER_VRAM).sum()) == counts.vram
    assert int((matrix == TIER_RAM).sum()) == counts.ram
    assert int((matrix == TIER_DISK).sum()) == counts.disk
    on_device = {k for k in KEYS if store.in_vram(*k)}
    assert counts.vram_bytes == sum(stored(*k) for k in on_device) == store.vram_bytes
    assert store.vram_bytes <= store.vram_budget_bytes
    for r, layer in enumerate(ROWS):
        for e in range(N):
            assert matrix[r, e] == store.tier_of((layer, e))
    # one tier each: a VRAM expert is held in no RAM tier
    assert not any(store.in_vram(*k) and (k in store._pinned or k in store._lru) for k in KEYS)
    assert not any(k in store._pinned and k in store._lru for k in KEYS)
    if device is not None:
        assert set(device.resident) == on_device


def test_the_ranking_prefix_goes_to_vram_then_ram() -> None:
    device = InMemoryVram(10**9, stored)
    budget = stored(*KEYS[0]) + stored(*KEYS[1]) + stored(*KEYS[2])
    store = make_store(device, budget)
    ranked = [KEYS[0], KEYS[1], KEYS[2], KEYS[3], KEYS[4]]
    placed = store.pin(ranked, budget_bytes=2 * store.expert_bytes)
    assert placed == 5
    assert [store.tier_of(k) for k in ranked] == [TIER_VRAM] * 3 + [TIER_RAM] * 2
    assert store.tier_counts(ROWS, N).vram == 3
    check_books(store, device)


def test_unranked_experts_fill_the_remaining_budget() -> None:
    device = InMemoryVram(10**9, stored)
    store = make_store(device, 10**9)
    assert store.pin([KEYS[5]], budget_bytes=0) == len(KEYS)
    assert store.tier_counts(ROWS, N).vram == len(KEYS)
    check_books(store, device)


def test_a_refused_upload_leaves_the_expert_in_ram() -> None:
    device = InMemoryVram(10**9, stored, refuse={KEYS[1]})
    store = make_store(device, 10**9)
    store.pin(KEYS[:4], budget_bytes=10 * store.expert_bytes)
    # the device is taken as full at the first refusal: the rest of the ranking pins in RAM
    assert [store.tier_of(k) for k in KEYS[:4]] == [TIER_VRAM, TIER_RAM, TIER_RAM, TIER_RAM]
    assert device.refusals == 1
    check_books(store, device)


def test_a_vram_expert_is_a_hit_and_stays_out_of_ram() -> None:
    device = InMemoryVram(10**9, stored)
    store = make_store(device, stored(*KEYS[0]))
    store.pin([KEYS[0]], 0)
    weights = store.expert(*KEYS[0])
    assert float(weights.gate[0, 0]) == KEYS[0][0]
    counters = store.counters()
    assert (counters.lookups, counters.hits, counters.disk_bytes) == (1, 1, 0)
    check_books(store, device)


def test_repin_swaps_a_vram_slot_when_heat_differs_by_more_than_one() -> None:
    device = InMemoryVram(10**9, stored)
    layer = ROWS[0]
    cold, hot = (layer, 0), (layer, 1)
    store = make_store(device, stored(*cold))  # exactly one slot's worth (sizes 1000, 1250)
    store.pin([cold], 0)
    store.vram_budget_bytes = max(stored(*cold), stored(*hot))
    for _ in range(2):
        store.expert(*hot)  # heat 2 against 0: a difference of 2 > 1
    swaps = store.repin()
    assert swaps == [Repin(layer, 1, TIER_RAM, 3)]
    assert store.in_vram(*hot) and not store.in_vram(*cold)
    # the demoted expert took the promoted one's place: it was cached, so is the demoted
    assert store.tier_of(cold) == TIER_RAM
    check_books(store, device)


def test_repin_keeps_vram_when_heat_differs_by_one() -> None:
    device = InMemoryVram(10**9, stored)
    layer = ROWS[0]
    store = make_store(device, 10**6)
    store.pin([(layer, 0)], 0)
    store.vram_budget_bytes = stored(layer, 0)
    store.expert(layer, 1)
    assert [s for s in store.repin() if s.gpu == 3] == []
    assert store.in_vram(layer, 0)


def test_a_refused_swap_puts_the_demoted_expert_back() -> None:
    layer = ROWS[0]
    device = InMemoryVram(10**9, stored, refuse={(layer, 1)})
    store = make_store(device, 10**6)
    store.pin([(layer, 0)], 0)
    store.vram_budget_bytes = 10**6
    for _ in range(3):
        store.expert(layer, 1)
    assert store.repin() == []
    assert store.in_vram(layer, 0) and not store.in_vram(layer, 1)
    check_books(store, device)


def test_without_a_vram_tier_nothing_reaches_tier_two() -> None:
    plain = TieredExpertStore(read, CFG, ROWS, 0, stored)
    budgeted = TieredExpertStore(read, CFG, ROWS, 0, stored, vram=None, vram_budget_bytes=10**9)
    for store in (plain, budgeted):
        assert store.pin(KEYS[:3], budget_bytes=2 * store.expert_bytes) == 2
        for k in KEYS[:6]:
            store.expert(*k)
        assert store.tier_counts(ROWS, N).vram == 0
        assert not (store.tier_matrix(ROWS, N) == TIER_VRAM).any()
    assert plain.tier_counts(ROWS, N) == budgeted.tier_counts(ROWS, N)
    assert np.array_equal(plain.tier_matrix(ROWS, N), budgeted.tier_matrix(ROWS, N))
    assert plain.repin() == budgeted.repin()


keys = st.sampled_from(KEYS)


class VramTraffic(RuleBasedStateMachine):
    """Random traffic, pins, refusals and re-pins: the books always balance."""

    def __init__(self) -> None:
        super().__init__()
        self.device: InMemoryVram | None = None
        self.store: TieredExpertStore | None = None

    @precondition(lambda self: self.store is None)
    @rule(budget_slots=st.integers(0, 12), capacity_slots=st.integers(0, 12),
          ram_slots=st.integers(0, 6), refuse=st.sets(keys, max_size=4))
    def start(self, budget_slots: int, capacity_slots: int, ram_slots: int,
              refuse: set[tuple[int, int]]) -> None:
        self.device = InMemoryVram(capacity_slots * 1300, stored, refuse)
        self.expert_nbytes = 3 * CFG.hidden_size * CFG.moe_intermediate_size * 4
        self.store = make_store(self.device, budget_slots * 1100, ram_slots * self.expert_nbytes)

    @precondition(lambda self: self.store is not None)
    @rule(key=keys)
    def route(self, key: tuple[int, int]) -> None:
        assert self.store is not None
        self.store.expert(*key)

    @precondition(lambda self: self.store is not None)
    @rule(ranked=st.lists(keys, max_size=10, unique=True), pin_slots=st.integers(0, 4))
    def pin(self, ranked: list[tuple[int, int]], pin_slots: int) -> None:
        assert self.store is not None
        self.store.pin(ranked, pin_slots * self.expert_nbytes)

    @precondition(lambda self: self.store is not None)
    @rule()
    def repin(self) -> None:
        assert self.store is not None
        for swap in self.store.repin():
            assert swap.gpu in (3, -1)
            key = (swap.layer, swap.expert)
            assert self.store.tier_of(key) in (TIER_VRAM, TIER_RAM)

    @invariant()
    def books_balance(self) -> None:
        if self.store is not None:
            check_books(self.store, self.device)


TestVramTraffic = VramTraffic.TestCase
TestVramTraffic.settings = settings(stateful_step_count=30)  # examples: the profile's


@pytest.mark.parametrize("budget", [0, 1])
def test_a_zero_or_tiny_budget_uploads_nothing(budget: int) -> None:
    device = InMemoryVram(10**9, stored)
    store = make_store(device, budget)
    store.pin(KEYS, 0)
    assert device.uploads == 0
    check_books(store, device)
