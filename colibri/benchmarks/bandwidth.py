"""The bandwidth probe: the ceilings that decode GB/s are divided by, measured on this machine.

A decode step streams its weights, so its speed is read against what memory can deliver:

* :func:`host_copy_bytes_per_s`: a numpy copy of 256 MiB (larger than any cache), best of 8,
  counted as bytes read plus bytes written per second: the roofline the CPU targets name;
* :func:`read_stream_bytes_per_s`: the accelerated kernels' own one-row float product over a
  256 MiB matrix (:func:`stream_weight`), weight bytes per second: what a one-row step's
  products alone reach here, which tells a host whose reads lag its copies from a slow step;
* :func:`device_copy`: a device-to-device copy through the CUDA driver API (cuMemcpyDtoD timed
  by CUDA events), best of 10, counted like the host copy so the GPU ratio compares like with
  like; it needs only the driver (no toolkit, torch or the project's CUDA kernels).

* :func:`storage_read_gb_s`: sequential ``O_DIRECT`` reads of model files in 8 MiB blocks
  (the page cache bypassed), one at a time or several in flight: the rate an out-of-core
  run's expert reads are held against is the disk's best, several in flight (one read at a
  time leaves a disk's queue partly idle; the disk tier keeps several in flight).

Each but the storage read takes well under a second, so a section can take one between
decode rounds and hold each round against the bandwidth the machine had then (a shared
host's moves by tens of percent from second to second). ``device_copy`` returns
``{"error": why}`` rather than raising, so it runs as a worker phase
(``workers.call("bandwidth:device_copy", ...)``).
"""

from __future__ import annotations

import ctypes
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colibri.benchmarks.stats import best_seconds

if TYPE_CHECKING:
    from colibri.engine.cuda_devices import Driver

MIB = 1 << 20
GIB = 1 << 30
#: The read stream's matrix: float32 rows of this many columns.
STREAM_COLS = 1024


