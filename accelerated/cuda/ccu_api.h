/* The C API of libcolibri_cuda.so (accelerated/cuda_native.py binds it; one prototype table).
 *
 * Every entry point returns a code and never aborts. Device-management calls (ccu_init,
 * ccu_device_count, ccu_device_info, ccu_mem_info) return the CUDA runtime's own code
 * (cudaSuccess = 0, cudaErrorInsufficientDriver = 35, cudaErrorNoDevice = 100, ...);
 * the others return a CCU_* code, CCU_ECUDA meaning a runtime call failed (its code in
 * ccu_last_cuda_error, its message in ccu_last_error). Pointers named *_dev are device memory
 * (ccu_alloc); *_host are host memory. Weights are validated on the host with the CPU
 * library's size and content rules (ccu_formats.h) before any byte is copied. */
#ifndef CCU_API_H
#define CCU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    CCU_OK = 0,
    CCU_EINVAL = 1, /* a size, pointer or flag argument is invalid */
    CCU_ENOMEM = 2, /* device or host memory could not be allocated */
    CCU_EDTYPE = 3, /* an unsupported float weight dtype */
    CCU_ECUDA = 4,  /* a CUDA runtime call failed: ccu_last_cuda_error / ccu_last_error */
    CCU_EQUANT_BASE = 100 /* + a COLI_Q_* code: the quantized weight was refused */
};

/* flags of the products */
#define CCU_X_ROTATED 1    /* e8: x is rotate(x) already */
#define CCU_TWO_ROUNDINGS 2 /* multiply and add rounded separately: the generic CPU build's
                             * bits; default is fused multiply-add, the avx2 build's bits */

typedef struct ccu_weight ccu_weight;

const char *ccu_version(void);
/* The CUDA runtime's code and message of the last failure on this thread. */
int ccu_last_cuda_error(void);
const char *ccu_last_error(void);
const char *ccu_error_name(int cuda_code);

/* cudaGetDeviceCount then cudaSetDevice(device) and a context: the runtime's code. */
int ccu_init(int device);
int ccu_device_count(int *count);
int ccu_device_info(int device, char *name, size_t name_len, uint64_t *total_bytes,
                    int *major, int *minor, int *multiprocessors);
int ccu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);
int ccu_synchronize(void);

/* Device buffers. */
int ccu_alloc(size_t bytes, void **out_dev);
int ccu_free(void *dev);
int ccu_to_device(void *dst_dev, const void *src_host, size_t bytes);
int ccu_to_host(void *dst_host, const void *src_dev, size_t bytes);

/* Weights: a float matrix [rows, cols] in dtype 0 f32, 1 bf16, 2 f16, or a quantized one
 * (format ordinal of csrc/quant/coli_quant.h, packed bytes, .qs scales). */
int ccu_upload_float(const void *w_host, int dtype, int64_t rows, int64_t cols,
                     ccu_weight **out);
int ccu_upload_quant(int fmt, int group_size, const uint8_t *packed_host, int64_t packed_len,
                     const float *scales_host, int64_t n_scales, int64_t out_features,
                     int64_t in_features, ccu_weight **out);
int ccu_weight_free(ccu_weight *w);
int64_t ccu_weight_bytes(const ccu_weight *w);
int ccu_weight_shape(const ccu_weight *w, int64_t *rows, int64_t *cols);

/* y[r, o] = w[o] . x[r] for r < m (device rows of ldx / ldy floats). */
int ccu_matmul(const ccu_weight *w, const float *x_dev, int64_t m, int64_t ldx, float *y_dev,
               int64_t ldy, int flags);
/* The same over host arrays (copied through a per-process device scratch; not thread-safe). */
int ccu_matmul_host(const ccu_weight *w, const float *x_host, int64_t m, float *y_host,
                    int flags);
/* ys_host[i] = x_host @ ws[i].T for n weights of one width (x copied to the device once). */
int ccu_matmul_many_host(int n, const ccu_weight *const *ws, const float *x_host, int64_t m,
                         float *const *ys_host, int flags);
/* fmt6's activation rotation of m rows of `cols`, in place. */
int ccu_rotate(float *x_dev, int64_t m, int64_t cols);

/* Elementwise (device arrays). */
int ccu_rms_norm(const float *x_dev, int64_t m, int64_t d, const float *w_dev, double eps,
                 float *out_dev);
int ccu_rope(float *x_dev, int64_t m, int64_t heads, int64_t row_stride, int64_t head_stride,
             int64_t d, const float *cos_dev, const float *sin_dev, int interleaved);
int ccu_silu_mul(const float *g_dev, const float *u_dev, int64_t n, float *out_dev);
/* out[r] = sum_s weights[r, s] * y[slot_row[r, s]] (slots ascending, from 0), + y[extra_row[r]]
 * when extra_row is given, then x[r] += out[r] when x is given. */
int ccu_expert_sum(const float *y_dev, int64_t m, int64_t d, int64_t k,
                   const float *weights_dev, const int64_t *slot_row_dev,
                   const int64_t *extra_row_dev, float *out_dev, float *x_dev);

/* A routed expert's SwiGLU over n device rows: out = down(silu(gate x) * up x). */
int ccu_expert_mlp(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                   const float *x_dev, int64_t n, float *out_dev, int flags);
/* The same over host rows. */
int ccu_expert_mlp_host(const ccu_weight *gate, const ccu_weight *up, const ccu_weight *down,
                        const float *x_host, int64_t n, float *out_host, int flags);

/* Absorbed MLA attention of one row (spec §5) over its latent cache: q [heads, nope + rope],
 * latent [seen, kvl], rope_key [seen, rope], keep (n_keep positions, or NULL: all), kv_b
 * [heads (nope + vdim), kvl] uploaded; out [heads, vdim]. All device memory. */
int ccu_mla_attention(const float *q_dev, int64_t heads, int64_t nope, int64_t rope,
                      int64_t vdim, int64_t kvl, const float *latent_dev,
                      const float *rope_key_dev, int64_t seen, const int64_t *keep_dev,
                      int64_t n_keep, const ccu_weight *kv_b, float scale, float *out_dev,
                      int flags);
/* DSA indexer scores (spec §6): out[t] = sum_h w[h] relu(scale q_h . key_t), t < s. */
int ccu_index_scores(const float *q_dev, const float *w_dev, int64_t nh, int64_t hd,
                     const float *keys_dev, int64_t s, float scale, float *out_dev, int flags);

#ifdef __cplusplus
}
#endif

#endif
