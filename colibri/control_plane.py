"""Which control plane this process runs: the plain ``.py`` modules or the mypyc-compiled ones.

The control plane is ``colibri.engine`` (mux and legacy loops, batcher, sampler, RNG, wire
I/O, ...) and the tokenizer in ``colibri.text``. ``make build`` compiles those modules with
mypyc (``python -m colibri.control_plane_build``) into a build directory *beside* the
sources, never over them, so a plain ``import colibri.engine`` always gets the ``.py`` files.
Only a process that calls :func:`activate` before it imports any of them runs the compiled
ones: :func:`activate` installs a meta-path finder that answers exactly the compiled module
names with their extension files. ``colibri.cli.main`` decides from the command line and the
environment, before it imports anything else of colibri (:func:`wanted`):

- ``COLIBRI_CONTROL_PLANE=compiled``: compiled, whatever the backend; a missing or stale build
  is an error (this is how the tests run the control plane compiled on the reference backend);
- ``COLIBRI_CONTROL_PLANE=interpreted``: the ``.py`` modules, whatever the backend;
- unset (or ``auto``): compiled iff the command line picks the accelerated backend
  (``--accelerated``, ``--backend accelerated``); a missing or stale build then falls back to
  the ``.py`` modules with a warning on stderr naming ``make build``.

The choice is visible: ``colibri engine`` prints :func:`describe` on stderr at startup
(``[CONTROL] interpreted`` or ``[CONTROL] compiled (mypyc) N modules from DIR``), and
:func:`compiled_modules` lists the loaded modules whose ``__file__`` is an extension file.

This module imports only the standard library, so deciding costs nothing and cannot itself
import the control plane.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ENV = "COLIBRI_CONTROL_PLANE"
#: The packages whose modules (all but the package ``__init__``) are compiled.
PACKAGES: tuple[str, ...] = ("colibri.engine", "colibri.text")
MANIFEST_NAME = "manifest.json"
#: Bumped when the manifest's meaning changes, so an old build reads as stale.
MANIFEST_VERSION = 1


class ControlPlaneError(RuntimeError):
    """The compiled control plane was demanded but cannot be used (missing, stale, too late)."""


def source_root() -> Path:
    """The directory holding the ``colibri`` package's sources (the checkout, or site-packages)."""
    return Path(__file__).resolve().parent.parent


def default_build_dir() -> Path:
    """``build/mypyc`` beside ``build/accelerated`` (the C library, ``native_build``): the
    directory above the ``colibri.accelerated`` package, i.e. the checkout's root, or the
    installed ``colibri`` package for a wheel."""
    spec = importlib.util.find_spec("colibri.accelerated")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    base = Path(locations[0]).resolve().parent if locations else source_root()
    return base / "build" / "mypyc"


def rebuild_hint(in_checkout: str = "run `make build`") -> str:
    """What builds this copy of colibri's compiled pieces (C library, CUDA library, mypyc
    control plane), for the messages that say one is missing: ``in_checkout`` in a checkout
    (its Makefile sits beside the build directory); in an installed package, a reinstall from
    the source distribution, whose wheel build compiles them (setup.py) where the tools
    exist."""
    if (default_build_dir().parent.parent / "Makefile").is_file():
        return in_checkout
    from colibri import __version__

    return ("reinstall colibri from its source distribution on a machine with a C compiler "
            "(and nvcc, for the CUDA kernels): `pip install --force-reinstall --no-deps "
            f"colibri-{__version__}.tar.gz` compiles them")


def control_plane_sources(root: Path | None = None) -> dict[str, Path]:
    """Module name -> source file of every module that is compiled."""
    base = source_root() if root is None else root
    found: dict[str, Path] = {}
    for package in PACKAGES:
        folder = base.joinpath(*package.split("."))
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                found[f"{package}.{path.stem}"] = path
    return found


