"""Expert workers as Ray actors behind ``RemoteExperts`` on a Ray cluster.

``--cluster ray`` starts a local Ray on demand (a small object store, no dashboard); ``--cluster
ray:ADDRESS`` joins an existing cluster (``ray start --head`` on one machine, ``ray start
--address`` on the others; ``ray:auto`` finds the one running on this machine). A process that
already called ``ray.init`` (a test that built a simulated cluster) is used as it is.

Placement: one worker per alive node (or ``workers`` of them, dealt round robin over the
nodes), each an actor that opens the model directory on its own node and loads its share. Ray
restarts a worker whose process dies (``max_restarts``); the restarted worker reloads its share
in its constructor. The layer calls do not go through Ray: each worker listens on a direct
channel (``expert_channel``: one TCP connection from the engine, a request and an answer per
layer), which Ray's ``serve`` call locates. Calls are never retried: a call in flight when
its worker dies fails as the connection closes, the step's requests end with an error, and
the next step's calls wait for the restarted worker and connect to it.

Ray is imported only here and only when a cluster is opened: the engine's start-up without
``--cluster`` never loads it. Ray ships no type stubs, so it is held as ``Any`` behind this
module's typed surface.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from colibri.backend_kit.expert_channel import (
    ChannelServer,
    WorkerFailed,
    no_delay,
    peer_closed,
    read_answer,
    send_request,
)
from colibri.backend_kit.expert_worker import ExpertWorker
from colibri.backend_kit.placement_file import read_placement
from colibri.backend_kit.remote_experts import (
    DEFAULT_DEADLINE_S,
    F32,
    ExpertCall,
    Placement,
    RemoteExpertError,
    RemoteExperts,
)

#: A worker's share is loaded before the engine says READY; a real model's share takes a
#: while to read, a worker that cannot start at all is reported after this.
START_TIMEOUT_S = 600.0
#: How often a call waiting for a restarting worker asks again.
RESTART_POLL_S = 0.05
#: The object store of a Ray this process starts: a step's calls carry a few rows of
#: activations, so the store's minimum is plenty.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024


class ClusterStartError(Exception):
    """The cluster could not be opened: Ray missing, unreachable, or a worker failed to load."""


@dataclass(frozen=True)
class ClusterSpec:
    """``ray`` (a local Ray started on demand) or ``ray:ADDRESS`` (an existing cluster), how
    many workers (0: one per alive node, or one per node of the placement file), and the
    placement file (``--cluster-placement``; None: experts striped over the workers)."""

    address: str | None = None
    workers: int = 0
    deadline_s: float = DEFAULT_DEADLINE_S
    placement: str | None = None

    @classmethod
    def parse(cls, text: str, workers: int = 0, deadline_s: float = DEFAULT_DEADLINE_S,
              placement: str | None = None) -> ClusterSpec:
        kind, sep, address = text.partition(":")
        if kind != "ray" or (sep and not address):
            raise ValueError(f"--cluster {text!r}: expected ray or ray:ADDRESS")
        if workers < 0:
            raise ValueError(f"--cluster-workers must be >= 0, got {workers}")
        if not deadline_s > 0:
            raise ValueError(f"the cluster deadline must be positive, got {deadline_s}")
        return cls(address or None, workers, deadline_s, placement)

    def __str__(self) -> str:
        return "ray" if self.address is None else f"ray:{self.address}"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterStartError("--cluster needs Ray: pip install 'colibri[cluster]'") from None
    return ray


class RayCaller:
    """The expert workers' control through Ray: waiting out a restart (the worker answers
    ``ready`` once its share is reloaded), their process ids, and their end. The layer calls
    are ``ChannelCaller``'s."""

    def __init__(self, ray: Any, actors: list[Any], names: list[str], started: bool) -> None:
        self.ray = ray
        self.actors = actors
        self.names = names
        self.started = started
        #: Workers whose last call found them lost: Ray is restarting them, and a call made
        #: before the restart ends fails at once (ActorUnavailableError), so the next call
        #: waits for them to be ready first, within its deadline.
        self._restarting: set[int] = set()

    def _await_ready(self, owner: int, until: float, during: str) -> tuple[Any, ...]:
        """Worker ``owner``'s ``ready`` answer once Ray has restarted it (its share reloaded),
        asking again while Ray says it is still restarting; ``RemoteExpertError`` if it is not
        back by ``until``."""
        ray = self.ray
        while True:
            left = until - time.monotonic()
            try:
                answer = tuple(ray.get(self.actors[owner].ready.remote(),
                                       timeout=max(0.0, left)))
            except ray.exceptions.ActorUnavailableError:
                if left <= 0:
                    break
                time.sleep(min(RESTART_POLL_S, left))
                continue
            except ray.exceptions.GetTimeoutError:
                break
            except ray.exceptions.RayActorError as exc:  # died for good (restarts used up)
                raise RemoteExpertError(f"expert worker {self.names[owner]} is gone "
                                        f"({during}): {type(exc).__name__}") from None
            self._restarting.discard(owner)
            return answer
        raise RemoteExpertError(f"expert worker {self.names[owner]} was not back from its "
                                f"restart in time for {during}")

    def pids(self, timeout_s: float = START_TIMEOUT_S) -> list[int]:
        """Each worker's process id (after a restart, the new process's, once it is back)."""
        until = time.monotonic() + timeout_s
        return [int(self._await_ready(owner, until, "a status query")[0])
                for owner in range(len(self.actors))]

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []
        if self.started:
            self.ray.shutdown()


