"""The model families the reference runs, each as a delta over the shared decoder.

Every family is the same decoder (spec/model.md §3): embedding, layers of
``h = x + attention(rms_norm(x))`` and ``y = h + mlp(rms_norm(h))``, final norm, lm_head, with
the same RMSNorm, RoPE, SwiGLU experts and weighted expert sum. What differs is written here,
as transformers' modular files write GLM-5 over DeepSeek-V3.2 over DeepSeek-V3:

* ``attention``: "mla" (multi-head latent attention over a compressed KV, DeepSeek-V3 and
  GLM-5, §5) or "mha" (standard multi-head attention with per-head keys and values, q/k
  RMSNorm and rotate-half RoPE, §5.3);
* ``qk_norm``: for "mha", what one q/k RMSNorm spans: "projection" (the whole q or k
  projection, OLMoE) or "head" (each head on its own, one weight shared by the heads,
  Qwen3-MoE);
* ``router``: "noaux_tc" (sigmoid affinities with the correction bias, groups, scaling, §7.1)
  or "softmax" (softmax over the router logits, top-k, renormalised per ``norm_topk_prob``,
  §7.1.1);
* ``shared_experts``: whether a sparse layer adds shared experts;
* ``dense_layers``: where a layer is dense rather than MoE: "first" (the first
  ``first_k_dense_replace`` layers), "scheduled" (Qwen3-MoE: a layer in ``mlp_only_layers``
  or off the ``decoder_sparse_step`` stride) or "none" (MoE in every layer).

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
    dense_layers: str
    qk_norm: str | None = None


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("glm_moe_dsa", attention="mla", router="noaux_tc", shared_experts=True,
               dense_layers="first"),
        Family("deepseek_v3", attention="mla", router="noaux_tc", shared_experts=True,
               dense_layers="first"),
        Family("olmoe", attention="mha", router="softmax", shared_experts=False,
               dense_layers="none", qk_norm="projection"),
        Family("qwen3_moe", attention="mha", router="softmax", shared_experts=False,
               dense_layers="scheduled", qk_norm="head"),
        # Kimi K2.5's text model is DeepSeek-V3's, unchanged (kimi_config.py): no delta.
        Family("kimi_k25", attention="mla", router="noaux_tc", shared_experts=True,
               dense_layers="first"),
    )
}
