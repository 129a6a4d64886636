"""NVIDIA devices as the CUDA driver reports them, found without the CUDA toolkit.

``probe()`` talks to the driver API (``libcuda.so.1``, installed with the driver, never with
the toolkit) through ctypes: cuInit, the driver version, the device count and, per device, its
name, total memory, compute capability, multiprocessors, memory bus and clock, and the free
memory under the device's primary context (the context the CUDA runtime also uses, so probing
neither leaks a context nor fights the backend for one). It never raises: where there is no
usable device it says exactly why (the library is missing, cuInit failed with which code,
the driver sees no device, COLI_CUDA=0, COLI_GPUS names no device the driver sees).

colibri's environment decides which devices count: ``COLI_CUDA=0`` turns CUDA off,
``COLI_GPUS=0,1`` (or ``COLI_GPU=1``) keeps those ordinals. ``COLIBRI_LIBCUDA`` names another
driver library (tests load a fake one built from C; see spec/DEVIATIONS.md, "CUDA discovery").
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The driver's soname: what the driver package installs (the toolkit ships only a stub).
DRIVER_LIBRARY = "libcuda.so.1"
LIBRARY_ENV = "COLIBRI_LIBCUDA"

# CUdevice_attribute values (cuda.h; stable across driver versions).
_ATTR_CLOCK_RATE = 13
_ATTR_MULTIPROCESSOR_COUNT = 16
_ATTR_MEMORY_CLOCK_RATE = 36
_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76

#: CUresult names for the codes a probe meets, for drivers whose cuGetErrorName fails.
_ERROR_NAMES: dict[int, str] = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}


@dataclass(frozen=True)
class CudaDevice:
    #: The driver's ordinal (COLI_GPUS selects by it).
    index: int
    name: str
    total_bytes: int
    #: Free memory under the primary context; -1 where the driver would not say.
    free_bytes: int
    compute_capability: tuple[int, int]
    multiprocessors: int
    memory_bus_bits: int
    memory_clock_khz: int

    @property
    def peak_bandwidth_bytes_s(self) -> float:
        """The spec sheet's memory bandwidth (double data rate × bus width); 0 when unknown."""
        return 2.0 * self.memory_clock_khz * 1e3 * self.memory_bus_bits / 8


@dataclass(frozen=True)
class Probe:
    devices: tuple[CudaDevice, ...] = ()
    #: cuDriverGetVersion, e.g. 13000 for 13.0; None where the driver was not reached.
    driver_version: int | None = None
    #: The library that answered (or was looked for).
    library: str = DRIVER_LIBRARY
    #: Why there are no devices; "" when there are.
    reason: str = ""
    #: Ordinals COLI_GPUS/COLI_GPU asked for that the driver does not have.
    missing: tuple[int, ...] = field(default=())

    @property
    def usable(self) -> bool:
        return bool(self.devices)

    @property
    def driver_text(self) -> str:
        v = self.driver_version
        return "" if v is None else f"{v // 1000}.{v % 1000 // 10}"

    def to_json(self) -> dict[str, object]:
        return {
            "devices": [device_json(d) for d in self.devices],
            "driver_version": self.driver_version,
            "driver": self.driver_text,
            "library": self.library,
            "reason": self.reason,
            "missing": list(self.missing),
        }


def device_json(d: CudaDevice) -> dict[str, object]:
    # Written out, not dataclasses.asdict: this module is compiled by mypyc with the engine.
    return {"index": d.index, "name": d.name, "total_bytes": d.total_bytes,
            "free_bytes": d.free_bytes, "compute_capability": list(d.compute_capability),
            "multiprocessors": d.multiprocessors, "memory_bus_bits": d.memory_bus_bits,
            "memory_clock_khz": d.memory_clock_khz}


