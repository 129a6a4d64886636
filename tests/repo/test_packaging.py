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


def build_sdist(out: Path) -> Path:
    """The source distribution, from the checkout's own PEP 517 backend (setuptools: no
    compiling, so no isolated environment is needed for this step)."""
    code = ("import sys; sys.path.insert(0, 'tools'); import build_backend; "
            f"print(build_backend.build_sdist({str(out)!r}))")
    name = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout.split()[-1]
    return out / name


@pytest.mark.slow
def test_sdist_install_gives_a_working_doctor_and_accelerated_engine(tmp_path: Path) -> None:
    # What `pip install colibri-X.tar.gz` does: pip builds the wheel from the sdist in an
    # isolated environment that holds only what the build backend asks for, so this catches
    # a dependency the compiled control plane's type check needs and the backend forgot
    # (without one, every sdist install runs the control plane interpreted).
    # pip runs from a bare environment of its own, as a user's would: mypy, inside the
    # isolated build, also reads the site-packages of the interpreter that runs pip, and the
    # test environment's hold every runtime dependency.
    sdist = build_sdist(tmp_path)
    builder = tmp_path / "builder-venv"
    venv.create(builder, with_pip=True)
    wheel_dir = tmp_path / "wheels"
    built = subprocess.run(
        [str(builder / "bin" / "python"), "-m", "pip", "wheel", "--no-deps", "-w",
         str(wheel_dir), str(sdist)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
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
    # The accelerated engine's C library and mypyc control plane: the wheel build compiles them
    # (setup.py), so the install has them wherever the checkout has them, and finds them in
    # the install rather than in the checkout's build/.
    checkout_statuses = {c["id"]: c["status"] for c in checkout_report["checks"]}
    accelerated = {c["id"]: c for c in report["checks"]}["accelerated"]
    assert accelerated["status"] == checkout_statuses["accelerated"], accelerated
    if accelerated["status"] == "ok":
        installed = str(Path(purelib, "colibri", "build"))
        assert f"C kernels: {installed}/accelerated/" in accelerated["summary"], accelerated
        assert "control plane compiled by mypyc" in accelerated["summary"], accelerated
        assert f"modules in {installed}/mypyc" in accelerated["summary"], accelerated
        # and the installed package decodes with it, the reference's greedy tokens
        generated = [subprocess.run(
            [str(python), "-m", "colibri", "generate", "--model",
             str(REPO / "fixtures" / "models" / "glm5-tiny"), "--ids", "3 14 159",
             "--max-tokens", "6", *flags],
            capture_output=True, text=True, check=True, cwd=tmp_path, env=env,
        ).stdout for flags in ([], ["--accelerated"])]
        assert generated[0] and generated[0] == generated[1], generated
    # Except the CUDA kernels, which the wheel carries only where nvcc built them for it.
    statuses.pop("cuda_build", None)
    assert checkout_statuses.pop("cuda_build") in ("ok", "warn")
    assert statuses == checkout_statuses
    assert result.returncode == checkout.returncode


def test_make_build_installs_what_a_wheel_build_compiles_with() -> None:
    """`make build` installs only the `build` extra before mypyc type-checks the control plane,
    so that extra must carry every stub package the wheel backend adds for the same step
    (without one, `make build` stops on a fresh clone)."""
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
