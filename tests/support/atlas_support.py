"""A test model with *planted* specialists, for the expert atlas.

From the embedded default model: every token that occurs in the probes of exactly one
category ``c`` gets a large component along a hidden dimension reserved for ``c`` (zeroed in
every other embedding), and in each planted layer the router row of expert ``e`` is replaced by
a large weight on that dimension alone (the column is zeroed in the other rows). The residual
stream carries the embedding to the router (no layer writes the reserved dimensions), so those
tokens route to ``e`` as a top-1 choice;
a negative selection bias keeps ``e`` out for every other token: ``e`` is a specialist for
``c`` by construction.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from colibri.reference import Tokenizer
from colibri.reference.safetensors import read_all, write_safetensors

from colibri.atlas.sweep import submit_script

#: layer -> category -> expert
PLANTED: dict[int, dict[str, int]] = {
    3: {"chinese": 7, "code_sql": 6, "poetry": 5, "casual_chat": 4, "law": 3},
    4: {"code_python": 7, "german": 6, "json_format": 5, "medicine": 4, "math_proof": 3},
}


def exclusive_tokens(tokenizer: Tokenizer, probes: dict[str, list[str]]) -> dict[str, set[int]]:
    """Tokens of each category's rendered probes that no other category's probes contain."""
    seen: dict[str, set[int]] = {}
    for category, prompts in probes.items():
        seen[category] = set()
        for prompt in prompts:
            payload = submit_script(prompt, 1).split(b"\n", 1)[1][:-1].decode()
            seen[category].update(tokenizer.encode(payload))
    out = {}
    for category, tokens in seen.items():
        others = set().union(*(t for c, t in seen.items() if c != category))
        out[category] = tokens - others
    return out


def plant(source: Path, target: Path, probes: dict[str, list[str]],
          planted: dict[int, dict[str, int]] = PLANTED, strength: float = 10.0) -> Path:
    shutil.copytree(source, target)
    tensors = read_all(source / "model.safetensors")
    tokenizer = Tokenizer.from_file(source / "tokenizer.json")
    exclusive = exclusive_tokens(tokenizer, probes)
    embed = tensors["model.embed_tokens.weight"].copy()
    hidden = embed.shape[1]
    categories = sorted({c for plan in planted.values() for c in plan})
    dims = {c: hidden - 1 - i for i, c in enumerate(categories)}
    scale = float(np.linalg.norm(embed, axis=1).mean())
    for category, dim in dims.items():
        embed[:, dim] = 0.0
        embed[sorted(exclusive[category]), dim] = strength * scale
    tensors["model.embed_tokens.weight"] = embed
    # Nothing but the embedding writes the reserved dimensions (attention and MLP outputs
    # would otherwise carry a planted token's huge component to its neighbours), so the
    # router sees each token's own identity there and nothing else.
    reserved = list(dims.values())
    for name, tensor in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")) and tensor.shape[0] == hidden:
            tensor = tensor.copy()
            tensor[reserved, :] = 0.0
            tensors[name] = tensor
    for layer, plan in planted.items():
        name = f"model.layers.{layer}.mlp.gate.weight"
        gate = tensors[name].copy()
        norm = tensors[f"model.layers.{layer}.post_attention_layernorm.weight"]
        gate[:, list(dims.values())] = 0.0
        for category, expert in plan.items():
            dim = dims[category]
            gate[expert, :] = 0.0
            # RMSNorm caps a planted token's component near sqrt(hidden) (~11): a gentle
            # weight saturates the sigmoid there, while the O(1) noise other tokens carry in
            # this dimension stays well inside it
            gate[expert, dim] = 0.4 / float(norm[dim])
        tensors[name] = gate
        # A planted row is ~0 for every other token (sigmoid 0.5), which would often beat
        # the random rows: a selection-only bias keeps it out unless its dimension fires.
        # (the other experts get a smaller one, so a planted token's own expert still wins
        # by a clear margin over their ~0.5 there)
        bias = np.full_like(tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"],
                            -0.1)
        bias[list(plan.values())] = -0.45
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = bias
    write_safetensors(target / "model.safetensors", tensors)
    (target / "PLANTED.json").write_text(json.dumps(
        {str(k): v for k, v in planted.items()}))
    # the fixture's oracle files describe the original weights
    for stale in ("oracle.json", "oracle_logits.npy"):
        (target / stale).unlink(missing_ok=True)
    return target
