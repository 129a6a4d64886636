/* Shared between the quantized-kernel sources: a validated view of one quantized matrix. */
#ifndef COLI_Q_INTERNAL_H
#define COLI_Q_INTERNAL_H

#include <stdint.h>

#include "quant/coli_quant.h"
#include "quant/q_sizes.h" /* the block constants and size rules */

/* Columns decoded onto the stack at a time (a chunk never crosses a scale group). */
#define COLI_Q_CHUNK 256
/* Batched path: activation rows per pass over the weights (more rows: another pass), and
 * output rows walked together so an activation chunk is reused from L1. */
#define COLI_Q_ROW_TILE 8
#define COLI_Q_OUT_BLOCK 8


typedef struct qlayout qlayout;

/* Decode columns [col, col + n) of one row (the row's packed bytes) to unscaled floats. */
typedef void (*q_decode_fn)(const uint8_t *row, int64_t col, int n, float *out);

/* Decode-and-accumulate columns [col, col + n) of one row into the 32 lane partials p with x
 * the activations of those columns, whole 8-column vectors only; returns how many columns it
 * did (the caller finishes a short tail through the decoder). Same operations as decoding
 * into a buffer and calling the lane dot: only the weights' trip through memory differs. */
typedef int (*q_fused_fn)(const uint8_t *row, int64_t col, int n, const float *x, float *p);

/* A whole output element for one activation row: the scaled group partials exactly as the
 * chunked path computes them, summed in registers as coli_qi_sum_lanes sums the 32 lanes (no
 * trip through memory: storing the lanes and summing them afterwards was 7 % of an int4
 * decode step). Only for layouts whose groups are multiples of 32 columns, and int2/int3/e8. */
typedef float (*q_fused_row_fn)(const qlayout *L, int64_t o, const float *x);

/* The same for two activation rows at once, decoding each weight block once; t0 and t1 are
 * each row's lanes (zeroed by the caller) and get exactly the one-row results. */
typedef void (*q_fused_row2_fn)(const qlayout *L, int64_t o, const float *x0, const float *x1,
                                float *t0, float *t1);

/* Four activation rows x, x + ldx, x + 2 ldx, x + 3 ldx against one weight row, each
 * 32-column block decoded once for the four: t[r * 32 + l] gets row r's lane l exactly as
 * the one-row path leaves it (every lane's multiply-adds in the same order). Only for rows
 * of whole groups of 32-column multiples. */
typedef void (*q_fused_row4_fn)(const qlayout *L, int64_t o, const float *x, int64_t ldx,
                                float *t);

/* q_fused_row4_fn's contract for three activation rows (t[r * 32 + l], r < 3). */
typedef q_fused_row4_fn q_fused_row3_fn;

/* Output rows o, o + 1, o + 2 for the first activation rows of x in whole blocks of the
 * build's register tile (4 rows, or 2 in the avx2 build for rows of several scale groups),
 * each element exactly the one-row path's, the three weight rows decoded once onto wd (3 x
 * in_features floats) for all of them; returns how many of the n_x rows it covered (the same
 * for every o of a layout). Only for rows of whole groups of 32-column multiples. */
typedef int64_t (*q_fused_tile_fn)(const qlayout *L, int64_t o, const float *x, int64_t ldx,
                                   int64_t n_x, float *y, int64_t ldy, float *wd);

/* The fused paths of a format in this build, or NULL (q_fused.c). */
q_fused_fn coli_qi_fused_for(int fmt);
q_fused_row_fn coli_qi_fused_row_for(int fmt, int64_t group);
q_fused_row2_fn coli_qi_fused_row2_for(int fmt, int64_t group);
q_fused_row3_fn coli_qi_fused_row3_for(int fmt, int64_t group, int64_t in_features);
q_fused_row4_fn coli_qi_fused_row4_for(int fmt, int64_t group, int64_t in_features);
q_fused_tile_fn coli_qi_fused_tile_for(int fmt, int64_t group, int64_t in_features);

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* The 32-lane sum coli_quant.h states, lanes t[0:8] .. t[24:32] in four registers:
 * ((a + b) + (c + d)) lane-wise = u, then ((u0 + u4) + (u2 + u6)) + ((u1 + u5) + (u3 + u7)):
 * the halves added give u[j] + u[j + 4], then (0 + 2) and (1 + 3), then those two. */
static inline float coli_qi_sum_lanes(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 u = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
#endif

/* The lane dot of the buffered path (q_matmul.c): p[(col + j) % 32] += w[j] * x[j]. */
void coli_qi_lanes_dot(const float *w, const float *x, int n, int64_t col, float *p);

struct qlayout {
    int fmt;
    int64_t out_features;
    int64_t in_features;
    int64_t row_bytes;      /* packed bytes of one output row */
    int64_t group;          /* columns per scale group */
    int64_t groups_per_row; /* scale groups along a row (fp8: 128-column blocks) */
    const uint8_t *packed;
    const float *scales;
    q_decode_fn decode;
    q_fused_fn fused;
    q_fused_row_fn fused_row;
    q_fused_row2_fn fused_row2;
    q_fused_row3_fn fused_row3;
    q_fused_row4_fn fused_row4;
    q_fused_tile_fn fused_tile;
};

/* Checks sizes and fills *L (q_layout.c). */
int coli_qi_layout_init(qlayout *L, int fmt, int group_size, const uint8_t *packed,
                  int64_t packed_len, const float *scales, int64_t n_scales,
                  int64_t out_features, int64_t in_features);

/* The multiplier of scale group g of output row o. */
float coli_qi_group_scale(const qlayout *L, int64_t o, int64_t g);

/* fmt6's fp16 super-scale as colibri decodes it (subnormals as 2^-14 (1 + m/1024)). */
float coli_qi_e8_half(uint16_t h);

#endif
