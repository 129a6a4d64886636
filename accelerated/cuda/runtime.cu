/* Devices, errors and buffers: thin, checked wrappers over the CUDA runtime (cudart is
 * linked statically, so the library loads where no toolkit is installed; without a driver
 * every call returns the runtime's cudaErrorInsufficientDriver / cudaErrorNoDevice). */
#include <stdio.h>
#include <string.h>

#include "ccu_internal.cuh"

static thread_local char last_message[512] = "ok";
static thread_local int last_cuda = 0;
/* The device ccu_init opened: the runtime's current device is per host thread, and the
 * engine may call from a thread other than the one that opened it. */
static int opened_device = -1;

int ccu_bind_thread(void) {
    if (opened_device < 0) return ccu_fail(CCU_EINVAL, "no device opened: call ccu_init first");
    CCU_TRY(cudaSetDevice(opened_device), "cudaSetDevice");
    return CCU_OK;
}

const char *ccu_version(void) { return "colibri-cuda 1"; }
int ccu_last_cuda_error(void) { return last_cuda; }
const char *ccu_last_error(void) { return last_message; }
const char *ccu_error_name(int code) { return cudaGetErrorName((cudaError_t)code); }

int ccu_fail_cuda(cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return CCU_OK;
    last_cuda = (int)rc;
    snprintf(last_message, sizeof last_message, "%s: %s (%s, code %d)", what,
             cudaGetErrorString(rc), cudaGetErrorName(rc), (int)rc);
    return CCU_ECUDA;
}

int ccu_fail(int code, const char *what) {
    snprintf(last_message, sizeof last_message, "%s", what);
    return code;
}

/* Runtime codes are returned as they are (the caller names the cause from them). */
static int runtime_code(cudaError_t rc, const char *what) {
    if (rc != cudaSuccess) ccu_fail_cuda(rc, what);
    return (int)rc;
}

int ccu_device_count(int *count) {
    if (count == NULL) return (int)cudaErrorInvalidValue;
    *count = 0;
    return runtime_code(cudaGetDeviceCount(count), "cudaGetDeviceCount");
}

int ccu_init(int device) {
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) return runtime_code(rc, "cudaGetDeviceCount");
    if (device < 0 || device >= count) return runtime_code(cudaErrorInvalidDevice, "ccu_init");
    rc = cudaSetDevice(device);
    if (rc == cudaSuccess) rc = cudaFree(0); /* creates the context now, not at first use */
    if (rc != cudaSuccess) return runtime_code(rc, "cudaSetDevice");
    if (ccu_products_init() != CCU_OK) return last_cuda;
    opened_device = device;
    return 0;
}

int ccu_device_info(int device, char *name, size_t name_len, uint64_t *total_bytes, int *major,
                    int *minor, int *multiprocessors) {
    cudaDeviceProp prop;
    cudaError_t rc = cudaGetDeviceProperties(&prop, device);
    if (rc != cudaSuccess) return runtime_code(rc, "cudaGetDeviceProperties");
    if (name != NULL && name_len > 0) {
        strncpy(name, prop.name, name_len - 1);
        name[name_len - 1] = '\0';
    }
    if (total_bytes) *total_bytes = (uint64_t)prop.totalGlobalMem;
    if (major) *major = prop.major;
    if (minor) *minor = prop.minor;
    if (multiprocessors) *multiprocessors = prop.multiProcessorCount;
    return 0;
}

int ccu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    cudaError_t rc = cudaMemGetInfo(&f, &t);
    if (rc != cudaSuccess) return runtime_code(rc, "cudaMemGetInfo");
    if (free_bytes) *free_bytes = (uint64_t)f;
    if (total_bytes) *total_bytes = (uint64_t)t;
    return 0;
}

int ccu_synchronize(void) {
    CCU_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return CCU_OK;
}

int ccu_alloc(size_t bytes, void **out_dev) {
    if (out_dev == NULL) return ccu_fail(CCU_EINVAL, "ccu_alloc: out is NULL");
    *out_dev = NULL;
    int bound = ccu_bind_thread();
    if (bound != CCU_OK) return bound;
    cudaError_t rc = cudaMalloc(out_dev, bytes ? bytes : 1);
    if (rc == cudaErrorMemoryAllocation) {
        ccu_fail_cuda(rc, "cudaMalloc");
        return CCU_ENOMEM;
    }
    CCU_TRY(rc, "cudaMalloc");
    return CCU_OK;
}

int ccu_free(void *dev) {
    if (dev) CCU_TRY(cudaFree(dev), "cudaFree");
    return CCU_OK;
}

int ccu_to_device(void *dst_dev, const void *src_host, size_t bytes) {
    if ((dst_dev == NULL || src_host == NULL) && bytes) return ccu_fail(CCU_EINVAL, "ccu_to_device: NULL");
    if (bytes) CCU_TRY(cudaMemcpy(dst_dev, src_host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return CCU_OK;
}

int ccu_to_host(void *dst_host, const void *src_dev, size_t bytes) {
    if ((dst_host == NULL || src_dev == NULL) && bytes) return ccu_fail(CCU_EINVAL, "ccu_to_host: NULL");
    if (bytes) CCU_TRY(cudaMemcpy(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return CCU_OK;
}
