"""``load_model`` on colibri containers: quantized dense weights, refusals at load time."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from colibri.reference import CheckpointError, load_model
from colibri.reference.quant import Fmt, QuantFormatError, dequantize, quantize
from colibri.reference.quant.convert import convert
from colibri.reference.quant.loading import CACHE_ENV, cache_budget_bytes
from colibri.reference.quant.safetensors_file import SafetensorsDir, write_safetensors

from colibri.resources import fixture_model_dir

O_PROJ = "model.layers.0.self_attn.o_proj.weight"
EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"


def test_quantized_dense_weights_are_dequantized_at_load(tmp_path: Path) -> None:
    source = fixture_model_dir("glm5-tiny")
    out = tmp_path / "dense"
    convert(source, out, "int4g64", "int8")
    model = load_model(out)
    original = SafetensorsDir(source).float32(O_PROJ)
    payload, scales = quantize(Fmt.INT8_ROW, original)
    expected = dequantize(Fmt.INT8_ROW, payload, scales, original.shape)
    np.testing.assert_array_equal(model.layers[0].attention.o, expected)
    logits = model.forward([3, 14, 159])
    assert logits.shape == (3, model.config.vocab_size) and np.isfinite(logits).all()


def rewrite(src: Path, dst: Path, **changes: np.ndarray | None) -> Path:
    """Copy a container, replacing (array) or dropping (None) the named tensors."""
    shutil.copytree(src, dst)
    files = SafetensorsDir(src)
    tensors = {n: np.array(files.array(n)) for n in files.tensors}
    for key, value in changes.items():
        name = key.replace("__", ".")
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    write_safetensors(dst / "model.safetensors", tensors, files.metadata["model.safetensors"])
    return dst


def test_bad_expert_is_refused_at_load(tmp_path: Path) -> None:
    src = fixture_model_dir("glm5-tiny-int4g64")
    short = np.array(SafetensorsDir(src).array(EXPERT + ".qs"))[:-1]
    broken = rewrite(src, tmp_path / "short", **{EXPERT.replace(".", "__") + "__qs": short})
    with pytest.raises(QuantFormatError, match="scale array") as info:
        load_model(broken)
    assert EXPERT in str(info.value)
    missing = rewrite(src, tmp_path / "noqs", **{EXPERT.replace(".", "__") + "__qs": None})
    with pytest.raises(CheckpointError, match=r"\.qs"):
        load_model(missing)


def test_non_finite_expert_scale_is_refused_on_first_use(tmp_path: Path) -> None:
    # Scales are read when the expert is first dequantized, not at load (they are GBs on GLM-5).
    src = fixture_model_dir("glm5-tiny-int4g64")
    bad = np.array(SafetensorsDir(src).array(EXPERT + ".qs"))
    bad[5] = np.inf
    model = load_model(rewrite(src, tmp_path / "inf", **{EXPERT.replace(".", "__") + "__qs": bad}))
    with pytest.raises(QuantFormatError, match="finite") as info:
        model.experts.expert(1, 3)
    assert EXPERT in str(info.value)


def test_converting_a_container_again_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="already a colibri container"):
        convert(fixture_model_dir("glm5-tiny-e8"), tmp_path / "o", "int8")
    assert not (tmp_path / "o").exists()


def test_f32_checkpoints_keep_the_mapped_store() -> None:
    model = load_model(fixture_model_dir("glm5-tiny"))
    assert type(model.experts).__name__ == "MappedExpertStore"


def test_cache_budget_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "3")
    assert cache_budget_bytes() == 3 << 20
    monkeypatch.setenv(CACHE_ENV, "lots")
    with pytest.raises(ValueError, match=CACHE_ENV):
        cache_budget_bytes()


def test_ue8m0_expert_scales_are_refused_at_load(tmp_path: Path) -> None:
    import ml_dtypes

    src = fixture_model_dir("glm5-tiny-fp8")
    qs = np.array(SafetensorsDir(src).array(EXPERT + ".qs"))
    ue8m0 = qs.astype(ml_dtypes.float8_e8m0fnu)
    broken = rewrite(src, tmp_path / "ue8m0", **{EXPERT.replace(".", "__") + "__qs": ue8m0})
    with pytest.raises(QuantFormatError, match="UE8M0") as info:
        load_model(broken)
    assert EXPERT in str(info.value)
