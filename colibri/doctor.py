"""Installation health checks behind ``colibri doctor``.

Each check returns a :class:`Check` with status ``ok``, ``warn`` (works, but an optional
piece is missing) or ``fail`` (the installation is broken). The overall status is the worst
of them; the CLI exits non-zero only on ``fail``. The JSON shape follows colibri's own
doctor (``schema_version``, ``status``, ``checks[{id, status, summary}]``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from colibri import resources

Status = Literal["ok", "warn", "fail"]
_SEVERITY: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}

SCHEMA_VERSION = 1
RUNTIME_MODULES: tuple[str, ...] = ("numpy", "ml_dtypes", "tornado", "jsonschema", "regex")


@dataclass(frozen=True)
class Check:
    id: str
    status: Status
    summary: str


def check_python() -> Check:
    version = platform.python_version()
    if sys.version_info < (3, 11):  # noqa: UP036 - doctor must say why an old Python fails
        return Check("python", "fail", f"Python {version}; colibri needs >= 3.11")
    return Check("python", "ok", f"Python {version} ({sys.executable})")


def _check_module(name: str) -> Check:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        return Check(name, "fail", f"cannot import {name}: {exc}")
    try:
        dist_version = importlib.metadata.version(name.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        dist_version = "unknown version"
    return Check(name, "ok", f"{name} {dist_version}")


def check_runtime_modules() -> list[Check]:
    return [_check_module(name) for name in RUNTIME_MODULES]


def check_spec_data() -> Check:
    try:
        path = resources.spec_path("DEVIATIONS.md")
    except FileNotFoundError as exc:
        return Check("spec", "fail", str(exc))
    return Check("spec", "ok", f"spec data at {path.parent}")


def check_default_model() -> Check:
    try:
        model_dir = resources.default_model_dir()
    except FileNotFoundError as exc:
        return Check("default_model", "fail", str(exc))
    config = model_dir / "config.json"
    if not config.is_file():
        return Check("default_model", "fail", f"embedded default model missing: no {config}")
    return Check("default_model", "ok", f"embedded default model at {model_dir}")


def check_accelerated() -> Check:
    """Whether the accelerated engine's C kernels (and any compiled modules) are built and load."""
    try:
        accelerated = importlib.import_module("colibri.accelerated")
    except ImportError as exc:
        return Check("accelerated", "fail", f"cannot import colibri.accelerated: {exc}")
    kernels = _accelerated_kernels()
    package_dir = Path(str(getattr(accelerated, "__path__", [""])[0]))
    compiled = sorted(p.name for p in package_dir.glob("*.so"))
    if kernels is None and not compiled:
        return Check(
            "accelerated",
            "warn",
            "accelerated engine not built (no compiled modules or kernels; run `make build`); "
            "the reference engine is used",
        )
    failures = []
    for name in compiled:
        try:
            ctypes.CDLL(str(package_dir / name))
        except OSError as exc:
            failures.append(f"{name}: {exc}")
    if kernels is not None and kernels.startswith("fail:"):
        failures.append(kernels[5:])
    if failures:
        return Check("accelerated", "fail", "accelerated engine fails to load: "
                     + "; ".join(failures))
    parts = [kernels] if kernels else []
    if compiled:
        parts.append("compiled modules: " + ", ".join(compiled))
    return Check("accelerated", "ok", "; ".join(parts))


def _accelerated_kernels() -> str | None:
    """'C kernels: PATH (variant V, ISA I)', 'fail: why', or None when not built."""
    try:
        native = importlib.import_module("colibri.accelerated.native")
    except ImportError:
        return None
    path = native.library_path()
    if not path.is_file():
        return None
    try:
        lib = native.load_library()
        isa = lib.col_isa
        isa.restype = ctypes.c_char_p
        name = isa().decode()
    except (native.LibraryNotBuilt, AttributeError, OSError) as exc:
        return f"fail: C kernels at {path}: {exc}"
    return (f"C kernels: {path} (variant {native.chosen_variant()}, ISA {name}, "
            f"{os.cpu_count() or 1} CPUs)")


def cuda_device_count() -> tuple[int, str]:
    """(usable CUDA devices, why): usable means the driver loads and cuInit succeeds."""
    library = ctypes.util.find_library("cuda")
    if library is None:
        return 0, "no CUDA driver found"
    try:
        cuda = ctypes.CDLL(library)
        result = int(cuda.cuInit(0))
        if result != 0:
            return 0, f"CUDA driver {library} present but cuInit returned {result}"
        count = ctypes.c_int(0)
        cuda.cuDeviceGetCount(ctypes.byref(count))
    except (OSError, AttributeError) as exc:
        return 0, f"CUDA driver {library} present but unusable: {exc}"
    return count.value, f"CUDA driver {library}"


def check_gpu() -> Check:
    count, why = cuda_device_count()
    if count == 0:
        return Check("gpu", "ok", f"no usable GPU ({why}); CPU only")
    return Check("gpu", "ok", f"{count} CUDA device(s) usable ({why})")


ALL_CHECKS: tuple[Callable[[], Check | list[Check]], ...] = (
    check_python,
    check_runtime_modules,
    check_spec_data,
    check_default_model,
    check_accelerated,
    check_gpu,
)


def run_checks() -> list[Check]:
    checks: list[Check] = []
    for check in ALL_CHECKS:
        result = check()
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def overall_status(checks: list[Check]) -> Status:
    worst: Status = "ok"
    for check in checks:
        if _SEVERITY[check.status] > _SEVERITY[worst]:
            worst = check.status
    return worst


def report(checks: list[Check]) -> dict[str, object]:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": overall_status(checks),
        "checks": [asdict(check) for check in checks],
    }
