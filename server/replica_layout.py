"""The KV slots of N engine replicas as one numbered pool, and which of them a request may take.

Replica ``r``'s local slot ``s`` is the pool's slot ``r * slots_per_replica + s``; with one
replica the pool's numbers are the engine's own. A request states a :class:`SlotClaim`: the
replica holding its conversation's prefix (when known) and the local slot it names (when it
names one). :meth:`ReplicaLayout.claimed` turns that into the pool slots it may take, routing
around replicas that are not ready; :meth:`ReplicaLayout.choose` picks among free ones the
slot on the least busy replica, lowest number first, so routing is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotClaim:
    #: The replica that holds the conversation's KV prefix; None: any replica.
    replica: int | None = None
    #: The KV slot inside a replica the request names; None: any slot.
    local: int | None = None


def _always_ready(_replica: int) -> bool:
    return True


class ReplicaLayout:
    def __init__(self, replicas: int, slots_per_replica: int,
                 ready: Callable[[int], bool] = _always_ready) -> None:
        if replicas < 1 or slots_per_replica < 1:
            raise ValueError(f"a replica layout needs at least one replica and one slot each, "
                             f"got {replicas} x {slots_per_replica}")
        self.replicas = replicas
        self.slots_per_replica = slots_per_replica
        self.ready = ready

    @property
    def capacity(self) -> int:
        return self.replicas * self.slots_per_replica

    def replica_of(self, slot: int) -> int:
        return slot // self.slots_per_replica

    def local_of(self, slot: int) -> int:
        return slot % self.slots_per_replica

    def slot(self, replica: int, local: int) -> int:
        return replica * self.slots_per_replica + local

    def serving(self) -> list[int]:
        """The replicas requests go to: the ready ones; all of them when none is ready, so
        that a request is admitted and fails fast with 503 as it does with one engine rather
        than queueing behind engines that may never come back."""
        ready = [r for r in range(self.replicas) if self.ready(r)]
        return ready or list(range(self.replicas))

    def claimed(self, claim: SlotClaim) -> set[int]:
        """Every pool slot ``claim`` may take: on its replica while that one is serving, else
        on any serving replica (its prefix is gone with the engine that held it anyway)."""
        serving = self.serving()
        replicas = [claim.replica] if claim.replica in serving else serving
        locals_ = (range(self.slots_per_replica) if claim.local is None
                   else [claim.local] if 0 <= claim.local < self.slots_per_replica else [])
        return {self.slot(r, s) for r in replicas for s in locals_}

    def choose(self, candidates: Set[int], free: Set[int]) -> int:
        """The candidate on the replica with the fewest busy slots, the lowest slot first."""
        def busy(replica: int) -> int:
            first = self.slot(replica, 0)
            return sum(1 for s in range(first, first + self.slots_per_replica) if s not in free)

        return min(candidates, key=lambda s: (busy(self.replica_of(s)), s))
