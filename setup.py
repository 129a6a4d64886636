"""The wheel's compiled pieces: setuptools' metadata lives in pyproject.toml; this file only
adds a build step. A (non-editable) wheel build, which is what ``pip install`` of the sdist
does, compiles the accelerated engine's C library (``accelerated/native_build.py``, when C
sources exist), its CUDA library where nvcc exists (``accelerated/cuda_build.py``) and the
mypyc control plane (``colibri/control_plane_build.py``) into the checkout's ``build/``
(incrementally, as ``make build`` does) and copies them into the wheel as
``colibri/build/{accelerated,mypyc}``, where the installed package looks for them.

Where no C compiler (or no nvcc, or no mypyc) exists the wheel is still built, without that
piece, and the build says so; the reference engine needs none of them. Editable installs
(``pip install -e .``, the Makefile's) skip this step: ``make build`` builds in place.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> ModuleType:
    # By file: `colibri.accelerated` is the folder `accelerated/` only once installed.
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _say(message: str) -> None:
    print(f"colibri build: {message}", file=sys.stderr)


def build_compiled(package_dir: Path) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    here = ROOT / "accelerated"
    native_build = _load("colibri.accelerated.native_build", here / "native_build.py")
    # After native_build: the control plane's build finds the C compiler through it.
    control_plane_build = _load("colibri.control_plane_build",
                                ROOT / "colibri" / "control_plane_build.py")
    out = package_dir / "build"
    if native_build.sources():
        try:
            native_build.build()
        except native_build.BuildError as exc:
            _say(f"WITHOUT the accelerated engine's C library: {exc}")
        else:
            build_cuda(_load("colibri.accelerated.cuda_build", here / "cuda_build.py"))
            shutil.copytree(native_build.DEFAULT_OUT, out / "accelerated", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.stamp", "sanitize"))
    mypyc_dir = ROOT / "build" / "mypyc"
    try:
        control_plane_build.build(mypyc_dir, root=ROOT)
    except control_plane_build.BuildError as exc:
        _say(f"WITHOUT the mypyc-compiled control plane (--accelerated runs it interpreted): {exc}")
    else:
        shutil.copytree(mypyc_dir, out / "mypyc", dirs_exist_ok=True)


def build_cuda(cuda_build: ModuleType) -> None:
    """The CUDA kernel library into the C library's build directory, where nvcc exists."""
    compiler = cuda_build.nvcc()
    if compiler is None:
        _say("no nvcc: the wheel has no CUDA kernels (--device cuda needs them; the CPU "
             "engines do not)")
        return
    try:
        cuda_build.build(compiler)
    except cuda_build.BuildError as exc:
        _say(f"WITHOUT the CUDA kernels: {exc}")


class BuildPyWithCompiled(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            build_compiled(Path(self.build_lib) / "colibri")


class PlatformDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True  # the wheel carries shared libraries: tag it for this platform


setup(cmdclass={"build_py": BuildPyWithCompiled}, distclass=PlatformDistribution)
