"""Expert-parallel on a simulated two-node Ray cluster gives the single process's bytes.

Sameness kind (c) (spec/model.md): the workers compute with the engine's own kernels on this
machine, so every logit is byte-equal to the single-process backend's, and so are the tokens
and routes; for both backends, on a float checkpoint and on grouped-int4 and e8 containers."""

from __future__ import annotations

from typing import Any

import pytest
from support.accelerated_support import needs_library
from support.cluster_support import drive, open_clustered, open_local, ray_cluster, remote  # noqa: F401 (fixture)

CASES = [
    ("reference", "glm5-tiny"),
    pytest.param("accelerated", "glm5-tiny", marks=needs_library),
    pytest.param("accelerated", "glm5-tiny-int4g64", marks=needs_library),
    pytest.param("accelerated", "glm5-tiny-e8", marks=needs_library),
]


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize(("backend_name", "model"), CASES)
def test_the_clustered_engine_gives_the_single_process_bytes(backend_name: str,
                                                             model: str) -> None:
    import ray

    local = open_local(backend_name, model)
    clustered = open_clustered(backend_name, model)
    try:
        experts = remote(clustered)
        want, got = drive(local), drive(clustered)
        assert len(want) == len(got)
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            assert a.tobytes() == b.tobytes(), f"array {i} differs"
        # The experts came from the workers, one on each node, never from the local store.
        assert experts.placement.owners == 2
        assert len(experts.round_trips) > 0
        assert clustered.tiers.counters().lookups == 0 < local.tiers.counters().lookups
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2
    finally:
        clustered.close()
        local.close()


@pytest.mark.usefixtures("ray_cluster")
def test_each_owner_gets_one_call_per_layer_with_only_its_experts() -> None:
    clustered = open_clustered("reference", "glm5-tiny")
    try:
        experts = remote(clustered)
        layer_calls: list[list[tuple[int, int, list[int]]]] = []
        inner = experts.caller

        class Recording:
            def call(self, calls: Any, deadline_s: float) -> Any:
                layer_calls.append([(owner, c.layer, c.experts) for owner, c in calls])
                return inner.call(calls, deadline_s)

            def close(self) -> None:
                inner.close()

        experts.caller = Recording()
        drive(clustered)
        table = experts.placement.owner
        assert len(layer_calls) == len(experts.round_trips) > 0
        for calls in layer_calls:
            owners = [owner for owner, _, _ in calls]
            assert len(set(owners)) == len(owners)  # one call per owner, never one per expert
            assert len({layer for _, layer, _ in calls}) == 1
            for owner, layer, ids in calls:
                assert ids == sorted(ids) and all(table[layer][e] == owner for e in ids)
    finally:
        clustered.close()
