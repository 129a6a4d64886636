"""``RayCaller`` after a lost worker: Ray restarts it, and until the restart is done a call
submitted to it fails at once (``ActorUnavailableError``). The call after a loss waits for the
worker to answer ``ready`` (within its deadline) instead of failing the next request too.

Driven by a scripted stand-in for Ray's API (the real exception classes), so the restart's
timing is the test's, not the machine's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from colibri.backend_kit.ray_cluster import RayCaller  # noqa: E402
from colibri.backend_kit.remote_experts import ExpertCall, RemoteExpertError  # noqa: E402


class Ref:
    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer


class Method:
    def __init__(self, answer: Callable[..., Any]) -> None:
        self._answer = answer

    def remote(self, *args: Any) -> Ref:
        return Ref(lambda: self._answer(*args))


class Worker:
    """``lost`` calls to ``run`` fail as a lost worker; then ``restarting`` calls (of any
    method) find it restarting; then it answers."""

    def __init__(self, lost: int, restarting: int) -> None:
        self.lost, self.restarting = lost, restarting
        self.pid = 100
        self.run = Method(self._run)
        self.ready = Method(self._ready)

    def _gate(self) -> None:
        if self.restarting > 0:
            self.restarting -= 1
            raise ray_exceptions.ActorUnavailableError("The actor is restarting", None)

    def _run(self, layer: int, experts: list[int], x: np.ndarray, start: Any,
             rows: Any) -> np.ndarray:
        if self.lost > 0:
            self.lost -= 1
            self.pid = 101  # Ray starts another process
            raise ray_exceptions.RayActorError()
        self._gate()
        return np.full((1, x.shape[1]), float(layer), np.float32)

    def _ready(self) -> tuple[int, int, int]:
        self._gate()
        return (self.pid, 0, 0)


class FakeRay:
    exceptions = ray_exceptions

    @staticmethod
    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [r.answer() for r in ref]
        return ref.answer()


def _call(layer: int) -> ExpertCall:
    return ExpertCall(layer, [0], np.zeros((1, 4), np.float32), np.array([0, 1]),
                      np.array([0]))


def test_the_call_after_a_lost_worker_waits_for_its_restart() -> None:
    worker = Worker(lost=1, restarting=3)
    caller = RayCaller(FakeRay(), [worker], ["w0"], started=False)
    with pytest.raises(RemoteExpertError, match="w0 was lost during layer 1"):
        caller.call([(0, _call(1))], deadline_s=5.0)
    answer = caller.call([(0, _call(2))], deadline_s=5.0)  # Ray still restarting it
    assert float(answer[0][0, 0]) == 2.0 and worker.restarting == 0
    assert caller.pids() == [101]


def test_a_worker_not_back_within_the_deadline_fails_the_call_by_name() -> None:
    worker = Worker(lost=1, restarting=10**9)
    caller = RayCaller(FakeRay(), [worker], ["w0"], started=False)
    with pytest.raises(RemoteExpertError):
        caller.call([(0, _call(1))], deadline_s=5.0)
    with pytest.raises(RemoteExpertError, match="w0 was not back from its restart"):
        caller.call([(0, _call(2))], deadline_s=0.2)
