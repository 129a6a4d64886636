"""``colibri serve --replicas N``: N engines behind one gateway.

Routing is checked as properties of the admission pool (one replica admits exactly as one
engine always did; a known conversation goes to the replica holding its prefix while it is
ready; a new one to the least busy ready replica), then on live servers over the scripted
engine (one shared queue and its 429s, affinity across turns, a replica killed mid-stream while
requests wait on another), then end to end through the CLI and the OpenAI SDK on a real model.
No Ray here: the replicas are the gateway's own child processes (spec/DEVIATIONS.md
"Replicas").
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from colibri.server.affinity import AffinityTable, conversation_key, conversation_slot
from colibri.server.context import ServerConfig
from colibri.server.metrics import GenerationMetrics
from colibri.server.replica_layout import ReplicaLayout, SlotClaim
from colibri.server.replicas import ReplicaSet, replica_env
from colibri.server.scheduler import Scheduler, _Waiter
from hypothesis import given
from hypothesis import strategies as st
from support.http_transcript import exchange
from support.server_harness import LiveServer, interrupt, launch, serve_process

from colibri import resources

M = "test-model"
ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"server never reached: {what}")
        time.sleep(0.02)


# ---- routing as properties of the pool ------------------------------------------------

def old_pick(free: set[int], requested: int | None, ahead: list[int | None]) -> int | None:
    """The single-engine admission rule before replicas existed, kept as the oracle."""
    candidates = set(free) if requested is None else {requested} & free
    for waiter in ahead:
        if waiter is None:
            return None
        candidates.discard(waiter)
    return min(candidates) if candidates else None


def scheduler(replicas: int, slots: int, free: set[int],
              ready: Callable[[int], bool] = lambda _r: True) -> Scheduler:
    layout = ReplicaLayout(replicas, slots, ready)
    sched = Scheduler(layout.capacity, 8, 5.0, GenerationMetrics(), layout)
    sched.free = set(free)
    return sched


@given(st.integers(1, 6).flatmap(lambda k: st.tuples(
    st.just(k), st.sets(st.integers(0, k - 1)), st.none() | st.integers(0, k),
    st.lists(st.none() | st.integers(0, k - 1), max_size=4))))
def test_one_replica_admits_exactly_as_one_engine(
        case: tuple[int, set[int], int | None, list[int | None]]) -> None:
    slots, free, requested, ahead = case
    sched = scheduler(1, slots, free)
    waiters = [_Waiter(SlotClaim(local=w)) for w in ahead]
    assert sched._pick(SlotClaim(local=requested), waiters) == old_pick(free, requested, ahead)
    # The affinity a single replica remembers (always replica 0) changes nothing either.
    assert sched._pick(SlotClaim(0, requested), waiters) == old_pick(free, requested, ahead)


pools = st.tuples(st.integers(2, 4), st.integers(1, 3)).flatmap(lambda shape: st.tuples(
    st.just(shape[0]), st.just(shape[1]),
    st.sets(st.integers(0, shape[0] * shape[1] - 1)),
    st.sets(st.integers(0, shape[0] - 1))))


@given(pools, st.data())
def test_a_known_conversation_goes_to_the_replica_holding_its_prefix(
        pool: tuple[int, int, set[int], set[int]], data: st.DataObject) -> None:
    replicas, slots, free, ready = pool
    home = data.draw(st.integers(0, replicas - 1))
    local = data.draw(st.integers(0, slots - 1))
    layout_ready = ready | {home}
    sched = scheduler(replicas, slots, free | {home * slots + local}, layout_ready.__contains__)
    assert sched._pick(SlotClaim(home, local), []) == home * slots + local
    # Deterministic: the same state routes the same way.
    assert sched._pick(SlotClaim(home, local), []) == home * slots + local


@given(pools, st.data())
def test_a_replica_that_is_not_ready_is_routed_around(
        pool: tuple[int, int, set[int], set[int]], data: st.DataObject) -> None:
    replicas, slots, free, ready = pool
    home = data.draw(st.integers(0, replicas - 1))
    ready -= {home}
    sched = scheduler(replicas, slots, free, ready.__contains__)
    picked = sched._pick(SlotClaim(home, None), [])
    if ready:
        # Its prefix died with the engine: any ready replica serves it, never the dead one.
        expected = old_pick({s for s in free if s // slots in ready}, None, [])
        assert (picked is None) == (expected is None)
        assert picked is None or picked // slots in ready
    else:
        # Nothing is ready: routed as if all were (to its own replica), admitted as one
        # engine would be, and answered 503 when the turn reaches the engine.
        assert picked == old_pick({s for s in free if s // slots == home}, None, [])


@given(pools)
def test_a_new_conversation_goes_to_the_least_busy_ready_replica(
        pool: tuple[int, int, set[int], set[int]]) -> None:
    replicas, slots, free, ready = pool
    sched = scheduler(replicas, slots, free, ready.__contains__)
    picked = sched._pick(SlotClaim(), [])
    serving = ready or set(range(replicas))
    open_slots = [s for s in free if s // slots in serving]
    if not open_slots:
        assert picked is None
        return
    assert picked in open_slots
    busy = sched.busy_by_replica()
    assert busy[picked // slots] == min(busy[s // slots] for s in open_slots)
    assert picked == min(s for s in open_slots if busy[s // slots] == busy[picked // slots])


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 3)), max_size=60),
       st.integers(1, 5))
def test_the_affinity_table_remembers_the_last_server_and_stays_bounded(
        served: list[tuple[int, int]], capacity: int) -> None:
    table = AffinityTable(capacity)
    last: dict[str, int] = {}
    for conversation, replica in served:
        key = f"c{conversation}"
        table.served(key, table.replica_for(key), replica)
        last[key] = replica
        assert table.replica_for(key) == replica
        assert len(table) <= capacity
    for key, replica in last.items():
        assert table.replica_for(key) in (None, replica)
    counts = table.counts
    assert counts.hits + counts.misses + counts.new == len(served)
    with pytest.raises(ValueError):
        AffinityTable(0)


def test_every_turn_of_a_conversation_has_its_key() -> None:
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = first + [{"role": "assistant", "content": "hello"},
                     {"role": "user", "content": "and?"}]
    other = [{"role": "user", "content": "hi there"}]
    assert conversation_key(first) == conversation_key(later) != conversation_key(other)
    assert conversation_slot(first, 16) == int(conversation_key(first)[:16], 16) % 16
    assert conversation_slot(first, 1) == 0


def test_each_replica_saves_its_kv_in_its_own_folder_and_knows_its_index() -> None:
    assert replica_env({"COLI_STATE_DIR": "/s", "X": "1"}, 2) == {
        "COLI_STATE_DIR": os.path.join("/s", "replica-2"), "X": "1", "COLI_REPLICA_INDEX": "2"}
    assert replica_env({"X": "1"}, 0) == {"X": "1", "COLI_REPLICA_INDEX": "0"}
    with pytest.raises(ValueError, match="--replicas must be at least 1"):
        ReplicaSet(["engine"], {}, 0, 1)


# ---- live servers over the scripted engine ------------------------------------------

def chat(live: LiveServer, messages: list[dict[str, str]], stream: bool = False) -> Any:
    return exchange(live.url, "POST", "/v1/chat/completions",
                    {"model": M, "messages": messages, "stream": stream})


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def replicas(live: LiveServer) -> dict[str, Any]:
    body: dict[str, Any] = exchange(live.url, "GET", "/health")["body"]
    return body


def active(live: LiveServer) -> list[int]:
    return [engine["active"] for engine in replicas(live)["replicas"]["engines"]]


def test_one_queue_and_its_429_span_the_replicas(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    live = launch(ServerConfig(model_id=M, kv_slots=1, replicas=2, max_queue=1,
                               max_tokens=64), env={"FAKE_GATE": str(gate)})
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = pool.submit(chat, live, [user("one @@gate:1@@")])
            wait_for(lambda: active(live) == [1, 0], "the first on replica 0")
            second = pool.submit(chat, live, [user("two @@gate:2@@")])
            wait_for(lambda: active(live) == [1, 1], "the second on replica 1")
            waiting = pool.submit(chat, live, [user("three")])
            wait_for(lambda: replicas(live)["scheduler"]["queued"] == 1, "one queued")
            refused = exchange(live.url, "POST", "/v1/messages", {
                "model": M, "max_tokens": 3, "messages": [user("four")]})
            assert refused["status"] == 429
            assert refused["headers"]["retry-after"] == "1"
            assert refused["body"] == {"type": "error", "error": {
                "type": "rate_limit_error", "message": "The inference queue is full."}}
            Path(f"{gate}.1").touch()
            Path(f"{gate}.2").touch()
            assert [f.result(30)["status"] for f in (first, second, waiting)] == [200] * 3
        snap = replicas(live)["scheduler"]
        assert (snap["capacity"], snap["max_queue"], snap["rejected"]) == (2, 1, 1)
        assert snap["admitted"] == snap["completed"] == 3
    finally:
        live.stop()


def test_a_conversation_follows_the_replica_holding_its_prefix(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    live = launch(ServerConfig(model_id=M, kv_slots=1, replicas=2, max_tokens=64),
                  env={"FAKE_GATE": str(gate)})
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            alpha = [user("alpha @@gate:1@@")]
            held = pool.submit(chat, live, alpha)
            wait_for(lambda: active(live) == [1, 0], "alpha on replica 0")
            beta = [user("beta")]
            reply = chat(live, beta)["body"]["choices"][0]["message"]["content"]
            Path(f"{gate}.1").touch()
            assert held.result(30)["status"] == 200
            # Both replicas are idle now, so the least busy rule alone would pick replica 0:
            # beta's next turn goes back to replica 1, which holds its prefix.
            beta_next = beta + [{"role": "assistant", "content": reply}, user("more @@gate:2@@")]
            follow = pool.submit(chat, live, beta_next)
            wait_for(lambda: active(live) == [0, 1], "beta's next turn on replica 1")
            Path(f"{gate}.2").touch()
            assert follow.result(30)["status"] == 200
        alpha_next = alpha + [{"role": "assistant", "content": "x"}, user("again")]
        assert chat(live, alpha_next)["status"] == 200
        assert replicas(live)["replicas"]["affinity"] == {"hits": 2, "misses": 0, "new": 2}
        assert live.state.affinity.replica_for(conversation_key(alpha)) == 0
        assert live.state.affinity.replica_for(conversation_key(beta)) == 1
    finally:
        live.stop()


def test_a_killed_replica_fails_only_its_own_requests_and_comes_back(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    live = launch(ServerConfig(model_id=M, kv_slots=1, replicas=2, max_tokens=64),
                  env={"FAKE_GATE": str(gate)})
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            doomed = pool.submit(chat, live, [user("alpha @@gate:1@@")], True)
            wait_for(lambda: active(live) == [1, 0], "alpha streaming on replica 0")
            # Two conversations whose prefixes are on replica 1 ...
            beta, delta = [user("beta")], [user("delta")]
            assert chat(live, beta)["status"] == chat(live, delta)["status"] == 200
            # ... one running there, the other queued behind it.
            running = pool.submit(chat, live, beta + [
                {"role": "assistant", "content": "x"}, user("@@gate:2@@")])
            wait_for(lambda: active(live) == [1, 1], "beta's next turn on replica 1")
            queued = pool.submit(chat, live, delta + [
                {"role": "assistant", "content": "x"}, user("go on")])
            wait_for(lambda: replicas(live)["scheduler"]["queued"] == 1, "delta queued")

            victim = replicas(live)["replicas"]["engines"][0]["pid"]
            os.kill(victim, signal.SIGKILL)
            stream = doomed.result(30)
            assert stream["status"] == 200 and "[DONE]" not in stream["events"]
            assert replicas(live)["scheduler"]["queued"] == 1  # still waiting on replica 1

            Path(f"{gate}.2").touch()
            assert running.result(30)["status"] == 200
            answer = queued.result(30)
            assert answer["status"] == 200
            assert answer["body"]["choices"][0]["message"]["content"] == "Héllo"

        wait_for(lambda: replicas(live)["replicas"]["engines"][0]["restarts"] == 1
                 and replicas(live)["replicas"]["engines"][0]["state"] == "ready",
                 "replica 0 restarted")
        health = replicas(live)
        assert health["status"] == "ok"
        assert health["replicas"]["engines"][0]["pid"] != victim
        assert health["replicas"]["engines"][0]["last_exit"] is not None
        assert health["replicas"]["engines"][1]["restarts"] == 0
        epsilon = [user("epsilon")]
        assert chat(live, epsilon)["status"] == 200  # both idle: replica 0, back in service
        assert live.state.affinity.replica_for(conversation_key(epsilon)) == 0
        snap = health["scheduler"]
        assert snap["failed"] == 1 and snap["completed"] == 4
    finally:
        live.stop()


# ---- the command line -------------------------------------------------------------------

def test_serve_refuses_a_replica_count_below_one() -> None:
    done = subprocess.run([sys.executable, "-m", "colibri", "serve", "--replicas", "0",
                           "--port", "0"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 1
    assert "colibri serve: --replicas must be between 1 and 64, got 0" in done.stderr


def test_serve_replicas_through_the_openai_sdk(tmp_path: Path) -> None:
    import json
    import urllib.request

    import openai
    model = resources.fixture_model_dir("glm5-chat-tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
    env["XDG_STATE_HOME"] = str(tmp_path)  # the replicas' saved KV stays in the test's folder
    with serve_process(["--model", str(model), "--replicas", "2"], env, ROOT) as (
            proc, line, url):
        assert line.startswith("colibri serving glm-5.2-colibri on http://127.0.0.1:"), line
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        question: list[Any] = [{"role": "user", "content": "What is 27 + 15?"}]
        first = client.chat.completions.create(model="glm-5.2-colibri", temperature=0,
                                               max_tokens=8, messages=question)
        answer = first.choices[0].message.content
        assert answer and first.usage is not None and first.usage.completion_tokens > 0
        stream = client.chat.completions.create(
            model="glm-5.2-colibri", temperature=0, max_tokens=8, stream=True,
            messages=[*question, {"role": "assistant", "content": answer},
                      {"role": "user", "content": "And 15 + 27?"}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as response:
            health = json.load(response)
        assert [e["state"] for e in health["replicas"]["engines"]] == ["ready", "ready"]
        assert health["replicas"]["affinity"] == {"hits": 1, "misses": 0, "new": 1}
        assert sorted(p.name for p in tmp_path.glob("colibri/*/replica-*")) == [
            "replica-0", "replica-1"]
        assert interrupt(proc) == 0
