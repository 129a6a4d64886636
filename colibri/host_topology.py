"""What a bandwidth figure depends on: the CPU, which usable CPUs share a core, the caches.

A decode step's GB/s is only comparable between hosts whose memory paths are alike. Two
usable CPUs that are SMT siblings of one core share its miss buffers and its L1/L2, so two
kernel threads there read little more than one; two separate cores read up to twice as much.
``colibri bench`` records this in its ``machine`` object and ``colibri doctor`` prints it, so
a figure from another host can be read without access to that host.

Everything comes from Linux's ``/proc/cpuinfo`` and ``/sys/devices/system/cpu``; where those
are absent (another OS, a restricted container) the fields are ``None`` rather than guesses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from colibri.engine.host_info import meminfo

SYSFS_CPU = Path("/sys/devices/system/cpu")
CPUINFO = Path("/proc/cpuinfo")
#: The feature flags that decide which kernel variant runs and how wide its vectors are.
VECTOR_FLAGS: tuple[str, ...] = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512_bf16", "avx512_vnni", "amx_tile", "asimd", "sve",
)
_SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask), as the kernel pool sizes itself."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def cpu_list(text: str) -> list[int]:
    """A sysfs CPU list (``0-3,8,10-11``) as the CPU numbers it names."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def cache_bytes(text: str) -> int:
    """A sysfs cache size (``32K``, ``1024K``, ``32M``) in bytes."""
    text = text.strip()
    unit = _SIZE_UNITS.get(text[-1:].upper())
    return int(text[:-1]) * unit if unit else int(text)


def cpu_identity(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The first processor's name, vendor, family/model/stepping and vector flags."""
    fields: dict[str, str] = {}
    for line in (_read(cpuinfo) or "").splitlines():
        if not line.strip():
            break  # the first processor's block is enough: the others repeat it
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else None

    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "name": " ".join(fields.get("model name", "").split()) or None,
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
        "family": number("cpu family"),
        "model": number("model"),
        "stepping": number("stepping"),
        "vector_flags": [f for f in VECTOR_FLAGS if f in flags],
    }


def core_groups(cpus: list[int], sysfs: Path = SYSFS_CPU) -> list[list[int]] | None:
    """``cpus`` grouped by the physical core they run on (package, core id), in CPU order;
    ``None`` where sysfs does not say."""
    groups: dict[tuple[str, str], list[int]] = {}
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        package, core = _read(topology / "physical_package_id"), _read(topology / "core_id")
        if package is None or core is None:
            return None
        groups.setdefault((package, core), []).append(cpu)
    return list(groups.values())


def caches(cpus: list[int], sysfs: Path = SYSFS_CPU) -> list[dict[str, Any]]:
    """The first usable CPU's caches: level, type, bytes, and how many usable CPUs share it."""
    if not cpus:
        return []
    found: list[dict[str, Any]] = []
    usable = set(cpus)
    for index in sorted((sysfs / f"cpu{cpus[0]}" / "cache").glob("index*")):
        level, kind = _read(index / "level"), _read(index / "type")
        size, shared = _read(index / "size"), _read(index / "shared_cpu_list")
        if level is None or kind is None or size is None:
            continue
        found.append({
            "level": int(level), "type": kind, "bytes": cache_bytes(size),
            "shared_by_usable_cpus": (len(usable & set(cpu_list(shared)))
                                      if shared is not None else None),
        })
    return found


def memory_gb() -> float | None:
    total = meminfo().get("MemTotal")
    return None if total is None else round(total * 1024 / 1e9, 1)


def describe(cpus: list[int] | None = None, sysfs: Path = SYSFS_CPU,
             cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The host as a JSON object (see the module docstring)."""
    cpus = usable_cpus() if cpus is None else cpus
    groups = core_groups(cpus, sysfs)
    return {
        "cpu": cpu_identity(cpuinfo),
        "usable_cpus": cpus,
        "physical_cores": None if groups is None else len(groups),
        "smt_siblings": None if groups is None else [g for g in groups if len(g) > 1],
        "caches": caches(cpus, sysfs),
        "memory_gb": memory_gb(),
    }


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


def summary(host: dict[str, Any]) -> str:
    """One line: ``2 usable CPUs on 2 cores; L1d 32 KiB, L2 1 MiB, L3 32 MiB (shared by 2)``."""
    n = len(host["usable_cpus"])
    cores = host["physical_cores"]
    if cores is None:
        text = f"{n} usable CPUs (cores unknown)"
    else:
        text = f"{n} usable CPUs on {cores} core{'s' if cores != 1 else ''}"
        if host["smt_siblings"]:
            pairs = ", ".join("+".join(map(str, group)) for group in host["smt_siblings"])
            text += f" ({pairs} are SMT siblings)"
    parts = []
    for cache in host["caches"]:
        if cache["type"] == "Instruction":
            continue
        name = f"L{cache['level']}{'d' if cache['type'] == 'Data' else ''}"
        shared = cache["shared_by_usable_cpus"]
        parts.append(f"{name} {_size(cache['bytes'])}"
                     + (f" (shared by {shared})" if shared and shared > 1 else ""))
    return text + ("; " + ", ".join(parts) if parts else "")
