"""A memory cgroup to run one benchmark process under, like a machine with less RAM, and
dropping the page cache before such a run.

cgroup v1 (``/sys/fs/cgroup/memory/``: ``memory.limit_in_bytes``, ``max_usage_in_bytes``,
``oom_control``) and v2 (a ``memory.max`` beside ``cgroup.procs``: ``memory.peak``,
``memory.events``) are both handled. The child joins the group before it execs, so every byte
it allocates and every page it faults in is charged there. Needs root (or a delegated
subtree); ``available()`` says why not where it cannot.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


def available() -> tuple[str | None, str]:
    """("v1" | "v2", "") where a memory cgroup can be made here, else (None, why not)."""
    if (V1_ROOT / "memory.limit_in_bytes").is_file():
        return ("v1", "") if os.access(V1_ROOT, os.W_OK) else (None, f"{V1_ROOT} not writable")
    if (V2_ROOT / "cgroup.controllers").is_file():
        if "memory" not in (V2_ROOT / "cgroup.controllers").read_text().split():
            return None, "cgroup v2 without the memory controller"
        return ("v2", "") if os.access(V2_ROOT, os.W_OK) else (None, f"{V2_ROOT} not writable")
    return None, "no memory cgroup controller mounted"


class MemoryCgroup:
    """One group with a hard memory limit (swap included where the kernel accounts it)."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        version, why = available()
        if version is None:
            raise OSError(why)
        self.version = version
        root = V1_ROOT if version == "v1" else V2_ROOT
        self.path = root / f"{name}-{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        if version == "v1":
            self._write("memory.limit_in_bytes", limit_bytes)
            if (self.path / "memory.memsw.limit_in_bytes").is_file():
                self._write("memory.memsw.limit_in_bytes", limit_bytes)
        else:
            self._write("memory.max", limit_bytes)
            if (self.path / "memory.swap.max").is_file():
                self._write("memory.swap.max", 0)
        self.limit_bytes = limit_bytes

    def _write(self, name: str, value: int) -> None:
        (self.path / name).write_text(f"{value}\n")

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the group (the shell joins it, then execs)."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv]

    def peak_bytes(self) -> int:
        if self.version == "v1":
            return int(self._read("memory.max_usage_in_bytes"))
        peak = self.path / "memory.peak"
        return int(peak.read_text()) if peak.is_file() else int(self._read("memory.current"))

    def oom_kills(self) -> int:
        text = self._read("memory.oom_control" if self.version == "v1" else "memory.events")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def close(self) -> None:
        for _ in range(50):  # the group empties once its process has been reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def drop_caches() -> bool:
    """Write back and drop the page cache (root only); False where it cannot."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        return False
    return True
