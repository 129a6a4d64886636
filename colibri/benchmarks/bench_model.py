"""The generated benchmark model: GLM-5 geometry big enough to measure, built from a seed.

Not committed (about 1.3 GB as float32): ``ensure_bench_model(cache_dir)`` writes it once
into ``cache_dir/glm5-bench-<seed>-r<revision>/`` (config.json, generation_config.json,
model.safetensors with unfused per-expert names) and reuses it afterwards. Weights are
N(0, 0.02), norms 1, the correction bias 0.05·N(0, 1); numpy's PCG64 with the seed makes it
reproducible without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from colibri.reference.safetensors import write_safetensors

BENCH_SEED = 1234
#: Bumped whenever BENCH_CONFIG changes, so a cached model of an older geometry is not reused.
#: Revision 2: ``index_head_dim`` 32 -> 64, because llama.cpp multiplies the indexer's q and k
#: by a Hadamard matrix of size >= 64 and refuses a smaller head (the llama.cpp peer's GGUF).
BENCH_REVISION = 2

#: colibri's make_glm_bench_model.py geometry (colibri's benchmark model).
BENCH_CONFIG: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "vocab_size": 8192,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 8,
    "first_k_dense_replace": 3,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 32,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "q_lora_rank": 256,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "index_topk": 4096,
    "index_head_dim": 64,
    "index_n_heads": 4,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}


def tensor_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ql, kl = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    hd, nh = cfg["index_head_dim"], cfg["index_n_heads"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg["vocab_size"], d),
        "model.norm.weight": (d,),
        "lm_head.weight": (cfg["vocab_size"], d),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            a + "q_a_proj.weight": (ql, d),
            a + "q_a_layernorm.weight": (ql,),
            a + "q_b_proj.weight": (h * (nope + rope), ql),
            a + "kv_a_proj_with_mqa.weight": (kl + rope, d),
            a + "kv_a_layernorm.weight": (kl,),
            a + "kv_b_proj.weight": (h * (nope + v), kl),
            a + "o_proj.weight": (d, h * v),
            a + "indexer.wq_b.weight": (nh * hd, ql),
            a + "indexer.wk.weight": (hd, d),
            a + "indexer.k_norm.weight": (hd,),
            a + "indexer.k_norm.bias": (hd,),
            a + "indexer.weights_proj.weight": (nh, d),
        })
        if i < cfg["first_k_dense_replace"]:
            inter = cfg["intermediate_size"]
            for proj, shape in (("gate", (inter, d)), ("up", (inter, d)), ("down", (d, inter))):
                shapes[f"{p}mlp.{proj}_proj.weight"] = shape
        else:
            inter = cfg["moe_intermediate_size"]
            shapes[p + "mlp.gate.weight"] = (cfg["n_routed_experts"], d)
            shapes[p + "mlp.gate.e_score_correction_bias"] = (cfg["n_routed_experts"],)
            prefixes = [f"{p}mlp.experts.{e}." for e in range(cfg["n_routed_experts"])]
            prefixes.append(p + "mlp.shared_experts.")
            for q in prefixes:
                shared = q.endswith("shared_experts.")
                width = inter * (cfg["n_shared_experts"] if shared else 1)
                shapes[q + "gate_proj.weight"] = (width, d)
                shapes[q + "up_proj.weight"] = (width, d)
                shapes[q + "down_proj.weight"] = (d, width)
    return shapes


def init_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """One generated weight: matrices N(0, 0.02), the router's correction bias 0.05·N(0, 1),
    other biases 0, norms 1."""
    if name.endswith("e_score_correction_bias"):
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)
    if len(shape) >= 2:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    return np.ones(shape, np.float32)


def build_tensors(cfg: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: init_tensor(rng, name, shape)
            for name, shape in sorted(tensor_shapes(cfg).items())}


#: The GPU bench model: the same architecture with 64 experts in 9 of 12 layers,
#: about 3.9 GB as float32 (experts 3.6 GB), so a step's weights are far beyond any cache and
#: the VRAM tier has something to split; generated on the GPU machine by tools/gpu_check.sh.
GPU_BENCH_CONFIG: dict[str, Any] = {**BENCH_CONFIG, "num_hidden_layers": 12,
                                    "n_routed_experts": 64}
GPU_BENCH_REVISION = 1


def bench_model_dir(cache_dir: Path, seed: int = BENCH_SEED, *, gpu: bool = False) -> Path:
    """Where ``ensure_bench_model`` keeps the model (nothing is generated)."""
    if gpu:
        return cache_dir / f"glm5-gpu-bench-{seed}-r{GPU_BENCH_REVISION}"
    return cache_dir / f"glm5-bench-{seed}-r{BENCH_REVISION}"


def ensure_bench_model(cache_dir: Path, seed: int = BENCH_SEED, *, gpu: bool = False) -> Path:
    """The benchmark model directory (``gpu``: the GPU-sized one), generated on first use."""
    target = bench_model_dir(cache_dir, seed, gpu=gpu)
    done = target / "bench_manifest.json"
    if done.is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    cfg = dict(GPU_BENCH_CONFIG if gpu else BENCH_CONFIG)
    (target / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (target / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=2) + "\n"
    )
    write_safetensors(target / "model.safetensors", build_tensors(cfg, seed), {"format": "pt"})
    done.write_text(json.dumps({"seed": seed,
                                "revision": GPU_BENCH_REVISION if gpu else BENCH_REVISION,
                                "gpu": gpu, "generator": "colibri.benchmarks.bench_model"}))
    return target
