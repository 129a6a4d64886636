"""The prepared device check (CUDA): on a GPU machine, from the repo root, after
``tools/gpu_check.sh`` made the venv, ``python tools/gpu_check.py --out DIR``

1. records the environment (Python, the modules the suite needs, nvidia-smi, nvcc);
2. runs ``make build`` (the C library, the CUDA library where nvcc exists, mypyc), then
   ``colibri doctor --json`` (what was built, the driver, the devices);
3. probes the driver: the first GPU step; without a usable device it stops here, saying why;
4. runs ``pytest -m gpu`` (JUnit XML beside the report);
5. generates the GPU bench model (``bench_model``, gpu=True);
6. runs the ``cuda-decode`` phases (copy bandwidth, decode, slots, CPU, tiered shares).

Every step has its own deadline, capped by what is left of the whole run's budget (default
540 s: the device tool's 10-minute command limit less a margin); a step that runs out of time
is recorded as timed out and the rest go on (or are skipped, out of budget). The report,
``DIR/gpu_report.json``, is rewritten after every step, so whatever happens a partial report
of what ran is there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "colibri-gpu-check/1"
#: Modules the package and its test suite import (the image lacks some: carry them as wheels,
#: tools/gpu_wheels.sh).
MODULES = ("numpy", "ml_dtypes", "regex", "tqdm", "prometheus_client", "tornado", "jsonschema",
           "llguidance", "pytest", "hypothesis", "syrupy")
#: Each step's own deadline in seconds (the run's remaining budget caps it further); the
#: bench phases' are cuda_decode's.
DEADLINES: dict[str, float] = {"doctor": 60, "build": 300, "probe": 60, "pytest_gpu": 180,
                               "bench_model": 180}
#: Seconds kept back at the end for the final write.
MARGIN_S = 10.0


@dataclass
class Run:
    """The report being built: steps in order, each with status and wall time."""

    out: Path
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    report: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.report = {"schema": SCHEMA, "status": "running",
                       "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "budget_s": self.budget_s, "steps": {}}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started) - MARGIN_S

    def deadline(self, step: str) -> float:
        from colibri.benchmarks.cuda_decode import PHASE_DEADLINES

        own = DEADLINES.get(step, PHASE_DEADLINES.get(step, 120.0))
        return min(own, self.left())

    def record(self, step: str, status: str, wall_s: float, **detail: Any) -> None:
        self.report["steps"][step] = {"status": status, "wall_s": round(wall_s, 3), **detail}
        self.report["current"] = f"after {step}"
        self.write()

    def stop(self, step: str, reason: str) -> None:
        self.report["status"] = "stopped"
        self.report["stopped_at"] = step
        self.report["reason"] = reason
        self.finish()

    def finish(self) -> None:
        if self.report["status"] == "running":
            failed = [s for s, v in self.report["steps"].items()
                      if v["status"] not in ("ok", "skipped")]
            self.report["status"] = "complete" if not failed else "partial"
            if failed:
                self.report["failed_steps"] = failed
        self.report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.report["wall_s"] = round(time.monotonic() - self.started, 3)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "gpu_report.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2) + "\n")
        tmp.replace(self.out / "gpu_report.json")


def command(run: Run, step: str, cmd: list[str], log: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str] | None:
    """Run one step's command under its deadline; record it; None when it could not finish."""
    limit = run.deadline(step)
    if limit <= 0:
        run.record(step, "skipped", 0.0, reason="out of the run's time budget")
        return None
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        if log is not None:
            log.write_text(text)
        run.record(step, "timed_out", time.monotonic() - t0, deadline_s=limit,
                   command=" ".join(cmd))
        return None
    except OSError as exc:
        run.record(step, "failed", time.monotonic() - t0, error=str(exc), command=" ".join(cmd))
        return None
    if log is not None:
        log.write_text(done.stdout + ("\n--- stderr ---\n" + done.stderr if done.stderr else ""))
    status = "ok" if done.returncode == 0 else "failed"
    tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
    run.record(step, status, time.monotonic() - t0, exit=done.returncode,
               command=" ".join(cmd), **({} if status == "ok" else {"tail": tail}))
    return done


def environment() -> dict[str, Any]:
    import importlib.util
    import platform

    missing = [m for m in MODULES if importlib.util.find_spec(m) is None]
    env: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                           "machine": platform.machine(), "cpus": os.cpu_count(),
                           "missing_modules": missing}
    for tool, args in (("nvidia-smi", ["-L"]), ("nvcc", ["--version"])):
        path = shutil.which(tool) or (f"/usr/local/cuda/bin/{tool}"
                                      if Path(f"/usr/local/cuda/bin/{tool}").is_file() else None)
        if path is None:
            env[tool] = None
            continue
        try:
            out = subprocess.run([path, *args], capture_output=True, text=True, timeout=30)
            env[tool] = out.stdout.strip().splitlines()[-3:]
        except (OSError, subprocess.SubprocessError) as exc:
            env[tool] = f"unusable: {exc}"
    return env


