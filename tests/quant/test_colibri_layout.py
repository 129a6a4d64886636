"""Containers in colibri's converters' layout, with and without the DSA indexer shard.

colibri's ``convert_fp8_to_int4.py`` writes ``out-NNNNN`` shards with no metadata, the MTP
layer in ``out-mtp-*`` and the DSA indexer only when asked, in ``out-idx-*``; its engine runs
the indexer only when those tensors are there. Our writer makes such containers
(``colibri convert --layout colibri [--no-indexer]``) and both engines must read them:

- with the indexer shard, the same logits as our own layout, byte for byte (kind c);
- without it, the indexer off: byte for byte the model whose config declares no indexer
  (kind c), and on a model whose indexer never selects (index_topk above the sequence),
  HF's own logits within the fixture's tolerance (kind b, spec/model.md §6 "Indexer off").
"""

from __future__ import annotations

import io
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, max_excess
from colibri.reference import ModelConfig, ReferenceModel, load_model
from colibri.reference.backend import open_backend
from colibri.reference.errors import CheckpointError
from colibri.reference.indexer_presence import without_indexer
from colibri.reference.quant.container import QuantContainer
from colibri.reference.quant.convert import EXPERT_SCHEMES, ConvertError, convert
from colibri.reference.quant.safetensors_file import SafetensorsDir, read_header
from colibri.reference.safetensors import Checkpoint, read_all, write_safetensors
from support.accelerated_support import BUILT, NOT_BUILT_REASON, needs_library

from colibri.cli import main
from colibri.doctor import check_model
from colibri.engine.registry import BackendOptions
from colibri.resources import fixture_model_dir

#: Longer than the source's index_topk (4), so the indexer selects and its shard matters.
IDS = [3, 14, 159, 26, 53, 58, 97, 93, 23, 84, 62, 64, 33, 83]


@cache
def float_source(root: Path) -> Path:
    """An HF float checkpoint with experts every format takes (e8 needs widths of 256): the
    e8 fixture's weights dequantized, its indexer made to select (index_topk 4)."""
    src = root / "hf-source"
    fixture = fixture_model_dir("glm5-tiny-e8")
    container = QuantContainer.open(fixture)
    config = ModelConfig.from_dir(fixture)
    width = (config.moe_intermediate_size, config.hidden_size)
    assert width == (width[1], width[0])  # square experts: one shape for all three
    tensors: dict[str, np.ndarray] = {}
    for name, entry in container.files.tensors.items():
        if name.endswith(".qs"):
            continue
        if container.is_quantized(name):
            tensors[name] = container.weight(name, width)
        else:
            tensors[name] = container.files.float32(name).reshape(entry.shape)
    src.mkdir(parents=True)
    write_safetensors(src / "model.safetensors", tensors)
    raw = json.loads((fixture / "config.json").read_text())
    raw["index_topk"] = 4
    (src / "config.json").write_text(json.dumps(raw))
    return src


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("colibri-layout")


def converted(root: Path, experts: str, layout: str, indexer: bool) -> Path:
    out = root / f"{experts}-{layout}-{'idx' if indexer else 'noidx'}"
    if not out.exists():
        convert(float_source(root), out, experts, layout=layout, indexer=indexer)
    return out


def logit_tolerance(fixture: str, positions: int) -> float:
    return Tolerance.for_model_dir(fixture_model_dir(fixture), positions=positions).logit


def top_margin(logits: np.ndarray) -> float:
    """The smallest top-1 minus top-2 logit over the positions."""
    top = np.sort(logits, axis=-1)
    return float((top[:, -1] - top[:, -2]).min())


def files(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.glob("*.safetensors"))


def reference_logits(model_dir: Path) -> np.ndarray:
    return load_model(model_dir).forward(IDS)


def accelerated_logits(model_dir: Path) -> np.ndarray:
    from colibri.accelerated import load_model as load_accelerated

    return load_accelerated(model_dir, threads=2).forward(IDS)


