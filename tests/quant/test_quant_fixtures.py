"""The quantized fixtures run token-exact against transformers on the dequantized weights."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, max_excess
from colibri.reference import load_model
from colibri.reference.quant import Fmt
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.convert import convert
from colibri.reference.quant.expert_store import QuantizedExpertStore
from colibri.reference.quant.safetensors_file import SafetensorsDir, write_safetensors
from support.reference_support import greedy, oracle

from colibri.resources import fixture_model_dir

FIXTURES = {
    "glm5-tiny-int4g64": {Fmt.INT4_GROUPED},
    # [128, 128] int4-row carries one scale per row = one group of 128: colibri (and we) read
    # it as int4-grouped with gs = 128, which is the same numbers.
    "glm5-tiny-int4row": {Fmt.INT4_ROW, Fmt.INT4_GROUPED},
    "glm5-tiny-e8": {Fmt.E8_IQ3},
    "glm5-tiny-fp8": {Fmt.FP8_E4M3_B128},
}


def expert_shapes(path: Path) -> dict[str, tuple[int, int]]:
    config = json.loads((path / "config.json").read_text())
    d, m = config["hidden_size"], config["moe_intermediate_size"]
    shapes = {}
    for name in SafetensorsDir(path).tensors:
        if ".mlp.experts." in name and not name.endswith(".qs"):
            shapes[name] = (d, m) if ".down_proj." in name else (m, d)
    return dict(sorted(shapes.items()))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_quantized_fixture_matches_the_oracle(name: str) -> None:
    path = fixture_model_dir(name)
    expected = oracle(name)
    model = load_model(path)
    assert isinstance(model.experts, QuantizedExpertStore)
    full = expected["full_ids"]
    logits = model.forward(full)
    reference = np.load(path / "oracle_logits.npy")
    tolerance = Tolerance.for_model_dir(path, positions=len(full))  # spec/model.md §15
    assert max_excess(logits, reference, tolerance.logit) <= 0
    assert [int(i) for i in np.argmax(logits, axis=-1)] == expected["tf_pred"]
    prompt = expected["prompt_ids"]
    assert greedy(model, prompt, len(full) - len(prompt)) == full


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_reader_recovers_the_oracles_weights(name: str) -> None:
    path = fixture_model_dir(name)
    record = oracle(name)["quantization"]
    container = QuantContainer.open(path)
    digest = hashlib.sha256()
    shapes = expert_shapes(path)
    assert len(shapes) == record["quantized_tensors"]
    for tensor, shape in shapes.items():
        assert container.tensor_format(tensor, shape).fmt in FIXTURES[name]
        digest.update(container.weight(tensor, shape).tobytes())
    assert digest.hexdigest() == record["dequantized_sha256"]


def as_hf_fp8(container_dir: Path, out: Path) -> None:
    """The fp8 fixture in HF's FP8 checkpoint layout (F8_E4M3 + ``weight_scale_inv``)."""
    out.mkdir()
    files = SafetensorsDir(container_dir)
    shapes = expert_shapes(container_dir)
    tensors: dict[str, np.ndarray] = {}
    for name in files.tensors:
        if name.endswith(".qs"):
            continue
        if name in shapes:
            rows, cols = shapes[name]
            tensors[name] = (
                np.array(files.raw(name)).view(ml_dtypes.float8_e4m3fn).reshape(rows, cols)
            )
            grid = (-(-rows // 128), -(-cols // 128))
            tensors[name + "_scale_inv"] = np.array(files.array(name + ".qs")).reshape(grid)
        else:
            tensors[name] = np.array(files.array(name))
    write_safetensors(out / "model.safetensors", tensors)
    for extra in ("config.json", "generation_config.json"):
        shutil.copyfile(container_dir / extra, out / extra)


def test_hf_fp8_checkpoint_converts_to_the_fp8_fixture(tmp_path: Path) -> None:
    fixture = fixture_model_dir("glm5-tiny-fp8")
    as_hf_fp8(fixture, tmp_path / "hf")
    report = convert(tmp_path / "hf", tmp_path / "out", "fp8")
    assert report.formats == {"f32": report.tensors - report.quantized, "fp8-e4m3-b128": 48}
    want, got = SafetensorsDir(fixture), SafetensorsDir(tmp_path / "out")
    assert sorted(want.tensors) == sorted(got.tensors)
    for name in want.tensors:
        if want.entry(name).dtype == "U8" or name.endswith(".qs"):
            # the fp8 experts and their block scales pass through byte for byte
            assert want.raw(name).tobytes() == got.raw(name).tobytes(), name
        else:
            # everything kept becomes F32 (the fixture stores bf16): same values
            assert got.entry(name).dtype == "F32", name
            np.testing.assert_array_equal(got.float32(name), want.float32(name))
    model = load_model(tmp_path / "out")
    expected = oracle("glm5-tiny-fp8")
    assert [int(i) for i in np.argmax(model.forward(expected["full_ids"]), -1)] == expected[
        "tf_pred"
    ]
