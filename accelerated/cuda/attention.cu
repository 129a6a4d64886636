/* Absorbed MLA attention over one row's latent cache (spec §5) and the DSA indexer's scores
 * (spec §6), in csrc/attention.c's operations and order:
 *
 *   qabs_h    = kv_b_k_h^T q_nope_h                  (per column j, i ascending)
 *   score_t   = (qabs_h . latent_t + q_rope_h . rope_key_t) * scale   (warp dots)
 *   context_h = sum_t softmax(score)_t latent_t      (per column j, t ascending)
 *   out_h     = kv_b_v_h context_h                   (warp dots)
 *
 * One block per head; the softmax's exponential is ccu_expf (not libm's expf, though equal
 * to it on all but rare inputs), so attention agrees with the CPU within kind (b). */
#include <math.h>

#include "ccu_internal.cuh"

/* A warp's dot of a[0:k] and b[0:k] in the float products' lane order. */
static __device__ inline float warp_dot(const void *a, int dtype, int64_t row, const float *b,
                                        int64_t k, int lane, int fused) {
    return ccu_warp_tree(0, ccu_f_lane(a, dtype, row, k, b, lane, fused));
}

static __global__ void mla_heads(const float *q, int64_t nope, int64_t rope, int64_t vdim,
                                 int64_t kvl, const float *latent, const float *rope_key,
                                 int64_t seen, const int64_t *keep, int64_t n_keep,
                                 const void *kv_b, int dtype, float scale, float *scores_all,
                                 float *out, int fused) {
    extern __shared__ float shared[]; /* qabs [kvl], ctx [kvl] */
    float *qabs = shared, *ctx = shared + kvl;
    __shared__ float mx, sum;
    const int64_t head = blockIdx.x, qk = nope + rope, base = head * (nope + vdim);
    const float *qn = q + head * qk, *qr = qn + nope;
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    const int warps = (int)(blockDim.x >> 5);
    const int64_t n = keep ? n_keep : seen;
    float *scores = scores_all + head * seen;
    for (int64_t j = threadIdx.x; j < kvl; j += blockDim.x) {
        float acc = 0.0f;
        for (int64_t i = 0; i < nope; i++)
            acc = __fadd_rn(acc, __fmul_rn(qn[i], ccu_w_at(kv_b, dtype, (base + i) * kvl + j)));
        qabs[j] = acc;
    }
    __syncthreads();
    for (int64_t s = warp; s < n; s += warps) {
        int64_t pos = keep ? keep[s] : s;
        float a = warp_dot(latent, CCU_F32, pos, qabs, kvl, lane, fused);
        float b = warp_dot(rope_key, CCU_F32, pos, qr, rope, lane, fused);
        if (lane == 0) scores[s] = __fmul_rn(__fadd_rn(a, b), scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int64_t s = 0; s < n; s++) m = scores[s] > m ? scores[s] : m;
        mx = m;
    }
    __syncthreads();
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) scores[s] = ccu_expf(__fsub_rn(scores[s], mx));
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int64_t s = 0; s < n; s++) acc = __fadd_rn(acc, scores[s]);
        sum = acc;
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < kvl; j += blockDim.x) {
        float acc = 0.0f;
        for (int64_t s = 0; s < n; s++) {
            int64_t pos = keep ? keep[s] : s;
            acc = __fadd_rn(acc, __fmul_rn(__fdiv_rn(scores[s], sum), latent[pos * kvl + j]));
        }
        ctx[j] = acc;
    }
    __syncthreads();
    for (int64_t v = warp; v < vdim; v += warps) {
        float o = warp_dot(kv_b, dtype, base + nope + v, ctx, kvl, lane, fused);
        if (lane == 0) out[head * vdim + v] = o;
    }
}

int ccu_mla_attention(const float *q_dev, int64_t heads, int64_t nope, int64_t rope,
                      int64_t vdim, int64_t kvl, const float *latent_dev,
                      const float *rope_key_dev, int64_t seen, const int64_t *keep_dev,
                      int64_t n_keep, const ccu_weight *kv_b, float scale, float *out_dev,
                      int flags) {
    if (!q_dev || !latent_dev || !rope_key_dev || !out_dev || !kv_b || kv_b->quantized ||
        heads <= 0 || heads > 65535 || kvl <= 0 || seen <= 0 || nope < 0 || rope < 0 ||
        vdim <= 0 || (keep_dev && (n_keep <= 0 || n_keep > seen)) ||
        kv_b->rows != heads * (nope + vdim) || kv_b->cols != kvl ||
        (size_t)(2 * kvl) * sizeof(float) > 40 * 1024 || (flags & ~CCU_TWO_ROUNDINGS))
        return ccu_fail(CCU_EINVAL, "ccu_mla_attention: bad sizes, weight or NULL");
    float *scores = NULL;
    int rc = ccu_alloc((size_t)(heads * seen) * sizeof(float), (void **)&scores);
    if (rc != CCU_OK) return rc;
    mla_heads<<<(unsigned)heads, CCU_BLOCK, (size_t)(2 * kvl) * sizeof(float)>>>(
        q_dev, nope, rope, vdim, kvl, latent_dev, rope_key_dev, seen, keep_dev, n_keep,
        kv_b->data, kv_b->dtype, scale, scores, out_dev, !(flags & CCU_TWO_ROUNDINGS));
    cudaError_t launched = cudaGetLastError();
    cudaFree(scores);
    CCU_TRY(launched, "mla_heads");
    return CCU_OK;
}

/* One warp per key: acc += w[h] * relu(scale * q_h . key_t), heads ascending. */
static __global__ void index_keys(const float *q, const float *w, int64_t nh, int64_t hd,
                                  const float *keys, int64_t s, float scale, float *out,
                                  int fused) {
    const int lane = (int)(threadIdx.x & 31);
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < s; t += warps) {
        float acc = 0.0f;
        for (int64_t h = 0; h < nh; h++) {
            float d = __fmul_rn(ccu_warp_tree(0, ccu_f_lane(keys, CCU_F32, t, hd, q + h * hd,
                                                           lane, fused)), scale);
            d = __shfl_sync(CCU_FULL_MASK, d, 0);
            acc = __fadd_rn(acc, __fmul_rn(w[h], d > 0.0f ? d : 0.0f));
        }
        if (lane == 0) out[t] = acc;
    }
}

int ccu_index_scores(const float *q_dev, const float *w_dev, int64_t nh, int64_t hd,
                     const float *keys_dev, int64_t s, float scale, float *out_dev, int flags) {
    if (!q_dev || !w_dev || !keys_dev || !out_dev || nh <= 0 || hd <= 0 || s < 0 ||
        (flags & ~CCU_TWO_ROUNDINGS))
        return ccu_fail(CCU_EINVAL, "ccu_index_scores: bad sizes or NULL");
    if (s == 0) return CCU_OK;
    index_keys<<<ccu_blocks(s, CCU_BLOCK / 32), CCU_BLOCK>>>(
        q_dev, w_dev, nh, hd, keys_dev, s, scale, out_dev, !(flags & CCU_TWO_ROUNDINGS));
    CCU_LAUNCHED("index_keys");
    return CCU_OK;
}