def reference_without_indexer(model_dir: Path) -> np.ndarray:
    """The same checkpoint run from a config that declares no indexer."""
    declared = load_model(model_dir)
    model = ReferenceModel(without_indexer(declared.config), declared.checkpoint, declared.experts)
    return model.forward(IDS)


@pytest.mark.parametrize("experts", EXPERT_SCHEMES)
def test_colibri_layout_files_and_metadata(root: Path, experts: str) -> None:
    with_idx = converted(root, experts, "colibri", True)
    without = converted(root, experts, "colibri", False)
    assert files(with_idx) == ["out-00000.safetensors", "out-idx-00000.safetensors"]
    assert files(without) == ["out-00000.safetensors"]
    idx_names = set(SafetensorsDir(with_idx).tensors) - set(SafetensorsDir(without).tensors)
    assert idx_names and all(".self_attn.indexer." in n for n in idx_names)
    for path in with_idx.glob("*.safetensors"):
        meta = read_header(path)[0].get("__metadata__", {})
        assert "format" not in meta  # colibri's converter writes no {"format": "pt"}
        stamps = json.loads(meta.get("colibri.fmt", "{}"))
        # colibri's repacker stamps every fp8 resident weight and never a routed expert.
        assert not [n for n in stamps if ".mlp.experts." in n]
        if experts == "fp8" and path.name == "out-00000.safetensors":
            assert "model.layers.0.self_attn.q_b_proj.weight" not in stamps  # --dense f32
    # Same tensors, same bytes as our own layout: only the files differ.
    ours, theirs = SafetensorsDir(converted(root, experts, "hf", True)), SafetensorsDir(with_idx)
    assert set(ours.tensors) == set(theirs.tensors)
    for name in ours.tensors:
        assert ours.raw(name).tobytes() == theirs.raw(name).tobytes(), name


@pytest.mark.parametrize("experts", EXPERT_SCHEMES)
def test_reference_reads_colibri_layout_like_our_own(root: Path, experts: str) -> None:
    ours = reference_logits(converted(root, experts, "hf", True))
    with_idx = reference_logits(converted(root, experts, "colibri", True))
    without = converted(root, experts, "colibri", False)
    assert with_idx.tobytes() == ours.tobytes()
    off = reference_logits(without)
    assert off.tobytes() == reference_without_indexer(converted(root, experts, "hf", True)
                                                      ).tobytes()
    # The indexer selects at these lengths: a reader that ignored out-idx would show here.
    assert off.tobytes() != ours.tobytes()


@needs_library
@pytest.mark.parametrize("experts", EXPERT_SCHEMES)
def test_accelerated_reads_colibri_layout_like_our_own(root: Path, experts: str) -> None:
    ours = accelerated_logits(converted(root, experts, "hf", True))
    assert accelerated_logits(converted(root, experts, "colibri", True)).tobytes() == ours.tobytes()
    without = converted(root, experts, "colibri", False)
    off = accelerated_logits(without)
    assert off.tobytes() != ours.tobytes()
    # Token for token with the reference's indexer-off run (kinds a and b).
    # The logit scale is the source's (its oracle is the e8 fixture's, whose weights these are).
    tolerance = logit_tolerance("glm5-tiny-e8", len(IDS))
    want = reference_logits(without)
    assert max_excess(off, want, tolerance) <= 0
    # Every top-1/top-2 margin is wider than two tolerances, so the argmaxes (kind a) follow
    # from the check above on any CPU; a model without that margin would fail here, loudly.
    assert top_margin(want) > 2 * tolerance
    assert np.array_equal(off.argmax(axis=-1), want.argmax(axis=-1))


def strip_indexer(fixture: str, dest: Path) -> Path:
    """The float fixture as colibri's converter lays out a container made without
    ``--indexer``: one ``out-00000`` shard, no metadata, no indexer tensors."""
    source = fixture_model_dir(fixture)
    dest.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "oracle.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    tensors = {k: v for k, v in read_all(source / "model.safetensors").items()
               if ".self_attn.indexer." not in k}
    write_safetensors(dest / "out-00000.safetensors", tensors)
    return dest


