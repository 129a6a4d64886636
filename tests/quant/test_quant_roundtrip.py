"""Property tests: round-trip error, nibble order, padding and resolution for every format."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from colibri.reference.quant import FORMAT_NAMES, Fmt, dequantize, quantize
from colibri.reference.quant.formats import GROUP_SIZES, payload_nbytes, scale_count
from colibri.reference.quant.resolve import candidates, resolve_format
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

QMAX = {Fmt.INT8_ROW: 127, Fmt.INT4_ROW: 7, Fmt.INT2_ROW: 1}


def matrices(max_rows: int = 6, max_cols: int = 200) -> st.SearchStrategy[np.ndarray]:
    shapes = st.tuples(st.integers(1, max_rows), st.integers(1, max_cols))
    values = st.floats(-4.0, 4.0, width=32, allow_subnormal=False)
    return shapes.flatmap(lambda s: arrays(np.float32, s, elements=values))


def per_weight_scale(fmt: Fmt, scales: np.ndarray, shape: tuple[int, int], gs: int) -> np.ndarray:
    rows, cols = shape
    if fmt in QMAX:
        return np.repeat(scales[:, None], cols, axis=1)
    return np.repeat(scales.reshape(rows, -1), gs, axis=1)[:, :cols]


@pytest.mark.parametrize(
    "fmt", [Fmt.INT8_ROW, Fmt.INT4_ROW, Fmt.INT2_ROW, Fmt.INT4_GROUPED, Fmt.INT3_G64]
)
@given(w=matrices())
def test_integer_round_trip_within_half_a_step(fmt: Fmt, w: np.ndarray) -> None:
    gs = 64 if fmt in (Fmt.INT4_GROUPED, Fmt.INT3_G64) else 0
    payload, scales = quantize(fmt, w)
    assert payload.size == payload_nbytes(fmt, *w.shape)
    assert scales.size == scale_count(fmt, *w.shape, gs)
    back = dequantize(fmt, payload, scales, w.shape, group_size=gs or None)
    step = per_weight_scale(fmt, scales, w.shape, gs)
    assert np.all(np.abs(back - w) <= step * np.float32(0.5 + 1e-5))


@given(w=matrices(max_rows=140, max_cols=300))
def test_fp8_round_trip_within_half_an_e4m3_step(w: np.ndarray) -> None:
    payload, scales = quantize(Fmt.FP8_E4M3_B128, w)
    back = dequantize(Fmt.FP8_E4M3_B128, payload, scales, w.shape)
    grid = np.repeat(np.repeat(scales.reshape(-(-w.shape[0] // 128), -1), 128, 0), 128, 1)
    s = grid[: w.shape[0], : w.shape[1]]
    scaled = np.abs(w / s)
    # e4m3: 3 mantissa bits, normals from 2^-6, subnormal step 2^-9.
    exponent = np.floor(np.log2(np.maximum(scaled, 2.0**-6)))
    half_step = np.exp2(exponent - 4)
    assert np.all(np.abs(back - w) <= half_step * s * (1 + 1e-5))


@given(w=matrices(max_rows=3, max_cols=40))
def test_fp8_bytes_are_ml_dtypes_e4m3fn(w: np.ndarray) -> None:
    payload, scales = quantize(Fmt.FP8_E4M3_B128, w)
    decoded = payload.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(w.shape)
    np.testing.assert_array_equal(decoded * scales[0], dequantize(8, payload, scales, w.shape))


def test_int4_nibble_order_and_odd_width_padding() -> None:
    # q = +7 (u = 15) in the even column, -7 (u = 1) in the odd one: byte 0 is 0x1f.
    w = np.array([[1.0, -1.0, 0.25]], dtype=np.float32)
    payload, scales = quantize(Fmt.INT4_ROW, w)
    assert scales[0] == np.float32(1.0) / np.float32(7)
    assert payload[0] == 0x1F
    assert payload[1] == 0x8A  # column 2: rint(1.75) = 2 -> u = 10 low; pad nibble q = 0 -> 8


def test_int2_and_int3_padding_bits_are_zero() -> None:
    w = np.ones((1, 5), dtype=np.float32)
    p2, _ = quantize(Fmt.INT2_ROW, w)
    assert p2[1] == 3  # one element (u = 3) then zero bits
    p3, _ = quantize(Fmt.INT3_G64, np.ones((1, 3), dtype=np.float32))
    assert p3[0] == 0b00111111  # three elements of u = 7 (low bits 3)
    assert all(b == 0 for b in p3[1:16])
    assert p3[16] == 0b00000111


@pytest.mark.parametrize("gs", GROUP_SIZES)
def test_group_size_round_trips_through_resolution(gs: int) -> None:
    rows, cols = 3, 768
    w = np.linspace(-1, 1, rows * cols, dtype=np.float32).reshape(rows, cols)
    payload, scales = quantize(Fmt.INT4_GROUPED, w, group_size=gs)
    resolved = resolve_format("t", rows, cols, payload.size, scales.nbytes)
    assert (resolved.fmt, resolved.group_size) == (Fmt.INT4_GROUPED, gs)


@given(
    rows=st.integers(1, 300),
    cols=st.integers(100, 700),
    fmt=st.sampled_from([Fmt.INT8_ROW, Fmt.INT4_ROW, Fmt.INT2_ROW, Fmt.INT3_G64]),
)
def test_unstamped_sizes_resolve_to_the_written_format(rows: int, cols: int, fmt: Fmt) -> None:
    nb = payload_nbytes(fmt, rows, cols)
    ns = 4 * scale_count(fmt, rows, cols)
    found = candidates(rows, cols, nb, ns)
    assert fmt in [c.fmt for c in found]
    if len(found) == 1:
        assert resolve_format("t", rows, cols, nb, ns).fmt == fmt
    else:
        # A byte collision (e.g. int3-g64 vs int4 at I = 143, one-group int4 rows): colibri's
        # unstamped precedence decides, and a stamp always selects the written format.
        assert resolve_format("t", rows, cols, nb, ns) == found[0]
        stamped = resolve_format("t", rows, cols, nb, ns, stamp=FORMAT_NAMES[fmt])
        assert stamped.fmt == fmt


def test_fp8_and_int8_collision_follows_colibri() -> None:
    # [4, 100]: int8 needs 4 scales (16 bytes); fp8 needs 1 block scale (4 bytes). At O = 1
    # both need 4 bytes: unstamped reads int8-row, a stamp selects fp8.
    assert resolve_format("t", 1, 100, 100, 4).fmt == Fmt.INT8_ROW
    stamped = resolve_format("t", 1, 100, 100, 4, stamp="fp8-e4m3-b128")
    assert stamped.fmt == Fmt.FP8_E4M3_B128
    assert resolve_format("t", 4, 100, 400, 4).fmt == Fmt.FP8_E4M3_B128


def test_e8_is_recognised_by_its_tag_size() -> None:
    assert resolve_format("t", 8, 512, 8 * 2 * 98, 4).fmt == Fmt.E8_IQ3


@given(
    rows=st.integers(1, 600),
    cols=st.integers(1, 1200),
    nb=st.integers(0, 800_000),
    ns=st.integers(0, 20_000),
    stamp=st.sampled_from([None, *FORMAT_NAMES.values(), "bogus"]),
)
def test_resolution_of_arbitrary_sizes_is_exact_or_refused(
    rows: int, cols: int, nb: int, ns: int, stamp: str | None
) -> None:
    from colibri.reference.quant import QuantFormatError
    from colibri.reference.quant.formats import FORMATS_BY_NAME

    try:
        resolved = resolve_format("t", rows, cols, nb, ns, stamp=stamp)
    except QuantFormatError as exc:
        assert str(exc).startswith("t: ")
        return
    # whatever was accepted fits both byte counts exactly
    assert payload_nbytes(resolved.fmt, rows, cols) == nb
    assert 4 * scale_count(resolved.fmt, rows, cols, resolved.group_size) == ns
    if stamp is not None:
        assert resolved.fmt == FORMATS_BY_NAME[stamp]


def test_codec_refuses_mismatched_sizes_naming_the_tensor() -> None:
    from colibri.reference.quant import QuantFormatError

    w = np.ones((4, 128), dtype=np.float32)
    payload, scales = quantize(Fmt.INT4_GROUPED, w)
    with pytest.raises(QuantFormatError, match="^w: int4-grouped scale count 7 matches no group"):
        dequantize(4, payload, scales[:7], w.shape, name="w")
    with pytest.raises(QuantFormatError, match="^w: int4-grouped payload of \\[4, 128\\] must be"):
        dequantize(4, payload[:-1], scales, w.shape, name="w")
    with pytest.raises(QuantFormatError, match="^w: int8-row needs a .qs scale sidecar"):
        dequantize(1, np.zeros(512, np.uint8), None, w.shape, name="w")
    with pytest.raises(ValueError, match="unknown quantized format ordinal 7"):
        dequantize(7, payload, scales, w.shape)
