"""A fake CUDA driver: a shared library built here with ``cc`` that exports the driver-API
symbols ``colibri.engine.cuda_devices`` calls, with canned answers.

It is a test double of the *driver*, so the probe's real ctypes code (argument passing, the
size_t and string out-parameters, error paths) runs against a real ``dlopen``ed library. Its
answers come from the environment at call time, so one build serves every case:

    FAKE_CU_INIT=<code>      cuInit's CUresult (default 0)
    FAKE_CU_COUNT=<n>        devices (default 2)
    FAKE_CU_MEMINFO=<code>   cuMemGetInfo_v2's CUresult (default 0)
    FAKE_CU_HANG=1           cuInit never returns (a wedged GPU)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

GIB = 1 << 30
#: What the fake reports per device (ordinal i adds i GiB of total and i·1 GiB of use).
NAME = "Fake H200"
TOTAL = 141 * GIB
FREE = 139 * GIB
CC = (9, 0)
SMS = 132
BUS_BITS = 6144
MEM_CLOCK_KHZ = 2619000
DRIVER_VERSION = 13000

SOURCE = r"""
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <unistd.h>
#include <time.h>

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return (v && *v) ? atoi(v) : fallback;
}
static int current = -1;

int cuGetErrorName(int code, const char **out) {
    switch (code) {
    case 0: *out = "CUDA_SUCCESS"; return 0;
    case 100: *out = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 999: *out = "CUDA_ERROR_UNKNOWN"; return 0;
    default: return 1; /* CUDA_ERROR_INVALID_VALUE: the caller falls back to its table */
    }
}
int cuInit(unsigned flags) {
    (void)flags;
    while (env_int("FAKE_CU_HANG", 0)) sleep(1); /* a wedged GPU */
    return env_int("FAKE_CU_INIT", 0);
}
int cuDriverGetVersion(int *v) { *v = DRIVER_VERSION; return 0; }
int cuDeviceGetCount(int *n) { *n = env_int("FAKE_CU_COUNT", 2); return 0; }
int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= env_int("FAKE_CU_COUNT", 2)) return 101;
    *dev = ordinal; return 0;
}
int cuDeviceGetName(char *name, int len, int dev) {
    if (len < 32) return 1;
    strcpy(name, NAME); name[strlen(NAME)] = '0' + dev; name[strlen(NAME) + 1] = 0;
    return 0;
}
int cuDeviceTotalMem_v2(size_t *bytes, int dev) {
    *bytes = (size_t)TOTAL + (size_t)dev * GIB;
    return 0;
}
int cuDeviceGetAttribute(int *value, int attr, int dev) {
    (void)dev;
    switch (attr) {
    case 16: *value = SMS; return 0;
    case 36: *value = MEM_CLOCK_KHZ; return 0;
    case 37: *value = BUS_BITS; return 0;
    case 75: *value = CC_MAJOR; return 0;
    case 76: *value = CC_MINOR; return 0;
    default: return 1;
    }
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)(size_t)(dev + 1); return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
int cuCtxPushCurrent_v2(void *ctx) { current = (int)(size_t)ctx - 1; return 0; }
int cuCtxPopCurrent_v2(void **ctx) { *ctx = (void *)(size_t)(current + 1); current = -1; return 0; }
/* Device memory is host memory, events are CLOCK_MONOTONIC stamps: enough for the bench's
   copy-bandwidth code to run its real ctypes path (allocation, memset, copy, timing). */
int cuMemAlloc_v2(unsigned long long *ptr, size_t bytes) {
    if (current < 0) return 201;
    void *p = malloc(bytes);
    if (!p) return 2;
    *ptr = (unsigned long long)(size_t)p;
    return 0;
}
int cuMemFree_v2(unsigned long long ptr) { free((void *)(size_t)ptr); return 0; }
int cuMemsetD8_v2(unsigned long long ptr, unsigned char v, size_t n) {
    memset((void *)(size_t)ptr, v, n); return 0;
}
int cuMemcpyDtoD_v2(unsigned long long dst, unsigned long long src, size_t n) {
    memcpy((void *)(size_t)dst, (const void *)(size_t)src, n); return 0;
}
int cuEventCreate(double **ev, unsigned flags) {
    (void)flags; *ev = calloc(1, sizeof(double)); return *ev ? 0 : 2;
}
int cuEventRecord(double *ev, void *stream) {
    struct timespec t; (void)stream;
    clock_gettime(CLOCK_MONOTONIC, &t);
    *ev = t.tv_sec * 1e3 + t.tv_nsec / 1e6;
    return 0;
}
int cuEventSynchronize(double *ev) { (void)ev; return 0; }
int cuEventElapsedTime(float *ms, double *a, double *b) { *ms = (float)(*b - *a); return 0; }
int cuEventDestroy_v2(double *ev) { free(ev); return 0; }
int cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    int code = env_int("FAKE_CU_MEMINFO", 0);
    if (code) return code;
    if (current < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT: the probe must push one */
    *free_b = (size_t)FREE - (size_t)current * GIB;
    *total_b = (size_t)TOTAL + (size_t)current * GIB;
    return 0;
}
"""


def build_fake_libcuda(directory: Path) -> Path:
    """Compile the fake driver into ``directory``; skip the test where there is no cc."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the fake CUDA driver")
    src = directory / "fake_cuda.c"
    src.write_text(SOURCE)
    out = directory / "libcuda.so.1"
    defines = {
        "NAME": f'"{NAME}"', "TOTAL": f"{TOTAL}ULL", "FREE": f"{FREE}ULL", "GIB": f"{GIB}ULL",
        "SMS": str(SMS), "BUS_BITS": str(BUS_BITS), "MEM_CLOCK_KHZ": str(MEM_CLOCK_KHZ),
        "CC_MAJOR": str(CC[0]), "CC_MINOR": str(CC[1]), "DRIVER_VERSION": str(DRIVER_VERSION),
    }
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    subprocess.run([cc, "-shared", "-fPIC", "-O0", *flags, "-o", str(out), str(src)],
                   check=True, capture_output=True)
    return out
