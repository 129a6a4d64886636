"""``colibri convert`` on the other families (OLMoE, Qwen3-MoE, Kimi): their routed experts are
quantized, and both engines run the container as the float model whose experts are the
codec's round trip of the originals.

The chain of evidence: each family's float fixture matches transformers (its oracle tests);
the float checkpoint built here holds exactly ``dequantize(quantize(W))`` for every routed
expert, computed from the fixture with the codec, not read back from the container; so an
engine that runs the container as that checkpoint runs what transformers would on the
weights a correct reader recovers (the same argument as the GLM-5 quantized fixtures, whose
oracle is transformers on the dequantized weights).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, max_excess
from colibri.reference import load_model
from colibri.reference.quant import dequantize, quantize
from colibri.reference.quant.convert import SCHEMES, convert, is_routed_expert
from colibri.reference.quant.expert_store import QuantizedExpertStore
from colibri.reference.safetensors import read_all, text_model_name, write_safetensors
from support.accelerated_support import needs_library
from support.reference_support import greedy, oracle

from colibri.resources import fixture_model_dir

FAMILIES = ("olmoe-tiny", "qwen3moe-tiny", "kimi-tiny")
SCHEMES_RUN = ("int8", "int4g64")


def _round_tripped_float_model(name: str, scheme: str, dest: Path) -> Path:
    """The family's fixture with every routed expert replaced by the codec's round trip."""
    fmt, group_size = SCHEMES[scheme]
    target = dest / f"{name}-{scheme}-float"
    shutil.copytree(fixture_model_dir(name), target)
    path = target / "model.safetensors"
    tensors = read_all(path)
    experts = [n for n in tensors if is_routed_expert(text_model_name(n))]
    assert experts, f"{name}: no routed expert found by the converter's rule"
    for n in experts:
        w = np.asarray(tensors[n], dtype=np.float32)
        payload, scales = quantize(fmt, w, group_size=group_size or 64, name=n)
        tensors[n] = dequantize(fmt, payload, scales, w.shape, name=n)
    path.unlink()
    write_safetensors(path, tensors)
    return target


@pytest.fixture(scope="module", params=[(f, s) for f in FAMILIES for s in SCHEMES_RUN],
                ids=lambda p: f"{p[0]}-{p[1]}")
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[str, Path, Path]:
    name, scheme = request.param
    dest = tmp_path_factory.mktemp(f"{name}-{scheme}")
    container = dest / "container"
    convert(fixture_model_dir(name), container, scheme)
    return name, container, _round_tripped_float_model(name, scheme, dest)


def test_the_container_runs_as_the_round_tripped_float_model(
        converted: tuple[str, Path, Path]) -> None:
    name, container, float_model = converted
    quantized = load_model(container)
    assert isinstance(quantized.experts, QuantizedExpertStore)  # the experts were quantized
    expected = load_model(float_model)
    prompt = oracle(name)["prompt_ids"]
    ids = greedy(expected, prompt, 8)
    assert greedy(quantized, prompt, 8) == ids
    tolerance = Tolerance.for_model_dir(fixture_model_dir(name), positions=len(ids))
    assert max_excess(quantized.forward(ids), expected.forward(ids), tolerance.logit) <= 0


@needs_library
def test_the_accelerated_engine_decodes_the_container_as_the_reference(
        converted: tuple[str, Path, Path]) -> None:
    from colibri.accelerated import load_model as load_accelerated

    name, container, _ = converted
    prompt = oracle(name)["prompt_ids"]
    accelerated = load_accelerated(container, threads=2)
    try:
        assert greedy(accelerated, prompt, 8) == greedy(load_model(container), prompt, 8)
    finally:
        accelerated.close()


def test_a_wrapped_text_model_is_written_under_its_text_names_and_its_vision_tower_kept(
        tmp_path: Path) -> None:
    """Kimi's checkpoint wraps the text model (``model.language_model.``) beside a vision
    tower: the container holds the text model under the names the engines read, the vision
    tower's tensors unchanged in name and unquantized, and Kimi's rank-BPE vocabulary."""
    from colibri.reference.quant.safetensors_file import SafetensorsDir

    source = SafetensorsDir(fixture_model_dir("kimi-tiny")).tensors
    convert(fixture_model_dir("kimi-tiny"), tmp_path / "out", "int8", dense="int8")
    written = SafetensorsDir(tmp_path / "out").tensors
    vision = [n for n in source if text_model_name(n) == n and n != "lm_head.weight"]
    assert vision and all(n in written and n + ".qs" not in written for n in vision)
    assert not any(n.startswith("model.language_model.") for n in written)
    assert "model.layers.1.mlp.experts.0.gate_proj.weight.qs" in written
    assert "model.layers.0.self_attn.o_proj.weight.qs" in written  # --dense reached the text
    assert (tmp_path / "out" / "tiktoken.model").read_bytes() == \
        (fixture_model_dir("kimi-tiny") / "tiktoken.model").read_bytes()
