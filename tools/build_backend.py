"""setuptools' PEP 517 backend, plus what compiling the wheel's control plane needs.

A wheel build (``pip install`` of the sdist) runs mypyc, which type-checks the control plane:
it needs mypy and the types of everything the control plane imports. pip builds in an isolated
environment holding only what the backend asks for, so it asks for the runtime dependencies
themselves (read from pyproject.toml, so a new one cannot be forgotten here: without one,
every sdist install falls back to the interpreted control plane) plus the stubs
of those that ship none. Editable and sdist builds need only setuptools, so ``pip install -e
.`` stays quick.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import build_meta as _meta
from setuptools.build_meta import *  # noqa: F403 - the backend's whole surface

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def runtime_dependencies(pyproject: Path = PYPROJECT) -> list[str]:
    """``[project] dependencies`` of the pyproject.toml beside this backend."""
    return list(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"])


#: What a wheel build installs beyond setuptools: mypyc and the stubs regex lacks, and the
#: runtime dependencies whose types the control plane's modules see.
WHEEL_EXTRAS = ["mypy>=1.10", "types-regex", *runtime_dependencies()]


def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    return [*_meta.get_requires_for_build_wheel(config_settings), *WHEEL_EXTRAS]
