/* Host build of the CUDA kernels' device math (accelerated/cuda/ccu_formats.h, ccu_orders.h),
 * compiled by tests/support/cuda_shim.py with the system cc: each export runs, on the CPU, the
 * very functions a GPU warp or thread runs -- the warp functions once per lane through an
 * emulated __shfl_down_sync -- so the tests can hold them against the CPU library's kernels
 * bit for bit without nvcc or a GPU. */
#include <stdlib.h>

#include "ccu_orders.h"

/* --- the emulated warp ------------------------------------------------------------------
 * A warp function runs once per lane, lane 31 first and lane 0 last. Lane l's k-th shuffle
 * records its value and reads the value lane l + delta recorded at its own k-th shuffle:
 * that lane ran already (a shuffle-down only reads higher lanes), and a converged warp's
 * lanes meet their k-th shuffle together, so this is the value the hardware would hand over
 * at that step. A lane whose source is past lane 31 gets its own value, as on the device.
 * A read of a shuffle its source lane never made, or lanes that shuffle different numbers
 * of times, is a divergent warp (undefined with the full mask): the run reports it. One
 * warp at a time (the tests call the shim from one thread). */
#define LANES 32

static struct {
    int lane;               /* the lane now running */
    int64_t calls[LANES];   /* shuffles each lane has made */
    float *values;          /* [capacity][LANES]: lane l's value at its k-th shuffle */
    int64_t capacity;
    int failed;             /* divergence or no memory */
} warp;

float ccu_emulated_shfl_down(float v, int delta) {
    int64_t k = warp.calls[warp.lane]++;
    if (k >= warp.capacity) {
        int64_t grown = warp.capacity ? 2 * warp.capacity : 64;
        float *values = realloc(warp.values, (size_t)(grown * LANES) * sizeof(float));
        if (values == NULL) {
            warp.failed = 1;
            return NAN;
        }
        warp.values = values;
        warp.capacity = grown;
    }
    warp.values[k * LANES + warp.lane] = v;
    if ((unsigned)delta >= (unsigned)(LANES - warp.lane)) return v;
    int src = warp.lane + delta;
    if (warp.calls[src] <= k) {
        warp.failed = 1;
        return NAN;
    }
    return warp.values[k * LANES + src];
}

typedef float (*lane_fn)(const void *args, int lane);

/* Runs fn on every lane of one warp; *lane0 gets lane 0's result. 0, or -1 when the warp
 * diverged. */
static int warp_run(lane_fn fn, const void *args, float *lane0) {
    warp.failed = 0;
    for (int l = 0; l < LANES; l++) warp.calls[l] = 0;
    float r = 0.0f;
    for (int l = LANES - 1; l >= 0; l--) {
        warp.lane = l;
        r = fn(args, l);
    }
    for (int l = 1; l < LANES; l++)
        if (warp.calls[l] != warp.calls[0]) warp.failed = 1;
    if (lane0) *lane0 = r;
    return warp.failed ? -1 : 0;
}

typedef struct {
    const float *lanes;
    int quantized;
} tree_args;

static float tree_lane(const void *raw, int lane) {
    const tree_args *a = raw;
    return ccu_warp_tree(a->quantized, a->lanes[lane]);
}

/* out[i]: ccu_warp_tree over the 32 lane values lanes[32 i : 32 i + 32], as lane 0 gets it. */
int shim_warp_tree(const float *lanes, int64_t n, int quantized, float *out) {
    for (int64_t i = 0; i < n; i++) {
        tree_args a = {lanes + LANES * i, quantized};
        if (warp_run(tree_lane, &a, &out[i])) return -1;
    }
    return 0;
}

int shim_q_sizes(int fmt, int gs, int64_t O, int64_t I, int64_t *bytes, int64_t *scales) {
    return coli_q_size_rule(fmt, gs, O, I, bytes, scales);
}

int shim_q_check(int fmt, int gs, const uint8_t *packed, int64_t len, const float *scales,
                 int64_t n_scales, int64_t O, int64_t I) {
    ccu_qview v;
    int rc = ccu_qview_init(&v, fmt, gs, packed, len, scales, n_scales, O, I);
    return rc != COLI_Q_OK ? rc : ccu_q_check_content(&v, n_scales);
}

/* q[o, c] (unscaled) and scale[o, g] of every element and group. */
int shim_q_decode(int fmt, int gs, const uint8_t *packed, int64_t len, const float *scales,
                  int64_t n_scales, int64_t O, int64_t I, const uint8_t (*grid)[4], float *q,
                  float *s) {
    ccu_qview v;
    int rc = ccu_qview_init(&v, fmt, gs, packed, len, scales, n_scales, O, I);
    if (rc != COLI_Q_OK) return rc;
    for (int64_t o = 0; o < O; o++) {
        for (int64_t c = 0; c < I; c++) q[o * I + c] = ccu_q_at(fmt, packed + o * v.row_bytes, c, grid);
        for (int64_t g = 0; g < v.groups_per_row; g++) s[o * v.groups_per_row + g] = ccu_q_scale(fmt, &v, o, g);
    }
    return COLI_Q_OK;
}