def pytest_summary(output: str) -> str:
    """pytest's final line ("12 passed, 3 skipped in 40.1s"), or ""."""
    lines = [line.strip("= ") for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-report")))
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/colibri-gpu-bench"))
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--model", type=Path, default=None,
                        help="bench this model instead of generating the GPU bench model")
    parser.add_argument("--tests", nargs="*", default=[],
                        help="what `pytest -m gpu` collects (default: the whole suite)")
    parser.add_argument("--copy-gib", type=float, default=1.0,
                        help="GiB of the device-to-device copy (>= 1 on a GPU)")
    parser.add_argument("--only", nargs="*", default=None, metavar="PHASE",
                        help="run only these bench phases (e.g. a rerun of the failed ones)")
    parser.add_argument("--skip-build", action="store_true", help="(tests) no `make build`")
    args = parser.parse_args(argv)
    run = Run(args.out, args.budget_s)
    try:
        return _check(run, args)
    except Exception as exc:  # noqa: BLE001 - the report must say what broke, then it ends
        import traceback

        run.report["traceback"] = traceback.format_exc().splitlines()[-12:]
        run.stop(run.report.get("current", "?"), f"the check itself crashed: "
                 f"{type(exc).__name__}: {exc}")
        return 5


def _check(run: Run, args: argparse.Namespace) -> int:
    py = sys.executable

    t0 = time.monotonic()
    run.report["environment"] = environment()
    run.record("environment", "ok", time.monotonic() - t0)
    if args.skip_build:
        run.record("build", "skipped", 0.0, reason="--skip-build")
    else:
        command(run, "build", ["make", "build"], log=args.out / "build.log")
    # After the build, so it reports what was built (the C and CUDA libraries).
    doctor = command(run, "doctor", [py, "-m", "colibri", "doctor", "--json"])
    if doctor is not None:
        try:
            run.report["doctor"] = json.loads(doctor.stdout)
        except ValueError:
            pass

    # The first GPU step: nothing after it means anything without a device.
    from colibri.engine.cuda_devices import probe_isolated

    t0 = time.monotonic()
    found = probe_isolated(timeout_s=max(1.0, run.deadline("probe")))
    run.report["probe"] = found.to_json()
    if not found.usable:
        run.record("probe", "failed", time.monotonic() - t0, reason=found.reason)
        run.stop("probe", f"no usable CUDA device: {found.reason}")
        return 3
    run.record("probe", "ok", time.monotonic() - t0)

    # A test module whose import fails there (a package the image lacks) must not stop the
    # GPU tests of the others from running: its error is in the log and the summary.
    tests = command(run, "pytest_gpu", [py, "-m", "pytest", *args.tests, "-m", "gpu", "-q", "-rs",
                                        "-p", "no:cacheprovider",
                                        "--continue-on-collection-errors",
                                        f"--junitxml={args.out / 'pytest_gpu.xml'}"],
                    log=args.out / "pytest_gpu.log")
    if tests is not None:
        run.report["pytest_gpu"] = pytest_summary(tests.stdout)
        run.write()

    from colibri.benchmarks.bench_model import bench_model_dir

    if args.model is not None:
        model_dir = args.model
        run.record("bench_model", "skipped", 0.0, reason=f"--model {model_dir}")
    else:
        made = command(run, "bench_model", [
            py, "-c", "import sys; from pathlib import Path; from colibri.benchmarks."
            "bench_model import ensure_bench_model as e; print(e(Path(sys.argv[1]), gpu=True))",
            str(args.cache_dir)])
        model_dir = bench_model_dir(args.cache_dir, gpu=True)
        if made is None or made.returncode != 0:
            run.stop("bench_model", "the GPU bench model could not be generated")
            return 4
    run.report["model"] = str(model_dir)

    from colibri.benchmarks import cuda_decode
    from colibri.benchmarks.cuda_report import assemble

    results: dict[str, dict[str, Any]] = {}
    for name, thunk in cuda_decode.phases(model_dir, args.tokens, args.warmup, run.deadline,
                                          args.copy_gib):
        if args.only is not None and name not in args.only:
            continue
        if run.left() <= 0:
            results[name] = {"error": "skipped: out of the run's time budget"}
            run.record(name, "skipped", 0.0, reason="out of the run's time budget")
            continue
        t0 = time.monotonic()
        results[name] = thunk()
        raw = results[name]
        status = ("timed_out" if raw.get("timed_out") else "failed") if "error" in raw else "ok"
        run.record(name, status, time.monotonic() - t0,
                   **({"error": raw["error"]} if "error" in raw else {}))
        run.report["bench"] = assemble(model_dir, results, args.tokens, args.warmup)
        run.write()
    run.finish()
    return 0 if run.report["status"] == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
