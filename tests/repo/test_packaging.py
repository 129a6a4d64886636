"""A non-editable install finds its package data as well as the editable checkout does."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_install_gives_a_working_doctor(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheel_dir), str(REPO)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheel_dir.glob("colibri-*.whl")
    env_dir = tmp_path / "clean-venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # Reuse the test environment's third-party packages (numpy, tornado, ...) without its
    # editable colibri: a plain path entry does not run the editable finder's .pth hook.
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    Path(purelib, "deps.pth").write_text(site.getsitepackages()[0] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         str(wheel)],
        check=True,
        cwd=tmp_path,
    )
    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_DEFAULT_MODEL"}
    where = subprocess.run(
        [str(python), "-c", "import colibri.resources as r; print(r.spec_dir())"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=env,
    ).stdout.strip()
    assert where.startswith(str(env_dir)), where
    result = subprocess.run(
        [str(python), "-m", "colibri", "doctor", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )
    report = json.loads(result.stdout)
    statuses = {check["id"]: check["status"] for check in report["checks"]}
    assert statuses["spec"] == "ok"
    # The embedded default model (glm5-chat-small) ships inside the wheel.
    assert statuses["default_model"] == "ok", report
    assert result.returncode == 0, result.stdout + result.stderr
    model_files = subprocess.run(
        [str(python), "-c", "import colibri.resources as r; d = r.default_model_dir(); "
         "print(sorted(p.name for p in d.iterdir()))"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=env,
    ).stdout
    for name in ("config.json", "generation_config.json", "model.safetensors",
                 "tokenizer.json", "tokenizer_config.json"):
        assert name in model_files, model_files
    # Package data parity: the wheel sees exactly what the checkout sees.
    checkout = subprocess.run(
        [sys.executable, "-m", "colibri", "doctor", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )
    checkout_report = json.loads(checkout.stdout)
    # Except the accelerated engine and its CUDA kernels: `make build` compiled their libraries
    # into this checkout's build/, which a wheel does not carry until the packaging builds them
    # (issue 13, sdist).
    checkout_statuses = {c["id"]: c["status"] for c in checkout_report["checks"]}
    for built in ("accelerated", "cuda_build"):
        statuses.pop(built, None)
        assert checkout_statuses.pop(built) in ("ok", "warn")
    assert statuses == checkout_statuses
    assert result.returncode == checkout.returncode


def test_make_build_installs_what_a_wheel_build_compiles_with() -> None:
    """`make serve` installs only the `build` extra before mypyc type-checks the control plane,
    so that extra must carry every stub package the wheel backend adds for the same step (it
    once lacked types-regex and `make serve` stopped on a fresh clone)."""
    import tomllib

    sys.path.insert(0, str(REPO / "tools"))
    try:
        from build_backend import WHEEL_EXTRAS
    finally:
        sys.path.remove(str(REPO / "tools"))
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["build"]
    names = {e.split(">")[0].split("=")[0] for e in extras}
    stubs = {e for e in WHEEL_EXTRAS if e.startswith("types-")}
    assert stubs and stubs <= names
