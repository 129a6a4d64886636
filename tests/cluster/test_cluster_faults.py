"""A lost or slow expert worker on a simulated two-node Ray cluster: the requests of the step
it was serving end with ``ERROR <id> EXPERT_READ`` within the layer deadline (no hang, no
partial layer used), Ray restarts the worker, it reloads its share, and the next request gets
the tokens of an undisturbed run. Also ``colibri engine --cluster ray:ADDRESS`` end to end,
and an engine started without ``--cluster`` never importing Ray."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from support.accelerated_support import needs_library
from support.cluster_support import PROMPT, drive, open_clustered, open_local, ray_cluster, remote  # noqa: F401 (fixture)
from support.engine_harness import EngineRun, ids, run_engine, submit

from colibri import resources
from colibri.backend_kit.remote_experts import RemoteExpertError
from colibri.engine.backend import Backend, Step, StepRow
from colibri.protocol import FrameReader

TINY = resources.fixture_model_dir("glm5-tiny")
#: How long an in-flight request may take to end after its worker dies: well past the 10 s
#: per-layer deadline (docs/cluster.md, Faults), so only a hang fails it.
ENDS_WITHIN_S = 30.0
BACKENDS = ["reference", pytest.param("accelerated", marks=needs_library)]


def _tokens(run: EngineRun, rid: int) -> list[int]:
    return [int(f.payload or b"") for f in run.for_id(rid) if f.kind == "DATA"]


def _pids(backend: Backend) -> list[int]:
    pids: list[int] = remote(backend).caller.pids()
    return pids


class KillMidStep:
    """A backend whose ``at``-th step runs while worker 0 is frozen (SIGSTOP, so its call is
    surely in flight) and then killed (SIGKILL): the worker dies in the middle of the step.
    The next step follows at once, while Ray restarts the worker."""

    def __init__(self, inner: Backend, at: int) -> None:
        self.inner, self.at, self.steps = inner, at, 0
        self.failed_after: float | None = None
        self.pids_before = _pids(inner)
        self.pids_after: list[int] = []

    def step(self, rows: Sequence[StepRow]) -> Step:
        self.steps += 1
        if self.steps == self.at + 1:
            # The step right after the loss: Ray may still be restarting the worker, and the
            # engine's calls must wait for it rather than fail (the pids are asked after).
            step = self.inner.step(rows)
            self.pids_after = _pids(self.inner)
            return step
        if self.steps != self.at:
            return self.inner.step(rows)
        pid = self.pids_before[0]
        os.kill(pid, signal.SIGSTOP)
        killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        try:
            return self.inner.step(rows)
        finally:
            self.failed_after = time.monotonic() - started
            killer.join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_worker_killed_mid_request_ends_it_and_the_restarted_worker_serves_the_next(
        backend_name: str) -> None:
    script = [submit(1, 0, ids(*PROMPT), 6, ext="ids=1"),
              submit(2, 0, ids(*PROMPT), 6, ext="ids=1")]
    base = run_engine(script[:1], model_dir=TINY, backend_name=backend_name)
    clustered = open_clustered(backend_name, "glm5-tiny")
    try:
        wrapped = KillMidStep(clustered, at=2)  # the first decode step of request 1
        run = run_engine(script, model_dir=TINY, backend_name=backend_name,
                         wrap=lambda _: wrapped)  # type: ignore[arg-type,return-value]
        first = [f.line.decode().strip() for f in run.for_id(1)]
        assert first[-1] == "ERROR 1 EXPERT_READ", first
        assert "was lost during layer" in run.stderr
        assert wrapped.failed_after is not None and wrapped.failed_after < ENDS_WITHIN_S
        # Ray restarted worker 0 (a new process, its share reloaded); the next request runs
        # through it and gets the undisturbed tokens.
        assert _tokens(run, 2) == _tokens(base, 1) and len(_tokens(base, 1)) == 6
        before, after = wrapped.pids_before, wrapped.pids_after
        assert after[0] != before[0] and after[1] == before[1]
    finally:
        clustered.close()


@pytest.mark.usefixtures("ray_cluster")
def test_a_worker_slower_than_the_deadline_fails_the_step_and_nothing_of_it_is_kept() -> None:
    local = open_local("reference", "glm5-tiny")
    clustered = open_clustered("reference", "glm5-tiny")
    try:
        experts = remote(clustered)
        experts.deadline_s = 1.0
        state = clustered.new_state()
        pids = _pids(clustered)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(RemoteExpertError, match="did not answer layer"):
                clustered.step([StepRow(state, t, True) for t in PROMPT])
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert time.monotonic() - started < 1.0 + 5.0
        assert clustered.length(state) == 0  # the failed step left no trace
        experts.deadline_s = 10.0
        assert [a.tobytes() for a in drive(clustered)] == [a.tobytes() for a in drive(local)]
    finally:
        clustered.close()
        local.close()


def test_the_engine_command_runs_on_a_cluster_and_survives_a_lost_worker(
        ray_cluster: Any) -> None:  # noqa: F811 (the fixture imported above)
    """``colibri engine --cluster ray:ADDRESS`` joins the cluster; a worker killed while the
    engine is idle is restarted by Ray, the report of its death goes to stderr (stdout stays
    the protocol's), and the request gets the single process's tokens."""
    script = submit(1, 0, ids(*PROMPT), 6, ext="ids=1")
    base = run_engine([script], model_dir=TINY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "colibri", "engine", "--model", str(TINY),
         "--cluster", f"ray:{ray_cluster.address}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    log: list[str] = []
    try:
        while not any("expert workers on 2 nodes" in line for line in log):
            line = proc.stderr.readline().decode()
            assert line, "".join(log)[-3000:]
            log.append(line)
        pids = [int(m.group(1)) for line in log if (m := re.search(r"pid (\d+),", line))]
        assert len(pids) == 2, "".join(log)
        os.kill(pids[0], signal.SIGKILL)
        time.sleep(3.0)  # Ray notices the death and reports it to the engine (its driver)
        stdout, stderr = proc.communicate(script, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(log) + stderr.decode()
    assert proc.returncode == 0, text[-3000:]
    reader = FrameReader(io.BytesIO(stdout))
    reader.read_preamble()
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame)
    assert all(f.parsed is not None for f in frames), stdout[-2000:]
    got = [int(f.payload or b"") for f in frames
           if f.kind == "DATA" and f.parsed is not None and f.parsed.values.get("id") == 1]
    assert got == _tokens(base, 1) and len(got) == 6


def test_a_bad_cluster_option_is_refused_before_ray_starts() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    done = subprocess.run(
        [sys.executable, "-m", "colibri", "engine", "--model", str(TINY), "--cluster", "dask"],
        input=b"", capture_output=True, env=env, timeout=60, check=False)
    assert done.returncode == 2
    assert "--cluster 'dask': expected ray or ray:ADDRESS" in done.stderr.decode()


PROBE = """
import sys
sys.argv = ["colibri", "engine", "--model", sys.argv[1]]
from colibri.cli import main
try:
    main()
except SystemExit:
    pass
print("RAY", "ray" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_an_engine_without_cluster_never_imports_ray(backend_name: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    probe = PROBE.replace('"--model"', f'"--backend", "{backend_name}", "--model"')
    done = subprocess.run([sys.executable, "-c", probe, str(TINY)], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, timeout=60, check=False)
    assert b"READY" in done.stdout, done.stderr.decode()[-2000:]
    assert "RAY False" in done.stderr.decode().splitlines(), done.stderr.decode()[-2000:]
