"""Reading quantized containers: resolution, refusals naming tensor and rule, the expert LRU."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from colibri.reference.experts import expert_tensor_names
from colibri.reference.quant import Fmt, QuantFormatError, dequantize, quantize
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.expert_store import PROJECTIONS, QuantizedExpertStore
from colibri.reference.quant.resolve import resolve_format
from colibri.reference.quant.safetensors_file import (
    ContainerError,
    SafetensorsDir,
    write_safetensors,
)

HIDDEN, INTER = 256, 256
NAME = "model.layers.3.mlp.experts.0.gate_proj.weight"


def expert_name(layer: int, expert: int, projection: str) -> str:
    """One projection's tensor name, by the engine's own naming rule."""
    return dict(zip(PROJECTIONS, expert_tensor_names(layer, expert), strict=True))[projection]


def weights(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, shape).astype(np.float32)


def write(tmp_path: Path, tensors: dict[str, np.ndarray], stamps: dict[str, str] | None = None):
    meta = {"colibri.fmt": json.dumps(stamps)} if stamps else None
    write_safetensors(tmp_path / "model.safetensors", tensors, meta)
    return QuantContainer.open(tmp_path)


def quantized(name: str, fmt: str, w: np.ndarray, **params: int) -> dict[str, np.ndarray]:
    payload, scales = quantize(fmt, w, **params)
    return {name: payload, name + ".qs": scales}


@pytest.mark.parametrize(
    "fmt", ["int8-row", "int4-row", "int2-row", "int4-grouped", "int3-g64", "e8-iq3-lattice"]
)
def test_container_weight_equals_codec(tmp_path: Path, fmt: str) -> None:
    w = weights((INTER, HIDDEN))
    tensors = quantized(NAME, fmt, w)
    container = write(tmp_path, tensors)
    info = container.tensor_format(NAME, (INTER, HIDDEN))
    assert info.fmt.name.lower().replace("_", "-").startswith(fmt.split("-")[0])
    expected = dequantize(fmt, tensors[NAME], tensors[NAME + ".qs"], w.shape)
    np.testing.assert_array_equal(container.weight(NAME, (INTER, HIDDEN)), expected)


def test_fp8_at_a_shape_that_is_not_ambiguous(tmp_path: Path) -> None:
    w = weights((300, 200))
    container = write(tmp_path, quantized(NAME, "fp8-e4m3-b128", w))
    assert container.tensor_format(NAME, (300, 200)).fmt == Fmt.FP8_E4M3_B128


def test_stamp_overrides_the_int8_default(tmp_path: Path) -> None:
    w = weights((1, 100))
    tensors = quantized(NAME, "fp8-e4m3-b128", w)
    assert write(tmp_path, tensors).tensor_format(NAME, (1, 100)).fmt == Fmt.INT8_ROW
    stamped = write(tmp_path, tensors, {NAME: "fp8-e4m3-b128"})
    assert stamped.tensor_format(NAME, (1, 100)).fmt == Fmt.FP8_E4M3_B128


def refused(fn, *rule: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(QuantFormatError) as info:
        fn()
    message = str(info.value)
    assert NAME in message
    for part in rule:
        assert part in message
    return message


def test_sizes_fitting_no_format_are_refused(tmp_path: Path) -> None:
    container = write(
        tmp_path,
        {NAME: np.zeros(1234, np.uint8), NAME + ".qs": np.ones(INTER, np.float32)},
    )
    refused(lambda: container.weight(NAME, (INTER, HIDDEN)), "1234 bytes", "no int8")


def test_missing_qs_is_refused(tmp_path: Path) -> None:
    container = write(tmp_path, {NAME: np.zeros(INTER * HIDDEN // 2, np.uint8)})
    refused(lambda: container.weight(NAME, (INTER, HIDDEN)), ".qs", "without")


def test_wrong_size_qs_is_refused(tmp_path: Path) -> None:
    tensors = quantized(NAME, "int4-row", weights((INTER, HIDDEN)))
    tensors[NAME + ".qs"] = tensors[NAME + ".qs"][:-1]
    container = write(tmp_path, tensors)
    refused(lambda: container.weight(NAME, (INTER, HIDDEN)), "scale array", "expects")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scales_are_refused(tmp_path: Path, bad: float) -> None:
    tensors = quantized(NAME, "int4-grouped", weights((INTER, HIDDEN)))
    tensors[NAME + ".qs"] = tensors[NAME + ".qs"].copy()
    tensors[NAME + ".qs"][7] = bad
    container = write(tmp_path, tensors)
    refused(lambda: container.weight(NAME, (INTER, HIDDEN)), "scale #7", "finite")


def test_e8_non_finite_super_scale_is_refused() -> None:
    payload, tag = quantize("e8-iq3-lattice", weights((2, 256)))
    payload = payload.copy()
    payload[96:98] = np.array([0x7C00], "<u2").view(np.uint8)  # +inf
    with pytest.raises(QuantFormatError, match="non-finite fp16 scale"):
        dequantize(6, payload, tag, (2, 256), name=NAME)


def test_e8_width_not_multiple_of_256_is_refused(tmp_path: Path) -> None:
    rows, cols = 4, 384  # two super-blocks per row fit the bytes, but 384 % 256 != 0
    container = write(
        tmp_path,
        {NAME: np.zeros(rows * 2 * 98, np.uint8), NAME + ".qs": np.array([6.0], np.float32)},
    )
    refused(lambda: container.weight(NAME, (rows, cols)), "multiple of 256", "384")
    with pytest.raises(QuantFormatError, match="multiple of 256"):
        quantize(6, weights((rows, cols)), name=NAME)


def test_e8_tag_must_be_six(tmp_path: Path) -> None:
    tensors = quantized(NAME, "e8-iq3-lattice", weights((4, 256)))
    tensors[NAME + ".qs"] = np.array([5.0], np.float32)
    refused(lambda: write(tmp_path, tensors).weight(NAME, (4, 256)), "tag 6.0")


def test_fp8_ue8m0_scales_are_refused(tmp_path: Path) -> None:
    payload, _ = quantize("fp8-e4m3-b128", weights((300, 200)))
    ue8m0 = np.full((3, 2), 1.0, dtype=ml_dtypes.float8_e8m0fnu)
    container = write(tmp_path, {NAME: payload, NAME + ".qs": ue8m0})
    refused(lambda: container.weight(NAME, (300, 200)), "UE8M0", "f32")
    with pytest.raises(QuantFormatError, match="UE8M0"):
        resolve_format(NAME, 300, 200, 60000, 6, scale_dtype="U8")


def test_fp8_nan_codes_are_refused() -> None:
    payload, scales = quantize("fp8-e4m3-b128", weights((4, 8)))
    payload = payload.copy()
    payload[3] = 0x7F
    with pytest.raises(QuantFormatError, match="NaN"):
        dequantize(8, payload, scales, (4, 8), name=NAME)


def test_stamp_that_disagrees_with_the_bytes_is_refused(tmp_path: Path) -> None:
    tensors = quantized(NAME, "int4-row", weights((INTER, HIDDEN)))
    container = write(tmp_path, tensors, {NAME: "int8-row"})
    refused(lambda: container.weight(NAME, (INTER, HIDDEN)), "stamp says int8-row", "int4")
    unknown = write(tmp_path, tensors, {NAME: "int5-magic"})
    refused(lambda: unknown.weight(NAME, (INTER, HIDDEN)), "int5-magic")


def test_e8_fp8_collision_needs_a_stamp(tmp_path: Path) -> None:
    # width 98: 98 e8 bytes per row == 98 fp8 bytes per row, and both carry one f32 scale.
    tensors = {NAME: np.zeros(4 * 98, np.uint8), NAME + ".qs": np.array([6.0], np.float32)}
    refused(lambda: write(tmp_path, tensors).weight(NAME, (4, 98)), "stamp is required")


def test_float_weight_with_wrong_shape_is_refused(tmp_path: Path) -> None:
    container = write(tmp_path, {NAME: weights((4, 8))})
    refused(lambda: container.weight(NAME, (8, 4)), "stored shape")


def test_conflicting_stamps_across_shards_are_refused(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "a.safetensors", {"x": np.zeros(1, np.float32)},
        {"colibri.fmt": json.dumps({NAME: "int8-row"})},
    )
    write_safetensors(
        tmp_path / "b.safetensors", {"y": np.zeros(1, np.float32)},
        {"colibri.fmt": json.dumps({NAME: "fp8-e4m3-b128"})},
    )
    with pytest.raises(ContainerError, match="disagree"):
        SafetensorsDir(tmp_path)


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"x": np.zeros(64, np.float32)})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ContainerError, match="out of range"):
        SafetensorsDir(tmp_path)


def expert_container(tmp_path: Path, fmt: str, experts: int = 4) -> QuantContainer:
    tensors: dict[str, np.ndarray] = {}
    shapes = {
        "gate_proj": (INTER, HIDDEN),
        "up_proj": (INTER, HIDDEN),
        "down_proj": (HIDDEN, INTER),
    }
    for e in range(experts):
        for i, (proj, shape) in enumerate(shapes.items()):
            tensors.update(quantized(expert_name(3, e, proj), fmt, weights(shape, 10 * e + i)))
    return write(tmp_path, tensors)


def test_expert_store_is_a_byte_bounded_lru(tmp_path: Path) -> None:
    container = expert_container(tmp_path, "int4-grouped")
    one = 3 * INTER * HIDDEN * 4
    store = QuantizedExpertStore(container, HIDDEN, INTER, budget_bytes=2 * one)
    first = store.expert(3, 0)
    assert store.expert(3, 0) is first and store.stats.hits == 1
    store.expert(3, 1)
    store.expert(3, 0)  # 0 becomes most recent
    store.expert(3, 2)  # evicts 1
    assert store.stats.evictions == 1 and store.resident_bytes == 2 * one
    assert store.expert(3, 0) is first
    misses = store.stats.misses
    store.expert(3, 1)
    assert store.stats.misses == misses + 1
    np.testing.assert_array_equal(
        first.down, container.weight(expert_name(3, 0, "down_proj"), (HIDDEN, INTER))
    )
    assert store.bytes_on_disk(3, 0) < one / 6


def test_expert_larger_than_budget_is_served_uncached(tmp_path: Path) -> None:
    store = QuantizedExpertStore(expert_container(tmp_path, "int8-row", 1), HIDDEN, INTER, 1000)
    assert store.expert(3, 0).gate.shape == (INTER, HIDDEN)
    assert len(store) == 0 and store.resident_bytes == 0


def test_e8_must_cover_all_three_projections(tmp_path: Path) -> None:
    e8 = "e8-iq3-lattice"
    tensors = {}
    tensors.update(quantized(expert_name(3, 0, "gate_proj"), e8, weights((INTER, HIDDEN))))
    tensors.update(quantized(expert_name(3, 0, "up_proj"), "int8-row", weights((INTER, HIDDEN))))
    tensors.update(quantized(expert_name(3, 0, "down_proj"), e8, weights((HIDDEN, INTER))))
    store = QuantizedExpertStore(write(tmp_path, tensors), HIDDEN, INTER)
    with pytest.raises(QuantFormatError, match="all three projections"):
        store.expert(3, 0)
