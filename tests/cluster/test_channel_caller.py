"""``ChannelCaller``: the engine's expert calls over direct channels, with Ray for control.

After a lost worker Ray restarts it, and until the restart is done a control call to it fails
at once (``ActorUnavailableError``): the call after a loss waits for the worker to answer
``ready`` (within its deadline) and connects to the new process instead of failing the next
request too. A worker that misses the deadline fails the layer by name, and its late answer
is never read as a later layer's.

Driven by a scripted stand-in for Ray's API (the real exception classes) in front of real
channels, so the restart's timing is the test's, not the machine's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from colibri.backend_kit.expert_channel import ChannelServer  # noqa: E402
from colibri.backend_kit.ray_cluster import ChannelCaller  # noqa: E402
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
    """Its process answers layer ``l`` with ``l`` everywhere, after ``delay_s``; ``lose()``
    ends the process (its channel goes with it) and Ray restarts it: the next ``restarting``
    control calls find it restarting, then a new process answers."""

    def __init__(self, restarting: int = 0, delay_s: float = 0.0) -> None:
        self.restarting, self.delay_s = restarting, delay_s
        self.pid = 100
        self.server = self._process()
        self.ready = Method(self._ready)
        self.serve = Method(self._serve)

    def _process(self) -> ChannelServer:
        def run(layer: int, _experts: list[int], x: np.ndarray, _start: Any,
                _rows: Any) -> np.ndarray:
            time.sleep(self.delay_s)
            return np.full((1, x.shape[1]), float(layer), np.float32)

        return ChannelServer(run)

    def lose(self) -> None:
        self.server.close()
        self.pid += 1
        self.server = self._process()

    def _gate(self) -> None:
        if self.restarting > 0:
            self.restarting -= 1
            raise ray_exceptions.ActorUnavailableError("The actor is restarting", None)

    def _ready(self) -> tuple[int, int, int]:
        self._gate()
        return (self.pid, 0, 0)

    def _serve(self) -> tuple[str, int]:
        self._gate()
        return "127.0.0.1", self.server.port


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
    worker = Worker()
    caller = ChannelCaller(FakeRay(), [worker], ["w0"], started=False)
    assert float(caller.call([(0, _call(1))], deadline_s=5.0)[0][0, 0]) == 1.0
    lose = threading.Timer(0.2, worker.lose)  # the process dies while layer 2 computes
    worker.delay_s, worker.restarting = 1.0, 3
    lose.start()
    with pytest.raises(RemoteExpertError, match="w0 was lost during layer 2"):
        caller.call([(0, _call(2))], deadline_s=5.0)
    lose.join()
    worker.delay_s = 0.0
    answer = caller.call([(0, _call(3))], deadline_s=5.0)  # Ray still restarting it
    assert float(answer[0][0, 0]) == 3.0 and worker.restarting == 0
    assert caller.pids() == [101]


def test_a_worker_lost_between_calls_is_waited_for_and_one_not_back_fails_by_name() -> None:
    worker = Worker()
    caller = ChannelCaller(FakeRay(), [worker], ["w0"], started=False)
    caller.call([(0, _call(1))], deadline_s=5.0)
    worker.lose()  # while the engine was idle: no layer of it was out
    worker.restarting = 3
    assert float(caller.call([(0, _call(2))], deadline_s=5.0)[0][0, 0]) == 2.0
    worker.lose()
    worker.restarting = 10**9
    with pytest.raises(RemoteExpertError, match="w0 was not back from its restart"):
        caller.call([(0, _call(3))], deadline_s=0.2)


def test_a_late_answer_is_never_read_as_a_later_layers() -> None:
    worker = Worker(delay_s=0.5)
    caller = ChannelCaller(FakeRay(), [worker], ["w0"], started=False)
    with pytest.raises(RemoteExpertError, match="w0 did not answer layer 1 within 0.1 s"):
        caller.call([(0, _call(1))], deadline_s=0.1)
    worker.delay_s = 0.0
    time.sleep(0.6)  # layer 1's answer has been written by now, to the dropped connection
    assert float(caller.call([(0, _call(2))], deadline_s=5.0)[0][0, 0]) == 2.0
    assert worker.pid == 100  # a slow worker is not a lost one: no restart was waited for
