"""`colibri doctor`: reports the installation, exits non-zero when it is broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colibri import doctor, resources


def _run_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "colibri", "doctor", *args],
        capture_output=True,
        text=True,
        env=full_env,
    )


def test_doctor_json_reports_every_check() -> None:
    result = _run_doctor("--json")
    report = json.loads(result.stdout)
    assert report["schema_version"] == 1
    ids = {check["id"] for check in report["checks"]}
    assert {"python", "numpy", "spec", "default_model", "host", "accelerated", "gpu"} <= ids
    host = next(c for c in report["checks"] if c["id"] == "host")
    assert f"{len(os.sched_getaffinity(0))} usable CPUs" in host["summary"]
    numpy_check = next(c for c in report["checks"] if c["id"] == "numpy")
    assert numpy_check["summary"].startswith("numpy ")
    assert result.returncode == (1 if report["status"] == "fail" else 0)


def test_doctor_fails_when_default_model_is_missing(tmp_path: Path) -> None:
    result = _run_doctor("--json", env={resources.DEFAULT_MODEL_ENV: str(tmp_path / "nope")})
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert report["status"] == "fail"
    model = next(c for c in report["checks"] if c["id"] == "default_model")
    assert model["status"] == "fail" and "nope" in model["summary"]


def test_doctor_human_output_names_status(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = _run_doctor(env={resources.DEFAULT_MODEL_ENV: str(tmp_path)})
    assert "default_model" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("status: ")


def test_overall_status_is_the_worst_check() -> None:
    checks = [doctor.Check("a", "ok", ""), doctor.Check("b", "warn", "")]
    assert doctor.overall_status(checks) == "warn"
    checks.append(doctor.Check("c", "fail", ""))
    assert doctor.overall_status(checks) == "fail"


def test_spec_data_is_found_through_the_resource_helper() -> None:
    assert resources.spec_path("DEVIATIONS.md").is_file()
    with pytest.raises(FileNotFoundError, match="no-such-file"):
        resources.spec_path("no-such-file.json")


def test_accelerated_check_names_library_compiler_threads_and_control_plane() -> None:
    check = doctor.check_accelerated()
    assert check.status in ("ok", "warn")
    summary = check.summary
    assert "C kernels" in summary
    assert "compiler " in summary or "no C compiler" in summary
    assert "threads " in summary
    assert "control plane compiled by mypyc" in summary or "control plane interpreted" in summary
    # Not built is a warning naming the step that builds it, never a failure.
    assert check.status == "ok" or "make build" in summary
    if check.status == "ok":
        assert "ISA " in summary
