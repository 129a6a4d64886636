"""The out-of-core bench models: GLM-5 geometry whose routed experts are far bigger than the
memory caps the bench runs under, with experts of realistic size.

96 experts per layer in 5 sparse layers (one dense layer first), top-8, each expert 9.4 MB as
float32 (hidden 1024, expert width 768): 4.5 GB of experts beside about 0.2 GB of dense
weights, so even the largest cap (half the expert bytes) reads from disk every token, and a
read is megabytes, not a syscall's worth.

Two routings over the same experts (the expert shards are hard links of one another):

- **uniform**: the correction bias is 0.05·N(0, 1), as the bench model's: every expert of a
  layer is about equally likely;
- **skewed**: the correction bias ranks each layer's experts in a random order and adds
  ``-SKEW * ln(1 + rank)``, so popularity falls with rank roughly as a power law (Zipf-like),
  the way trained MoE routers concentrate on a few hot experts. With ``SKEW`` 0.06 (the
  router's sigmoid scores spread by about 0.14 over this geometry) a quarter of a layer's
  experts take about 57 % of the selections and the top eighth 39 %, so neither an LRU nor a
  pinned set holds everything that matters at the caps the bench runs.

Written once into ``cache_dir/glm5-ooc-<routing>-<seed>-r<revision>/`` (HF's shard names: the
dense weights first, then one shard of experts per sparse layer; the index) and reused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from colibri.benchmarks.bench_model import BENCH_CONFIG, init_tensor, tensor_shapes
from colibri.reference.safetensors import write_safetensors

OOC_SEED = 4321
OOC_REVISION = 3
ROUTINGS = ("uniform", "skewed")
#: The skewed router's bias per log-rank step (see the module docstring).
SKEW = 0.06

OOC_CONFIG: dict[str, Any] = {
    **BENCH_CONFIG,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 6,
    "first_k_dense_replace": 1,
    "n_routed_experts": 96,
    "num_experts_per_tok": 8,
}


def model_dir(cache_dir: Path, routing: str, seed: int = OOC_SEED) -> Path:
    return cache_dir / f"glm5-ooc-{routing}-{seed}-r{OOC_REVISION}"


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def skewed_bias(rng: np.random.Generator, n_experts: int) -> np.ndarray:
    """A layer's correction bias with Zipf-like popularity: a random ranking, ``-SKEW·ln(1 +
    rank)`` over the uniform model's small noise."""
    rank = rng.permutation(n_experts)
    noise = 0.05 * rng.standard_normal(n_experts)
    return (noise - SKEW * np.log1p(rank)).astype(np.float32)


def ensure_models(cache_dir: Path, seed: int = OOC_SEED) -> dict[str, Path]:
    """Both routings' model directories, generated on first use."""
    dirs = {routing: model_dir(cache_dir, routing, seed) for routing in ROUTINGS}
    if all((d / "bench_manifest.json").is_file() for d in dirs.values()):
        return dirs
    cfg = OOC_CONFIG
    shapes = tensor_shapes(cfg)
    uniform, skewed = dirs["uniform"], dirs["skewed"]
    for target in (uniform, skewed):
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (target / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=2) + "\n")
    rng = np.random.default_rng(seed)
    dense = {name: init_tensor(rng, name, shape) for name, shape in sorted(shapes.items())
             if not _is_expert(name)}
    sparse = range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"])
    shards = len(sparse) + 1
    dense_shard = f"model-00001-of-{shards:05d}.safetensors"
    weight_map: dict[str, str] = {name: dense_shard for name in dense}
    for number, layer in enumerate(sparse, 2):
        shard = f"model-{number:05d}-of-{shards:05d}.safetensors"
        prefix = f"model.layers.{layer}.mlp.experts."
        tensors = {name: init_tensor(rng, name, shape) for name, shape in sorted(shapes.items())
                   if name.startswith(prefix)}
        write_safetensors(uniform / shard, tensors)
        if (skewed / shard).exists():
            (skewed / shard).unlink()
        os.link(uniform / shard, skewed / shard)
        weight_map.update({name: shard for name in tensors})
        del tensors
    write_safetensors(uniform / dense_shard, dense)
    bias_rng = np.random.default_rng(seed + 1)
    for layer in sparse:
        name = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        dense[name] = skewed_bias(bias_rng, cfg["n_routed_experts"])
    write_safetensors(skewed / dense_shard, dense)
    index = json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1, sort_keys=True)
    for routing, target in dirs.items():
        (target / "model.safetensors.index.json").write_text(index + "\n")
        (target / "bench_manifest.json").write_text(json.dumps(
            {"seed": seed, "revision": OOC_REVISION, "routing": routing, "skew": SKEW,
             "generator": "colibri.benchmarks.out_of_core_model"}))
    return dirs


def expert_bytes(cfg: dict[str, Any] = OOC_CONFIG) -> int:
    """Every routed expert's float32 bytes."""
    sparse = cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    return int(sparse * cfg["n_routed_experts"] * 3 * cfg["hidden_size"]
               * cfg["moe_intermediate_size"] * 4)
