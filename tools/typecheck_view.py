"""Build build/typecheck/colibri: a symlink view of the package as it is installed.

pyproject maps top-level folders into the ``colibri`` namespace (``reference/`` is
``colibri.reference``). Setuptools' editable finder resolves that at import time, but mypy
cannot see through it, so ``make test`` type-checks this view instead of the raw folders.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    view = ROOT / "build" / "typecheck"
    shutil.rmtree(view, ignore_errors=True)
    top = view / "colibri"
    top.mkdir(parents=True)
    for entry in (ROOT / package_dir["colibri"]).iterdir():
        if entry.name != "__pycache__":
            os.symlink(entry, top / entry.name)
    for package, folder in package_dir.items():
        parts = package.split(".")
        if len(parts) == 2 and not (top / parts[1]).exists():
            os.symlink(ROOT / folder, top / parts[1])
    print(view)
    return 0


if __name__ == "__main__":
    sys.exit(main())
