"""Bench section ``replicas``: ``colibri serve --replicas N`` against one engine, in one run.

Three figures, side by side:

* time to first token through the gateway, one request at a time, with 1 and with 2 replicas:
  what the replica layer (the pool, the affinity table, the per-replica supervisor) adds to a
  request;
* a multi-turn workload (``conversations`` chats of ``turns`` turns each, every chat on its
  own client thread, each new turn carrying the whole history) with 1 and 2 replicas:
  aggregate completion tokens per second, and the prefix-affinity hit rate of the follow-up
  turns (``/health`` ``replicas.affinity``);
* the same two replicas with their engines on the two nodes of a simulated Ray cluster
  (``ray.cluster_utils.Cluster``; ``--replica-cluster``, frames over one TCP connection per
  engine): what placing replicas through Ray adds, on one machine;
* what a Ray actor in the token path would cost: the median round trip of a no-op actor call
  on a local Ray, next to a decode step of the same engine (spec/DEVIATIONS.md "Replicas"
  explains why the replicas are child processes of the gateway and not Ray actors or Ray
  Serve deployments). Skipped, with the reason, where Ray is not installed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.sse_client import stream_chunks
from colibri.server.context import ServerConfig
from colibri.server.runner import RunningServer, start

MODEL_ID = "bench"
#: The Ray namespace the actor probe runs in, apart from any other Ray user on the machine.
RAY_NAMESPACE = "colibri-bench-replicas"


def _post_stream(port: int, messages: list[dict[str, str]], tokens: int) -> tuple[float, str,
                                                                                   int]:
    """One streamed chat turn: seconds to the first content, the reply, completion tokens."""
    payload = {"model": MODEL_ID, "messages": messages, "max_tokens": tokens,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    began = time.perf_counter()
    first = 0.0
    reply = ""
    count = 0
    for chunk in stream_chunks(port, "/v1/chat/completions", payload):
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            first = first or time.perf_counter() - began
            reply += chunk["choices"][0]["delta"]["content"]
        if chunk.get("usage"):
            count = int(chunk["usage"]["completion_tokens"])
    return first, reply, count


def _health(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/health")
    body: dict[str, Any] = json.loads(conn.getresponse().read())
    conn.close()
    return body


def _conversation(port: int, index: int, turns: int, tokens: int) -> int:
    messages = [{"role": "user", "content": f"Conversation {index}: tell me about birds."}]
    produced = 0
    for turn in range(turns):
        _, reply, count = _post_stream(port, messages, tokens)
        produced += count
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"Go on ({turn + 1})."}]
    return produced


def _measure_serving(argv: list[str], env: dict[str, str], replicas: int, *, tokens: int,
                     rounds: int, conversations: int, turns: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(3600)

    config = ServerConfig(model_id=MODEL_ID, max_tokens=tokens, replicas=replicas,
                          max_queue=conversations)
    server: RunningServer = call(start(config, argv, env, 0))
    try:
        question = [{"role": "user", "content": "What is 27 + 15?"}]
        _post_stream(server.port, question, tokens)  # warm-up
        ttft = [_post_stream(server.port, question, tokens)[0] for _ in range(rounds)]
        began = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(conversations) as pool:
            produced = sum(pool.map(lambda i: _conversation(server.port, i, turns, tokens),
                                    range(conversations)))
        wall = time.perf_counter() - began
        health = _health(server.port)
    finally:
        call(server.stop(10.0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    out: dict[str, Any] = {
        "replicas": replicas, "ttft_ms_median": round(statistics.median(ttft) * 1000, 2),
        "ttft_ms_min": round(min(ttft) * 1000, 2), "workload_s": round(wall, 3),
        "completion_tokens": produced, "aggregate_tok_s": round(produced / wall, 2)}
    affinity = health.get("replicas", {}).get("affinity")
    if affinity is not None:
        follow_ups = affinity["hits"] + affinity["misses"]
        out["affinity"] = affinity
        out["affinity_hit_rate"] = round(affinity["hits"] / follow_ups, 3) if follow_ups else None
    return out


def _on_ray_nodes(argv: list[str], env: dict[str, str], shape: dict[str, int]
                  ) -> dict[str, Any]:
    """Two replicas whose engines run on the two nodes of a simulated Ray cluster."""
    try:
        import ray.cluster_utils
    except ImportError:
        return {"skipped": "ray is not installed (pip install 'colibri[cluster]')"}
    from colibri.server.remote_replica import remote_replica_argv

    utils: Any = ray.cluster_utils  # (Ray ships no type stubs)
    cluster = utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024)
        relayed = remote_replica_argv(f"ray:{cluster.address}", argv)
        measured = _measure_serving(relayed, env, 2, **shape)
    finally:
        cluster.shutdown()
    return {"nodes": 2, **measured}


def _ray_actor_round_trip(calls: int) -> dict[str, Any]:
    """Median seconds of a no-op Ray actor call on a local Ray started for this probe."""
    try:
        import ray
    except ImportError:
        return {"skipped": "ray is not installed (pip install 'colibri[cluster]')"}

    @ray.remote(num_cpus=0)
    class Relay:
        def frame(self, data: bytes) -> bytes:
            return data

    started = not ray.is_initialized()
    if started:
        ray.init(namespace=RAY_NAMESPACE, include_dashboard=False, num_cpus=1,
                 object_store_memory=80 * 1024 * 1024, log_to_driver=False)
    try:
        relay = Relay.remote()  # type: ignore[attr-defined]
        frame = b"DATA 1 1\nx"
        ray.get(relay.frame.remote(frame))
        times = []
        for _ in range(calls):
            began = time.perf_counter()
            ray.get(relay.frame.remote(frame))
            times.append(time.perf_counter() - began)
        ray.kill(relay)
    finally:
        if started:
            ray.shutdown()
    return {"calls": calls, "median_ms": round(statistics.median(times) * 1000, 3),
            "p90_ms": round(sorted(times)[int(0.9 * (len(times) - 1))] * 1000, 3)}


def run(options: BenchOptions) -> dict[str, Any]:
    from colibri import resources

    model = options.model
    if model is None or not (model / "tokenizer.json").exists():
        model = resources.fixture_model_dir("glm5-chat-tiny")  # chat needs a tokenizer
    argv = [sys.executable, "-m", "colibri", "engine", "--model", str(model)]
    tokens = max(options.tokens, 4)
    shape = {"tokens": tokens, "rounds": 5, "conversations": 4, "turns": 3}
    with tempfile.TemporaryDirectory(prefix="colibri-bench-replicas-") as state:
        # The replicas' saved KV goes to a scratch folder, never the user's state.
        env = {**os.environ, "COLI_STATE_DIR": state, "SNAP": str(model), "SERVE": "1",
               "SERVE_BATCH": "1", "NGEN": str(tokens), "KV_SLOTS": "1"}
        one = _measure_serving(argv, env, 1, **shape)
        two = _measure_serving(argv, env, 2, **shape)
        on_nodes = _on_ray_nodes(argv, env, shape)
    decode_step_ms = 1000 * one["workload_s"] / max(one["completion_tokens"], 1)
    return {"model": str(Path(model)), **shape, "one_replica": one, "two_replicas": two,
            "ttft_ratio_two_over_one": round(two["ttft_ms_median"] / one["ttft_ms_median"], 3),
            "throughput_ratio_two_over_one": round(
                two["aggregate_tok_s"] / one["aggregate_tok_s"], 3),
            "one_replica_ms_per_token": round(decode_step_ms, 3),
            "two_replicas_on_ray_nodes": on_nodes,
            "ray_actor_call": _ray_actor_round_trip(200)}


register(Section(
    name="replicas", engines=("reference", "server"),
    description="colibri serve --replicas 2 vs 1: time to first token, multi-turn tok/s, "
                "prefix-affinity hits, and a Ray actor call's round trip, in one run", run=run))
