"""setuptools' PEP 517 backend, plus what compiling the wheel's control plane needs.

A wheel build (``pip install`` of the sdist) runs mypyc, which type-checks the control plane:
it needs mypy and the types of what the control plane imports (numpy, regex). Editable and
sdist builds need only setuptools, so ``pip install -e .`` stays quick.
"""

from __future__ import annotations

from setuptools import build_meta as _meta
from setuptools.build_meta import *  # noqa: F403 - the backend's whole surface

WHEEL_EXTRAS = ["mypy>=1.10", "numpy>=1.26", "types-regex"]


def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    return [*_meta.get_requires_for_build_wheel(config_settings), *WHEEL_EXTRAS]
