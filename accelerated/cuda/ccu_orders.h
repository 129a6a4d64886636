/* Every summation order the CUDA kernels run, written once in the subset of C11 and CUDA C++
 * that nvcc and the host's cc both accept: the warp tree, a product's warp item, and the
 * per-item arithmetic of the attention and elementwise kernels. The .cu kernels only spread
 * these items over threads; tests/support/cuda_shim.c compiles this same header with cc and
 * runs it on the CPU -- the warp functions once per lane, through an emulated shuffle -- so
 * the host tests hold the device's own order, not a copy of it, against the CPU builds' bits
 * (tests/accelerated/test_cuda_orders.py, test_cuda_formats.py).
 *
 * The one device line the host build never sees, CCU_SHFL_DOWN's mapping to __shfl_down_sync,
 * test_cuda_ptx.py checks in what nvcc emitted. Two things only a GPU run checks
 * (tests/accelerated/test_cuda_gpu.py):
 *   - the exponential: ccu_expf is the device's float64 exp on the GPU, and the CPU build's
 *     expf on the host, so the host tests check the arithmetic around it, not it;
 *   - how a kernel spreads the items over threads, warps, shared memory and barriers (the
 *     launch shapes, attention.cu's mla_heads stages, __syncthreads). */
#ifndef CCU_ORDERS_H
#define CCU_ORDERS_H

#include "ccu_formats.h"

#ifdef __CUDACC__
#define CCU_WARP_FN static __device__ inline
#define CCU_SHFL_DOWN(v, delta) __shfl_down_sync(0xffffffffu, (v), (unsigned)(delta))
#define CCU_UNROLL _Pragma("unroll")
#else
/* The host program supplies the warp: lane `lane` of the emulated warp now running gets the
 * value lane + delta passed to its own call of the same rank, or v where that lane is past 31
 * (what __shfl_down_sync returns). */
#define CCU_WARP_FN static inline
float ccu_emulated_shfl_down(float v, int delta);
#define CCU_SHFL_DOWN(v, delta) ccu_emulated_shfl_down((v), (delta))
#define CCU_UNROLL
#endif

CCU_HD float ccu_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