class ChannelWorker(ExpertWorker):
    """An expert worker that answers its layer calls over a direct channel
    (``expert_channel``); Ray places it, restarts it and asks where it listens."""

    _server: ChannelServer | None = None

    def serve(self) -> tuple[str, int]:
        """(this node's IP, the port of the worker's channel), the channel opened once."""
        if self._server is None:
            self._server = ChannelServer(self.run)
        return str(_ray().util.get_node_ip_address()), self._server.port


class ChannelCaller(RayCaller):
    """``ExpertCaller`` over one direct connection per worker: a layer's requests sent to
    every owner at once, then each answer read within what is left of the deadline.

    A connection found closed before a layer's request (the worker died between calls) is
    waited out as a restart; one that breaks while a layer's request is out fails the layer
    at once, and the worker is treated as restarting: the next call waits for Ray's restart
    (its share reloaded) and connects to the new process. A connection given up on by the
    deadline, or left with an answer unread because another owner failed first, is closed
    and opened again for the next call, so no late answer is ever read as a later layer's."""

    def __init__(self, ray: Any, actors: list[Any], names: list[str], started: bool) -> None:
        super().__init__(ray, actors, names, started)
        self._conns: list[socket.socket | None] = [None] * len(actors)

    def _connection(self, owner: int, until: float, during: str) -> socket.socket:
        conn = self._conns[owner]
        if conn is not None:
            return conn
        name = self.names[owner]
        try:
            ip, port = self.ray.get(self.actors[owner].serve.remote(),
                                    timeout=max(0.0, until - time.monotonic()))
            conn = socket.create_connection((ip, port), max(0.001, until - time.monotonic()))
        except self.ray.exceptions.GetTimeoutError:
            raise RemoteExpertError(f"expert worker {name} did not answer {during} in "
                                    "time") from None
        except (self.ray.exceptions.RayError, OSError) as exc:
            self._restarting.add(owner)
            raise RemoteExpertError(f"expert worker {name} could not be reached for "
                                    f"{during}: {type(exc).__name__}") from None
        no_delay(conn)
        self._conns[owner] = conn
        return conn

    def connect(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Open every worker's channel now (at start-up, so a first call meets only the
        channel)."""
        until = time.monotonic() + timeout_s
        for owner in range(len(self.actors)):
            self._connection(owner, until, "start-up")

    def _drop(self, owner: int) -> None:
        conn, self._conns[owner] = self._conns[owner], None
        if conn is not None:
            conn.close()

    def call(self, calls: Sequence[tuple[int, ExpertCall]], deadline_s: float) -> list[F32]:
        until = time.monotonic() + deadline_s
        during = f"layer {calls[0][1].layer}" if calls else "a call"
        owners = {owner for owner, _ in calls}
        for owner in owners:
            conn = self._conns[owner]
            if conn is not None and peer_closed(conn):  # it died since the last call
                self._drop(owner)
                self._restarting.add(owner)
        for owner in sorted(owners & self._restarting):
            self._await_ready(owner, until, during)
        pending = [owner for owner, _ in calls]
        try:
            conns = []
            for owner, c in calls:
                conn = self._connection(owner, until, during)
                try:
                    conn.settimeout(max(0.001, until - time.monotonic()))
                    send_request(conn, c)
                except OSError:
                    raise self._lost(owner, c.layer) from None
                conns.append(conn)
            answers: list[F32] = []
            for (owner, c), conn in zip(calls, conns, strict=True):
                name = self.names[owner]
                try:
                    conn.settimeout(max(0.001, until - time.monotonic()))
                    answers.append(read_answer(conn))
                except TimeoutError:
                    raise RemoteExpertError(f"expert worker {name} did not answer layer "
                                            f"{c.layer} within {deadline_s:g} s") from None
                except WorkerFailed as exc:
                    pending.remove(owner)  # the answer was read: the connection is in step
                    raise RemoteExpertError(f"expert worker {name} failed layer {c.layer}: "
                                            f"{exc}") from None
                except OSError:
                    raise self._lost(owner, c.layer) from None
                pending.remove(owner)
            return answers
        finally:
            for owner in pending:  # an answer may still come: never read it as another's
                self._drop(owner)

    def _lost(self, owner: int, layer: int) -> RemoteExpertError:
        self._drop(owner)
        self._restarting.add(owner)
        return RemoteExpertError(f"expert worker {self.names[owner]} was lost during layer "
                                 f"{layer}: its connection closed")

    def close(self) -> None:
        for owner in range(len(self._conns)):
            self._drop(owner)
        super().close()


def _cluster_errors_to_stderr() -> None:
    """Ray's driver prints the cluster's error reports ("a worker died...") to ``sys.stdout``,
    which is an engine's protocol stream: send them to stderr, the engine's log. They are
    reports only; the calls they concern fail on their own (``RemoteExpertError``)."""
    import importlib

    module: Any = importlib.import_module("ray._private.worker")
    printer = getattr(module, "print_to_stdstream", None)
    if printer is None or getattr(printer, "to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_stderr


def _connect(ray: Any, spec: ClusterSpec) -> bool:
    """Join or start Ray; True when this process started it (and so stops it)."""
    _cluster_errors_to_stderr()
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if spec.address is not None:
            ray.init(address=spec.address, **quiet)
            return False
        # The CPUs this process may use: shared by the workers as kernel threads.
        ray.init(num_cpus=max(1, len(os.sched_getaffinity(0))),
                 object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterStartError(f"--cluster {spec}: {exc}") from None
    return True


def planned_placement(spec: ClusterSpec, layers: Sequence[int],
                      n_experts: int) -> Placement | None:
    """The placement file's placement, checked against the model (before Ray starts: a file
    for another model is refused at once); None without a file."""
    if spec.placement is None:
        return None
    placement = read_placement(Path(spec.placement), layers, n_experts)
    if spec.workers and spec.workers != placement.owners:
        raise ClusterStartError(f"--cluster-workers {spec.workers} disagrees with the placement "
                                f"file {spec.placement}, which places the experts on "
                                f"{placement.owners} nodes (leave --cluster-workers out)")
    return placement


def open_ray_experts(spec: ClusterSpec, model_dir: str, factory: str, layers: Sequence[int],
                     n_experts: int, log: TextIO) -> RemoteExperts:
    """Workers placed and loaded (each has answered ``ready``), behind ``RemoteExperts``. With
    a placement file, worker i holds the experts the file gives node i."""
    planned = planned_placement(spec, layers, n_experts)
    ray = _ray()
    started = _connect(ray, spec)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n["NodeID"]))
    if not nodes:
        raise ClusterStartError(f"--cluster {spec}: the cluster has no alive node")
    if planned is not None:
        count, placement = planned.owners, planned
        if count > len(nodes):
            # Still runs (workers share nodes), but the plan's per-node RAM no longer holds.
            print(f"== cluster {spec}: the placement file names {count} nodes, the cluster "
                  f"has {len(nodes)} alive: some nodes run several workers ==", file=log)
    else:
        count = spec.workers or len(nodes)
        placement = Placement.striped(layers, n_experts, count)
    where = [nodes[i % len(nodes)] for i in range(count)]
    per_node: dict[str, int] = {}
    for node in where:
        per_node[str(node["NodeID"])] = per_node.get(str(node["NodeID"]), 0) + 1
    worker_class = ray.remote(ChannelWorker)
    actors: list[Any] = []
    names: list[str] = []
    for i, node in enumerate(where):
        node_id = str(node["NodeID"])
        # The node's CPUs shared among its workers become each worker's kernel threads; the
        # actor reserves none, so engines sharing a cluster never wait on each other's
        # reservations.
        threads = max(1, int(node.get("Resources", {}).get("CPU", 1)) // per_node[node_id])
        # soft: a worker whose node is gone may restart on another node (it opens the
        # model directory there by the same path).
        actors.append(worker_class.options(
            max_restarts=-1, max_task_retries=0, num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True),
        ).remote(model_dir, factory, placement.owned(i), threads))
        names.append(f"{i} ({node.get('NodeManagerAddress', '?')})")
    caller = ChannelCaller(ray, actors, names, started)
    try:
        ready = ray.get([a.ready.remote() for a in actors], timeout=START_TIMEOUT_S)
    except ray.exceptions.RayError as exc:
        caller.close()
        raise ClusterStartError(f"--cluster {spec}: an expert worker did not start: "
                                f"{str(exc).strip().splitlines()[-1]}") from None
    try:
        caller.connect()
    except RemoteExpertError as exc:
        caller.close()
        raise ClusterStartError(f"--cluster {spec}: {exc}") from None
    for name, (pid, held, nbytes) in zip(names, ready, strict=True):
        print(f"== expert worker {name}: pid {pid}, {held} experts, {nbytes / 1e6:.1f} MB ==",
              file=log)
    where_s = f"{len(nodes)} node" + ("s" if len(nodes) > 1 else "")
    placed = "striped" if spec.placement is None else f"placed by {spec.placement}"
    print(f"== cluster {spec}: {count} expert workers on {where_s}, experts {placed}, layer "
          f"deadline {spec.deadline_s:g} s ==", file=log)
    return RemoteExperts(caller, placement, spec.deadline_s,
                         [int(nbytes) for _, _, nbytes in ready])
