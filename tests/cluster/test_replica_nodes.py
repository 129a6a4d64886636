"""``colibri serve --replicas N --replica-cluster ray:ADDRESS``: the replicas' engines on the
nodes of a Ray cluster (a simulated two-node ``ray.cluster_utils.Cluster``), one per node,
served through the same gateway as local replicas; an engine host lost with its node's actor
is replaced on an alive node and serving goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from colibri.server.remote_replica import NAMESPACE, actor_name, main, remote_replica_argv
from support.cluster_support import ray_cluster  # noqa: F401 (the module's simulated cluster)
from support.server_harness import interrupt, serve_process

from colibri import resources

ROOT = Path(__file__).resolve().parents[2]
MODEL = "glm-5.2-colibri"


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as response:
        found: dict[str, Any] = json.load(response)
    return found


def wait_ready(url: str, replicas: int, limit_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    found: dict[str, Any] = {}
    while True:
        try:
            found = health(url)
            states = [e["state"] for e in found["replicas"]["engines"]]
            if states == ["ready"] * replicas:
                return found
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas never all ready: {found}")
        time.sleep(0.1)


def ask(url: str, text: str) -> str:
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=6,
                                           messages=[{"role": "user", "content": text}])
    answer = reply.choices[0].message.content
    assert answer
    return answer


def hosts(ray: Any, gateway_pid: int, replicas: int) -> list[Any]:
    return [ray.get_actor(actor_name(gateway_pid, i), namespace=NAMESPACE)
            for i in range(replicas)]


@pytest.fixture()
def served(ray_cluster: Any,  # noqa: F811 (the fixture imported above)
           tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
    env["XDG_STATE_HOME"] = str(tmp_path)
    model = resources.fixture_model_dir("glm5-chat-tiny")
    with serve_process(["--model", str(model), "--replicas", "2",
                        "--replica-cluster", f"ray:{ray_cluster.address}"], env, ROOT) as (
            proc, line, url):
        assert line.startswith(f"colibri serving {MODEL} on http://127.0.0.1:"), line
        yield proc, url


def test_each_replica_runs_on_its_own_node_and_serves(
        served: tuple[subprocess.Popen[str], str]) -> None:
    import ray

    proc, url = served
    wait_ready(url, 2)
    engines = hosts(ray, proc.pid, 2)
    nodes = [ray.get(h.node.remote()) for h in engines]
    alive = sorted(str(n["NodeID"]) for n in ray.nodes() if n["Alive"])
    assert nodes == alive  # replica i on the i-th node by id
    first = ask(url, "What is 27 + 15?")
    assert ask(url, "What is 27 + 15?") == first  # the same answer from either node
    assert interrupt(proc) == 0
    deadline = time.monotonic() + 30
    while any(a["name"].startswith(f"colibri-replica-{proc.pid}-")
              for a in ray.util.list_named_actors(all_namespaces=True)):
        assert time.monotonic() < deadline, "the engine hosts outlived the server"
        time.sleep(0.1)


def test_a_lost_engine_host_is_replaced_and_serving_goes_on(
        served: tuple[subprocess.Popen[str], str]) -> None:
    import ray

    proc, url = served
    before = wait_ready(url, 2)
    lost = hosts(ray, proc.pid, 2)[1]
    _, _, engine_pid = ray.get(lost.address.remote())
    ray.kill(lost, no_restart=True)  # its node's actor is gone, and the engine with it
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the engine outlived its host"
        time.sleep(0.1)
    deadline = time.monotonic() + 120
    while health(url)["replicas"]["engines"][1]["restarts"] < 1:
        assert time.monotonic() < deadline, "the lost replica was never started again"
        time.sleep(0.1)
    after = wait_ready(url, 2)
    assert after["replicas"]["engines"][0]["pid"] == before["replicas"]["engines"][0]["pid"]
    ask(url, "What is 2 + 3?")
    ask(url, "What is 4 + 4?")
    assert interrupt(proc) == 0


def test_the_relay_refuses_a_cluster_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cluster", "slurm", "--", "true"]) == 2
    assert "--replica-cluster 'slurm': expected ray or ray:ADDRESS" in capsys.readouterr().err
    argv = remote_replica_argv("ray:10.0.0.1:6379", ["engine", "--model", "m"])
    assert argv[1:6] == ["-m", "colibri.server.remote_replica", "--cluster", "ray:10.0.0.1:6379",
                         "--"] and argv[6:] == ["engine", "--model", "m"]
    assert sys.executable == argv[0]
