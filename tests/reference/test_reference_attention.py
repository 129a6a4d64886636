"""MLA's two forms agree; the DSA indexer really prunes on glm5-tiny-dsa and follows its rules."""

from __future__ import annotations

import numpy as np
from colibri.reference import dsa
from colibri.reference.mla import absorbed_attention_row, naive_attention, project
from colibri.reference.rope import cos_sin
from colibri.reference.tensors import dense_matmul
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reference_support import causal_model, fresh_model, model, oracle


@settings(max_examples=20)
@given(
    name=st.sampled_from(("glm5-tiny", "deepseek3-tiny")),
    layer=st.integers(0, 2),
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 24),
)
def test_naive_and_absorbed_mla_agree(name: str, layer: int, seed: int, length: int) -> None:
    m = model(name)
    cfg = m.config
    aw = m.layers[layer].attention
    x = np.random.default_rng(seed).standard_normal((length, cfg.hidden_size)).astype(np.float32)
    cos, sin = cos_sin(np.arange(length), cfg.qk_rope_head_dim, cfg.rope_theta)
    p = project(x, aw, cfg, cos, sin, dense_matmul)
    causal = np.tril(np.ones((length, length), dtype=bool))
    naive = naive_attention(p, p.latent, p.rope_key, causal, aw, cfg)
    kv_b_k, kv_b_v = aw.kv_b_heads(cfg)
    absorbed = np.stack([
        absorbed_attention_row(p.q_nope[i], p.q_rope[i], p.latent[: i + 1], p.rope_key[: i + 1],
                               kv_b_k, kv_b_v, cfg)
        for i in range(length)
    ])
    assert float(np.max(np.abs(naive - absorbed))) <= 1e-5


def _kept_counts(name: str) -> list[int]:
    """How many keys the first full indexer layer keeps for each query of the oracle ids."""
    m = model(name)
    cfg = m.config
    ids = oracle(name)["full_ids"]
    lw = m.layers[0]
    assert lw.attention.indexer is not None
    x = m.embed[np.asarray(ids)]
    from colibri.reference.norms import rms_norm

    h = rms_norm(x, lw.input_norm, cfg.rms_norm_eps)
    cos, sin = cos_sin(np.arange(len(ids)), cfg.qk_rope_head_dim, cfg.rope_theta)
    p = project(h, lw.attention, cfg, cos, sin, dense_matmul)
    assert p.q_resid is not None
    keys = dsa.index_keys(h, lw.attention.indexer, cfg, cos, sin, dense_matmul)
    queries = dsa.index_queries(p.q_resid, lw.attention.indexer, cfg, cos, sin, dense_matmul)
    weights = dsa.head_weights(h, lw.attention.indexer, cfg, dense_matmul)
    counts = []
    for i in range(len(ids)):
        kept = dsa.select(dsa.scores_row(queries[i], weights[i], keys[: i + 1], cfg),
                          cfg.index_topk)
        counts.append(i + 1 if kept is None else len(kept))
    return counts


def test_dsa_indexer_keeps_fewer_keys_than_the_causal_window() -> None:
    cfg = model("glm5-tiny-dsa").config
    counts = _kept_counts("glm5-tiny-dsa")
    assert cfg.index_topk < len(counts)
    assert max(counts) == cfg.index_topk
    assert sum(1 for i, c in enumerate(counts) if c < i + 1) >= len(counts) - cfg.index_topk


def test_dsa_indexer_is_a_no_op_on_glm5_tiny() -> None:
    counts = _kept_counts("glm5-tiny")
    assert counts == list(range(1, len(counts) + 1))


def test_disabling_the_indexer_changes_the_dsa_fixture_logits() -> None:
    ids = oracle("glm5-tiny-dsa")["full_ids"]
    m = fresh_model("glm5-tiny-dsa")
    causal = causal_model("glm5-tiny-dsa")
    with_dsa = m.forward(ids)
    without = causal.forward(ids)
    assert float(np.max(np.abs(with_dsa - without))) > 1e-2
    # Up to index_topk keys every query sees all of them: the early rows are unchanged (the
    # incremental path is row-invariant, so "unchanged" means the same bytes there).
    topk = m.config.index_topk
    off = causal.prefill(causal.new_state(), ids)
    on = m.prefill(m.new_state(), ids)
    assert on[:topk].tobytes() == off[:topk].tobytes()
    assert float(np.max(np.abs(on[topk:] - off[topk:]))) > 1e-2


def test_disabling_the_indexer_changes_nothing_on_glm5_tiny() -> None:
    ids = oracle("glm5-tiny")["full_ids"]
    assert np.array_equal(fresh_model("glm5-tiny").forward(ids),
                          causal_model("glm5-tiny").forward(ids))


def test_dsa_fixture_mixes_full_and_shared_layers() -> None:
    m = model("glm5-tiny-dsa")
    assert m.indexer_modes == ["full", "shared", "full", "shared", "shared"]
    assert m.layers[1].attention.indexer is None
    assert m.layers[2].attention.indexer is not None


@settings(max_examples=50)
@given(
    scores=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=16),
    topk=st.integers(1, 8),
)
def test_dsa_selection_prefers_higher_scores_then_earlier_positions(
    scores: list[float], topk: int
) -> None:
    kept = dsa.select(np.asarray(scores, dtype=np.float32), topk)
    if len(scores) <= topk:
        assert kept is None
        return
    assert kept is not None
    expected = sorted(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:topk])
    assert kept.tolist() == expected