def source_digest(sources: Mapping[str, Path]) -> str:
    """SHA-256 over the module names and their source bytes: what a build was made from."""
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0")
        digest.update(sources[name].read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Build:
    """A compiled control plane on disk, as its manifest describes it."""

    directory: Path
    #: module name -> extension file (the module shims and mypyc's shared library).
    files: dict[str, Path]
    sources_sha256: str
    mypy_version: str


def read_build(directory: Path | None = None) -> Build:
    """The build in ``directory``; ControlPlaneError when there is none or it is unusable here."""
    where = default_build_dir() if directory is None else directory
    manifest = where / MANIFEST_NAME
    try:
        raw = json.loads(manifest.read_text())
    except (OSError, ValueError):
        raise ControlPlaneError(
            f"the compiled control plane is not built (no {manifest}): {rebuild_hint()}"
        ) from None
    if raw.get("manifest_version") != MANIFEST_VERSION or raw.get("cache_tag") != (
        sys.implementation.cache_tag
    ):
        raise ControlPlaneError(
            f"the compiled control plane in {where} was built for another Python or by another "
            f"colibri: {rebuild_hint()}"
        )
    files = {name: where / rel for name, rel in dict(raw["files"]).items()}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise ControlPlaneError(
            f"the compiled control plane is incomplete ({missing[0]} is missing): "
            f"{rebuild_hint()}"
        )
    return Build(where, files, str(raw["sources_sha256"]), str(raw["mypy_version"]))


def check_current(build: Build, root: Path | None = None) -> None:
    """ControlPlaneError unless ``build`` was compiled from the sources as they are now."""
    if source_digest(control_plane_sources(root)) != build.sources_sha256:
        raise ControlPlaneError(
            f"the compiled control plane in {build.directory} is stale (the sources changed "
            f"since it was built): {rebuild_hint()}"
        )


class _CompiledFinder:
    """Answers the compiled module names, and only those, with their extension files.

    A meta path finder by protocol (``find_spec``), not by subclassing importlib.abc's ABC:
    importing importlib.abc pulls in importlib.resources, ~20 ms of every engine start."""

    def __init__(self, build: Build) -> None:
        self.build = build
        self.files = dict(build.files)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _finder() -> _CompiledFinder | None:
    for finder in sys.meta_path:
        if isinstance(finder, _CompiledFinder):
            return finder
    return None


def activate(directory: Path | None = None) -> Build:
    """Make every later import of a control-plane module load its compiled file.

    Must run before any of them is imported: a half-compiled control plane would mix mypyc's
    native classes with their interpreted twins. Raises ControlPlaneError when the build is
    missing, stale or too late."""
    build = read_build(directory)
    check_current(build)
    existing = _finder()
    if existing is not None:
        return build
    early = sorted(name for name in build.files if name in sys.modules)
    if early:
        raise ControlPlaneError(
            f"cannot switch to the compiled control plane: {early[0]} is already imported"
        )
    sys.meta_path.insert(0, _CompiledFinder(build))
    return build


def wanted(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """``compiled``, ``interpreted`` or ``auto-compiled`` (compiled if built, for the
    accelerated backend) for a process started with ``argv`` in ``env``."""
    choice = env.get(ENV, "auto").strip().lower() or "auto"
    if choice in ("compiled", "interpreted"):
        return choice
    if choice != "auto":
        raise ControlPlaneError(f"{ENV}={env[ENV]!r}: expected compiled, interpreted or auto")
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--accelerated" or arg == "--backend=accelerated":
            return "auto-compiled"
        if arg == "--backend" and i + 1 < len(argv) and argv[i + 1] == "accelerated":
            return "auto-compiled"
    return "interpreted"


def select(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """What ``colibri.cli.main`` runs first: activate the compiled control plane if wanted.

    ``auto-compiled`` with no usable build warns and keeps the ``.py`` modules (they behave
    identically, only slower); an explicit ``compiled`` raises ControlPlaneError."""
    environment = os.environ if env is None else env
    choice = wanted(argv, environment)
    if choice == "interpreted":
        return
    try:
        activate()
    except ControlPlaneError as exc:
        if choice == "compiled":
            raise
        print(f"[CONTROL] {exc}; running the interpreted control plane", file=sys.stderr)


def compiled_modules() -> dict[str, str]:
    """Loaded control-plane modules that are compiled: name -> extension file."""
    found: dict[str, str] = {}
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name, module in list(sys.modules.items()):
        if not any(name.startswith(package + ".") for package in PACKAGES):
            continue
        file = getattr(module, "__file__", None) or ""
        if file.endswith(suffixes):
            found[name] = file
    return found


def describe() -> str:
    """One line for stderr: which control plane this process runs."""
    finder = _finder()
    if finder is None:
        return "[CONTROL] interpreted"
    count = sum(1 for name in finder.files if name.startswith(tuple(p + "." for p in PACKAGES)))
    return f"[CONTROL] compiled (mypyc) {count} modules from {finder.build.directory}"
