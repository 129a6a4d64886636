"""``colibri convert``: HF checkpoints (f32, fused experts, HF FP8) into colibri containers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from colibri.reference.quant import Fmt, dequantize, quantize
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.convert import convert
from colibri.reference.quant.safetensors_file import SafetensorsDir, write_safetensors

from colibri.cli import main

D, M, E = 256, 256, 2
L = 1  # the sparse layer


def expert(e: int, proj: str) -> str:
    return f"model.layers.{L}.mlp.experts.{e}.{proj}.weight"


def rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.05, shape).astype(np.float32)


def base_tensors() -> dict[str, np.ndarray]:
    return {
        "model.embed_tokens.weight": rand((16, D), 1),
        "lm_head.weight": rand((16, D), 2),
        "model.norm.weight": np.ones(D, np.float32),
        f"model.layers.{L}.self_attn.o_proj.weight": rand((D, 128), 3),
        f"model.layers.{L}.mlp.gate.weight": rand((E, D), 4),
        f"model.layers.{L}.mlp.gate.e_score_correction_bias": np.zeros(E, np.float32),
    }


def hf_dir(tmp_path: Path, tensors: dict[str, np.ndarray], config: dict | None = None) -> Path:
    src = tmp_path / "hf"
    src.mkdir()
    write_safetensors(src / "model.safetensors", tensors)
    (src / "config.json").write_text(json.dumps(config or {"hidden_size": D}))
    (src / "generation_config.json").write_text("{}")
    return src


def unfused(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    tensors = base_tensors()
    for e in range(E):
        tensors[expert(e, "gate_proj")] = rand((M, D), 10 + e)
        tensors[expert(e, "up_proj")] = rand((M, D), 20 + e)
        tensors[expert(e, "down_proj")] = rand((D, M), 30 + e)
    return hf_dir(tmp_path, tensors), tensors


@pytest.mark.parametrize(
    ("scheme", "fmt"),
    [
        ("int4g64", Fmt.INT4_GROUPED),
        ("int4", Fmt.INT4_ROW),
        ("e8", Fmt.E8_IQ3),
        ("int3", Fmt.INT3_G64),
        ("fp8", Fmt.FP8_E4M3_B128),
    ],
)
def test_experts_are_quantized_and_the_rest_kept(tmp_path: Path, scheme: str, fmt: Fmt) -> None:
    src, tensors = unfused(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", "--model", str(src), "--out", str(out), "--experts", scheme]) == 0
    container = QuantContainer.open(out)
    name = expert(1, "down_proj")
    info = container.tensor_format(name, (D, M))
    # The format is not stored: an int4-row tensor has one scale per row, the same sizes as
    # int4-grouped with gs = I, and that tie reads as int4-grouped (spec/model.md, "Without a
    # stamp"): the same numbers, as the dequantized comparison below shows.
    assert info.fmt == (Fmt.INT4_GROUPED if fmt == Fmt.INT4_ROW else fmt)
    payload, scales = quantize(fmt, tensors[name], group_size=64)
    np.testing.assert_array_equal(
        container.weight(name, (D, M)), dequantize(fmt, payload, scales, (D, M))
    )
    for kept in ("model.embed_tokens.weight", f"model.layers.{L}.self_attn.o_proj.weight"):
        assert not container.is_quantized(kept)
        np.testing.assert_array_equal(container.files.float32(kept), tensors[kept])
    assert (out / "generation_config.json").is_file()


IO_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def test_io_int8_writes_the_embedding_and_lm_head_as_int8_row(tmp_path: Path) -> None:
    """``--io int8`` (colibri's ``--io-bits 8``): exactly the embedding and the lm_head become
    int8-row with a ``.qs`` sidecar; the norms, router and ``--dense`` weights are untouched."""
    src, tensors = unfused(tmp_path)
    out = tmp_path / "out"
    argv = ["convert", "--model", str(src), "--out", str(out), "--experts", "int4g64"]
    assert main([*argv, "--io", "int8"]) == 0
    container = QuantContainer.open(out)
    for name in IO_TENSORS:
        shape = tensors[name].shape
        assert container.tensor_format(name, shape).fmt == Fmt.INT8_ROW
        payload, scales = quantize(Fmt.INT8_ROW, tensors[name])
        np.testing.assert_array_equal(container.files.raw(name).reshape(-1), payload)
        np.testing.assert_array_equal(container.files.float32(name + ".qs"), scales)
    for kept in (f"model.layers.{L}.self_attn.o_proj.weight", f"model.layers.{L}.mlp.gate.weight",
                 "model.norm.weight"):
        assert not container.is_quantized(kept)
        np.testing.assert_array_equal(container.files.float32(kept), tensors[kept])


def test_io_defaults_to_f32_and_refuses_unknown_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, tensors = unfused(tmp_path)
    report = convert(src, tmp_path / "default", "int8")
    container = QuantContainer.open(tmp_path / "default")
    for name in IO_TENSORS:
        assert not container.is_quantized(name)
        np.testing.assert_array_equal(container.files.float32(name), tensors[name])
    # the io pair, the norm, o_proj (--dense f32), the router and its bias
    assert report.formats["f32"] == 6
    with pytest.raises(ValueError, match="--io must be one of f32, int8"):
        convert(src, tmp_path / "bad", "int8", io="int4")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit):
        main(["convert", "--model", str(src), "--out", str(tmp_path / "o"), "--experts", "int8",
              "--io", "int4"])
    assert "invalid choice" in capsys.readouterr().err


def test_fused_experts_are_split(tmp_path: Path) -> None:
    tensors = base_tensors()
    gate_up = rand((E, 2 * M, D), 7)
    down = rand((E, D, M), 8)
    tensors[f"model.layers.{L}.mlp.experts.gate_up_proj"] = gate_up
    tensors[f"model.layers.{L}.mlp.experts.down_proj"] = down
    out = tmp_path / "out"
    convert(hf_dir(tmp_path, tensors), out, "int8")
    container = QuantContainer.open(out)
    up = container.weight(expert(1, "up_proj"), (M, D))
    payload, scales = quantize(Fmt.INT8_ROW, gate_up[1, M:])
    np.testing.assert_array_equal(up, dequantize(1, payload, scales, (M, D)))
    assert f"model.layers.{L}.mlp.experts.gate_up_proj" not in container


def fp8_checkpoint(tmp_path: Path, scale_dtype: str = "F32") -> tuple[Path, dict[str, np.ndarray]]:
    tensors = base_tensors()
    for e in range(E):
        for i, (proj, shape) in enumerate(
            (("gate_proj", (M, D)), ("up_proj", (M, D)), ("down_proj", (D, M)))
        ):
            payload, scales = quantize(Fmt.FP8_E4M3_B128, rand(shape, 40 + 3 * e + i))
            name = expert(e, proj)
            tensors[name] = payload.view(ml_dtypes.float8_e4m3fn).reshape(shape)
            grid = scales.reshape(shape[0] // 128, shape[1] // 128)
            if scale_dtype == "F8_E8M0":
                grid = grid.astype(ml_dtypes.float8_e8m0fnu)
            tensors[name + "_scale_inv"] = grid
    config = {"hidden_size": D, "quantization_config": {"quant_method": "fp8"}}
    return hf_dir(tmp_path, tensors, config), tensors


def test_hf_fp8_passes_through_byte_for_byte(tmp_path: Path) -> None:
    src, tensors = fp8_checkpoint(tmp_path)
    out = tmp_path / "out"
    convert(src, out, "fp8")
    files = SafetensorsDir(out)
    name = expert(0, "down_proj")
    assert files.raw(name).tobytes() == tensors[name].tobytes()
    assert files.array(name + ".qs").tobytes() == tensors[name + "_scale_inv"].tobytes()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())


def test_hf_fp8_requantizes_to_other_formats(tmp_path: Path) -> None:
    src, tensors = fp8_checkpoint(tmp_path)
    out = tmp_path / "out"
    convert(src, out, "int4g64")
    name = expert(1, "gate_proj")
    source = dequantize(
        8, tensors[name].view(np.uint8).reshape(-1), tensors[name + "_scale_inv"], (M, D)
    )
    payload, scales = quantize(Fmt.INT4_GROUPED, source, group_size=64)
    got = QuantContainer.open(out).weight(name, (M, D))
    np.testing.assert_array_equal(got, dequantize(4, payload, scales, (M, D)))


def test_hf_fp8_with_ue8m0_scales_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = fp8_checkpoint(tmp_path, "F8_E8M0")
    rc = main(["convert", "--model", str(src), "--out", str(tmp_path / "o"), "--experts", "fp8"])
    assert rc == 1
    err = capsys.readouterr().err
    assert expert(0, "down_proj") in err and "UE8M0" in err


def test_non_empty_output_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = unfused(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    rc = main(["convert", "--model", str(src), "--out", str(out), "--experts", "int8"])
    assert rc == 1 and "refusing to overwrite" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "precious"


def test_e8_dense_width_must_be_a_multiple_of_256(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = unfused(tmp_path)  # o_proj is [256, 128]
    rc = main(
        [
            "convert",
            "--model",
            str(src),
            "--out",
            str(tmp_path / "o"),
            "--experts",
            "e8",
            "--dense",
            "e8",
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "o_proj" in err and "multiple of 256" in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_progress_reaches_the_total(tmp_path: Path) -> None:
    """One callback per tensor, with its input bytes and the fixed total; the CLI's tqdm bar
    drawn from it ends at 100%."""
    from colibri.commands.progress import byte_progress

    src, _ = unfused(tmp_path)
    calls: list[tuple[int, int]] = []
    report = convert(src, tmp_path / "out", "int2", progress=lambda n, t: calls.append((n, t)))
    assert len(calls) == report.tensors and {t for _, t in calls} == {report.input_bytes}
    assert sum(n for n, _ in calls) == report.input_bytes
    stream = io.StringIO()
    advance, close = byte_progress("convert", stream)
    convert(src, tmp_path / "again", "int2", progress=advance)
    close()
    assert "100%" in stream.getvalue() and "convert" in stream.getvalue()


def test_ambiguous_shapes_get_a_stamp(tmp_path: Path) -> None:
    # gate [1, 100] fp8: unstamped it would read as int8-row; the converter stamps it.
    tensors = base_tensors()
    for e in range(E):
        tensors[expert(e, "gate_proj")] = rand((1, 100), e)
        tensors[expert(e, "up_proj")] = rand((1, 100), 5 + e)
        tensors[expert(e, "down_proj")] = rand((100, 1), 9 + e)
    out = tmp_path / "out"
    report = convert(hf_dir(tmp_path, tensors), out, "fp8")
    assert expert(0, "gate_proj") in report.stamped and expert(0, "down_proj") not in report.stamped
    container = QuantContainer.open(out)
    assert container.tensor_format(expert(0, "gate_proj"), (1, 100)).fmt == Fmt.FP8_E4M3_B128


def test_large_models_are_split_into_shards(tmp_path: Path) -> None:
    src, tensors = unfused(tmp_path)
    out = tmp_path / "out"
    report = convert(src, out, "int4g64", shard_bytes=100_000)
    assert len(report.shards) > 1
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(report.shards)
    container = QuantContainer.open(out)
    name = expert(1, "up_proj")
    payload, scales = quantize(Fmt.INT4_GROUPED, tensors[name], group_size=64)
    np.testing.assert_array_equal(
        container.weight(name, (M, D)), dequantize(4, payload, scales, (M, D))
    )
