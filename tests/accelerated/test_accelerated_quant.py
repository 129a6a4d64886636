"""The fused dequantize-and-dot kernels (accelerated/csrc/quant, colibri.accelerated.quant_kernels).

Tolerance (sameness kind (b), spec/model.md §15): the kernel and ``x @ dequantize(W).T`` in
float64 sum the same ``n`` products in different orders (and the kernel scales a group's
partial sum once instead of rounding every ``q * s``). Each float32 rounding moves a partial
sum by at most ``u`` times its magnitude, and every partial sum is bounded by
``A = sum_i |w_i x_i|``; the errors add as a random walk, so

    |kernel - exact| <= FACTOR * u * sqrt(n) * A        u = 2^-24, FACTOR = 8

(``FACTOR`` as in ``colibri.conformance.sameness``). For e8 the two sides also differ by the
rotation (rotate(x) against unrotate(W), log2 of the block size butterfly stages of an
orthogonal map), which the same bound covers while log2(block) <= sqrt(n). A single wrong
weight moves a product by about ``A / n`` -- far outside the bound -- so the comparison
catches decoding mistakes (test_the_bound_catches_one_wrong_weight); on CASES the measured
error stays below 0.03 of the bound. Alone-vs-batched, o-range splits and pre-rotated
activations, and threads splitting one product by output rows, are kind (c): byte-identical.
generic vs avx2 (FMA contraction) is kind (b) with the same bound.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from colibri.accelerated import quant_kernels as qk
from colibri.accelerated.native import library_path, supported_variants
from colibri.accelerated.native_build import DEFAULT_OUT, LIBRARY_NAME, SOURCE_DIR
from colibri.accelerated.weights import expert_names
from colibri.conformance.sameness import SAFETY_FACTOR, UNIT_ROUNDOFF
from colibri.reference.quant import dequantize, quantize, rotate_activations
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.formats import GROUP_SIZES, Fmt
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "models"

pytestmark = pytest.mark.skipif(
    not library_path().is_file(),
    reason=f"the accelerated C library is not built ({library_path()}): run `make build`",
)

#: (format, quantize kwargs, [O, I]) with odd widths wherever the format allows them.
CASES: list[tuple[str, dict[str, int], tuple[int, int]]] = [
    ("int8-row", {}, (37, 77)),
    ("int8-row", {}, (5, 1000)),
    ("int4-row", {}, (37, 77)),
    ("int4-row", {}, (9, 513)),
    ("int2-row", {}, (37, 77)),
    ("int2-row", {}, (3, 270)),
    *[("int4-grouped", {"group_size": gs}, (11, 301)) for gs in GROUP_SIZES],
    ("int3-g64", {}, (37, 77)),
    ("int3-g64", {}, (4, 64)),
    ("int3-g64", {}, (6, 333)),
    ("int3-g64", {}, (5, 100)),
    ("int2-row", {}, (5, 45)),
    ("fp8-e4m3-b128", {}, (37, 77)),
    ("fp8-e4m3-b128", {}, (131, 300)),
    ("e8-iq3-lattice", {}, (9, 256)),
    ("e8-iq3-lattice", {}, (5, 768)),
    ("e8-iq3-lattice", {}, (3, 1536)),
]


def case_id(case: tuple[str, dict[str, int], tuple[int, int]]) -> str:
    fmt, kw, (o, i) = case
    return f"{fmt}{kw.get('group_size', '')}-{o}x{i}"


def bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``FACTOR * u * sqrt(n) * sum_i |w_i x_i|`` per output element (float64)."""
    a = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    return SAFETY_FACTOR * UNIT_ROUNDOFF * math.sqrt(w.shape[1]) * a