typedef struct {
    int fmt;
    const ccu_qview *v;
    int64_t o, ldx, ldy;
    const float *x;
    int nr, fused;
    const uint8_t (*grid)[4];
    float *y;
} quant_args;

static float quant_lane(const void *raw, int lane) {
    const quant_args *a = raw;
    ccu_quant_item(a->fmt, a->v, a->o, a->x, a->ldx, a->nr, lane, a->fused, a->grid, a->y,
                   a->ldy);
    return 0.0f;
}

/* y[r, o] for r < m: the warp items of products.cu over tiles of `tile` rows
 * (1..CCU_ROW_TILE; x rotated already for e8). */
int shim_q_matmul(int fmt, int gs, const uint8_t *packed, int64_t len, const float *scales,
                  int64_t n_scales, int64_t O, int64_t I, const uint8_t (*grid)[4],
                  const float *x, int64_t m, float *y, int fused, int tile) {
    ccu_qview v;
    int rc = ccu_qview_init(&v, fmt, gs, packed, len, scales, n_scales, O, I);
    if (rc != COLI_Q_OK) return rc;
    for (int64_t r0 = 0; r0 < m; r0 += tile) {
        int nr = (int)(m - r0 < tile ? m - r0 : tile);
        for (int64_t o = 0; o < O; o++) {
            quant_args a = {fmt, &v, o, I, O, x + r0 * I, nr, fused, grid, y + r0 * O};
            if (warp_run(quant_lane, &a, NULL)) return -1;
        }
    }
    return COLI_Q_OK;
}

typedef struct {
    const void *w;
    int dtype, nr, fused;
    int64_t o, k;
    const float *x;
    float *y;
    int64_t ldy;
} float_args;

static float float_lane(const void *raw, int lane) {
    const float_args *a = raw;
    ccu_float_item(a->w, a->dtype, a->o, a->k, a->x, a->k, a->nr, lane, a->fused, a->y, a->ldy);
    return 0.0f;
}

int shim_f_matmul(const void *w, int dtype, int64_t rows, int64_t k, const float *x,
                  int64_t m, float *y, int fused, int tile) {
    for (int64_t r0 = 0; r0 < m; r0 += tile) {
        int nr = (int)(m - r0 < tile ? m - r0 : tile);
        for (int64_t o = 0; o < rows; o++) {
            float_args a = {w, dtype, nr, fused, o, k, x + r0 * k, y + r0 * rows, rows};
            if (warp_run(float_lane, &a, NULL)) return -1;
        }
    }
    return 0;
}

/* kind 0 bf16, 1 f16, 2 e8 half, 3 e4m3 */
void shim_convert(int kind, const uint32_t *in, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: out[i] = ccu_bf16_to_f32((uint16_t)in[i]); break;
        case 1: out[i] = ccu_f16_to_f32((uint16_t)in[i]); break;
        case 2: out[i] = ccu_e8_half((uint16_t)in[i]); break;
        default: out[i] = ccu_e4m3_to_f32((uint8_t)in[i]); break;
        }
    }
}

/* The rotation as the GPU runs it: per block the sign stream, then every span's butterflies
 * (independent pairs, in any order), then the 1/sqrt(n) multiply. */
void shim_rotate(float *a, int64_t m, int64_t cols) {
    for (int64_t r = 0; r < m; r++) {
        float *row = a + r * cols;
        for (int64_t off = 0; off < cols;) {
            int64_t n = ccu_rot_block(cols - off);
            float *b = row + off;
            uint64_t s = 417u + (uint64_t)n;
            for (int64_t i = 0; i < (n + 7) / 8; i++) {
                unsigned byte = ccu_rot_sign_byte(&s);
                for (int k = 0; k < 8 && 8 * i + k < n; k++)
                    if ((byte >> k) & 1) b[8 * i + k] = -b[8 * i + k];
            }
            for (int64_t span = 1; span < n; span *= 2)
                for (int64_t j = 0; j < n; j++)
                    if ((j / span) % 2 == 0) ccu_butterfly(b, j, span);
            float inv = 1.0f / sqrtf((float)n);
            for (int64_t j = 0; j < n; j++) b[j] = ccu_mul(b[j], inv);
            off += n;
        }
    }
}

/* --- attention.cu and elementwise.cu, item by item ---------------------------------------- */

typedef struct {
    const float *latent, *rope_key, *qabs, *qr;
    int64_t pos, kvl, rope;
    float scale;
    int fused;
} score_args;

static float score_lane(const void *raw, int lane) {
    const score_args *a = raw;
    return ccu_mla_score(a->latent, a->rope_key, a->pos, a->qabs, a->kvl, a->qr, a->rope,
                         a->scale, lane, a->fused);
}

