"""The device's measured copy bandwidth: a device-to-device copy of ``size`` bytes through
the CUDA driver API (cuMemcpyDtoD, timed with CUDA events), best of ``repeats``.

It is the ceiling the GPU bench divides achieved GB/s by (the target: >= 0.5 at batch 1).
Counted as the CPU bench counts its numpy copy: bytes read plus bytes written per second, so the
ratio compares like with like. No toolkit, torch or the project's CUDA kernels are
needed, only the driver. Run as ``python -m colibri.benchmarks.cuda_copy [--gib N]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from typing import Any

from colibri.engine.cuda_devices import Driver, open_driver

GIB = 1 << 30


class CopyError(RuntimeError):
    """A driver call failed; the message names it and its CUresult."""


def _check(drv: Driver, name: str, *args: object) -> None:
    code = drv.call(name, *args)
    if code != 0:
        raise CopyError(f"{name} returned {code} ({drv.error_name(code)})")


def copy_bandwidth(drv: Driver, ordinal: int = 0, size: int = GIB,
                   repeats: int = 10) -> dict[str, Any]:
    """Best-of-``repeats`` device-to-device copy on device ``ordinal`` (one warm-up copy first)."""
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
                if i > 0:  # the first copy warms the allocation and clocks
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


def measure(ordinal: int = 0, size: int = GIB, repeats: int = 10) -> dict[str, Any]:
    """The measurement, or ``{"error": why}`` (no driver, a failed call)."""
    drv = open_driver()
    if isinstance(drv, str):
        return {"error": drv}
    try:
        return copy_bandwidth(drv, ordinal, size, repeats)
    except CopyError as exc:
        return {"error": str(exc)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="bytes copied, GiB (1)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    result = measure(args.device, int(args.gib * GIB), args.repeats)
    print(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
