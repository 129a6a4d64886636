"""The clustered engine against the single process, on a simulated two-node Ray cluster.

Runs in a worker process of its own (``workers.call("cluster_decode:measure", ...)``): it
starts a two-node ``ray.cluster_utils.Cluster`` on this machine (both nodes share its cores),
decodes the same greedy continuation on a single-process backend and on one whose routed
experts are on the cluster's expert workers (one per node), and reports tok/s for both and the
per-layer round trip (``RemoteExperts.round_trips``: one call per owner per layer, every
owner answered) as median and p90.
"""

from __future__ import annotations

import importlib
import io
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from colibri.benchmarks.stats import median, percentile
from colibri.engine.backend import Backend, StepRow

PROMPT = [3, 14, 15, 9]
#: A private namespace: another driver on the same machine never sees these actors.
NAMESPACE = "colibri-bench-cluster"
#: The object store's floor: the calls carry a few rows of activations.
STORE_BYTES = 80 * 1024 * 1024


def _decode_seconds(backend: Backend, tokens: int, warmup: int) -> list[float]:
    """Wall seconds of each of ``tokens`` greedy decode steps at batch 1, after the prompt
    and ``warmup`` untimed steps."""
    state = backend.new_state()
    logits = backend.step([StepRow(state, t, True) for t in PROMPT]).logits
    token = int(np.argmax(logits[-1]))
    seconds = []
    for i in range(warmup + tokens):
        started = time.perf_counter()
        logits = backend.step([StepRow(state, token, True)]).logits
        if i >= warmup:
            seconds.append(time.perf_counter() - started)
        token = int(np.argmax(logits[-1]))
    return seconds


def _one_backend(name: str, model: Path, tokens: int, warmup: int) -> dict[str, Any]:
    from colibri.engine.registry import BackendOptions, BackendUnavailable, open_backend

    try:
        local = open_backend(name, model, BackendOptions(), io.StringIO())
    except BackendUnavailable as exc:
        return {"unavailable": str(exc)}
    try:
        clustered = open_backend(name, model, BackendOptions(cluster="ray"), io.StringIO())
    except BackendUnavailable as exc:
        local.close()
        return {"unavailable": str(exc)}
    try:
        single = _decode_seconds(local, tokens, warmup)
        remote = clustered.model.remote_experts  # type: ignore[attr-defined]
        remote.round_trips.clear()
        cluster = _decode_seconds(clustered, tokens, warmup)
        trips = list(remote.round_trips)[-tokens * len(remote.placement.owner):]
        layers = len(remote.placement.owner)
    finally:
        clustered.close()
        local.close()
    single_s, cluster_s = median(single), median(cluster)
    return {
        "single_tok_s": 1.0 / single_s,
        "cluster_tok_s": 1.0 / cluster_s,
        "cluster_over_single_ratio": single_s / cluster_s,
        "routed_layers": layers,
        "round_trip_us": {"median": 1e6 * median(trips), "p90": 1e6 * percentile(trips, 0.9),
                          "calls": len(trips)},
        # What the cluster adds to a step, per routed layer: the remote call less the local
        # expert work it replaces.
        "overhead_per_layer_us": 1e6 * (cluster_s - single_s) / layers,
    }


def measure(model: str, backends: list[str], tokens: int, warmup: int) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    # Ray's API is only partly typed: held as Any, as ray_cluster.py holds it.
    ray: Any = importlib.import_module("ray")

    cluster: Any = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": STORE_BYTES, "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    try:
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING)
        nodes = sum(1 for n in ray.nodes() if n["Alive"])
        result: dict[str, Any] = {"model": model, "nodes": nodes, "decode_tokens": tokens,
                                  "batch": 1}
        for name in backends:
            result[name] = _one_backend(name, Path(model), tokens, warmup)
        return result
    finally:
        ray.shutdown()
        cluster.shutdown()