CCU_HD double ccu_dadd(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

CCU_HD double ccu_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

/* On the device: float64 exp rounded once to float, which is the correctly rounded expf
 * except within ~2^-29 ulp of a rounding boundary; CUDA's own expf is up to 2 ulp off. glibc's
 * expf (the CPU build's) is not correctly rounded on about 1 input in 1600 (glibc 2.36,
 * measured over [-40, 0]), so the two differ there: SwiGLU and softmax are kind (b) between
 * CPU and GPU. On the host the CPU build's expf stands in, so a host test compares the
 * operations around the exponential bit for bit. */
CCU_HD float ccu_expf(float x) {
#ifdef __CUDA_ARCH__
    return (float)exp((double)x);
#else
    return expf(x);
#endif
}

/* --- the warp tree ----------------------------------------------------------------------
 * Step i adds lane l + offset(i) into lane l; lane 0 ends with the sum. The offsets are the
 * CPU builds' pairings:
 *   float products (quantized = 0): 16, 8, 4, 2, 1 -- lane j += lane j + 16, + 8, ...
 *     (csrc/dot.c's reduce32);
 *   quantized products (1): 8, 16, 4, 2, 1 -- u[l] = (t[l] + t[l+8]) + (t[l+16] + t[l+24]),
 *     then ((u0 + u4) + (u2 + u6)) + ((u1 + u5) + (u3 + u7)) (csrc/quant/coli_quant.h). */
#define CCU_TREE_STEPS 5

CCU_HD int ccu_tree_offset(int quantized, int step) {
    if (step < 2) return quantized ? (step == 0 ? 8 : 16) : (step == 0 ? 16 : 8);
    return 4 >> (step - 2);
}

/* Every lane of the warp calls it (the shuffles use the full mask). A lane whose partner is
 * past lane 31 adds its own value; no such sum reaches lane 0. */
CCU_WARP_FN float ccu_warp_tree(int quantized, float v) {
    CCU_UNROLL
    for (int step = 0; step < CCU_TREE_STEPS; step++)
        v = ccu_add(v, CCU_SHFL_DOWN(v, ccu_tree_offset(quantized, step)));
    return v;
}

/* A warp's dot of row `row` of a (dtype) with b[0:k] in the float products' lane order: on
 * lane 0, col_dot_f32's bits (csrc/dot.c; fused selects the avx2 or the generic build's). */
CCU_WARP_FN float ccu_warp_dot(const void *a, int dtype, int64_t row, const float *b,
                               int64_t k, int lane, int fused) {
    return ccu_warp_tree(0, ccu_f_lane(a, dtype, row, k, b, lane, fused));
}

/* --- a product's warp item: output o for the nr <= CCU_ROW_TILE rows x + r ldx ----------
 * Each row gets its own lanes and its own tree, so its bits do not depend on the rows that
 * share its tile; lane 0 writes y[r ldy + o]. nr is the same on every lane, so the shuffles
 * stay converged. */
CCU_WARP_FN void ccu_float_item(const void *w, int dtype, int64_t o, int64_t k, const float *x,
                                int64_t ldx, int nr, int lane, int fused, float *y,
                                int64_t ldy) {
    float p[CCU_ROW_TILE];
    ccu_f_lanes(w, dtype, o, k, x, ldx, nr, lane, fused, p);
    CCU_UNROLL
    for (int r = 0; r < CCU_ROW_TILE; r++) {
        if (r >= nr) break;
        float v = ccu_warp_tree(0, p[r]);
        if (lane == 0) y[r * ldy + o] = v;
    }
}

/* The same for quantized weights (x rotated already for e8; fmt is v->fmt). */
CCU_WARP_FN void ccu_quant_item(int fmt, const ccu_qview *v, int64_t o, const float *x,
                                int64_t ldx, int nr, int lane, int fused,
                                const uint8_t (*grid)[4], float *y, int64_t ldy) {
    float t[CCU_ROW_TILE];
    ccu_q_lanes(fmt, v, o, x, ldx, nr, lane, fused, grid, t);
    CCU_UNROLL
    for (int r = 0; r < CCU_ROW_TILE; r++) {
        if (r >= nr) break;
        float s = ccu_warp_tree(1, t[r]);
        if (lane == 0) y[r * ldy + o] = s;
    }
}

/* --- absorbed MLA attention (csrc/attention.c's operations, in its order) ---------------- */

/* qabs[j] = sum_i q_nope[i] kv_b[base + i, j], i ascending, each step rounded twice (the CPU
 * builds never contract this loop). */
CCU_HD float ccu_mla_qabs_at(const float *qn, int64_t nope, const void *kv_b, int dtype,
                             int64_t base, int64_t kvl, int64_t j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < nope; i++)
        acc = ccu_add(acc, ccu_mul(qn[i], ccu_w_at(kv_b, dtype, (base + i) * kvl + j)));
    return acc;
}

/* score = (qabs . latent[pos] + q_rope . rope_key[pos]) * scale, on lane 0. */
CCU_WARP_FN float ccu_mla_score(const float *latent, const float *rope_key, int64_t pos,
                                const float *qabs, int64_t kvl, const float *qr, int64_t rope,
                                float scale, int lane, int fused) {
    float a = ccu_warp_dot(latent, CCU_F32, pos, qabs, kvl, lane, fused);
    float b = ccu_warp_dot(rope_key, CCU_F32, pos, qr, rope, lane, fused);
    return ccu_mul(ccu_add(a, b), scale);
}

/* The first maximum in ascending order (NaN-free scores: any order gives the same value). */
CCU_HD float ccu_softmax_max(const float *scores, int64_t n) {
    float m = -INFINITY;
    for (int64_t s = 0; s < n; s++) m = scores[s] > m ? scores[s] : m;
    return m;
}

