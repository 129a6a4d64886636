"""Which control plane a process runs: ``colibri engine`` the ``.py`` modules, ``--accelerated``
the mypyc-compiled ones from ``build/mypyc`` (colibri.control_plane)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.control_plane_support import needs_compiled

from colibri import control_plane

PY_ONLY = {k: v for k, v in os.environ.items() if k != control_plane.ENV}




def _engine_stderr(*args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "engine", *args],
        input=b"", capture_output=True, env=env or PY_ONLY, timeout=120,
    )
    return proc.stderr.decode()


def test_reference_engine_runs_the_py_modules() -> None:
    assert "[CONTROL] interpreted\n" in _engine_stderr()


@needs_compiled
@pytest.mark.parametrize("args", [("--accelerated",), ("--backend", "accelerated"),
                                  ("--backend=accelerated",)])
def test_accelerated_engine_runs_the_compiled_modules(args: tuple[str, ...]) -> None:
    # The accelerated backend may be absent from this build: the control plane is chosen,
    # and said, before the backend is opened.
    assert "[CONTROL] compiled (mypyc)" in _engine_stderr(*args)


@needs_compiled
def test_compiled_modules_are_extension_files_and_the_py_ones_stay_importable() -> None:
    probe = (
        "import sys; from colibri import control_plane as c; c.select(sys.argv[1:]);"
        "import colibri.engine.mux, colibri.text; import json;"
        "print(json.dumps([colibri.engine.mux.__file__, colibri.text.Tokenizer.__module__,"
        " sorted(c.compiled_modules())]))"
    )
    compiled = json.loads(subprocess.run(
        [sys.executable, "-c", probe, "--accelerated"], capture_output=True, text=True,
        check=True, env=PY_ONLY).stdout)
    plain = json.loads(subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        env=PY_ONLY).stdout)
    assert compiled[0].endswith(".so") and plain[0].endswith("mux.py")
    assert set(compiled[2]) >= {"colibri.engine.mux", "colibri.text.tokenizer"}
    assert plain[2] == []
    assert compiled[1] == plain[1] == "colibri.text.tokenizer"


@needs_compiled
def test_compiled_engine_serves_the_reference_backend() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "engine"], input=b"", capture_output=True,
        env={**PY_ONLY, control_plane.ENV: "compiled", "COLI_PERSIST": "0"}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"READY" in proc.stdout
    assert "[CONTROL] compiled (mypyc)" in proc.stderr.decode()


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["engine"], {}, "interpreted"),
    (["engine", "--accelerated"], {}, "auto-compiled"),
    (["serve", "--backend", "accelerated"], {}, "auto-compiled"),
    (["engine", "--backend", "reference"], {}, "interpreted"),
    (["engine", "--", "--accelerated"], {}, "interpreted"),
    (["engine", "--accelerated"], {control_plane.ENV: "interpreted"}, "interpreted"),
    (["engine"], {control_plane.ENV: "compiled"}, "compiled"),
    (["engine"], {control_plane.ENV: "auto"}, "interpreted"),
])
def test_the_choice_comes_from_argv_and_the_environment(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    assert control_plane.wanted(argv, env) == expected


def test_an_unknown_choice_is_refused() -> None:
    with pytest.raises(control_plane.ControlPlaneError, match="expected compiled"):
        control_plane.wanted([], {control_plane.ENV: "yes"})


def test_a_missing_build_names_make_build(tmp_path: Path) -> None:
    with pytest.raises(control_plane.ControlPlaneError, match="make build"):
        control_plane.read_build(tmp_path)
    proc = subprocess.run([sys.executable, "-c",
                           "import pathlib; from colibri import control_plane as c;"
                           f"c.activate(pathlib.Path({str(tmp_path)!r}))"],
                          capture_output=True, text=True, env=PY_ONLY)
    assert proc.returncode != 0 and "make build" in proc.stderr


def test_a_build_from_other_sources_is_stale(tmp_path: Path) -> None:
    sources = control_plane.control_plane_sources()
    (tmp_path / "lib.so").write_bytes(b"")
    manifest = {"manifest_version": control_plane.MANIFEST_VERSION,
                "cache_tag": sys.implementation.cache_tag, "sources_sha256": "0" * 64,
                "mypy_version": "0", "files": {"colibri.engine.mux": "lib.so"}}
    (tmp_path / control_plane.MANIFEST_NAME).write_text(json.dumps(manifest))
    build = control_plane.read_build(tmp_path)
    with pytest.raises(control_plane.ControlPlaneError, match="stale"):
        control_plane.check_current(build)
    # The digest covers every compiled module's bytes.
    copy = tmp_path / "src"
    for name, path in sources.items():
        target = copy.joinpath(*name.split(".")).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    before = control_plane.source_digest(control_plane.control_plane_sources(copy))
    assert before == control_plane.source_digest(sources)
    with (copy / "colibri" / "engine" / "mux.py").open("a") as handle:
        handle.write("\n")
    assert control_plane.source_digest(control_plane.control_plane_sources(copy)) != before


@needs_compiled
def test_switching_after_the_control_plane_is_imported_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import colibri.engine.mux; from colibri import control_plane as c;"
         "c.activate()"], capture_output=True, text=True, env=PY_ONLY)
    assert proc.returncode != 0 and "already imported" in proc.stderr


def test_the_rebuild_hint_fits_a_checkout_or_an_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This checkout: its Makefile builds everything.
    assert control_plane.rebuild_hint() == "run `make build`"
    assert control_plane.rebuild_hint("run make build with nvcc") == "run make build with nvcc"
    # An installed package (site-packages/colibri/build/mypyc, no Makefile above it): the
    # source distribution's wheel build is what compiles the pieces there.
    from colibri import __version__

    monkeypatch.setattr(control_plane, "default_build_dir",
                        lambda: tmp_path / "colibri" / "build" / "mypyc")
    hint = control_plane.rebuild_hint("run make build with nvcc")
    assert "make build" not in hint
    assert f"pip install --force-reinstall --no-deps colibri-{__version__}.tar.gz" in hint
    assert "C compiler" in hint
    with pytest.raises(control_plane.ControlPlaneError, match="source distribution"):
        control_plane.read_build(tmp_path)
