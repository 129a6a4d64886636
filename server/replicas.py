"""N engine replicas behind one gateway: ``colibri serve --replicas N``.

Each replica is an engine process under its own :class:`EngineSupervisor`, which restarts it
with backoff when it dies; the replicas share nothing, so a replica's death ends only the
requests running on it (as an engine's death does with one engine) while the others keep
serving. The set answers what the HTTP side asks of one supervisor (state, telemetry,
``submit``, ``close``): a request's slot is a slot of the replica pool
(:class:`ReplicaLayout`), and :meth:`ReplicaSet.submit` hands it to the replica that owns the
slot with the replica's own slot number.

The engines are child processes of the gateway, not Ray actors: a Ray actor in the token path
costs a remote call per relayed frame, which the measurement in spec/DEVIATIONS.md
("Replicas") found larger than a decode step of a small model, while restart-on-death is what
the supervisor already does (docs/cluster.md). On a Ray cluster (``--replica-cluster``) each
child is a relay to an engine on another node (``remote_replica``), which keeps Ray out of
the token path too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping, Sequence

from colibri.server.engine_client import EngineProcess, Event, Telemetry
from colibri.server.remote_replica import REPLICA_INDEX
from colibri.server.replica_layout import ReplicaLayout
from colibri.server.supervisor import EngineSupervisor

from colibri.protocol import SubmitRequest

#: Where each replica keeps its saved KV slots, under the engine's state folder: two engines
#: writing the same slot files would load each other's conversations after a restart.
REPLICA_STATE_DIR = "replica-{index}"


def replica_env(env: Mapping[str, str], index: int) -> dict[str, str]:
    """Replica ``index``'s engine environment: ``env`` with its index (``COLI_REPLICA_INDEX``)
    and ``COLI_STATE_DIR`` (when set) made the replica's own subfolder."""
    own = dict(env)
    own[REPLICA_INDEX] = str(index)  # which node a replica on a Ray cluster goes to
    state_dir = own.get("COLI_STATE_DIR")
    if state_dir:
        own["COLI_STATE_DIR"] = os.path.join(state_dir, REPLICA_STATE_DIR.format(index=index))
    return own


class ReplicaSet:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str], replicas: int,
                 slots_per_replica: int, ready_timeout: float = 600.0) -> None:
        if replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {replicas}")
        self.supervisors = [EngineSupervisor(argv, replica_env(env, i), ready_timeout)
                            for i in range(replicas)]
        self.layout = ReplicaLayout(replicas, slots_per_replica, self.replica_ready)

    def replica_ready(self, index: int) -> bool:
        supervisor = self.supervisors[index]
        return (supervisor.state == "ready" and supervisor.engine is not None
                and supervisor.engine.alive())

    # ---- what the HTTP side reads of one supervisor ----------------------------------

    @property
    def state(self) -> str:
        """``ready`` while any replica serves; else the first replica's state."""
        if any(self.replica_ready(i) for i in range(len(self.supervisors))):
            return "ready"
        return self.supervisors[0].state

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.supervisors)

    @property
    def pid(self) -> int | None:
        return self.supervisors[0].pid

    @property
    def last_exit(self) -> str | None:
        return next((s.last_exit for s in self.supervisors if s.last_exit is not None), None)

    @property
    def supports_seeds(self) -> bool:
        return all(s.supports_seeds for s in self.supervisors)

    @property
    def telemetry(self) -> Telemetry:
        """Replica 0's telemetry: every replica runs the same model and build, so its
        capabilities and hardware stand for all; its expert map and profile are one replica's
        sample of the traffic."""
        return self.supervisors[0].telemetry

    def describe(self) -> list[dict[str, object]]:
        """Each replica's engine, as ``/health`` lists them."""
        return [{"replica": i, "state": s.state, "restarts": s.restarts, "pid": s.pid,
                 "last_exit": s.last_exit} for i, s in enumerate(self.supervisors)]

    # ---- lifecycle and requests ------------------------------------------------------

    async def start(self) -> None:
        """Start every replica at once; if one never gets READY, stop the others and raise
        its EngineStartError."""
        results = await asyncio.gather(*(s.start() for s in self.supervisors),
                                       return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self.close(drain_s=2.0)
            raise failure

    async def submit(self, request: SubmitRequest) -> tuple[EngineProcess, int,
                                                            asyncio.Queue[Event]]:
        """Send ``request`` (its slot a pool slot) to the replica owning that slot; raises
        EngineUnavailable when that replica is not ready."""
        replica = self.layout.replica_of(request.slot)
        local = dataclasses.replace(request, slot=self.layout.local_of(request.slot))
        return await self.supervisors[replica].submit(local)

    async def close(self, drain_s: float = 30.0) -> None:
        await asyncio.gather(*(s.close(drain_s) for s in self.supervisors))
