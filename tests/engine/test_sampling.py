"""colibri's RNG, sampler and log-probability tables (spec/model.md, "Sampling and RNG")."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from colibri.engine.rng import GOLDEN, Rng, seed_state
from colibri.engine.sampling import (
    NO_PREDICTOR_TAIL,
    argmax,
    distribution,
    log_softmax,
    logprob_entry,
    nucleus_order,
    sample,
    sample_index,
    sorted_by_logprob,
    top_k_table,
)
from colibri.resources import spec_path

rows = hnp.arrays(
    np.float32,
    st.integers(1, 40),
    elements=st.floats(-30, 30, width=32) | st.sampled_from([0.0, 1.0, -1.0]),
)
rows_with_specials = hnp.arrays(
    np.float32,
    st.integers(1, 40),
    elements=st.floats(width=32, allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, 1.0, math.nan, -math.inf]),
)


# ----------------------------------------------------------------------------- RNG
def _spec_tables() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The two golden tables of spec/model.md: seed -> states, seed -> uniforms."""
    text = spec_path("model.md").read_text(encoding="utf-8")
    section = text.split("Sampling and RNG\n", 1)[1]
    tables: list[dict[str, list[str]]] = [{}, {}]
    index = -1
    for line in section.splitlines():
        if line.startswith("| seed |"):
            index += 1
        row = re.findall(r"`([^`]+)`", line)
        if line.startswith("| `") and len(row) == 5:
            tables[index][row[0]] = row[1:]
    return tables[0], tables[1]


def _rng_for(seed: str) -> Rng:
    return Rng() if seed == "none" else Rng.from_seed(int(seed))


def test_golden_rng_states_in_spec_match() -> None:
    states, uniforms = _spec_tables()
    assert len(states) == len(uniforms) >= 5
    for seed, expected in states.items():
        rng = _rng_for(seed)
        assert [f"{rng.next_u64():016x}" for _ in range(4)] == expected, seed
    for seed, expected in uniforms.items():
        rng = _rng_for(seed)
        assert [repr(rng.uniform()) for _ in range(4)] == expected, seed


def test_seed_formula_and_degenerate_seed() -> None:
    assert Rng().state == GOLDEN == 0x9E3779B97F4A7C15
    assert seed_state(0) == 1
    assert seed_state(3) == (3 * GOLDEN + 1) % 2**64
    assert seed_state(-1) == seed_state(2**64 - 1)
    degenerate = Rng.from_seed(1018231460777725123)
    assert degenerate.state == 0 and degenerate.uniform() == 0.0


@given(seed=st.integers(0, 2**64 - 1))
def test_uniform_is_in_unit_interval_and_uses_top_53_bits(seed: int) -> None:
    a, b = Rng.from_seed(seed), Rng.from_seed(seed)
    for _ in range(4):
        u = a.uniform()
        assert 0.0 <= u < 1.0
        assert u == (b.next_u64() >> 11) / 2.0**53


# ----------------------------------------------------------------------------- greedy
def _first_max_skipping_nan(row: np.ndarray) -> int:
    best, best_value = -1, -math.inf
    for i, value in enumerate(row.tolist()):
        if value == value and value > best_value:
            best, best_value = i, value
    return max(best, 0)


@given(row=rows_with_specials)
def test_greedy_is_first_max_skipping_nan(row: np.ndarray) -> None:
    expected = _first_max_skipping_nan(row)
    assert argmax(row) == expected
    rng = Rng.from_seed(5)
    assert sample(row, 0.0, 0.9, rng) == expected
    assert sample(row, -1.0, 1.0, rng) == expected
    assert rng.state == seed_state(5)  # greedy draws nothing


@given(row=rows)
def test_greedy_equals_numpy_argmax_without_nan(row: np.ndarray) -> None:
    assert argmax(row) == int(np.argmax(row))


