"""Helpers of the accelerated-engine tests: skip (naming `make build`) only when the C library
is not built, and cached fixture models for both engines."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from colibri.reference import Model as ReferenceModel
from colibri.reference import load_model as load_reference

from colibri.resources import fixture_model_dir

try:
    from colibri.accelerated.native import LibraryNotBuilt, load_library

    load_library()
    BUILT = True
    NOT_BUILT_REASON = ""
except LibraryNotBuilt as exc:
    BUILT = False
    NOT_BUILT_REASON = f"the accelerated C library is not built ({exc}); run `make build`"

needs_library = pytest.mark.skipif(not BUILT, reason=NOT_BUILT_REASON or "built")

FLOAT_FIXTURES = (
    "glm5-tiny", "glm5-tiny-dsa", "deepseek3-tiny", "glm5-tiny-mtp", "glm5-chat-tiny",
    "glm5-chat-small",
)
QUANT_FIXTURES = ("glm5-tiny-int4g64", "glm5-tiny-int4row", "glm5-tiny-fp8", "glm5-tiny-e8")
ALL_FIXTURES = FLOAT_FIXTURES + QUANT_FIXTURES


@cache
def reference(name: str) -> ReferenceModel:
    return load_reference(fixture_model_dir(name))


@cache
def accelerated(name: str, threads: int = 2):  # type: ignore[no-untyped-def]
    from colibri.accelerated import load_model

    return load_model(fixture_model_dir(name), threads=threads)


def assert_decode_batch_invariant(m: object, prompts: list[list[int]], token: int = 42) -> None:
    """Each prompt's next-token logits are the same bytes decoded alone and inside one batch
    of all of them (sameness kind (c), spec/model.md §15)."""
    model: Any = m
    alone = []
    for p in prompts:
        s = model.new_state()
        model.prefill(s, p)
        alone.append(model.decode(s, token))
    states = [model.new_state() for _ in prompts]
    for s, p in zip(states, prompts, strict=True):
        model.prefill(s, p)
    batched = model.decode_batch(states, [token] * len(prompts))
    for i in range(len(prompts)):
        assert batched[i].tobytes() == alone[i].tobytes(), f"row {i} differs in the batch"


def assert_mtp_drafts_match(a: Any, r: Any, ids: list[int], tolerance: float,
                            tokens: tuple[int, ...] = (5, 9)) -> None:
    """After prefilling ``ids`` in both engines, each of ``tokens`` drafts the same MTP routes
    and argmax on the accelerated engine ``a`` as on the reference ``r``, with draft logits
    within ``tolerance``; each token is then decoded, so the next draft reads a longer cache."""
    import numpy as np
    from colibri.conformance.sameness import max_excess

    sa, sr = a.new_state(), r.new_state()
    a.prefill(sa, ids)
    r.prefill(sr, ids)
    for token in tokens:
        da, ra = a.mtp_draft_routed(sa, token)
        dr, rr = r.mtp_draft_routed(sr, token)
        assert np.array_equal(ra, rr)
        assert max_excess(da, dr, tolerance) <= 0
        assert int(np.argmax(da)) == int(np.argmax(dr))
        a.decode(sa, token)
        r.decode(sr, token)
