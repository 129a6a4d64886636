"""Host facts for HWINFO, STAT and PROF: cores, memory, peak RSS, physical read bytes."""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from functools import lru_cache

from colibri.engine.backend import Device
from colibri.protocol.records import GpuDevice, Gpus, HwInfo


def peak_rss_gb() -> float:
    """Peak resident set size in GB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def meminfo() -> dict[str, int]:
    """/proc/meminfo's numeric fields (KiB for the sizes); empty where it cannot be read."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if fields and fields[0].isdigit():
                    values[name] = int(fields[0])
    except OSError:
        pass
    return values


@lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return " ".join(line.partition(":")[2].split())
    except OSError:
        pass
    return os.uname().machine


def hwinfo_line(devices: Sequence[Device]) -> str:
    """HWINFO: the host, and the backend's devices (none on CPU: `0 0.0` and no GPU name)."""
    mem = meminfo()
    total = mem.get("MemTotal", 0) / 1e6
    avail = mem.get("MemAvailable", 0) / 1e6
    cores = os.cpu_count() or 1
    vram = sum(d.memory_bytes for d in devices) / 1e9
    gpu = devices[0].name if devices else ""
    return HwInfo(cores, total, avail, len(devices), vram, cpu_name(), gpu).line()


def gpus_line(devices: Sequence[Device]) -> str:
    """GPUS: per device, used GB, total GB, resident experts; `GPUS 0` on CPU."""
    return Gpus(tuple(GpuDevice(d.used_bytes / 1e9, d.memory_bytes / 1e9, d.experts)
                      for d in devices)).line()


def physical_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage (/proc/self/io), if available."""
    try:
        with open("/proc/self/io", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None
