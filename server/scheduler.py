"""Admission to KV slots: a FIFO queue with per-slot reservations (spec/http.md §6).

A request that can take a slot no earlier waiter has a claim on is admitted at once; one
that must wait joins the queue unless ``max_queue`` requests already wait (429
``queue_full``). Waiters are re-examined whenever a slot is released and at least every
0.25 s: shutdown, then client cancellation, then the queue deadline, then a slot.

With several engine replicas the slots of all of them form one pool (:class:`ReplicaLayout`)
behind this one queue, so ``max_queue`` and the 429s are the gateway's, not per replica; a
request's :class:`SlotClaim` says which slots it may take.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from colibri.server import errors
from colibri.server.errors import ClientCancelled
from colibri.server.metrics import GenerationMetrics
from colibri.server.replica_layout import ReplicaLayout, SlotClaim

POLL_S = 0.25


@dataclass(eq=False)
class _Waiter:
    claim: SlotClaim
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Admission:
    #: The slot in the pool (with one replica, the engine's own slot number).
    slot: int
    wait_s: float
    admitted_at: float


class Scheduler:
    def __init__(self, capacity: int, max_queue: int, queue_timeout: float,
                 metrics: GenerationMetrics, layout: ReplicaLayout | None = None) -> None:
        self.layout = layout or ReplicaLayout(1, capacity)
        if self.layout.capacity != capacity:
            raise ValueError(f"capacity {capacity} is not the layout's "
                             f"{self.layout.capacity} slots")
        self.capacity = capacity
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.metrics = metrics
        self.free: set[int] = set(range(capacity))
        self.waiters: list[_Waiter] = []
        self.closed = False
        self.counts = {"admitted": 0, "completed": 0, "failed": 0, "rejected": 0,
                       "timed_out": 0, "cancelled": 0}

    def snapshot(self) -> dict[str, float | int]:
        return {"active": self.capacity - len(self.free), "queued": len(self.waiters),
                "capacity": self.capacity, "max_queue": self.max_queue,
                "queue_timeout_seconds": float(self.queue_timeout), **self.counts}

    def busy_by_replica(self) -> list[int]:
        """Slots in use on each replica, in replica order."""
        layout = self.layout
        busy = [0] * layout.replicas
        for slot in set(range(layout.capacity)) - self.free:
            busy[layout.replica_of(slot)] += 1
        return busy

    def _pick(self, claim: SlotClaim, ahead: list[_Waiter]) -> int | None:
        candidates = self.layout.claimed(claim) & self.free
        for waiter in ahead:
            if not candidates:
                return None
            candidates -= self.layout.claimed(waiter.claim)
        return self.layout.choose(candidates, self.free) if candidates else None

    async def acquire(self, requested: SlotClaim | int | None,
                      cancelled: Callable[[], bool]) -> Admission:
        """A slot for ``requested``: a claim, or a slot number (None: any slot)."""
        if self.closed:
            raise errors.scheduler_closed()
        start = time.monotonic()
        claim = requested if isinstance(requested, SlotClaim) else SlotClaim(local=requested)
        slot = self._pick(claim, self.waiters)
        if slot is None:
            if len(self.waiters) >= self.max_queue:
                self.counts["rejected"] += 1
                raise errors.queue_full()
            waiter = _Waiter(claim)
            self.waiters.append(waiter)
            try:
                slot = await self._wait(waiter, start, cancelled)
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
                    self._wake_all()
        elif cancelled():
            self.counts["cancelled"] += 1
            raise ClientCancelled()
        self.free.discard(slot)
        self.counts["admitted"] += 1
        wait_s = time.monotonic() - start
        self.metrics.queue_wait.observe(wait_s)
        return Admission(slot, wait_s, time.monotonic())

    async def _wait(self, waiter: _Waiter, start: float, cancelled: Callable[[], bool]) -> int:
        deadline = start + self.queue_timeout
        while True:
            if self.closed:
                raise errors.scheduler_closed()
            if cancelled():
                self.counts["cancelled"] += 1
                raise ClientCancelled()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.counts["timed_out"] += 1
                raise errors.queue_timeout()
            index = self.waiters.index(waiter)
            slot = self._pick(waiter.claim, self.waiters[:index])
            if slot is not None:
                return slot
            waiter.wake.clear()
            try:
                await asyncio.wait_for(waiter.wake.wait(), min(POLL_S, remaining))
            except TimeoutError:
                pass

    def release(self, admission: Admission, outcome: str) -> None:
        self.free.add(admission.slot)
        self.counts[outcome] += 1
        self.metrics.slot_duration.observe(time.monotonic() - admission.admitted_at)
        self._wake_all()

    def _wake_all(self) -> None:
        for waiter in self.waiters:
            waiter.wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake_all()
