"""The model families the reference runs, each as a delta over the shared decoder.

Every family is the same decoder (spec/model.md §3): embedding, layers of
``h = x + attention(rms_norm(x))`` and ``y = h + mlp(rms_norm(h))``, final norm, lm_head, with
the same RMSNorm, RoPE, SwiGLU experts and weighted expert sum. What differs is written here,
as transformers' modular files write GLM-5 over DeepSeek-V3.2 over DeepSeek-V3:

* ``attention``: "mla" (multi-head latent attention over a compressed KV, DeepSeek-V3 and
  GLM-5, §5) or "mha" (standard multi-head attention with per-head keys and values, OLMoE's
  q/k RMSNorm and rotate-half RoPE, §5.3);
* ``router``: "noaux_tc" (sigmoid affinities with the correction bias, groups, scaling, §7.1)
  or "softmax" (softmax over the router logits, top-k, renormalised per ``norm_topk_prob``,
  §7.1.1);
* ``shared_experts``: whether a sparse layer adds shared experts;
* ``dense_layers_first``: whether the first layers may be dense (``first_k_dense_replace``);
  a family without them is MoE in every layer.

Spec: spec/model.md §2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str
    attention: str
    router: str
    shared_experts: bool
    dense_layers_first: bool


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("glm_moe_dsa", attention="mla", router="noaux_tc", shared_experts=True,
               dense_layers_first=True),
        Family("deepseek_v3", attention="mla", router="noaux_tc", shared_experts=True,
               dense_layers_first=True),
        Family("olmoe", attention="mha", router="softmax", shared_experts=False,
               dense_layers_first=False),
    )
}