def test_greedy_ties_take_the_first() -> None:
    assert argmax(np.array([1.0, 3.0, 3.0, np.nan, 3.0], dtype=np.float32)) == 1
    assert argmax(np.array([np.nan, np.nan], dtype=np.float32)) == 0
    assert argmax(np.array([-np.inf, np.nan, -np.inf], dtype=np.float32)) == 0


# ----------------------------------------------------------------------------- distribution
@given(row=rows, temperature=st.floats(0.05, 3.0), top_p=st.floats(0.05, 1.0))
def test_distribution_is_normalised_and_keeps_the_nucleus(
    row: np.ndarray, temperature: float, top_p: float
) -> None:
    probs = distribution(row, temperature, top_p)
    assert probs.dtype == np.float32
    assert abs(float(probs.astype(np.float64).sum()) - 1.0) < 1e-5
    full = distribution(row, temperature, 1.0)
    kept = np.flatnonzero(probs)
    # The kept set is a prefix of (descending p, ascending id) that reaches top_p.
    order = sorted(range(row.size), key=lambda i: (-float(full[i]), i))
    assert sorted(kept.tolist()) == sorted(order[: kept.size])
    nucleus = float(np.float32(top_p))
    if nucleus < 1.0:
        mass = np.cumsum(full[order].astype(np.float64))
        assert mass[kept.size - 1] >= nucleus or kept.size == row.size
        assert kept.size == 1 or mass[kept.size - 2] < nucleus