def host_copy_bytes_per_s(mib: int = 256, repeats: int = 8) -> float:
    """Bytes read plus written per second by a numpy copy of ``mib`` MiB, best of ``repeats``."""
    import numpy as np

    src = np.ones(mib * MIB // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / best_seconds(lambda: np.copyto(dst, src), repeats)


def stream_weight(mib: int = 256) -> Any:
    """A ``Weight`` of ``mib`` MiB of float32 for :func:`read_stream_bytes_per_s`."""
    import numpy as np

    from colibri.accelerated.kernels import Weight

    return Weight(np.ones((mib * MIB // (4 * STREAM_COLS), STREAM_COLS), np.float32), 0)


def read_stream_bytes_per_s(kernels: Any, weights: Any, repeats: int = 4) -> float:
    """Weight bytes per second of ``kernels``' one-row float product over ``weights`` (from
    :func:`stream_weight`), on the kernels' threads, best of ``repeats``."""
    import numpy as np

    x = np.ones((1, weights.cols), np.float32)
    out = np.empty((1, weights.rows), np.float32)
    best = best_seconds(lambda: kernels.matmul(x, weights, out), repeats)
    return float(weights.rows * weights.cols * 4) / best


class CopyError(RuntimeError):
    """A driver call failed; the message names it and its CUresult."""


def _check(drv: Driver, name: str, *args: object) -> None:
    code = drv.call(name, *args)
    if code != 0:
        raise CopyError(f"{name} returned {code} ({drv.error_name(code)})")


def device_copy_with(drv: Driver, ordinal: int = 0, size: int = GIB,
                     repeats: int = 10) -> dict[str, Any]:
    """Best-of-``repeats`` device-to-device copy of ``size`` bytes on device ``ordinal`` (one
    warm-up copy first: it warms the allocation and the clocks)."""
    dev = ctypes.c_int(0)
    _check(drv, "cuDeviceGet", ctypes.byref(dev), ordinal)
    ctx = ctypes.c_void_p()
    _check(drv, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev.value)
    src, dst = ctypes.c_uint64(0), ctypes.c_uint64(0)
    start, stop = ctypes.c_void_p(), ctypes.c_void_p()
    try:
        _check(drv, "cuCtxPushCurrent_v2", ctx)
        try:
            _check(drv, "cuMemAlloc_v2", ctypes.byref(src), ctypes.c_size_t(size))
            _check(drv, "cuMemAlloc_v2", ctypes.byref(dst), ctypes.c_size_t(size))
            _check(drv, "cuMemsetD8_v2", src, ctypes.c_ubyte(1), ctypes.c_size_t(size))
            _check(drv, "cuEventCreate", ctypes.byref(start), 0)
            _check(drv, "cuEventCreate", ctypes.byref(stop), 0)
            times_ms: list[float] = []
            for i in range(repeats + 1):
                _check(drv, "cuEventRecord", start, None)
                _check(drv, "cuMemcpyDtoD_v2", dst, src, ctypes.c_size_t(size))
                _check(drv, "cuEventRecord", stop, None)
                _check(drv, "cuEventSynchronize", stop)
                elapsed = ctypes.c_float(0.0)
                _check(drv, "cuEventElapsedTime", ctypes.byref(elapsed), start, stop)
                if i > 0:
                    times_ms.append(float(elapsed.value))
        finally:
            for event in (start, stop):
                if event.value:
                    drv.call("cuEventDestroy_v2", event)
            for buf in (src, dst):
                if buf.value:
                    drv.call("cuMemFree_v2", buf)
            popped = ctypes.c_void_p()
            drv.call("cuCtxPopCurrent_v2", ctypes.byref(popped))
    finally:
        drv.call("cuDevicePrimaryCtxRelease_v2", dev.value)
    best = min(times_ms)
    if best <= 0:
        raise CopyError(f"the copy took {best} ms: the events did not time it")
    return {"device": ordinal, "bytes": size, "repeats": repeats, "best_ms": best,
            "times_ms": times_ms, "method": "cuMemcpyDtoD timed by CUDA events, best of N; "
            "bytes read + written per second",
            "copy_bandwidth_gb_per_s": 2 * size / (best / 1e3) / 1e9}


def device_copy(gib: float = 1.0, repeats: int = 10, device: int = 0) -> dict[str, Any]:
    """:func:`device_copy_with` through the system's driver, or ``{"error": why}`` (no driver,
    a failed call)."""
    from colibri.engine.cuda_devices import open_driver

    drv = open_driver()
    if isinstance(drv, str):
        return {"error": drv}
    try:
        return device_copy_with(drv, device, int(gib * GIB), repeats)
    except CopyError as exc:
        return {"error": str(exc)}


#: Block of the storage probe: large enough that the disk, not syscalls, limits.
STORAGE_BLOCK = 8 << 20


def _pread(fd: int, job: tuple[memoryview, int]) -> int:
    view, offset = job
    return os.preadv(fd, [view], offset)


def storage_read_gb_s(paths: list[Path], limit_bytes: int = 2 << 30,
                      in_flight: int = 1) -> float | None:
    """Sequential O_DIRECT read bandwidth over ``paths`` (GB/s, up to ``limit_bytes``), with
    ``in_flight`` consecutive blocks read at once (a disk's queue kept that full), or None
    where the file system refuses O_DIRECT."""
    import numpy as np

    blocks = []
    for _ in range(max(1, in_flight)):
        raw = np.empty(STORAGE_BLOCK + 4096, np.uint8)
        shift = -raw.ctypes.data % 4096
        blocks.append(raw[shift : shift + STORAGE_BLOCK].data.cast("B"))
    done = 0
    started = time.perf_counter()
    with ThreadPoolExecutor(len(blocks)) as pool:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            except OSError:
                return None
            try:
                offset, size = 0, os.fstat(fd).st_size
                while done < limit_bytes and offset < size:
                    wave = [(view, offset + i * STORAGE_BLOCK) for i, view in enumerate(blocks)]
                    try:
                        got = list(pool.map(_pread, [fd] * len(wave), wave))
                    except OSError:
                        return None
                    offset += len(blocks) * STORAGE_BLOCK
                    done += sum(got)
            finally:
                os.close(fd)
            if done >= limit_bytes:
                break
    seconds = time.perf_counter() - started
    return done / seconds / 1e9 if done else None
