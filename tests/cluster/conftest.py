"""A simulated two-node Ray cluster (``ray.cluster_utils.Cluster``) per test module, with this
process connected to it as a driver: a backend opened with ``cluster="ray"`` places one expert
worker on each node. Starting Ray costs seconds, so each module starts it once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

#: The object store's floor: the calls carry a few rows of activations.
STORE_BYTES = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="the cluster tests need the `cluster` extra (Ray)")
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
