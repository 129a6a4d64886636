"""RMSNorm, LayerNorm and RoPE invariants."""

from __future__ import annotations

import numpy as np
from colibri.reference.norms import layer_norm, rms_norm
from colibri.reference.rope import apply_rope, cos_sin, inv_freq
from hypothesis import given, settings
from hypothesis import strategies as st

vectors = st.integers(0, 2**31 - 1).map(
    lambda seed: np.random.default_rng(seed).standard_normal((3, 64)).astype(np.float32)
)


@given(x=vectors, scale=st.floats(0.01, 100.0))
def test_rms_norm_is_scale_invariant_and_unit_rms(x: np.ndarray, scale: float) -> None:
    ones = np.ones(64, np.float32)
    y = rms_norm(x, ones, 0.0)
    assert np.allclose(np.sqrt(np.mean(y.astype(np.float64) ** 2, axis=-1)), 1.0, atol=1e-5)
    assert np.allclose(rms_norm(x * np.float32(scale), ones, 0.0), y, atol=1e-5)


@given(x=vectors)
def test_rms_norm_applies_the_weight_elementwise(x: np.ndarray) -> None:
    w = np.linspace(0.5, 1.5, 64).astype(np.float32)
    assert np.allclose(rms_norm(x, w, 1e-5), rms_norm(x, np.ones(64, np.float32), 1e-5) * w,
                       atol=1e-6)


@given(x=vectors)
def test_layer_norm_centres_and_scales(x: np.ndarray) -> None:
    y = layer_norm(x, np.ones(64, np.float32), np.zeros(64, np.float32), 0.0).astype(np.float64)
    assert np.allclose(y.mean(-1), 0.0, atol=1e-5)
    assert np.allclose(y.var(-1), 1.0, atol=1e-4)


@settings(max_examples=50)
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(0, 5000), n=st.integers(0, 5000),
       shift=st.integers(0, 1000))
def test_rope_scores_depend_only_on_relative_position(
    seed: int, m: int, n: int, shift: int
) -> None:
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, 8)).astype(np.float32)

    def score(a: int, b: int) -> float:
        ca, sa = cos_sin(np.asarray([a]), 8, 10000.0)
        cb, sb = cos_sin(np.asarray([b]), 8, 10000.0)
        return float(np.dot(apply_rope(q, ca, sa)[0], apply_rope(k, cb, sb)[0]))

    assert abs(score(m, n) - score(m + shift, n + shift)) <= 2e-3 * (1 + abs(score(m, n)))


@given(seed=st.integers(0, 2**31 - 1), pos=st.integers(0, 10000))
def test_rope_preserves_each_pair_norm(seed: int, pos: int) -> None:
    v = np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)
    c, s = cos_sin(np.asarray([pos]), 8, 10000.0)
    out = apply_rope(v, c, s)
    before = v[0, 0::2] ** 2 + v[0, 1::2] ** 2
    after = out[0, :4] ** 2 + out[0, 4:] ** 2
    assert np.allclose(before, after, rtol=1e-5, atol=1e-6)


def test_rope_at_position_zero_only_deinterleaves() -> None:
    v = np.arange(8, dtype=np.float32)[None]
    c, s = cos_sin(np.asarray([0]), 8, 10000.0)
    assert apply_rope(v, c, s).tolist() == [[0, 2, 4, 6, 1, 3, 5, 7]]
    assert apply_rope(v, c, s, interleaved=False).tolist() == v.tolist()


def test_rope_pair_j_turns_by_pos_times_theta_power() -> None:
    freqs = inv_freq(8, 10000.0)
    assert np.allclose(freqs, [10000.0 ** (-2 * j / 8) for j in range(4)], rtol=1e-6)
    v = np.zeros((1, 8), np.float32)
    v[0, 2] = 1.0  # pair 1, even element
    c, s = cos_sin(np.asarray([3]), 8, 10000.0)
    out = apply_rope(v, c, s)[0]
    angle = 3 * freqs[1]
    assert np.isclose(out[1], np.cos(angle)) and np.isclose(out[5], np.sin(angle))
