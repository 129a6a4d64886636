"""Compile the control plane with mypyc, incrementally, into ``build/mypyc`` (what ``make
build`` runs: ``python -m colibri.control_plane_build``), beside ``colibri.control_plane``,
which decides whether a process loads it. The step has the shape of every build step
(``colibri.accelerated.native_build``).

The control plane is every module of ``colibri.engine`` and ``colibri.text`` but the package
``__init__`` files (``colibri.control_plane.control_plane_sources``). They are compiled as one
mypyc group, so calls between them are native C calls, into a directory beside the sources:

    build/mypyc/manifest.json                 what was built, from which sources
    build/mypyc/colibri_cp__mypyc.<abi>.so    mypyc's shared library of the group
    build/mypyc/colibri/engine/mux.<abi>.so   one small shim per module, ...

Nothing lands next to a ``.py`` file, so the interpreted engine stays interpreted; only a
process that calls ``colibri.control_plane.activate`` imports these (``--accelerated``).

The build is skipped when the manifest's stamp (SHA-256 of the sources, the mypy version, the
Python ABI and the optimisation level) is current. ``--force`` rebuilds regardless. The C
compiler is the C library's (``native_build.compiler``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from colibri import control_plane
from colibri.accelerated.native_build import BuildError, ToolMissing, compiler, run_step

GROUP = "colibri_cp"
OPT_LEVEL = "3"


def mypy_version() -> str | None:
    try:
        from mypy.version import __version__
    except ImportError:
        return None
    return str(__version__)


def stamp(sources_sha256: str, mypy: str) -> str:
    parts = (sources_sha256, mypy, sys.implementation.cache_tag,
             str(sysconfig.get_config_var("EXT_SUFFIX")), OPT_LEVEL, GROUP,
             str(control_plane.MANIFEST_VERSION))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def is_current(out: Path, build_stamp: str) -> bool:
    try:
        raw = json.loads((out / control_plane.MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    if raw.get("stamp") != build_stamp:
        return False
    return all((out / rel).is_file() for rel in dict(raw.get("files", {})).values())


def _file_parallel_build_ext() -> type[Any]:
    """setuptools' build_ext, compiling the C files of one extension concurrently.

    build_ext's own ``parallel`` spreads *extensions* over threads, but mypyc puts the whole
    group (52 of the 85 C files) into one extension, so its files compiled one after another:
    63 s of a fresh ``make build`` on two cores, 35 s this way. Each file goes through the
    compiler's public ``compile`` alone, with the arguments build_ext gave the batch."""
    from setuptools.command.build_ext import build_ext

    class FileParallelBuildExt(build_ext):  # type: ignore[misc]  # setuptools is untyped here
        def build_extensions(self) -> None:
            compile_batch = self.compiler.compile

            def compile_each(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
                with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                    done = pool.map(lambda source: compile_batch([source], *args, **kwargs),
                                    sources)
                    return [obj for objects in done for obj in objects]

            self.compiler.compile = compile_each
            try:
                super().build_extensions()
            finally:
                del self.compiler.compile

    return FileParallelBuildExt


def _compile(root: Path, sources: dict[str, Path], staging: Path, temp: Path) -> None:
    """mypyc -> C -> extension modules under ``staging`` (with the package layout)."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    paths = [str(path.relative_to(root)) for path in sources.values()]
    cwd = Path.cwd()
    # mypyc names modules from paths relative to the working directory, and reads the
    # project's [tool.mypy] (strict) from pyproject.toml there.
    os.chdir(root)
    try:
        extensions = mypycify(paths, opt_level=OPT_LEVEL, group_name=GROUP,
                              target_dir=str(temp / "c"), multi_file=True)
        dist = Distribution({"name": "colibri-control-plane", "ext_modules": extensions,
                             "cmdclass": {"build_ext": _file_parallel_build_ext()}})
        dist.verbose = 0
        command = dist.get_command_obj("build_ext")
        command.build_lib = str(staging)
        command.build_temp = str(temp / "obj")
        command.inplace = False
        command.parallel = os.cpu_count() or 1
        dist.run_command("build_ext")
    except SystemExit as exc:  # mypyc reports type errors by exiting
        raise BuildError(f"mypyc refused the control plane (exit {exc.code}); see above") from None
    except Exception as exc:  # setuptools' CompileError, LinkError, ...
        raise BuildError(f"compiling the control plane failed: {exc}") from None
    finally:
        os.chdir(cwd)


def build(out: Path | None = None, *, force: bool = False, root: Path | None = None) -> bool:
    """Build unless current; True when it compiled. Raises BuildError."""
    target = control_plane.default_build_dir() if out is None else out
    base = control_plane.source_root() if root is None else root
    mypy = mypy_version()
    if mypy is None:
        raise ToolMissing("mypy (which provides mypyc) is not installed: pip install mypy")
    sources = control_plane.control_plane_sources(base)
    digest = control_plane.source_digest(sources)
    build_stamp = stamp(digest, mypy)
    if not force and is_current(target, build_stamp):
        return False
    if compiler() is None:
        raise ToolMissing("no C compiler found (set CC, or install cc/gcc/clang)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mypyc-", dir=target.parent) as scratch:
        staging = Path(scratch) / "out"
        _compile(base, sources, staging, Path(scratch))
        suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
        names = [*sources, f"{GROUP}__mypyc"]
        files = {name: name.replace(".", "/") + suffix for name in names}
        for name, rel in files.items():
            if not (staging / rel).is_file():
                raise BuildError(f"mypyc produced no {rel} for {name}")
        manifest = {
            "manifest_version": control_plane.MANIFEST_VERSION,
            "stamp": build_stamp,
            "sources_sha256": digest,
            "mypy_version": mypy,
            "cache_tag": sys.implementation.cache_tag,
            "files": files,
        }
        (staging / control_plane.MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
        # Swap the whole directory: a running process keeps its mapped files, a new one sees
        # either the old build or the new one, never a mix.
        old = Path(scratch) / "old"
        if target.exists():
            target.replace(old)
        staging.replace(target)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m colibri.control_plane_build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="build directory (default: build/mypyc)")
    parser.add_argument("--force", action="store_true", help="rebuild even when current")
    args = parser.parse_args(argv)
    where = args.out or control_plane.default_build_dir()
    return run_step("mypyc control plane", where,
                    lambda: [(where / control_plane.MANIFEST_NAME,
                              build(args.out, force=args.force))],
                    "--accelerated runs the control plane interpreted")


__all__ = ["BuildError", "ToolMissing", "build", "is_current", "main", "stamp"]

if __name__ == "__main__":
    raise SystemExit(main())
