/* Absorbed MLA attention over one row's latent cache (spec §5) and the DSA indexer's scores
 * (spec §6), in csrc/attention.c's operations and order:
 *
 *   qabs_h    = kv_b_k_h^T q_nope_h                  (per column j, i ascending)
 *   score_t   = (qabs_h . latent_t + q_rope_h . rope_key_t) * scale   (warp dots)
 *   context_h = sum_t softmax(score)_t latent_t      (per column j, t ascending)
 *   out_h     = kv_b_v_h context_h                   (warp dots)
 *
 * One block per head. Every value is one ccu_orders.h item (ccu_mla_qabs_at, ccu_mla_score,
 * ccu_softmax_*, ccu_mla_context_at, ccu_warp_dot), which the host tests run against
 * csrc/attention.c bit for bit; this file only spreads the items over the block's threads and
 * warps, with a barrier between stages. The softmax's exponential is ccu_expf, which differs
 * from the CPU's expf on about 1 input in 1600 (ccu_orders.h), so attention agrees with the
 * CPU within kind (b). */
#include <math.h>

#include "ccu_internal.cuh"

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
    for (int64_t j = threadIdx.x; j < kvl; j += blockDim.x)
        qabs[j] = ccu_mla_qabs_at(qn, nope, kv_b, dtype, base, kvl, j);
    __syncthreads();
    for (int64_t s = warp; s < n; s += warps) {
        float sc = ccu_mla_score(latent, rope_key, keep ? keep[s] : s, qabs, kvl, qr, rope,
                                 scale, lane, fused);
        if (lane == 0) scores[s] = sc;
    }
    __syncthreads();
    if (threadIdx.x == 0) mx = ccu_softmax_max(scores, n);
    __syncthreads();
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x)
        scores[s] = ccu_softmax_exp(scores[s], mx);
    __syncthreads();
    if (threadIdx.x == 0) sum = ccu_softmax_sum(scores, n);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < kvl; j += blockDim.x)
        ctx[j] = ccu_mla_context_at(scores, sum, latent, keep, n, kvl, j);
    __syncthreads();
    for (int64_t v = warp; v < vdim; v += warps) {
        float o = ccu_warp_dot(kv_b, dtype, base + nope + v, ctx, kvl, lane, fused);
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

/* One warp per key (ccu_index_key). */
static __global__ void index_keys(const float *q, const float *w, int64_t nh, int64_t hd,
                                  const float *keys, int64_t s, float scale, float *out,
                                  int fused) {
    const int lane = (int)(threadIdx.x & 31);
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t t = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < s; t += warps) {
        float acc = ccu_index_key(q, w, nh, hd, keys, t, scale, lane, fused);
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
