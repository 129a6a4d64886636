"""The incremental path skips work whose result would be discarded, without changing a byte."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import colibri.reference.model as model_module
import numpy as np
import pytest
from colibri.reference import dsa
from support.reference_support import causal_model, model


def _count(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls = [0]
    real: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_indexer_queries_wait_until_a_row_sees_more_than_index_topk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = model("glm5-tiny-dsa")
    topk = m.config.index_topk
    queries = _count(monkeypatch, dsa, "index_queries")
    weights = _count(monkeypatch, dsa, "head_weights")
    scores = _count(monkeypatch, dsa, "scores_row")
    state = m.new_state()
    m.prefill(state, list(range(1, topk + 1)))  # every row sees at most index_topk keys
    assert (queries[0], weights[0], scores[0]) == (0, 0, 0)
    m.decode(state, 9)  # this row sees index_topk + 1 keys: the full layers must select
    assert queries[0] > 0 and weights[0] > 0 and scores[0] > 0


def test_disabled_indexer_computes_no_indexer_products(monkeypatch: pytest.MonkeyPatch) -> None:
    m = causal_model("glm5-tiny-dsa")
    queries = _count(monkeypatch, dsa, "index_queries")
    keys = _count(monkeypatch, dsa, "index_keys")
    state = m.new_state()
    m.prefill(state, list(range(1, 2 * m.config.index_topk + 2)))
    m.decode(state, 5)
    assert queries[0] == 0 and keys[0] == 0
    assert all("index_key" not in layer.arrays for layer in state.layers)


def test_rope_tables_are_computed_once_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model("glm5-tiny-dsa")
    assert m.config.num_hidden_layers > 1
    calls = _count(monkeypatch, model_module, "cos_sin")
    state = m.new_state()
    m.prefill(state, [1, 2, 3])
    m.decode(state, 4)
    m.forward([1, 2, 3])
    assert calls[0] == 3


def test_skipping_keeps_mixed_batches_bit_identical() -> None:
    # One row below index_topk and one above, batched and alone.
    m = model("glm5-tiny-dsa")
    topk = m.config.index_topk
    short, long = m.new_state(), m.new_state()
    m.prefill(short, [3] * (topk - 2))
    m.prefill(long, list(range(10, 10 + topk + 3)))
    alone = [m.decode(copy.deepcopy(short), 7), m.decode(copy.deepcopy(long), 8)]
    together = m.decode_batch([short, long], [7, 8])
    assert together.tobytes() == np.stack(alone).tobytes()
