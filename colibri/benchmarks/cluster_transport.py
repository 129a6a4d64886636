"""The repeated per-layer call itself: plain Ray actor calls, a Ray compiled graph, and the
direct channels the engine uses (``expert_channel``).

Runs in a worker process of its own (``workers.call("cluster_transport:measure", ...)``) on a
one-node local Ray with two echo actors standing in for two expert workers: each layer sends
both one array of ``rows × hidden`` float32 and waits for both answers, the engine's per-layer
pattern. ``plain`` is ``actor.run.remote`` + ``ray.get`` (what ``ray_cluster.py`` does);
``compiled`` is the same two calls as a compiled graph (``ray.dag``'s
``experimental_compile``: shared-memory channels, no per-call scheduling); ``channel`` is a
TCP connection to each actor (what ``ray_cluster.ChannelCaller`` does), across two nodes.

Why one node: in Ray 2.60 a compiled graph whose actors sit on two nodes of a simulated cluster
(two raylets on one machine) crashes the second raylet (a failed semaphore check in
``PlasmaObjectHeader::WriteAcquire`` when the first input is pushed), so the two-node
comparison cannot run here at all; on one node both transports run and are timed side by
side, with the plain call across two nodes as the reference the engine meets.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import time
from typing import Any

import numpy as np

from colibri.benchmarks.stats import median, percentile

NAMESPACE = "colibri-bench-transport"
STORE_BYTES = 80 * 1024 * 1024


class Echo:
    """An expert worker's stand-in: answers a layer call with an array of the same shape."""

    def run(self, x: Any) -> Any:
        return x

    def serve(self) -> tuple[str, int]:
        """The same answer over a direct channel (``expert_channel``, what the engine's
        expert calls use): where it listens."""
        from colibri.backend_kit.expert_channel import ChannelServer

        self.server = ChannelServer(lambda _layer, _experts, x, _start, _rows: x)
        ray: Any = importlib.import_module("ray")
        return str(ray.util.get_node_ip_address()), self.server.port


def _channel_layer(ray: Any, actors: list[Any], x: np.ndarray[Any, Any], calls: int,
                   warmup: int) -> dict[str, float]:
    """The engine's layer call over direct channels: a request to each actor, then each
    answer."""
    import socket

    from colibri.backend_kit.expert_channel import no_delay, read_answer, send_request
    from colibri.backend_kit.remote_experts import ExpertCall

    conns = []
    for ip, port in ray.get([a.serve.remote() for a in actors]):
        conn = socket.create_connection((ip, port))
        no_delay(conn)
        conns.append(conn)
    call = ExpertCall(0, [0], x, np.array([0, x.shape[0]], np.int64),
                      np.arange(x.shape[0], dtype=np.int64))

    def layer() -> None:
        for conn in conns:
            send_request(conn, call)
        for conn in conns:
            read_answer(conn)

    try:
        return _summary(_timed(layer, calls, warmup))
    finally:
        for conn in conns:
            conn.close()


def _summary(seconds: list[float]) -> dict[str, float]:
    return {"median_us": 1e6 * median(seconds), "p90_us": 1e6 * percentile(seconds, 0.9)}


def _timed(call: Any, calls: int, warmup: int) -> list[float]:
    seconds = []
    for i in range(warmup + calls):
        started = time.perf_counter()
        call()
        if i >= warmup:
            seconds.append(time.perf_counter() - started)
    return seconds


def _leave_without_finalizing() -> None:
    """Ray 2.60 crashes this interpreter at finalization (SIGSEGV) once a compiled graph has
    run, even after a clean teardown and shutdown; the result is printed by then, so the
    process leaves without finalizing rather than report a crash that is not the
    measurement's."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _two_actor_layer(ray: Any, nodes: list[str], x: np.ndarray[Any, Any], calls: int,
                     warmup: int, compiled: bool, channel: bool = False) -> dict[str, float]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_class = ray.remote(Echo)
    actors = [actor_class.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote() for node in nodes]
    ray.get([a.run.remote(x) for a in actors])
    if channel:
        result = _channel_layer(ray, actors, x, calls, warmup)
    elif not compiled:
        result = _summary(_timed(lambda: ray.get([a.run.remote(x) for a in actors]), calls,
                                 warmup))
    else:
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as given:
            graph = MultiOutputNode([a.run.bind(given) for a in actors])
        started = time.perf_counter()
        compiled_graph = graph.experimental_compile()
        compile_s = time.perf_counter() - started
        try:
            result = {**_summary(_timed(lambda: ray.get(compiled_graph.execute(x)), calls,
                                        warmup)), "compile_s": compile_s}
        finally:
            compiled_graph.teardown()
    for actor in actors:
        ray.kill(actor)
    return result


def measure(rows: int, hidden: int, calls: int, warmup: int) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    # Ray's API is only partly typed: held as Any, as ray_cluster.py holds it.
    ray: Any = importlib.import_module("ray")

    x = np.random.default_rng(0).standard_normal((rows, hidden)).astype(np.float32)
    result: dict[str, Any] = {"payload_bytes": int(x.nbytes), "calls": calls, "actors": 2}
    cluster: Any = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": STORE_BYTES, "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    atexit.register(_leave_without_finalizing)
    try:
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING)
        # "One node" is the driver's own: a compiled graph's channel to the driver must not
        # cross nodes either.
        head = str(ray.get_runtime_context().get_node_id())
        other = next(str(n["NodeID"]) for n in ray.nodes()
                     if n["Alive"] and str(n["NodeID"]) != head)
        result["plain_two_nodes"] = _two_actor_layer(ray, [head, other], x, calls, warmup,
                                                     compiled=False)
        result["plain_one_node"] = _two_actor_layer(ray, [head, head], x, calls, warmup,
                                                    compiled=False)
        result["channel_two_nodes"] = _two_actor_layer(ray, [head, other], x, calls, warmup,
                                                       compiled=False, channel=True)
        result["compiled_one_node"] = _two_actor_layer(ray, [head, head], x, calls, warmup,
                                                       compiled=True)
        result["compiled_two_nodes"] = {"not_run": "crashes the second raylet in Ray 2.60 "
                                        "(see this module's docstring)"}
        plain = result["plain_one_node"]["median_us"]
        result["compiled_speedup"] = plain / result["compiled_one_node"]["median_us"]
        result["channel_speedup_two_nodes"] = (result["plain_two_nodes"]["median_us"]
                                               / result["channel_two_nodes"]["median_us"])
        return result
    finally:
        ray.shutdown()
        cluster.shutdown()
