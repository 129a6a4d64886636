"""The MTP head (defined by spec/model.md; HF builds none): properties."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from support.reference_support import fresh_model, model, oracle

IDS = oracle("glm5-tiny-mtp")["full_ids"]
#: Random MTP weights, and the trained default's MTP head (whose layer has its own indexer).
MTP_MODELS = ["glm5-tiny-mtp", "glm5-chat-small"]


def test_mtp_head_is_found_only_where_stored() -> None:
    assert model("glm5-tiny-mtp").mtp is not None
    assert model("glm5-tiny").mtp is None
    with pytest.raises(ValueError, match="no MTP head"):
        m = model("glm5-tiny")
        s = m.new_state()
        m.prefill(s, [1, 2])
        m.mtp_draft(s, 3)


def test_mtp_does_not_change_the_main_model() -> None:
    assert np.array_equal(model("glm5-tiny-mtp").forward(IDS), model("glm5-tiny").forward(IDS))


@pytest.mark.parametrize("name", MTP_MODELS)
def test_draft_is_finite_deterministic_and_depends_on_token_and_hidden(name: str) -> None:
    m = model(name)
    ids = oracle(name)["full_ids"]
    s = m.new_state()
    m.prefill(s, ids[:10])
    a = m.mtp_draft(copy.deepcopy(s), ids[10])
    assert a.shape == (m.config.vocab_size,) and np.isfinite(a).all()
    assert m.mtp_draft(copy.deepcopy(s), ids[10]).tobytes() == a.tobytes()
    assert not np.array_equal(m.mtp_draft(copy.deepcopy(s), ids[10] + 1), a)
    other = m.new_state()
    m.prefill(other, ids[1:11])  # same last token... different history and hidden state
    assert not np.array_equal(m.mtp_draft(other, ids[10]), a)
    main_next = m.decode(copy.deepcopy(s), ids[10])
    assert not np.allclose(main_next, a)


@pytest.mark.parametrize("name", MTP_MODELS)
def test_lazily_filled_mtp_cache_equals_drafting_every_step(name: str) -> None:
    m = model(name)
    ids = oracle(name)["full_ids"]
    eager = m.new_state()
    m.prefill(eager, ids[:12])
    lazy = copy.deepcopy(eager)
    drafts_eager = []
    for i in range(12, 20):
        drafts_eager.append(m.mtp_draft(eager, ids[i]))
        m.decode(eager, ids[i])
    m.mtp_draft(lazy, ids[12])  # the MTP cache starts at the same position
    m.prefill(lazy, ids[12:19])  # several tokens accepted at once: no drafts in between
    assert lazy.mtp is not None and eager.mtp is not None
    assert m.mtp_draft(lazy, ids[19]).tobytes() == drafts_eager[-1].tobytes()
    assert lazy.mtp.length == eager.mtp.length


@pytest.mark.parametrize("name", MTP_MODELS)
def test_redrafting_the_same_position_replaces_the_entry(name: str) -> None:
    m = model(name)
    ids = oracle(name)["full_ids"]
    s = m.new_state()
    m.prefill(s, ids[:12])
    first = m.mtp_draft(s, ids[12])
    m.mtp_draft(s, 7)
    assert m.mtp_draft(s, ids[12]).tobytes() == first.tobytes()


def test_truncate_drops_mtp_entries_that_used_forgotten_positions() -> None:
    m = fresh_model("glm5-tiny-mtp")
    s = m.new_state()
    m.prefill(s, IDS[:12])
    for i in range(12, 16):
        m.mtp_draft(s, IDS[i])
        m.decode(s, IDS[i])
    assert s.mtp is not None and s.mtp.length == 4
    s.truncate(14)
    assert s.mtp.length == 14 - 1 - 11
    s.truncate(5)
    assert s.mtp.start is None and s.mtp.length == 0


def test_mtp_draft_returns_the_mtp_layer_routing() -> None:
    m = fresh_model("glm5-tiny-mtp")
    s = m.new_state()
    m.prefill(s, [1, 2, 3])
    logits, routes = m.mtp_draft_routed(s, 4)
    assert routes.shape == (1, m.config.num_experts_per_tok)  # one position forwarded
    assert logits.tobytes() == m.mtp_draft(s, 4).tobytes()