def test_distribution_matches_the_float32_formula() -> None:
    row = np.array([2.0, -1.0, 0.5, 2.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    probs = distribution(row, 0.7, 1.0)
    inv_t = np.float32(1) / np.float32(0.7)
    expected = np.zeros(7, dtype=np.float32)
    for i in range(4):
        expected[i] = np.float32(math.exp(float((row[i] - np.float32(2.0)) * inv_t)))
    total = 0.0
    for value in expected.tolist():
        total += value
    expected = expected / np.float32(total)
    assert probs.tobytes() == expected.tobytes()
    assert probs[4] == probs[5] == probs[6] == 0.0


def test_nucleus_tie_rule_keeps_lower_ids() -> None:
    row = np.zeros(4, dtype=np.float32)  # four tokens of probability 1/4
    probs = distribution(row, 1.0, 0.5)
    assert probs.tolist() == [0.5, 0.5, 0.0, 0.0]


def test_non_finite_rows_fall_back_to_argmax() -> None:
    assert distribution(np.array([np.nan, np.nan], np.float32), 1.0, 1.0).tolist() == [1, 0]
    row = np.array([-np.inf, 3.0, np.nan], np.float32)
    assert distribution(row, 1.0, 0.9).tolist() == [0, 1, 0]


# ----------------------------------------------------------------------------- drawing
@given(row=rows, temperature=st.floats(0.3, 2.0))
def test_top_p_one_reaches_every_token_with_nonzero_probability(
    row: np.ndarray, temperature: float
) -> None:
    probs = distribution(row, temperature, 1.0)
    running = np.cumsum(probs.astype(np.float64))
    before = 0.0
    for token in range(row.size):
        end = float(running[token])
        if probs[token] > 0 and end < 1.0:
            # Any uniform in (before, end] selects the token; the interval is empty only
            # when a probability below double rounding of the running sum is absorbed.
            if probs[token] >= 1e-15:
                assert end > before
            if end > before:
                assert sample_index(probs, end) == token
                assert sample_index(probs, float(np.nextafter(before, 1.0))) == token
        before = end


def test_draw_scans_ascending_ids_for_the_first_running_sum_at_or_above_u() -> None:
    probs = np.array([0.25, 0.0, 0.5, 0.25], dtype=np.float32)
    assert sample_index(probs, 0.0) == 0
    assert sample_index(probs, 0.25) == 0  # >= u, not > u
    assert sample_index(probs, 0.2500001) == 2
    assert sample_index(probs, 0.75) == 2
    assert sample_index(probs, 0.9999) == 3
    # A banned token is skipped and the rest renormalised on the fly.
    assert sample_index(probs, 0.01, ban=0) == 2
    # colibri's ">=": u == 0.0 (odds 2^-53) stops at the first id not banned, even at p == 0.
    assert sample_index(probs, 0.0, ban=0) == 1
    assert sample_index(probs, 0.66, ban=0) == 2
    assert sample_index(probs, 0.67, ban=0) == 3


def test_same_seed_same_tokens_and_requests_are_independent() -> None:
    logits = np.random.default_rng(3).normal(size=64).astype(np.float32)

    def run(rng: Rng, n: int = 40) -> list[int]:
        return [sample(logits, 0.9, 0.95, rng) for _ in range(n)]

    alone = run(Rng.from_seed(11))
    assert alone == run(Rng.from_seed(11))
    assert alone != run(Rng.from_seed(12))
    # Interleaving two requests' streams does not change either one.
    first, second = Rng.from_seed(11), Rng.from_seed(12)
    mixed_first, mixed_second = [], []
    for _ in range(40):
        mixed_first.append(sample(logits, 0.9, 0.95, first))
        mixed_second.append(sample(logits, 0.9, 0.95, second))
    assert mixed_first == alone and mixed_second == run(Rng.from_seed(12))


def _chi_square_critical(df: int, z: float = 3.09) -> float:
    """Upper quantile of chi-square (Wilson-Hilferty); z = 3.09 is p = 0.001."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.8)])
def test_draws_follow_the_distribution_chi_square(temperature: float, top_p: float) -> None:
    logits = np.array([1.5, 0.2, -0.3, 2.0, 0.0, -1.0, 1.0, 0.7], dtype=np.float32)
    probs = distribution(logits, temperature, top_p)
    rng = Rng.from_seed(2024)
    draws = 20_000
    counts = np.bincount([sample(logits, temperature, top_p, rng) for _ in range(draws)],
                         minlength=logits.size)
    support = np.flatnonzero(probs)
    assert counts[probs == 0].sum() == 0
    assert (counts[support] > 0).all()  # every token that can be drawn was drawn
    expected = draws * probs[support].astype(np.float64)
    statistic = float((((counts[support] - expected) ** 2) / expected).sum())
    assert statistic < _chi_square_critical(support.size - 1)


# ----------------------------------------------------------------------------- logprobs
def _colibri_slots(row: np.ndarray, k: int) -> list[int]:
    """colibri's min-replacement, literally (placeholders -1e30, first minimum)."""
    ids, values = [-1] * k, [float(np.float32(-1e30))] * k
    for i, value in enumerate(row.tolist()):
        slot = min(range(k), key=values.__getitem__)
        if value > values[slot]:
            ids[slot], values[slot] = i, value
    return ids


@given(row=rows, k=st.integers(1, 40))
def test_top_k_table_is_colibris_slot_order(row: np.ndarray, k: int) -> None:
    table = top_k_table(row, k)
    assert table == _colibri_slots(row, min(k, 32, row.size))


def test_top_k_table_on_a_large_row_is_colibris() -> None:
    row = np.random.default_rng(9).normal(size=20_000).astype(np.float32)
    row[::97] = row[5]  # ties
    assert top_k_table(row, 32) == _colibri_slots(row, 32)
    assert sorted(top_k_table(row, 32)) == sorted(np.argsort(-row, kind="stable")[:32].tolist())


@given(row=rows_with_specials, k=st.integers(1, 8))
def test_top_k_table_ids_are_unique_real_ids(row: np.ndarray, k: int) -> None:
    table = top_k_table(row, k)
    assert len(table) == min(k, row.size) and len(set(table)) == len(table)
    assert all(0 <= i < row.size for i in table)


@given(row=rows, token=st.integers(0, 39), k=st.integers(0, 32))
def test_logprob_entry_is_float64_log_softmax(row: np.ndarray, token: int, k: int) -> None:
    assume(token < row.size)
    entry = logprob_entry(row, token, k)
    wide = row.astype(np.float64)
    reference = wide - (wide.max() + math.log(np.exp(wide - wide.max()).sum()))
    assert entry.logprob == pytest.approx(reference[token], abs=1e-12)
    assert entry.logprob <= 1e-12
    assert len(entry.top) == min(k, row.size)
    table = dict(entry.top)
    if token in table:
        assert table[token] == entry.logprob  # bit-identical in both places
    assert np.allclose(log_softmax(row), reference, atol=1e-12)
    assert [lp for _, lp in sorted_by_logprob(entry.top)] == sorted(table.values(), reverse=True)


def test_tail_formatting() -> None:
    row = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    entry = logprob_entry(row, 1, 2)
    assert entry.tail() == " -1.407606 2 2 -0.407606 1 -1.407606"
    assert logprob_entry(row, 0, 0).tail() == " -2.407606 0"
    nan_row = np.array([np.nan, 1.0], dtype=np.float32)
    assert logprob_entry(nan_row, 1, 1).tail().startswith(" nan 1 1 nan")
    assert NO_PREDICTOR_TAIL == " nan 0"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        logprob_entry(row, 3, 1)


# ----------------------------------------------------------------------------- goldens
def _golden_row() -> np.ndarray:
    """A fixed logit row from a formula (no RNG, so it is the same on every platform)."""
    ids = np.arange(64, dtype=np.float64)
    return (3.0 * np.sin(ids * 1.7) + 0.05 * ids).astype(np.float32)


def test_sampled_sequences_snapshot(snapshot_json: object) -> None:
    """Golden draws: another engine's sampler must produce these ids for these seeds.

    Exact, as is the tails snapshot below: the row is a formula rounded to float32 and the
    sampler's arithmetic is elementwise or a sequential sum, with no BLAS reduction whose
    order a CPU could change (spec/model.md §15, kind (a)).
    """
    row = _golden_row()
    golden: dict[str, list[int]] = {}
    for seed in (1, 42):
        for temperature, top_p in ((0.7, 0.9), (1.0, 1.0), (1.3, 0.5)):
            rng = Rng.from_seed(seed)
            golden[f"seed={seed} t={temperature} top_p={top_p}"] = [
                sample(row, temperature, top_p, rng) for _ in range(16)
            ]
    golden["greedy"] = [sample(row, 0.0, 1.0, Rng())]
    assert golden == snapshot_json


def test_logprob_tails_snapshot(snapshot_json: object) -> None:
    row = _golden_row()
    tails = {f"token={t} k={k}": logprob_entry(row, t, k).tail() for t, k in
             ((0, 1), (int(np.argmax(row)), 5), (17, 32))}
    assert tails == snapshot_json


@given(row=rows, top_p=st.floats(0.05, 0.999), prefix=st.integers(1, 8))
def test_partial_nucleus_order_equals_the_full_sort(
    row: np.ndarray, top_p: float, prefix: int
) -> None:
    probs = distribution(row, 1.0, 1.0)
    nucleus = float(np.float32(top_p))
    assert nucleus_order(probs, nucleus, prefix).tobytes() == \
        nucleus_order(probs, nucleus, prefix=10**9).tobytes()


def test_partial_nucleus_on_a_large_vocabulary() -> None:
    row = np.random.default_rng(4).normal(size=154_880).astype(np.float32) * 4
    row[:50] = row.max()  # ties straddling the partition boundary
    probs = distribution(row, 0.8, 1.0)
    for top_p in (0.5, 0.9, 0.999):
        fast = nucleus_order(probs, top_p)
        assert fast.tobytes() == nucleus_order(probs, top_p, prefix=10**9).tobytes()