def test_indexer_off_matches_the_oracle_of_a_model_whose_indexer_never_selects(
    tmp_path: Path,
) -> None:
    # glm5-tiny's index_topk (4096) is above every oracle sequence: HF's DSA keeps all keys,
    # so its oracle is the indexer-off math.
    model_dir = strip_indexer("glm5-tiny", tmp_path / "glm5-tiny-noidx")
    oracle: dict[str, Any] = json.loads((model_dir / "oracle.json").read_text())
    ids = oracle["full_ids"]
    model = load_model(model_dir)
    assert model.config.indexer_types is None and model.indexer.dropped
    got = model.forward(ids)
    expected = np.load(fixture_model_dir("glm5-tiny") / "oracle_logits.npy")
    tolerance = logit_tolerance("glm5-tiny", len(ids))
    assert max_excess(got, expected, tolerance) <= 0


def test_indexer_off_is_the_model_declared_without_one(tmp_path: Path) -> None:
    model_dir = strip_indexer("glm5-tiny-dsa", tmp_path / "dsa-noidx")
    fixture = fixture_model_dir("glm5-tiny-dsa")
    causal = ReferenceModel(without_indexer(ModelConfig.from_dir(fixture)), Checkpoint(fixture))
    got = load_model(model_dir).forward(IDS)
    assert got.tobytes() == causal.forward(IDS).tobytes()
    assert got.tobytes() != load_model(fixture).forward(IDS).tobytes()


def test_incremental_decode_and_kv_records_follow_the_indexer_off(tmp_path: Path) -> None:
    model_dir = strip_indexer("glm5-tiny-dsa", tmp_path / "dsa-noidx")
    model = load_model(model_dir)
    state = model.new_state()
    prefill = model.prefill(state, IDS[:-1])
    step = model.decode(state, IDS[-1])
    whole = model.forward(IDS)
    tolerance = logit_tolerance("glm5-tiny-dsa", len(IDS))
    assert max_excess(np.vstack([prefill, step[None]]), whole, tolerance) <= 0
    # No layer keeps indexer keys: the KV record is the latent and rope key only.
    assert all(set(layer.widths) == {"latent", "rope_key"} for layer in state.layers)


def test_a_partly_stored_indexer_is_refused_by_name(tmp_path: Path) -> None:
    one_tensor = strip_indexer("glm5-tiny-dsa", tmp_path / "a")
    tensors = read_all(fixture_model_dir("glm5-tiny-dsa") / "model.safetensors")
    partial = {k: v for k, v in tensors.items()
               if k != "model.layers.2.self_attn.indexer.wk.weight"}
    (one_tensor / "out-00000.safetensors").unlink()
    write_safetensors(one_tensor / "out-00000.safetensors", partial)
    with pytest.raises(CheckpointError, match=r"layer 2's DSA indexer is incomplete: missing "
                                              r"model\.layers\.2\.self_attn\.indexer\.wk\.weight"):
        load_model(one_tensor)
    one_layer = strip_indexer("glm5-tiny-dsa", tmp_path / "b")
    layer0 = {k: v for k, v in tensors.items()
              if k.startswith("model.layers.0.self_attn.indexer.")}
    write_safetensors(one_layer / "out-idx-00000.safetensors", layer0)
    with pytest.raises(CheckpointError, match=r"stored for layer\(s\) 0 but not for 2"):
        load_model(one_layer)
    assert [c.status for c in check_model(one_layer) if c.id == "model_indexer"] == ["fail"]


def test_doctor_and_engine_start_up_say_the_indexer_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = strip_indexer("glm5-tiny-dsa", tmp_path / "noidx")
    [check] = [c for c in check_model(model_dir) if c.id == "model_indexer"]
    assert check.status == "warn" and "off" in check.summary and "out-idx" in check.summary
    [on] = [c for c in check_model(fixture_model_dir("glm5-tiny-dsa")) if c.id == "model_indexer"]
    assert on.status == "ok" and on.summary == "DSA indexer on (2 indexer layer(s))"
    log = io.StringIO()
    open_backend(model_dir, BackendOptions(), log)
    assert "== DSA indexer: off: config.json declares it but the checkpoint holds no " in (
        log.getvalue())


