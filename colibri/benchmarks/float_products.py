"""Bench section ``float-products``: the float32 product kernels by activation rows, fed from
memory and from cache, beside this machine's copy bandwidth.

A batched decode step's dense products meet 4-8 activation rows per weight row, and whether
they keep up with memory depends on the machine: with 16 vector registers (the avx2 build)
an 8-row product issues one multiply-add per weight float, so it can be bound by arithmetic
on one CPU and by memory on another. This section measures, for every library variant the
CPU runs and for the bench model's three product widths (``k`` = 512, 1024, 2048, 8 MiB of
weights a matrix):

* ``memory``: one pass over distinct matrices totalling ``MEMORY_MIB`` (larger than any
  cache), so every weight byte comes from memory, as in a decode step;
* ``cache``: the same product over one matrix of ``CACHE_MIB``, repeated, so its weights
  come from the last-level cache (a matrix small enough for L2 would make each call a few
  microseconds, which the Python call and the pool's start would dominate);

each at 1, 2, 3, 4 and 8 activation rows, on one thread and on the engine's threads
(``COLIBRI_THREADS``, else every CPU), best of ``REPEATS``. Reported: weight GB/s, billions of
multiply-adds a second (weights x rows), ``memory_over_cache`` (the share of the in-cache
rate reached from memory) and ``memory_time_over_one_row`` (how much longer the rows take
than one row over the same weights). Near 1 for the latter, the extra rows are free: the
product is bound by memory. Near ``memory_over_cache`` 1 and well above 1 for the latter, it
is bound by arithmetic; low in both, its memory stream does not overlap its arithmetic. The
copy bandwidth (the roofline's, best of 8) is measured once before and once after, for
scale. Only a benchmark: no test times anything.
"""

from __future__ import annotations

from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.bandwidth import host_copy_bytes_per_s
from colibri.benchmarks.stats import best_seconds
from colibri.control_plane import rebuild_hint

#: Output rows and widths (``k``) of one matrix: the bench model's hidden size, its dense
#: intermediate size and its expert intermediate size as ``k``, 8 MiB of float32 each.
SHAPES: tuple[tuple[int, int], ...] = ((2048, 1024), (1024, 2048), (4096, 512))
ROWS: tuple[int, ...] = (1, 2, 3, 4, 8)
MEMORY_MIB = 128
CACHE_MIB = 4
REPEATS = 3


def _measure(kernels: Any, weights: list[Any], rows: int, passes: int, repeats: int
             ) -> dict[str, float]:
    """GB/s and G multiply-adds/s of ``passes`` passes of ``rows``-row products over
    ``weights`` (each a ``Weight`` of one shape), best of ``repeats``."""
    import numpy as np

    k, n = weights[0].cols, weights[0].rows
    x = np.ones((rows, k), np.float32)
    out = np.empty((rows, n), np.float32)

    def run() -> None:
        for _ in range(passes):
            for w in weights:
                kernels.matmul(x, w, out)

    run()  # page in, warm the caches for the in-cache case
    seconds = best_seconds(run, repeats)
    floats = float(passes * len(weights) * n * k)
    return {"gb_per_s": round(4 * floats / seconds / 1e9, 3),
            "g_multiply_adds_per_s": round(rows * floats / seconds / 1e9, 3)}


def _variant(lib_path: Any, threads: list[int], memory_mib: int, cache_mib: int,
             repeats: int) -> dict[str, Any]:
    import ctypes

    import numpy as np

    from colibri.accelerated.kernels import Kernels, Weight

    report: dict[str, Any] = {}
    lib = ctypes.CDLL(str(lib_path))
    for n, k in SHAPES:
        matrix_bytes = n * k * 4
        count = max(1, (memory_mib << 20) // matrix_bytes)
        from_memory = [Weight(np.full((n, k), 0.5, np.float32), 0) for _ in range(count)]
        cache_rows = max(1, (cache_mib << 20) // (4 * k))
        in_cache = [Weight(np.full((cache_rows, k), 0.5, np.float32), 0)]
        # as many passes over the small matrix as weight bytes read from memory
        passes = max(1, count * n // cache_rows)
        shape: dict[str, Any] = {}
        for t in threads:
            kernels = Kernels(t, lib)
            try:
                per_rows: dict[str, Any] = {}
                for rows in ROWS:  # one row first: the others' times are held against it
                    memory = _measure(kernels, from_memory, rows, 1, repeats)
                    cache = _measure(kernels, in_cache, rows, passes, repeats)
                    if rows == 1:
                        one_row = memory["gb_per_s"]
                    per_rows[str(rows)] = {
                        "memory": memory, "cache": cache,
                        "memory_over_cache": round(memory["gb_per_s"] / cache["gb_per_s"], 3),
                        "memory_time_over_one_row": round(one_row / memory["gb_per_s"], 3),
                    }
            finally:
                kernels.close()
            shape[f"threads_{t}"] = per_rows
        report[f"{n}x{k}"] = shape
        del from_memory
    return report


def run(options: BenchOptions) -> dict[str, Any]:
    try:
        from colibri.accelerated.model import default_threads
        from colibri.accelerated.native import LibraryNotBuilt, supported_variants
        from colibri.accelerated.native_build import DEFAULT_OUT, LIBRARY_NAME
    except ImportError as exc:  # pragma: no cover - a partial install
        return {"skipped": f"accelerated package unavailable: {exc}"}
    paths = {v: DEFAULT_OUT / v / LIBRARY_NAME for v in supported_variants()}
    paths = {v: p for v, p in paths.items() if p.is_file()}
    if not paths:
        return {"skipped": str(LibraryNotBuilt(f"the C library is not built: {rebuild_hint()}"))}
    memory_mib = int(options.extra.get("float_memory_mib", MEMORY_MIB))
    cache_mib = int(options.extra.get("float_cache_mib", CACHE_MIB))
    repeats = int(options.extra.get("float_repeats", REPEATS))
    engine_threads = default_threads()
    threads = sorted({1, engine_threads})
    copy_before = host_copy_bytes_per_s()
    variants = {v: _variant(p, threads, memory_mib, cache_mib, repeats)
                for v, p in paths.items()}
    copy_after = host_copy_bytes_per_s()
    return {
        "threads": threads,
        "memory_mib": memory_mib,
        "cache_mib": cache_mib,
        "copy_bandwidth_gb_per_s": [round(copy_before / 1e9, 3), round(copy_after / 1e9, 3)],
        "variants": variants,
    }


register(Section(
    name="float-products",
    engines=("accelerated",),
    description="float32 products at 1-8 activation rows from memory and from cache, per"
                " library variant: GB/s, multiply-adds/s, memory ÷ cache",
    run=run,
))
