"""Helpers of the cluster tests: a simulated two-node Ray cluster (``ray.cluster_utils.Cluster``)
per test module with this process connected to it as a driver (a backend opened with
``cluster="ray"`` places one expert worker on each node; starting Ray costs seconds, so each
module starts it once: import the ``ray_cluster`` fixture), the same steps on a
single-process backend and a clustered one, and the clustered backend's workers."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from colibri import resources
from colibri.engine.backend import Backend, StepRow
from colibri.engine.registry import BackendOptions, open_backend

PROMPT = [3, 14, 15, 9, 26, 5, 8, 1]


def open_clustered(backend_name: str, model: str) -> Backend:
    """``backend_name`` over fixture ``model`` with its routed experts on the workers of the
    cluster this process is connected to (one per node)."""
    return open_backend(backend_name, resources.fixture_model_dir(model),
                        BackendOptions(cluster="ray"), io.StringIO())


def open_local(backend_name: str, model: str) -> Backend:
    return open_backend(backend_name, resources.fixture_model_dir(model), BackendOptions(),
                        io.StringIO())


def remote(backend: Backend) -> Any:
    """The backend's ``RemoteExperts``."""
    found = backend.model.remote_experts  # type: ignore[attr-defined]
    assert found is not None
    return found


def drive(backend: Backend) -> list[np.ndarray]:
    """Every logits array of a fixed script: two prefills, batched decode steps of both
    sequences, and an MTP draft where the model has a head."""
    a, b = backend.new_state(), backend.new_state()
    out = [backend.step([StepRow(a, t, True) for t in PROMPT]).logits,
           backend.step([StepRow(b, t, True) for t in PROMPT[:3]]).logits]
    for i in range(4):
        step = backend.step([StepRow(a, 7 + i, True), StepRow(b, 11 + i, True)])
        out += [step.logits, step.routes.astype(np.float32)]
    if backend.has_mtp:
        out.append(backend.draft(a, 5).logits)
    return out


#: The object store's floor: the calls carry a few rows of activations.
STORE_BYTES = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    # Ray comes with the `test` extra (through `cluster`): a missing Ray fails, never skips.
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": STORE_BYTES, "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