def test_mtp_layer_and_shards_follow_colibri_naming(tmp_path: Path) -> None:
    src = fixture_model_dir("glm5-tiny-mtp")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert main(["convert", "--model", str(src), "--out", str(ours), "--experts", "int8"]) == 0
    assert main(["convert", "--model", str(src), "--out", str(theirs), "--experts", "int8",
                 "--layout", "colibri", "--shard-mb", "1"]) == 0
    names = files(theirs)
    assert names[0] == "out-00000.safetensors" and "out-00001.safetensors" in names
    assert "out-idx-00000.safetensors" in names and "out-mtp-00000.safetensors" in names
    layers = ModelConfig.from_dir(src).num_hidden_layers
    mtp = [n for p in theirs.glob("out-mtp-*") for n in read_header(p)[0] if n != "__metadata__"]
    assert mtp and all(n.startswith(f"model.layers.{layers}.") for n in mtp)
    a, b = load_model(ours), load_model(theirs)
    assert a.forward(IDS).tobytes() == b.forward(IDS).tobytes()
    sa, sb = a.new_state(), b.new_state()
    a.prefill(sa, IDS)
    b.prefill(sb, IDS)
    assert a.mtp_draft(sa, 7).tobytes() == b.mtp_draft(sb, 7).tobytes()


def test_layout_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as refused:  # argparse refuses an unknown layout
        main(["convert", "--model", str(fixture_model_dir("glm5-tiny")), "--out", str(out),
              "--experts", "int8", "--layout", "gguf"])
    assert refused.value.code == 2 and not out.exists()
    with pytest.raises(ConvertError, match="--layout must be one of hf, colibri"):
        convert(fixture_model_dir("glm5-tiny"), out, "int8", layout="gguf")
    assert not out.exists()


def test_fp8_passthrough_container_with_experts_as_the_source_has_them(tmp_path: Path) -> None:
    # colibri's fp8 repacker (older era) byte-preserves the fp8 residents, stamped, and leaves
    # the routed experts as the source has them: float tensors beside .qs-backed weights.
    src = fixture_model_dir("glm5-tiny-dsa")
    out = tmp_path / "fp8"
    assert main(["convert", "--model", str(src), "--out", str(out), "--experts", "fp8",
                 "--dense", "fp8", "--layout", "colibri"]) == 0
    shard = out / "out-00000.safetensors"
    meta = read_header(shard)[0]["__metadata__"]
    stamps = json.loads(meta["colibri.fmt"])
    assert stamps["model.layers.0.self_attn.kv_b_proj.weight"] == "fp8-e4m3-b128"
    tensors = {k: v for k, v in read_all(shard).items() if ".mlp.experts." not in k}
    source = read_all(src / "model.safetensors")
    tensors.update({k: v for k, v in source.items() if ".mlp.experts." in k})
    shard.unlink()
    write_safetensors(shard, tensors, meta)
    container = QuantContainer.open(out)
    expert = "model.layers.3.mlp.experts.0.down_proj.weight"
    cfg = ModelConfig.from_dir(src)
    shape = (cfg.hidden_size, cfg.moe_intermediate_size)
    assert container.tensor_format(expert, shape).fmt.name == "F32"
    assert container.tensor_format("model.layers.0.self_attn.o_proj.weight",
                                   (cfg.hidden_size, cfg.num_attention_heads * cfg.v_head_dim)
                                   ).fmt.name == "FP8_E4M3_B128"
    want = load_model(out).forward(IDS)
    assert want.tobytes() != load_model(src).forward(IDS).tobytes()  # the fp8 residents count
    if not BUILT:
        pytest.skip(NOT_BUILT_REASON)
    from colibri.accelerated import load_model as load_accelerated

    got = load_accelerated(out, threads=2).forward(IDS)
    tolerance = logit_tolerance("glm5-tiny-dsa", len(IDS))
    assert max_excess(got, want, tolerance) <= 0
    assert top_margin(want) > 2 * tolerance  # so the argmaxes below follow on any CPU
    assert np.array_equal(got.argmax(axis=-1), want.argmax(axis=-1))
