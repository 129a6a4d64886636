"""Shared pytest configuration: hypothesis profiles, marker-driven skips, snapshot flavour."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

# Every process the suite starts (hundreds of engines, servers and CLI runs, and the workers
# themselves) loads numpy, whose OpenBLAS starts one thread per core that spins about 0.1 s of
# CPU at start-up and after each product. The suite already runs one worker per core, so those
# threads only take CPU from the other worker (an engine's start: 0.55 -> 0.45 s of CPU). Set
# before anything here imports numpy; subprocesses inherit it. Nothing in the suite times
# anything, and thread-count sameness is kind (c), within one machine and one setting.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest
from hypothesis import HealthCheck, settings
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from colibri import control_plane

# COLIBRI_CONTROL_PLANE=compiled runs the suite against the mypyc-compiled control plane
# (engine subprocesses inherit the variable). It must be switched on before any test module
# imports colibri.engine; a missing or stale build fails the session, never a silent fallback.
if os.environ.get(control_plane.ENV) == "compiled":
    control_plane.activate()

# `dev` explores more; `ci` is bounded and derandomised so CI verdicts are reproducible.
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # Engines persist KV slots and expert usage under $XDG_STATE_HOME by default. A test run
    # must neither read a developer's state (a resumed conversation changes telemetry) nor
    # leave its own behind, so every engine started by the suite, in-process or as a
    # subprocess, gets a fresh state root for this session.
    state_root = tempfile.mkdtemp(prefix="colibri-test-state-")
    os.environ["XDG_STATE_HOME"] = state_root
    config.add_cleanup(lambda: shutil.rmtree(state_root, ignore_errors=True))


def pytest_sessionstart(session: pytest.Session) -> None:
    # `make test` builds the accelerated C library first and sets COLIBRI_REQUIRE_ACCELERATED,
    # so there a missing library is a failed build, not a reason for the accelerated tests to
    # skip. A bare `pytest` without `make build` still skips them, naming the step.
    if os.environ.get("COLIBRI_REQUIRE_ACCELERATED") == "1":
        from colibri.accelerated.native import LibraryNotBuilt, load_library

        try:
            load_library()
        except LibraryNotBuilt as exc:
            raise pytest.UsageError(f"COLIBRI_REQUIRE_ACCELERATED=1 but {exc}") from None


def _missing_oracle() -> str | None:
    if all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers")):
        return None
    return "needs oracle (torch + transformers, not available)"


def _missing_gpu() -> str | None:
    """The driver probe's own reason ("no NVIDIA driver: libcuda.so.1 not found", "cuInit
    returned 100 (CUDA_ERROR_NO_DEVICE)", ...), probed in a child so a wedged GPU cannot hang
    the session."""
    from colibri.engine.cuda_devices import probe_isolated

    found = probe_isolated()
    return None if found.usable else f"needs a usable CUDA GPU: {found.reason}"


def _missing_browser() -> str | None:
    return None if shutil.which("chromium") is not None else "needs browser (not available)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    available = {
        "oracle": _missing_oracle,
        "gpu": _missing_gpu,
        "browser": _missing_browser,
    }
    cache: dict[str, str | None] = {}
    for item in items:
        for marker, missing in available.items():
            if item.get_closest_marker(marker) is not None:
                if marker not in cache:
                    cache[marker] = missing()
                reason = cache[marker]
                if reason is not None:
                    item.add_marker(pytest.mark.skip(reason=reason))
        if "interpreted_only" in item.keywords and os.environ.get(control_plane.ENV) == "compiled":
            item.add_marker(pytest.mark.skip(
                reason="observes the control plane by monkeypatching its modules; compiled code "
                "calls its functions natively, so the patch is not seen"))


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """Golden outputs are stored as readable JSON files."""
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.fixture
def no_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget's runtime part is this test process's heap, which grows from test to test;
    fixing it at 0 makes the rest of the split exact (the cgroup bench measures the real one)."""
    import importlib

    for module in ("colibri.reference.backend", "colibri.accelerated.backend"):
        try:
            backend_module = importlib.import_module(module)
        except ImportError:  # no native build: the accelerated cases are skipped anyway
            continue
        monkeypatch.setattr(backend_module, "runtime_bytes", lambda _dense: 0)
