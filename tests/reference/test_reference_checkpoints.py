"""Bad model directories are refused with messages that name the key or tensor; dtypes load."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from colibri.reference import CheckpointError, load_model
from colibri.reference.safetensors import Checkpoint, write_safetensors
from support.reference_support import copy_fixture, oracle, rewrite_tensors


def _edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_unknown_model_type_is_refused(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    _edit_config(d, model_type="llama")
    with pytest.raises(CheckpointError, match="model_type 'llama' is not supported"):
        load_model(d)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    rewrite_tensors(d, lambda t: t.pop("model.layers.2.self_attn.kv_b_proj.weight"))
    message = r"missing tensor model\.layers\.2\.self_attn\.kv_b_proj"
    with pytest.raises(CheckpointError, match=message):
        load_model(d)


def test_missing_expert_is_named_at_load(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    rewrite_tensors(d, lambda t: t.pop("model.layers.4.mlp.experts.7.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.4\.mlp\.experts\.7\.down_proj"):
        load_model(d)


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    name = "model.layers.0.self_attn.q_b_proj.weight"
    rewrite_tensors(d, lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(CheckpointError, match=rf"{name.replace('.', '[.]')} has shape \[127, 64\]"):
        load_model(d)


def test_non_finite_weight_is_refused_at_load(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"

    def poison(t: dict[str, np.ndarray]) -> None:
        t[name] = t[name].copy()
        t[name][3, 5] = np.nan

    rewrite_tensors(d, poison)
    with pytest.raises(CheckpointError, match=rf"{name.replace('.', '[.]')} contains non-finite"):
        load_model(d)


def test_non_finite_expert_is_refused_when_first_used(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)

    def poison(t: dict[str, np.ndarray]) -> None:
        for e in range(8):
            name = f"model.layers.3.mlp.experts.{e}.gate_proj.weight"
            t[name] = t[name].copy()
            t[name][0, 0] = np.inf

    rewrite_tensors(d, poison)
    m = load_model(d)  # experts are mapped, not read, at load
    with pytest.raises(CheckpointError, match=r"model\.layers\.3\.mlp\.experts\.\d\.gate_proj"):
        m.forward([1, 2, 3])


def test_bad_config_values_name_the_key(tmp_path: Path) -> None:
    cases = {
        "num_experts_per_tok": (99, "num_experts_per_tok=99 exceeds"),
        "hidden_size": ("big", "hidden_size must be an integer"),
        "rope_parameters": ({"rope_type": "yarn", "factor": 4.0}, "rope_type 'yarn'"),
        "indexer_types": (["shared"] * 5, "indexer_types\\[0\\] must be 'full'"),
    }
    for key, (value, message) in cases.items():
        d = copy_fixture("glm5-tiny", tmp_path / key)
        _edit_config(d, **{key: value})
        with pytest.raises(CheckpointError, match=message):
            load_model(d)


def test_corrupt_safetensors_header_is_refused(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    (d / "model.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="header length"):
        load_model(d)


def test_weights_are_memory_mapped_not_copied() -> None:
    from support.reference_support import model

    m = model("glm5-tiny")
    assert not m.embed.flags.owndata and not m.embed.flags.writeable


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        (np.float32, "F32"),
        (np.float16, "F16"),
        (ml_dtypes.bfloat16, "BF16"),
        (ml_dtypes.float8_e4m3fn, "F8_E4M3"),
        (ml_dtypes.float8_e5m2, "F8_E5M2"),
    ],
)
def test_float_dtypes_load_as_float32(tmp_path: Path, dtype: type, name: str) -> None:
    values = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6).astype(dtype)
    write_safetensors(tmp_path / "x.safetensors", {"w": values, "odd": np.ones(3, np.int8)})
    ckpt = Checkpoint(tmp_path)
    assert ckpt.info("w").dtype == name
    loaded = ckpt.float32("w")
    assert loaded.dtype == np.float32
    assert loaded.tobytes() == values.astype(np.float32).tobytes()


def test_bf16_fixture_holds_bf16_values_exactly() -> None:
    from support.reference_support import model

    m = model("deepseek3-tiny")
    raw = m.checkpoint.raw("model.layers.0.self_attn.o_proj.weight")
    assert raw.dtype == np.dtype(ml_dtypes.bfloat16)
    assert oracle("deepseek3-tiny")["tf_pred"]  # the oracle was computed from these values


def test_q_proj_without_q_lora_is_consistent(tmp_path: Path) -> None:
    """DeepSeek-V3 allows q_lora_rank=null (one q_proj); both execution forms must agree."""
    d = copy_fixture("deepseek3-tiny", tmp_path)
    _edit_config(d, q_lora_rank=None)
    rng = np.random.default_rng(5)

    def to_q_proj(t: dict[str, np.ndarray]) -> None:
        for layer in range(3):
            p = f"model.layers.{layer}.self_attn."
            for name in ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"):
                del t[p + name]
            t[p + "q_proj.weight"] = (0.05 * rng.standard_normal((4 * 32, 128))).astype(
                ml_dtypes.bfloat16
            )

    rewrite_tensors(d, to_q_proj)
    m = load_model(d)
    assert m.config.q_lora_rank is None
    ids = oracle("deepseek3-tiny")["full_ids"]
    full = m.forward(ids)
    state = m.new_state()
    assert float(np.max(np.abs(m.prefill(state, ids) - full))) <= 1e-5


def test_tied_embeddings_serve_as_the_head(tmp_path: Path) -> None:
    d = copy_fixture("glm5-tiny", tmp_path)
    _edit_config(d, tie_word_embeddings=True)
    rewrite_tensors(d, lambda t: t.pop("lm_head.weight"))
    m = load_model(d)
    assert m.lm_head is m.embed
    ids = [3, 14, 159]
    hidden, logits = m.forward_hidden(ids)
    from colibri.reference.norms import rms_norm

    normed = rms_norm(hidden, m.final_norm, m.config.rms_norm_eps)
    assert np.allclose(logits, normed @ m.embed.T, atol=1e-5)
