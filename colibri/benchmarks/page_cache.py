"""Put the files a bench section times into one page-cache state first: read afresh from disk.

A decode step streams its weights through the memory map of a file in the page cache, and how
fast it streams depends on the folios the cache holds the file in, which depends on which
program read the file first and how: a file read through a map (or written in large aligned
chunks, ``colibri.reference.aligned_write``) is cached in folios of up to 2 MiB and mapped
with one page-table entry each; one read by small scattered reads stays in 4 KiB folios until
the cache drops it (llama.cpp's GGUF converter, run as the bench checkpoint's first reader,
leaves it so). The same checkpoint in the two states, alternating in one process (2-core EPYC
Zen 5, accelerated, two threads, 15 paired rounds): the one-row step 1.06-1.09x and the 8-row
step 1.06x slower in 4 KiB folios. That is the size of a kernel change, and nothing in a run
said which state it got, so the sections that time decoding refresh their files first: drop
each file's clean cached pages (``posix_fadvise(DONTNEED)``: pages some other process maps
stay) and read it back through a map advised ``MADV_HUGEPAGE``, the state a model's first load
after a boot gives. llama.cpp's GGUFs get the same, so both engines stream from the same kind
of cache.

``python -m colibri.benchmarks.page_cache DIR...`` does the same for any model directory, for
a checkpoint served after it was downloaded or copied in small pieces (``colibri doctor
--model`` says when one is cached so).

A file is refreshed once per ``colibri bench`` process. Files of more than half the memory
the kernel calls available are left as they are (reading them back would evict each other),
and the report says so.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions
from colibri.benchmarks.page_mapping import SMAPS, huge_mapped_fraction, mapped_sizes, touch_pages

#: Files refreshed by this process (resolved paths), so each is read back once per run.
REFRESHED: set[Path] = set()


def model_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint or container directory."""
    return sorted(Path(model_dir).glob("*.safetensors"))


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` in bytes, or None where the kernel does not say."""
    try:
        for line in meminfo.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_back(path: Path) -> mmap.mmap | None:
    """Drop ``path``'s clean cached pages and fault every page back in through a map advised
    for 2 MiB folios. Returns the map (kept open so smaps can be read; None for an empty
    file)."""
    with path.open("rb") as fh:
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        if os.fstat(fh.fileno()).st_size == 0:
            return None
        view = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            view.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # a kernel without transparent huge pages: the read still happens
    touch_pages(view)
    return view


def refresh_page_cache(paths: Iterable[Path], *, available_bytes: int | None = None,
                       done: set[Path] | None = None, smaps: Path = SMAPS) -> dict[str, Any]:
    """Read ``paths`` back from disk into the page cache (see the module docstring); a report
    of what was done, or ``{"skipped": reason}``. ``done``: the files already refreshed, which
    are left alone and to which these are added (default: this process's, ``REFRESHED``)."""
    done = REFRESHED if done is None else done
    files = sorted({Path(p).resolve() for p in paths} - done)
    if not files:
        return {"skipped": "refreshed earlier in this run, or no files"}
    if not hasattr(os, "posix_fadvise"):
        return {"skipped": "this platform has no posix_fadvise"}
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        return {"skipped": f"not a file: {', '.join(missing)}"}
    total = sum(f.stat().st_size for f in files)
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if available is None:
        return {"skipped": "the kernel does not say how much memory is available"}
    if 2 * total > available:
        return {"skipped": f"the files ({total / 1e9:.2f} GB) are more than half the available "
                           f"memory ({available / 1e9:.2f} GB); their cache is left as it is"}
    t0 = time.perf_counter()
    views: list[mmap.mmap] = []
    try:
        for f in files:
            try:
                view = _read_back(f)
            except OSError as exc:  # the section still runs, on the cache as it is
                return {"skipped": f"cannot read {f} back: {exc}"}
            if view is not None:
                views.append(view)
        seconds = time.perf_counter() - t0
        try:  # how the refreshed pages are mapped, while this process still maps them
            sizes = mapped_sizes(smaps.read_text(encoding="utf-8", errors="replace"),
                                 (str(f) for f in files))
        except OSError:
            sizes = None
    finally:
        for view in views:
            view.close()
    done.update(files)
    report: dict[str, Any] = {"files": [str(f) for f in files], "bytes": total,
                              "seconds": seconds}
    if sizes is not None and sizes["resident_bytes"]:
        report["huge_mapped_fraction"] = huge_mapped_fraction(sizes)
    return report


def refresh_for(options: BenchOptions, paths: Iterable[Path]) -> dict[str, Any]:
    """:func:`refresh_page_cache` of the existing ``paths``, unless ``--keep-page-cache``."""
    if not options.refresh_page_cache:
        return {"skipped": "--keep-page-cache"}
    return refresh_page_cache([p for p in paths if Path(p).is_file()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m colibri.benchmarks.page_cache",
        description="read model directories' weight files back from disk into the page cache, "
                    "in 2 MiB folios where the kernel gives them")
    parser.add_argument("model_dir", type=Path, nargs="+")
    args = parser.parse_args(argv)
    report = refresh_page_cache([f for d in args.model_dir for f in model_files(d)])
    print(json.dumps(report, indent=2))
    return 1 if "skipped" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())