CCU_HD float ccu_softmax_exp(float score, float mx) { return ccu_expf(ccu_sub(score, mx)); }

/* The exponentials' sum, ascending. */
CCU_HD float ccu_softmax_sum(const float *e, int64_t n) {
    float acc = 0.0f;
    for (int64_t s = 0; s < n; s++) acc = ccu_add(acc, e[s]);
    return acc;
}

/* context[j] = sum_s (e[s] / sum) latent[pos_s, j], s ascending (pos_s = keep[s], or s). */
CCU_HD float ccu_mla_context_at(const float *e, float sum, const float *latent,
                                const int64_t *keep, int64_t n, int64_t kvl, int64_t j) {
    float acc = 0.0f;
    for (int64_t s = 0; s < n; s++) {
        int64_t pos = keep ? keep[s] : s;
        acc = ccu_add(acc, ccu_mul(ccu_div(e[s], sum), latent[pos * kvl + j]));
    }
    return acc;
}

/* The DSA indexer's score of key t: acc += w[h] relu(scale (q_h . key_t)), heads ascending.
 * Lane 0's result is the score (the other lanes add partial trees, and nothing reads them). */
CCU_WARP_FN float ccu_index_key(const float *q, const float *w, int64_t nh, int64_t hd,
                                const float *keys, int64_t t, float scale, int lane,
                                int fused) {
    float acc = 0.0f;
    for (int64_t h = 0; h < nh; h++) {
        float d = ccu_mul(ccu_warp_dot(keys, CCU_F32, t, q + h * hd, hd, lane, fused), scale);
        acc = ccu_add(acc, ccu_mul(w[h], d > 0.0f ? d : 0.0f));
    }
    return acc;
}

/* --- elementwise kernels (csrc/elementwise.c's and model.py's operations) ---------------- */

/* RMSNorm's multiplier: the float64 sum of squares on one thread, ascending, as the CPU
 * sums it (spec §3.1). */
CCU_HD float ccu_rms_scale(const float *xr, int64_t d, double eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < d; i++) sum = ccu_dadd(sum, ccu_dmul((double)xr[i], (double)xr[i]));
    return (float)(1.0 / sqrt(sum / (double)d + eps));
}

CCU_HD float ccu_rms_at(float x, float scale, float w) { return ccu_mul(ccu_mul(x, scale), w); }

/* Pair j of a head's d = 2 half values v (interleaved: v[2j], v[2j+1]; else v[j],
 * v[half + j]) rotated by (c[j], s[j]): the values that go to j and half + j (spec §4). */
CCU_HD void ccu_rope_pair(const float *v, const float *c, const float *s, int64_t half,
                          int64_t j, int interleaved, float *lo, float *hi) {
    float a = interleaved ? v[2 * j] : v[j];
    float b = interleaved ? v[2 * j + 1] : v[half + j];
    *lo = ccu_sub(ccu_mul(a, c[j]), ccu_mul(b, s[j]));
    *hi = ccu_add(ccu_mul(b, c[j]), ccu_mul(a, s[j]));
}

/* SwiGLU's gate: (g sigmoid(g)) u. */
CCU_HD float ccu_silu_mul_at(float g, float u) {
    float sig = ccu_div(1.0f, ccu_add(1.0f, ccu_expf(-g)));
    return ccu_mul(ccu_mul(g, sig), u);
}

/* Element c of row r of the weighted expert sum, model.py's order: acc = 0, then
 * acc + w_s y_s for the slots s ascending, then + the shared expert's row (spec §7.2). */
CCU_HD float ccu_expert_sum_at(const float *y, int64_t d, int64_t k, const float *w,
                               const int64_t *slot_row, const int64_t *extra_row, int64_t r,
                               int64_t c) {
    float acc = 0.0f;
    for (int64_t s = 0; s < k; s++)
        acc = ccu_add(acc, ccu_mul(w[r * k + s], y[slot_row[r * k + s] * d + c]));
    if (extra_row) acc = ccu_add(acc, y[extra_row[r] * d + c]);
    return acc;
}

#endif