def exact(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def assert_close(y: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
    err = np.abs(y.astype(np.float64) - exact(w, x))
    tol = bound(w, x)
    worst = float(np.max(err / np.maximum(tol, 1e-300)))
    assert np.all(err <= tol), f"error {float(err.max()):.3g} is {worst:.2f}x the bound"


def make(case: tuple[str, dict[str, int], tuple[int, int]], seed: int = 0
         ) -> tuple[qk.QuantMatrix, np.ndarray]:
    fmt, kw, shape = case
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    payload, scales = quantize(fmt, w, **kw)
    m = qk.quant_matrix(fmt, payload, scales, shape, group_size=kw.get("group_size"))
    deq = dequantize(fmt, payload, scales, shape, group_size=kw.get("group_size"))
    return m, deq


def activations(rows: int, cols: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_float64_product_of_reference_dequantize(case):
    m, deq = make(case)
    x = activations(7, m.in_features)
    assert_close(qk.qmatmul(m, x), deq, x)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_batch_of_seven_is_byte_identical_to_each_row_alone(case):
    # In the avx2 build one row takes the register-resident path and seven rows the shared
    # stack buffer: the two must perform the same operations.
    m, _ = make(case)
    x = activations(7, m.in_features)
    batched = qk.qmatmul(m, x)
    alone = np.stack([qk.qmatmul(m, x[r]) for r in range(7)])
    assert batched.tobytes() == alone.tobytes()


@pytest.mark.parametrize("gs", [32, 64, 128])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_whole_group_rows_give_the_general_group_loops_bytes(gs, batch):
    # Rows of whole 32/64/128-column groups take unrolled group loops (q_fused.c Q_UNROLLED),
    # rows ending in a part group the general loop. Padding the same weights and activations
    # with half a group of zeros sends them down the general loop while adding only +0 to
    # each lane partial, so the two must give the same bytes (one-row and two-row paths).
    rng = np.random.default_rng(gs + batch)
    rows, cols = 13, 4 * gs
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    pad = gs // 2
    wide = np.concatenate([w, np.zeros((rows, pad), np.float32)], axis=1)
    xw = np.concatenate([x, np.zeros((batch, pad), np.float32)], axis=1)
    results = []
    for weights, acts in ((w, x), (wide, xw)):
        payload, scales = quantize("int4-grouped", weights, group_size=gs)
        m = qk.quant_matrix("int4-grouped", payload, scales, weights.shape, group_size=gs)
        results.append(qk.qmatmul(m, acts))
    assert np.all(np.isfinite(results[0]))
    assert results[0].tobytes() == results[1].tobytes()


@pytest.mark.parametrize("fmt", ["int4-grouped", "e8-iq3-lattice", "int8-row"])
def test_batches_past_one_tile_and_output_splits_are_byte_identical(fmt):
    case = next(c for c in CASES if c[0] == fmt)
    m, _ = make(case)
    x = activations(37, m.in_features)  # more rows than one 16-row tile
    full = qk.qmatmul(m, x)
    alone = np.stack([qk.qmatmul(m, x[r]) for r in range(37)])
    assert full.tobytes() == alone.tobytes()
    split = np.full_like(full, np.nan)
    cuts = [0, 1, m.out_features // 2, m.out_features]
    for o0, o1 in zip(cuts, cuts[1:], strict=False):
        qk.qmatmul(m, x, out=split, o_range=(o0, o1))
    assert split.tobytes() == full.tobytes()


PREFILL_CASES: list[tuple[str, dict[str, int], tuple[int, int]]] = [
    ("int8-row", {}, (14, 256)),
    ("int4-row", {}, (13, 512)),
    *[("int4-grouped", {"group_size": gs}, (16, 384)) for gs in (32, 64, 128)],
    ("fp8-e4m3-b128", {}, (130, 256)),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id)
def test_decode_batches_and_prefills_are_each_row_alone(
    case: tuple[str, dict[str, int], tuple[int, int]],
) -> None:
    # Rows of whole 32-column groups: 3-7 activation rows take the paths that decode each
    # block once for three or four rows (with pairs and a last row alone around them); 8 or
    # more the tiles (three weight rows decoded once, activations four or two at a time) with
    # the rows past the last block and the weight rows past the last three on the row path;
    # output splits start tiles off the multiples of three.
    m, _ = make(case)
    x = activations(37, m.in_features)
    alone = np.stack([qk.qmatmul(m, x[r]) for r in range(37)])
    for n in (*range(2, 10), 12, 13, 37):
        assert qk.qmatmul(m, x[:n]).tobytes() == alone[:n].tobytes(), n
    split = np.full_like(alone, np.nan)
    cuts = [0, 1, 5, m.out_features]
    for o0, o1 in zip(cuts, cuts[1:], strict=False):
        qk.qmatmul(m, x, out=split, o_range=(o0, o1))
    assert split.tobytes() == alone.tobytes()


@pytest.mark.parametrize("fmt", ["int4-grouped", "e8-iq3-lattice", "fp8-e4m3-b128"])
def test_threads_splitting_by_output_give_the_same_bytes(fmt):
    from concurrent.futures import ThreadPoolExecutor

    case = next(c for c in CASES if c[0] == fmt)
    m, _ = make(case)
    x = activations(3, m.in_features)
    xr = qk.rotate(x) if m.rotated else x
    out = np.full((3, m.out_features), np.nan, dtype=np.float32)
    cuts = np.linspace(0, m.out_features, 5).astype(int)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(
            lambda r: qk.qmatmul(m, xr, out=out, o_range=r, x_rotated=m.rotated),
            zip(cuts[:-1], cuts[1:], strict=True),
        ))
    assert out.tobytes() == qk.qmatmul(m, x).tobytes()


def test_o_range_writes_only_its_columns():
    m, _ = make(CASES[0])
    x = activations(3, m.in_features)
    out = np.full((3, m.out_features), 7.0, dtype=np.float32)
    qk.qmatmul(m, x, out=out, o_range=(4, 9))
    assert np.all(out[:, :4] == 7.0) and np.all(out[:, 9:] == 7.0)
    assert out[:, 4:9].tobytes() == qk.qmatmul(m, x)[:, 4:9].tobytes()


@pytest.mark.parametrize("cols", [256, 768, 1536])
def test_e8_prerotated_activations_give_the_same_bytes(cols):
    m, _ = make(("e8-iq3-lattice", {}, (4, cols)))
    x = activations(5, cols)
    xr = qk.rotate(x)
    assert xr.tobytes() == rotate_activations(x).tobytes()
    assert qk.qmatmul(m, xr, x_rotated=True).tobytes() == qk.qmatmul(m, x).tobytes()


@given(cols=st.integers(1, 2100), rows=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_rotation_is_bit_identical_to_the_reference(cols, rows, seed):
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    assert qk.rotate(x).tobytes() == rotate_activations(x).tobytes()


def test_strided_and_float64_activations_are_accepted():
    m, deq = make(CASES[2])
    wide = activations(6, 2 * m.in_features)
    x = wide[::2, ::2]  # neither rows nor columns contiguous: copied once
    y = qk.qmatmul(m, x)
    assert y.tobytes() == qk.qmatmul(m, np.ascontiguousarray(x)).tobytes()
    x_rows = wide[:, : m.in_features]  # padded rows: walked in place
    assert qk.qmatmul(m, x_rows).tobytes() == qk.qmatmul(m, x_rows.copy()).tobytes()
    assert qk.qmatmul(m, x.astype(np.float64)).tobytes() == y.tobytes()


def test_empty_batch():
    m, _ = make(CASES[0])
    assert qk.qmatmul(m, np.zeros((0, m.in_features), np.float32)).shape == (0, m.out_features)


_HYP_FORMATS = ["int8-row", "int4-row", "int2-row", "int4-grouped", "int3-g64", "fp8-e4m3-b128"]


@given(
    fmt=st.sampled_from(_HYP_FORMATS),
    rows=st.integers(1, 40),
    # Whole 32-column blocks half the time: the paths that decode a block once for three or
    # four rows and the tiles (8+ rows) take only rows of whole groups.
    cols=st.one_of(st.integers(1, 300), st.integers(1, 12).map(lambda n: 32 * n)),
    batch=st.integers(1, 13),
    gs=st.sampled_from(GROUP_SIZES),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
    seed=st.integers(0, 2**31),
)
def test_hypothesis_shapes_and_values(fmt, rows, cols, batch, gs, scale, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    w[rng.random((rows, cols)) < 0.1] = 0.0
    kw = {"group_size": gs} if fmt == "int4-grouped" else {}
    payload, scales = quantize(fmt, w, **kw)
    m = qk.quant_matrix(fmt, payload, scales, (rows, cols), group_size=kw.get("group_size"))
    deq = dequantize(fmt, payload, scales, (rows, cols), group_size=kw.get("group_size"))
    x = (rng.standard_normal((batch, cols)) * rng.choice([1e-2, 1.0, 50.0])).astype(np.float32)
    y = qk.qmatmul(m, x)
    assert_close(y, deq, x)
    for r in range(batch):  # every row's bytes as alone, whichever path the batch took
        assert y[r:r + 1].tobytes() == qk.qmatmul(m, x[r:r + 1]).tobytes(), r


# -- the fixtures' and freshly converted containers' real expert tensors ---------------------


def container_cases() -> list[tuple[str, Path]]:
    return [(p.name, p) for p in sorted(FIXTURES.glob("glm5-tiny-*"))
            if any(p.glob("*.safetensors")) and QuantContainer.open(p).has_quantized_tensors()]


def check_container_experts(folder: Path, experts: int = 3) -> set[Fmt]:
    cfg = json.loads((folder / "config.json").read_text())
    d, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    container = QuantContainer.open(folder)
    layer = cfg["first_k_dense_replace"]
    seen: set[Fmt] = set()
    for e in range(experts):
        gate, up, down = (qk.container_matrix(container, name, shape) for name, shape in
                          zip(expert_names(layer, e), ((inter, d), (inter, d), (d, inter)),
                              strict=True))
        x = activations(5, d, seed=e)
        prefix = f"model.layers.{layer}.mlp.experts.{e}."
        for m, xin in ((gate, x), (up, x), (down, activations(5, inter, seed=e + 9))):
            seen.add(m.fmt)
            w = container.weight(m.name, (m.out_features, m.in_features))
            assert m.name.startswith(prefix)
            y = qk.qmatmul(m, xin)
            assert_close(y, w, xin)
            assert y[2:3].tobytes() == qk.qmatmul(m, xin[2:3]).tobytes()
    return seen


@pytest.mark.parametrize("folder", [p for _, p in container_cases()],
                         ids=[n for n, _ in container_cases()])
def test_fixture_container_experts(folder):
    seen = check_container_experts(folder)
    assert seen and Fmt.F32 not in seen


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from colibri.reference.quant.convert import convert

    base = tmp_path_factory.mktemp("quantk")
    out = {}
    for scheme in ("int8", "int2", "int3", "int4g128"):
        convert(FIXTURES / "glm5-tiny", base / scheme, scheme)
        out[scheme] = base / scheme
    return out


@pytest.mark.parametrize("scheme", ["int8", "int2", "int3", "int4g128"])
def test_converted_container_experts(converted, scheme):
    want = {"int8": Fmt.INT8_ROW, "int2": Fmt.INT2_ROW, "int3": Fmt.INT3_G64}
    seen = check_container_experts(converted[scheme])
    if scheme in want:
        assert seen == {want[scheme]}


# -- generic vs avx2 ---------------------------------------------------------------------------


def test_generic_and_avx2_variants_agree_within_tolerance():
    if "avx2" not in supported_variants():
        pytest.skip("this CPU runs only the generic variant")
    paths = {v: DEFAULT_OUT / v / LIBRARY_NAME for v in ("generic", "avx2")}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not built: run `make build`")
    libs = {v: qk.QuantKernels.from_path(p) for v, p in paths.items()}
    differ = 0
    for case in CASES:
        m, deq = make(case)
        x = activations(4, m.in_features)
        ys = {v: k.matmul(m, x) for v, k in libs.items()}
        for y in ys.values():
            assert_close(y, deq, x)
        for k in libs.values():  # each variant is batch invariant on its own paths
            alone = np.stack([k.matmul(m, x[r]) for r in range(4)])
            assert alone.tobytes() == k.matmul(m, x).tobytes()
        bit_gap = np.abs(ys["generic"].astype(np.float64) - ys["avx2"].astype(np.float64))
        assert np.all(bit_gap <= 2 * bound(deq, x))
        differ += int(np.any(bit_gap > 0))
    # The variants really are two code paths (FMA vs separate rounding), not one library twice.
    assert differ > 0


# -- tables ------------------------------------------------------------------------------------


def test_compiled_tables_match_their_sources():
    header = SOURCE_DIR / "quant" / "coli_quant_tables.h"
    assert header.read_text() == qk.render_tables_header()
    grid, lut = qk.kernels().tables()
    src = json.loads((REPO / "reference" / "quant" / "iq3xxs_grid.json").read_text())
    assert grid.tolist() == src
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(lut, want, equal_nan=True)


# -- bad input: named errors, never a crash ----------------------------------------------------


def raw(m: qk.QuantMatrix, **changes: object) -> qk.QuantMatrix:
    """``m`` with fields replaced and no content check, to reach the C size checks."""
    fields = {f: getattr(m, f) for f in
              ("name", "fmt", "group_size", "out_features", "in_features", "payload", "scales")}
    fields.update(changes)
    return qk.QuantMatrix(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", [c for c in CASES if c[1].get("group_size", 64) == 64],
                         ids=case_id)
def test_corrupt_sizes_are_refused(case):
    m, _ = make(case)
    x = activations(2, m.in_features)
    fmt, kw, shape = case
    with pytest.raises(qk.PayloadSizeError):
        qk.qmatmul(raw(m, payload=m.payload[:-1]), x)
    with pytest.raises(qk.PayloadSizeError):
        qk.quant_matrix(fmt, np.append(m.payload, np.uint8(0)), m.scales, shape,
                        group_size=kw.get("group_size"))
    with pytest.raises(qk.ScaleCountError):
        qk.qmatmul(raw(m, scales=np.append(m.scales, np.float32(1))), x)
    with pytest.raises(qk.PayloadSizeError):  # the payload no longer fits one more row
        qk.qmatmul(raw(m, out_features=m.out_features + 1), activations(2, m.in_features))
    with pytest.raises(qk.ShapeError):
        qk.qmatmul(m, activations(2, m.in_features + 1))
    with pytest.raises(qk.OutputRangeError):
        qk.qmatmul(m, x, o_range=(2, 1))
    with pytest.raises(qk.OutputRangeError):
        qk.qmatmul(m, x, o_range=(0, m.out_features + 1))
    with pytest.raises(qk.StrideError):
        qk.qmatmul(m, x, out=np.zeros((2, m.out_features + 1), np.float32))
    with pytest.raises(qk.ShapeError):
        qk.qmatmul(raw(m, out_features=0), x)


def test_bad_group_size_format_and_content_are_refused():
    m, _ = make(("int4-grouped", {"group_size": 64}, (11, 301)))
    x = activations(1, m.in_features)
    with pytest.raises(qk.GroupSizeError):
        qk.qmatmul(raw(m, group_size=40), x)
    with pytest.raises(qk.UnknownFormatError):
        qk.qmatmul(raw(m, fmt=7), x)
    with pytest.raises(qk.UnknownFormatError):
        qk.quant_matrix("f32", m.payload, m.scales, (11, 301))
    bad = m.scales.copy()
    bad[3] = np.inf
    with pytest.raises(qk.NonFiniteScaleError):
        qk.quant_matrix("int4-grouped", m.payload, bad, (11, 301))

    f, _ = make(("fp8-e4m3-b128", {}, (37, 77)))
    nan = f.payload.copy()
    nan[100] = 0xFF
    with pytest.raises(qk.Fp8NanError):
        qk.quant_matrix("fp8-e4m3-b128", nan, f.scales, (37, 77))

    e, _ = make(("e8-iq3-lattice", {}, (9, 256)))
    with pytest.raises(qk.E8TagError):
        qk.qmatmul(raw(e, scales=np.array([1.0], np.float32)), activations(1, 256))
    with pytest.raises(qk.ShapeError):
        qk.qmatmul(raw(e, in_features=250), activations(1, 250))
    inf = e.payload.copy()
    inf[98 * 4 + 96 : 98 * 4 + 98] = (0x00, 0x7C)  # block 4's fp16 super-scale = +inf
    with pytest.raises(qk.NonFiniteScaleError):
        qk.quant_matrix("e8-iq3-lattice", inf, e.scales, (9, 256))


def test_c_entry_points_refuse_nulls_and_negative_rows():
    k = qk.kernels()
    m, _ = make(CASES[0])
    rc = k.lib.coli_q_matmul(int(m.fmt), 0, None, m.payload.size, m.scales.ctypes.data,
                             m.scales.size, m.out_features, m.in_features, None, 1, 77,
                             None, 37, 0, 37, 0)
    assert qk.ERRORS[rc] is qk.NullPointerError
    x = activations(1, 77)
    y = np.zeros((1, 37), np.float32)
    rc = k.lib.coli_q_matmul(int(m.fmt), 0, m.payload.ctypes.data, m.payload.size,
                             m.scales.ctypes.data, m.scales.size, 37, 77, x.ctypes.data, -1,
                             77, y.ctypes.data, 37, 0, 37, 0)
    assert qk.ERRORS[rc] is qk.StrideError
    nb, ns = ctypes.c_int64(), ctypes.c_int64()
    assert k.lib.coli_q_sizes(6, 0, 2, 512, ctypes.byref(nb), ctypes.byref(ns)) == 0
    assert (nb.value, ns.value) == (2 * 2 * 98, 1)
    assert k.sizes(Fmt.FP8_E4M3_B128, 129, 300) == (129 * 300, 2 * 3)
    assert k.lib.coli_q_strerror(3) == b"packed byte count does not fit the shape and format"


def test_the_bound_catches_one_wrong_weight():
    m, deq = make(("int4-row", {}, (37, 77)))
    x = activations(3, m.in_features)
    payload = m.payload.copy()
    payload[5 * 39 + 10] ^= 0x01  # row 5, column 20: one int4 level off
    y = qk.qmatmul(raw(m, payload=payload), x)
    with pytest.raises(AssertionError, match="bound"):
        assert_close(y, deq, x)
    assert_close(np.delete(y, 5, axis=1), np.delete(deq, 5, axis=0), x)


def test_bench_section_reports_every_format_side_by_side():
    from colibri.benchmarks import BenchOptions, load_sections

    section = load_sections()["quant-kernels"]
    report = section.run(BenchOptions(extra={"quant_shape": (8, 256), "quant_repeats": 1}))
    assert report["shape"] == [8, 256]
    assert set(report["formats"]) == {
        "int8-row", "int4-row", "int4-grouped-64", "int4-grouped-128", "int3-g64",
        "int2-row", "fp8-e4m3-b128", "e8-iq3-lattice",
    }
    for entry in report["formats"].values():
        assert entry["packed_bytes"] > 0 and "numpy_gbps" in entry
        for variant in report["variants"]:
            assert set(entry[variant]) == {
                "fused_ms", "fused_gbps", "speedup_vs_numpy", "batch_ms", "batch_sharing",
            }
