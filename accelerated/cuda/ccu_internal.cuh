/* Shared by the .cu sources: the weight record, error reporting and launch shapes. Their
 * arithmetic and summation orders are ccu_formats.h's and ccu_orders.h's, which the host
 * tests compile too. */
#ifndef CCU_INTERNAL_CUH
#define CCU_INTERNAL_CUH

#include <cuda_runtime.h>

#include "ccu_api.h"
#include "ccu_orders.h"

struct ccu_weight {
    int quantized;
    int dtype;      /* float weights */
    int group_size; /* int4-grouped */
    int64_t rows, cols;
    void *data;      /* device */
    int64_t data_len; /* bytes */
    float *scales;   /* device, quantized only */
    int64_t n_scales;
    ccu_qview view; /* device addresses */
};

/* Records a failed runtime call for ccu_last_error; returns CCU_ECUDA (CCU_OK on success). */
int ccu_fail_cuda(cudaError_t rc, const char *what);
int ccu_fail(int code, const char *what);
/* Makes the opened device current on the calling thread (every allocation does). */
int ccu_bind_thread(void);
/* The host-array entry points share one device scratch: they hold this lock. */
int ccu_host_scratch(size_t bytes, void **out);
void ccu_host_lock(void);
void ccu_host_unlock(void);

#define CCU_TRY(call, what)                                                                \
    do {                                                                                    \
        cudaError_t ccu_rc_ = (call);                                                       \
        if (ccu_rc_ != cudaSuccess) return ccu_fail_cuda(ccu_rc_, what);                    \
    } while (0)

/* After a launch: a configuration error now, an execution error at the next sync. */
#define CCU_LAUNCHED(what) CCU_TRY(cudaGetLastError(), what)

/* Warps per block and blocks of a grid-stride launch: any values give the same results. */
#define CCU_BLOCK 256
static inline unsigned ccu_blocks(int64_t items, int64_t per_block) {
    int64_t b = (items + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

/* Products over device x / y (products.cu), used by moe.cu and attention.cu. */
int ccu_products_init(void);

#endif