class Driver:
    """The driver library's entry points; ``call`` returns each CUresult, ``error_name`` names
    it (the probe here, the bench's copy-bandwidth measurement in colibri.benchmarks)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        fn = getattr(self.lib, "cuGetErrorName", None)
        if fn is not None and fn(code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode("ascii", "replace")
        return _ERROR_NAMES.get(code, "unknown CUresult")

    def call(self, name: str, *args: object) -> int:
        """The CUresult of one call (a missing symbol is CUDA_ERROR_NOT_SUPPORTED's 801)."""
        fn = getattr(self.lib, name, None)
        if fn is None:
            return 801
        fn.restype = ctypes.c_int
        return int(fn(*args))

    def attribute(self, attr: int, dev: int) -> int:
        value = ctypes.c_int(0)
        if self.call("cuDeviceGetAttribute", ctypes.byref(value), attr, dev) != 0:
            return 0
        return value.value

    def free_bytes(self, dev: int) -> int:
        ctx = ctypes.c_void_p()
        if self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev) != 0:
            return -1
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        try:
            if self.call("cuCtxPushCurrent_v2", ctx) != 0:
                return -1
            ok = self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) == 0
            popped = ctypes.c_void_p()
            self.call("cuCtxPopCurrent_v2", ctypes.byref(popped))
            return int(free.value) if ok else -1
        finally:
            self.call("cuDevicePrimaryCtxRelease_v2", dev)

    def device(self, ordinal: int, with_free: bool) -> CudaDevice | str:
        dev = ctypes.c_int(0)
        code = self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        if code != 0:
            return f"cuDeviceGet({ordinal}) returned {code} ({self.error_name(code)})"
        name = ctypes.create_string_buffer(256)
        if self.call("cuDeviceGetName", name, len(name), dev) != 0:
            name.value = b""
        total = ctypes.c_size_t(0)
        code = self.call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)
        if code != 0:
            return f"cuDeviceTotalMem({ordinal}) returned {code} ({self.error_name(code)})"
        d = dev.value
        return CudaDevice(
            index=ordinal,
            name=name.value.decode("utf-8", "replace").strip() or f"CUDA device {ordinal}",
            total_bytes=int(total.value),
            free_bytes=self.free_bytes(d) if with_free else -1,
            compute_capability=(self.attribute(_ATTR_CC_MAJOR, d),
                                self.attribute(_ATTR_CC_MINOR, d)),
            multiprocessors=self.attribute(_ATTR_MULTIPROCESSOR_COUNT, d),
            memory_bus_bits=self.attribute(_ATTR_GLOBAL_MEMORY_BUS_WIDTH, d),
            memory_clock_khz=self.attribute(_ATTR_MEMORY_CLOCK_RATE, d),
        )


def open_driver(env: Mapping[str, str] | None = None,
                library: str | None = None) -> Driver | str:
    """The initialised driver (cuInit done), or why not (the probe's reasons)."""
    env = os.environ if env is None else env
    lib_name = library or env.get(LIBRARY_ENV) or DRIVER_LIBRARY
    try:
        drv = Driver(ctypes.CDLL(lib_name))
    except OSError:
        return f"no NVIDIA driver: {lib_name} not found"
    code = drv.call("cuInit", 0)
    if code != 0:
        return f"cuInit returned {code} ({drv.error_name(code)})"
    return drv


