"""This process's memory as ``/proc/self/status`` counts it: resident now (``VmRSS``) and its
peak (``VmHWM``).

``VmHWM`` is the address space's own high-water mark, so a worker started by fork and exec
reports its own peak. ``getrusage``'s ``ru_maxrss`` survives ``exec`` and reports the parent
that forked the worker when that parent was larger (a pytest worker, a bench process that
holds a model)."""

from __future__ import annotations

from pathlib import Path

STATUS = Path("/proc/self/status")


def status_bytes(field: str, status: Path = STATUS) -> int:
    """A ``kB`` field of the status file in bytes; 0 where the file or the field is missing
    (not Linux)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    return status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    return status_bytes("VmHWM")
