"""Find and load the accelerated engine's C library (built by ``native_build``).

The variant is the best one the running CPU supports (``avx2`` needs both AVX2 and FMA,
``avx512`` those and AVX-512 F/BW/VL/DQ),
unless ``COLIBRI_ISA`` names one (``generic`` forces the portable build, e.g. to compare
the two paths). A missing library is a :class:`LibraryNotBuilt` naming the step that
builds it, never an ``OSError`` from ctypes.
"""

from __future__ import annotations

import ctypes
import os
import platform
from functools import cache
from pathlib import Path

from colibri.accelerated.native_build import AVX512_FLAGS, DEFAULT_OUT, LIBRARY_NAME, variants

from colibri.control_plane import rebuild_hint


class LibraryNotBuilt(RuntimeError):
    """The C library of the accelerated engine is absent or does not load."""


def cpu_flags() -> frozenset[str]:
    """The running CPU's feature flags as Linux names them (empty where unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def supported_variants() -> list[str]:
    """Variant names this CPU can run, best last."""
    names = ["generic"]
    if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= cpu_flags():
        names.append("avx2")
        # /proc/cpuinfo names each subset as the flag that enables it, without "-m".
        if {flag.removeprefix("-m") for flag in AVX512_FLAGS} <= cpu_flags():
            names.append("avx512")
    return [v.name for v in variants() if v.name in names]


def chosen_variant() -> str:
    forced = os.environ.get("COLIBRI_ISA")
    supported = supported_variants()
    # The ASan + UBSan build (``native_build --sanitize``) runs on any CPU; it is only ever
    # chosen by name, by the process ``native_build --sanitize -- CMD`` starts.
    if forced == "sanitize":
        return forced
    if forced:
        if forced not in supported:
            raise LibraryNotBuilt(
                f"COLIBRI_ISA={forced} is not a variant this CPU runs (it runs: "
                f"{', '.join(supported)})"
            )
        return forced
    return supported[-1]


def library_path(out: Path = DEFAULT_OUT) -> Path:
    return out / chosen_variant() / LIBRARY_NAME


@cache
def load_library() -> ctypes.CDLL:
    path = library_path()
    if not path.is_file():
        raise LibraryNotBuilt(
            f"the accelerated engine's C library is not built ({path} is missing): "
            f"{rebuild_hint()}"
        )
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise LibraryNotBuilt(f"{path} does not load: {exc}; {rebuild_hint()}") from exc