def requested_ordinals(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """COLI_GPUS (a comma list) or COLI_GPU (one ordinal); None: every device. A value that is
    not a list of ordinals names none (an empty tuple), and the probe says which value."""
    raw = env.get("COLI_GPUS") or env.get("COLI_GPU")
    if raw is None or raw.strip() in ("", "auto"):
        return None
    try:
        return tuple(sorted({int(p, 10) for p in raw.split(",") if p.strip()}))
    except ValueError:
        return ()


def probe(env: Mapping[str, str] | None = None, *, library: str | None = None,
          with_free: bool = True) -> Probe:
    """The devices this process may use, or why there are none. Never raises."""
    env = os.environ if env is None else env
    lib_name = library or env.get(LIBRARY_ENV) or DRIVER_LIBRARY
    if env.get("COLI_CUDA", "").strip() == "0":
        return Probe(library=lib_name, reason="CUDA is off (COLI_CUDA=0)")
    try:
        lib = ctypes.CDLL(lib_name)
    except OSError as exc:
        detail = str(exc).split(":")[-1].strip()
        return Probe(library=lib_name,
                     reason=f"no NVIDIA driver: {lib_name} not found ({detail})")
    drv = Driver(lib)
    try:
        return _probe_driver(drv, lib_name, env, with_free)
    except (AttributeError, OSError, ValueError) as exc:  # a broken library, not a crash
        return Probe(library=lib_name, reason=f"the NVIDIA driver {lib_name} is unusable: {exc}")


def _probe_driver(drv: Driver, lib_name: str, env: Mapping[str, str],
                  with_free: bool) -> Probe:
    code = drv.call("cuInit", 0)
    version = ctypes.c_int(0)
    driver = version.value if drv.call("cuDriverGetVersion", ctypes.byref(version)) == 0 else None
    if code != 0:
        return Probe(driver_version=driver, library=lib_name,
                     reason=f"cuInit returned {code} ({drv.error_name(code)})")
    count = ctypes.c_int(0)
    code = drv.call("cuDeviceGetCount", ctypes.byref(count))
    if code != 0:
        return Probe(driver_version=driver, library=lib_name,
                     reason=f"cuDeviceGetCount returned {code} ({drv.error_name(code)})")
    if count.value <= 0:
        return Probe(driver_version=driver, library=lib_name,
                     reason="the NVIDIA driver sees no CUDA device")
    wanted = requested_ordinals(env)
    ordinals = list(range(count.value)) if wanted is None else [
        i for i in wanted if i < count.value]
    missing = () if wanted is None else tuple(i for i in wanted if i >= count.value)
    devices: list[CudaDevice] = []
    failures: list[str] = []
    for i in ordinals:
        found = drv.device(i, with_free)
        if isinstance(found, str):
            failures.append(found)
        else:
            devices.append(found)
    reason = ""
    if not devices:
        if failures:
            reason = "; ".join(failures)
        else:
            raw = env.get("COLI_GPUS") or env.get("COLI_GPU") or ""
            reason = (f"COLI_GPUS/COLI_GPU={raw!r} names no device the driver sees "
                      f"({count.value} device(s): ordinals 0..{count.value - 1})")
    return Probe(tuple(devices), driver, lib_name, reason, missing)


def probe_isolated(env: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> Probe:
    """``probe()`` in a child process with a deadline: a driver that hangs in cuInit (a wedged
    GPU) costs the caller ``timeout_s``, never a hang (doctor and the test suite use this)."""
    env = dict(os.environ if env is None else env)
    try:
        done = subprocess.run([sys.executable, "-m", "colibri.engine.cuda_devices"],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return Probe(reason=f"the CUDA driver did not answer within {timeout_s:g} s")
    except OSError as exc:
        return Probe(reason=f"could not run the CUDA probe: {exc}")
    try:
        return probe_from_json(json.loads(done.stdout))
    except (ValueError, KeyError, TypeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Probe(reason=f"the CUDA probe failed (exit {done.returncode}): {tail}")


def probe_from_json(data: dict[str, Any]) -> Probe:
    """The inverse of ``Probe.to_json`` (what ``probe_isolated`` reads back)."""
    devices = tuple(
        CudaDevice(int(d["index"]), str(d["name"]), int(d["total_bytes"]), int(d["free_bytes"]),
                   (int(d["compute_capability"][0]), int(d["compute_capability"][1])),
                   int(d["multiprocessors"]), int(d["memory_bus_bits"]),
                   int(d["memory_clock_khz"]))
        for d in data["devices"]
    )
    version = data["driver_version"]
    return Probe(devices, int(version) if version is not None else None, str(data["library"]),
                 str(data["reason"]), tuple(int(m) for m in data["missing"]))


if __name__ == "__main__":
    print(json.dumps(probe().to_json()))