typedef struct {
    const void *a;
    int dtype, fused;
    int64_t row, k;
    const float *b;
} dot_args;

static float dot_lane(const void *raw, int lane) {
    const dot_args *d = raw;
    return ccu_warp_dot(d->a, d->dtype, d->row, d->b, d->k, lane, d->fused);
}

/* One row's attention as mla_heads computes it, head after head, stage after stage (qabs,
 * scores, max, exponentials, sum, context, output). keep may be NULL. 0, or -1 for a
 * divergent warp or no memory. */
int shim_mla_attention(const float *q, int64_t heads, int64_t nope, int64_t rope,
                       int64_t vdim, int64_t kvl, const float *latent, const float *rope_key,
                       int64_t seen, const int64_t *keep, int64_t n_keep, const void *kv_b,
                       int dtype, float scale, float *out, int fused) {
    const int64_t n = keep ? n_keep : seen;
    float *qabs = malloc((size_t)kvl * sizeof(float));
    float *ctx = malloc((size_t)kvl * sizeof(float));
    float *scores = malloc((size_t)(n ? n : 1) * sizeof(float));
    int rc = qabs && ctx && scores ? 0 : -1;
    for (int64_t head = 0; rc == 0 && head < heads; head++) {
        const int64_t base = head * (nope + vdim);
        const float *qn = q + head * (nope + rope), *qr = qn + nope;
        for (int64_t j = 0; j < kvl; j++)
            qabs[j] = ccu_mla_qabs_at(qn, nope, kv_b, dtype, base, kvl, j);
        for (int64_t s = 0; rc == 0 && s < n; s++) {
            score_args a = {latent, rope_key, qabs, qr, keep ? keep[s] : s, kvl, rope, scale,
                            fused};
            rc = warp_run(score_lane, &a, &scores[s]);
        }
        if (rc) break;
        float mx = ccu_softmax_max(scores, n);
        for (int64_t s = 0; s < n; s++) scores[s] = ccu_softmax_exp(scores[s], mx);
        float sum = ccu_softmax_sum(scores, n);
        for (int64_t j = 0; j < kvl; j++)
            ctx[j] = ccu_mla_context_at(scores, sum, latent, keep, n, kvl, j);
        for (int64_t v = 0; rc == 0 && v < vdim; v++) {
            dot_args a = {kv_b, dtype, fused, base + nope + v, kvl, ctx};
            rc = warp_run(dot_lane, &a, &out[head * vdim + v]);
        }
    }
    free(qabs);
    free(ctx);
    free(scores);
    return rc;
}

typedef struct {
    const float *q, *w, *keys;
    int64_t nh, hd, t;
    float scale;
    int fused;
} index_args;

static float index_lane(const void *raw, int lane) {
    const index_args *a = raw;
    return ccu_index_key(a->q, a->w, a->nh, a->hd, a->keys, a->t, a->scale, lane, a->fused);
}

int shim_index_scores(const float *q, const float *w, int64_t nh, int64_t hd, const float *keys,
                      int64_t s, float scale, float *out, int fused) {
    for (int64_t t = 0; t < s; t++) {
        index_args a = {q, w, keys, nh, hd, t, scale, fused};
        if (warp_run(index_lane, &a, &out[t])) return -1;
    }
    return 0;
}

void shim_rms_norm(const float *x, int64_t m, int64_t d, const float *w, double eps, float *out) {
    for (int64_t r = 0; r < m; r++) {
        float scale = ccu_rms_scale(x + r * d, d, eps);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = ccu_rms_at(x[r * d + i], scale, w[i]);
    }
}

void shim_rope(float *x, int64_t m, int64_t heads, int64_t row_stride, int64_t head_stride,
               int64_t d, const float *cos, const float *sin, int interleaved) {
    float tmp[4096];
    int64_t half = d / 2;
    for (int64_t r = 0; r < m; r++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * row_stride + h * head_stride;
            for (int64_t j = 0; j < half; j++)
                ccu_rope_pair(v, cos + r * half, sin + r * half, half, j, interleaved, &tmp[j],
                              &tmp[half + j]);
            for (int64_t j = 0; j < d; j++) v[j] = tmp[j];
        }
}

void shim_silu_mul(const float *g, const float *u, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = ccu_silu_mul_at(g[i], u[i]);
}

void shim_expert_sum(const float *y, int64_t m, int64_t d, int64_t k, const float *w,
                     const int64_t *slot_row, const int64_t *extra_row, float *out, float *x) {
    for (int64_t i = 0; i < m * d; i++) {
        float acc = ccu_expert_sum_at(y, d, k, w, slot_row, extra_row, i / d, i % d);
        if (out) out[i] = acc;
        if (x) x[i] = ccu_add(x[i], acc);
    }
}
