/* RMSNorm (statistics in float64, spec §3.1), interleaved RoPE (§4), SwiGLU's gate and the
 * weighted expert sum (§7.2), with csrc/elementwise.c's and model.py's operations in their
 * order: each value is one ccu_orders.h item (ccu_rms_scale / ccu_rms_at, ccu_rope_pair,
 * ccu_silu_mul_at, ccu_expert_sum_at), which the host tests run against the CPU builds bit
 * for bit; this file only spreads the items over threads. The norm's float64 sum runs on one
 * thread per row, ascending, as the CPU sums it. silu's exponential is ccu_expf, which
 * differs from glibc's expf on about 1 input in 1600: agreement is kind (b). */
#include "ccu_internal.cuh"

static __global__ void rms_norm_rows(const float *x, int64_t d, const float *w, double eps,
                                     float *out) {
    __shared__ float scale;
    const float *xr = x + (int64_t)blockIdx.x * d;
    if (threadIdx.x == 0) scale = ccu_rms_scale(xr, d, eps);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        out[(int64_t)blockIdx.x * d + i] = ccu_rms_at(xr[i], scale, w[i]);
}

int ccu_rms_norm(const float *x_dev, int64_t m, int64_t d, const float *w_dev, double eps,
                 float *out_dev) {
    if (m < 0 || m > 65535 || d <= 0 || (m && (!x_dev || !w_dev || !out_dev)))
        return ccu_fail(CCU_EINVAL, "ccu_rms_norm: bad sizes or NULL");
    if (m == 0) return CCU_OK;
    rms_norm_rows<<<(unsigned)m, CCU_BLOCK>>>(x_dev, d, w_dev, eps, out_dev);
    CCU_LAUNCHED("rms_norm_rows");
    return CCU_OK;
}

/* One block per (row, head): the rotated values go through shared memory, since in the
 * interleaved layout a pair is read where other pairs are written. */
static __global__ void rope_heads(float *x, int64_t heads, int64_t row_stride,
                                  int64_t head_stride, int64_t d, const float *cos,
                                  const float *sin, int interleaved) {
    extern __shared__ float tmp[];
    int64_t r = blockIdx.x / heads, h = blockIdx.x % heads, half = d / 2;
    float *v = x + r * row_stride + h * head_stride;
    const float *c = cos + r * half, *s = sin + r * half;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x)
        ccu_rope_pair(v, c, s, half, j, interleaved, &tmp[j], &tmp[half + j]);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v[j] = tmp[j];
}

int ccu_rope(float *x_dev, int64_t m, int64_t heads, int64_t row_stride, int64_t head_stride,
             int64_t d, const float *cos_dev, const float *sin_dev, int interleaved) {
    if (m < 0 || heads <= 0 || d <= 0 || d % 2 || d > 4096 || m * heads > 65535 ||
        (m && (!x_dev || !cos_dev || !sin_dev)))
        return ccu_fail(CCU_EINVAL, "ccu_rope: bad sizes or NULL");
    if (m == 0) return CCU_OK;
    rope_heads<<<(unsigned)(m * heads), CCU_BLOCK, (size_t)d * sizeof(float)>>>(
        x_dev, heads, row_stride, head_stride, d, cos_dev, sin_dev, interleaved);
    CCU_LAUNCHED("rope_heads");
    return CCU_OK;
}

static __global__ void silu_mul_items(const float *g, const float *u, int64_t n, float *out) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = ccu_silu_mul_at(g[i], u[i]);
}

int ccu_silu_mul(const float *g_dev, const float *u_dev, int64_t n, float *out_dev) {
    if (n < 0 || (n && (!g_dev || !u_dev || !out_dev)))
        return ccu_fail(CCU_EINVAL, "ccu_silu_mul: bad size or NULL");
    if (n == 0) return CCU_OK;
    silu_mul_items<<<ccu_blocks(n, CCU_BLOCK), CCU_BLOCK>>>(g_dev, u_dev, n, out_dev);
    CCU_LAUNCHED("silu_mul_items");
    return CCU_OK;
}

/* out = the weighted sum (ccu_expert_sum_at), x = x + that sum. */
static __global__ void expert_sum_items(const float *y, int64_t m, int64_t d, int64_t k,
                                        const float *w, const int64_t *slot_row,
                                        const int64_t *extra_row, float *out, float *x) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m * d;
         i += (int64_t)gridDim.x * blockDim.x) {
        float acc = ccu_expert_sum_at(y, d, k, w, slot_row, extra_row, i / d, i % d);
        if (out) out[i] = acc;
        if (x) x[i] = ccu_add(x[i], acc);
    }
}

int ccu_expert_sum(const float *y_dev, int64_t m, int64_t d, int64_t k,
                   const float *weights_dev, const int64_t *slot_row_dev,
                   const int64_t *extra_row_dev, float *out_dev, float *x_dev) {
    if (m < 0 || d <= 0 || k < 0 || (m && !y_dev) || (k && (!weights_dev || !slot_row_dev)) ||
        (!out_dev && !x_dev))
        return ccu_fail(CCU_EINVAL, "ccu_expert_sum: bad sizes or NULL");
    if (m == 0) return CCU_OK;
    expert_sum_items<<<ccu_blocks(m * d, CCU_BLOCK), CCU_BLOCK>>>(
        y_dev, m, d, k, weights_dev, slot_row_dev, extra_row_dev, out_dev, x_dev);
    CCU_LAUNCHED("expert_sum_items");
    return CCU_OK;
}
