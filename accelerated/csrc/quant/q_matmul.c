/* The fused driver: decode a chunk of a weight row onto the stack, dot it with every row of
 * the batch. The summation order is the one coli_quant.h states; nothing here depends on how
 * many rows the batch has or which output range a call covers. */
#include <stdlib.h>
#include <string.h>

#include "quant/q_internal.h"

#define LANES 32

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* p[(col + j) % 32] += w[j] * x[j] for j < n, one FMA per lane; `col % 32` is a multiple of 8
 * (chunks start on 8-column boundaries), so vector v of the chunk feeds lanes 8v'..8v'+7 with
 * v' = (col / 8 + v) % 4. Four independent accumulators keep the FMA pipes busy. */
static void lanes_dot(const float *w, const float *x, int n, int64_t col, float *p) {
    int v = (int)((col / 8) & 3);
    int j = 0;
    for (; v != 0 && j + 8 <= n; j += 8, v = (v + 1) & 3)
        _mm256_storeu_ps(p + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(w + j),
                                                     _mm256_loadu_ps(x + j),
                                                     _mm256_loadu_ps(p + 8 * v)));
    if (v == 0 && j + 32 <= n) {
        __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + 8);
        __m256 a2 = _mm256_loadu_ps(p + 16), a3 = _mm256_loadu_ps(p + 24);
        for (; j + 32 <= n; j += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 8), _mm256_loadu_ps(x + j + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 16), _mm256_loadu_ps(x + j + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 24), _mm256_loadu_ps(x + j + 24), a3);
        }
        _mm256_storeu_ps(p, a0);
        _mm256_storeu_ps(p + 8, a1);
        _mm256_storeu_ps(p + 16, a2);
        _mm256_storeu_ps(p + 24, a3);
    }
    for (; j + 8 <= n; j += 8, v = (v + 1) & 3)
        _mm256_storeu_ps(p + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(w + j),
                                                     _mm256_loadu_ps(x + j),
                                                     _mm256_loadu_ps(p + 8 * v)));
    if (j < n) {
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane);
        _mm256_storeu_ps(p + 8 * v, _mm256_fmadd_ps(_mm256_maskload_ps(w + j, mask),
                                                     _mm256_maskload_ps(x + j, mask),
                                                     _mm256_loadu_ps(p + 8 * v)));
    }
}

/* t[l] += s * p[l]; p[l] = 0 */
static void lanes_scale(float s, float *p, float *t) {
    __m256 sv = _mm256_set1_ps(s);
    for (int k = 0; k < LANES; k += 8) {
        _mm256_storeu_ps(t + k, _mm256_fmadd_ps(sv, _mm256_loadu_ps(p + k),
                                                _mm256_loadu_ps(t + k)));
        _mm256_storeu_ps(p + k, _mm256_setzero_ps());
    }
}
#else
/* The same lanes and order as the avx2 version, two roundings per step. */
static void lane_step(const float *w, const float *x, float *q) {
    for (int l = 0; l < 8; l++) q[l] += w[l] * x[l];
}

static void lanes_dot(const float *w, const float *x, int n, int64_t col, float *p) {
    int v = (int)((col / 8) & 3);
    int j = 0;
    for (; v != 0 && j + 8 <= n; j += 8, v = (v + 1) & 3) lane_step(w + j, x + j, p + 8 * v);
    if (v == 0 && j + 32 <= n) {
        float a[LANES];
        memcpy(a, p, sizeof a);
        for (; j + 32 <= n; j += 32)
            for (int l = 0; l < LANES; l++) a[l] += w[j + l] * x[j + l];
        memcpy(p, a, sizeof a);
    }
    for (; j + 8 <= n; j += 8, v = (v + 1) & 3) lane_step(w + j, x + j, p + 8 * v);
    for (int l = 0; j + l < n; l++) p[8 * v + l] += w[j + l] * x[j + l];
}

static void lanes_scale(float s, float *p, float *t) {
    for (int l = 0; l < LANES; l++) {
        t[l] += s * p[l];
        p[l] = 0.0f;
    }
}
#endif

/* For q_fused.c's row tails (a wrapper: the global symbol could be interposed, the static
 * one is inlined here). */
void coli_qi_lanes_dot(const float *w, const float *x, int n, int64_t col, float *p) {
    lanes_dot(w, x, n, col, p);
}

/* ((t[0:8] + t[8:16]) + (t[16:24] + t[24:32])) lane-wise, then the 8-lane tree. */
static float lanes_sum(const float *t) {
#if defined(__AVX2__) && defined(__FMA__)
    /* The same adds in registers; float addition commutes bit for bit, so the scalar tree's
     * result. */
    return coli_qi_sum_lanes(_mm256_loadu_ps(t), _mm256_loadu_ps(t + 8),
                             _mm256_loadu_ps(t + 16), _mm256_loadu_ps(t + 24));
#else
    float u[8];
    for (int l = 0; l < 8; l++) u[l] = (t[l] + t[8 + l]) + (t[16 + l] + t[24 + l]);
    return ((u[0] + u[4]) + (u[2] + u[6])) + ((u[1] + u[5]) + (u[3] + u[7]));
#endif
}

/* Without a whole-row path (int4-grouped 16/48), batches up to this many rows still decode in
 * registers chunk by chunk; larger ones share one decoded chunk through the stack buffer. */
#define FUSED_MAX_ROWS 4

/* How far ahead of the weight row being computed one- and two-row products prefetch. */
#define ROW_PREFETCH_BYTES 4096

/* Register-resident decoding, one output row at a time: rows in fours through the four-row
 * path where the build has one, an odd three through the three-row path, then pairs through
 * the two-row path (each weight block decoded once per four, three or two rows), an odd last
 * row alone. With one or two activation rows, each weight
 * row first asks for the row ROW_PREFETCH_BYTES on, all of its lines: the hardware prefetcher
 * alone left the int8 kernel at about two thirds of a float stream's rate from memory
 * (2-core EPYC Zen 3, avx2, one thread, rows of 1024 from memory: int8 1.16-1.30x the GB/s at
 * 1-2 rows, int4-grouped-64 0.95-1.02x; the int4g64 + int8 container's one-row decode step
 * 1.07-1.09x in three runs of 40 pairs, two rows 1.06x). Wider batches decode longer per byte
 * and gained nothing from it. */
static void run_rows(const qlayout *L, const float *x, int64_t n_rows, int64_t x_stride,
                     float *y, int64_t y_stride, int64_t o0, int64_t o1) {
    float t[COLI_Q_ROW_TILE][LANES];
    int64_t ahead = n_rows <= 2 ? (ROW_PREFETCH_BYTES + L->row_bytes - 1) / L->row_bytes : 0;
    for (int64_t o = o0; o < o1; o++) {
        if (ahead > 0 && o + ahead < o1) {
            const uint8_t *next = L->packed + (o + ahead) * L->row_bytes;
            for (int64_t b = 0; b < L->row_bytes; b += 64) __builtin_prefetch(next + b, 0, 3);
        }
        for (int64_t r0 = 0; r0 < n_rows; r0 += COLI_Q_ROW_TILE) {
            int nr = (int)(n_rows - r0 < COLI_Q_ROW_TILE ? n_rows - r0 : COLI_Q_ROW_TILE);
            const float *xr = x + r0 * x_stride;
            int r = 0;
            if (L->fused_row4 != NULL) /* quads of rows first: each writes its four rows' lanes */
                for (; r + 4 <= nr; r += 4) L->fused_row4(L, o, xr + r * x_stride, x_stride, t[r]);
            if (L->fused_row3 != NULL && nr - r >= 3 && (nr - r) % 2 == 1) { /* an odd three */
                L->fused_row3(L, o, xr + r * x_stride, x_stride, t[r]);
                r += 3;
            }
            if (L->fused_row2 != NULL && nr - r >= 2) {
                int end = r + (nr - r) / 2 * 2;
                memset(t[r], 0, (size_t)(end - r) * sizeof t[0]); /* row2 accumulates into t */
                for (; r < end; r += 2)
                    L->fused_row2(L, o, xr + r * x_stride, xr + (r + 1) * x_stride, t[r],
                                  t[r + 1]);
            }
            for (int q = 0; q < r; q++) y[(r0 + q) * y_stride + o] = lanes_sum(t[q]);
            for (; r < nr; r++) y[(r0 + r) * y_stride + o] = L->fused_row(L, o, xr + r * x_stride);
        }
    }
}

/* Small batches of a format with only the chunk-level register path. */
static void run_small(const qlayout *L, const float *x, int64_t n_rows, int64_t x_stride,
                      float *y, int64_t y_stride, int64_t o0, int64_t o1) {
    const int64_t I = L->in_features;
    const int64_t G = L->group;
    float buf[COLI_Q_CHUNK];
    float p[FUSED_MAX_ROWS][LANES];
    float t[FUSED_MAX_ROWS][LANES];
    int nr = (int)n_rows;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = L->packed + o * L->row_bytes;
        memset(t, 0, sizeof t);
        memset(p, 0, sizeof p);
        int64_t g = 0, group_end = G < I ? G : I, col = 0;
        while (col < I) {
            int64_t n = group_end - col;
            if (n > COLI_Q_CHUNK) n = COLI_Q_CHUNK;
            for (int r = 0; r < nr; r++) {
                const float *xc = x + r * x_stride + col;
                int done = L->fused(row, col, (int)n, xc, p[r]);
                if (done < n) {
                    L->decode(row, col + done, (int)n - done, buf);
                    lanes_dot(buf, xc + done, (int)n - done, col + done, p[r]);
                }
            }
            col += n;
            if (col == group_end) {
                float s = coli_qi_group_scale(L, o, g);
                for (int r = 0; r < nr; r++) lanes_scale(s, p[r], t[r]);
                g++;
                group_end = group_end + G < I ? group_end + G : I;
            }
        }
        for (int r = 0; r < nr; r++) y[r * y_stride + o] = lanes_sum(t[r]);
    }
}

/* Larger batches: a block of COLI_Q_OUT_BLOCK output rows by a tile of COLI_Q_ROW_TILE
 * activation rows, walked chunk by chunk, so each decoded chunk serves every row of the tile
 * and each activation chunk stays in L1 while every output row of the block uses it. */
static void run_buffered(const qlayout *L, const float *x, int64_t n_rows, int64_t x_stride,
                         float *y, int64_t y_stride, int64_t o0, int64_t o1) {
    const int64_t I = L->in_features;
    const int64_t G = L->group;
    float buf[COLI_Q_CHUNK];
    float p[COLI_Q_OUT_BLOCK][COLI_Q_ROW_TILE][LANES];
    float t[COLI_Q_OUT_BLOCK][COLI_Q_ROW_TILE][LANES];
    for (int64_t r0 = 0; r0 < n_rows; r0 += COLI_Q_ROW_TILE) {
        int nr = (int)(n_rows - r0 < COLI_Q_ROW_TILE ? n_rows - r0 : COLI_Q_ROW_TILE);
        const float *xr = x + r0 * x_stride;
        for (int64_t b0 = o0; b0 < o1; b0 += COLI_Q_OUT_BLOCK) {
            int nb = (int)(o1 - b0 < COLI_Q_OUT_BLOCK ? o1 - b0 : COLI_Q_OUT_BLOCK);
            for (int b = 0; b < nb; b++) {
                memset(p[b], 0, (size_t)nr * sizeof p[b][0]);
                memset(t[b], 0, (size_t)nr * sizeof t[b][0]);
            }
            int64_t g = 0, group_end = G < I ? G : I, col = 0;
            while (col < I) {
                int64_t n = group_end - col;
                if (n > COLI_Q_CHUNK) n = COLI_Q_CHUNK;
                for (int b = 0; b < nb; b++) {
                    L->decode(L->packed + (b0 + b) * L->row_bytes, col, (int)n, buf);
                    for (int r = 0; r < nr; r++)
                        lanes_dot(buf, xr + r * x_stride + col, (int)n, col, p[b][r]);
                }
                col += n;
                if (col == group_end) {
                    for (int b = 0; b < nb; b++) {
                        float s = coli_qi_group_scale(L, b0 + b, g);
                        for (int r = 0; r < nr; r++) lanes_scale(s, p[b][r], t[b][r]);
                    }
                    g++;
                    group_end = group_end + G < I ? group_end + G : I;
                }
            }
            for (int b = 0; b < nb; b++)
                for (int r = 0; r < nr; r++) y[(r0 + r) * y_stride + b0 + b] = lanes_sum(t[b][r]);
        }
    }
}

/* Activation rows from which products take the tiles where the build has them (fewer keep
 * run_rows): a full decode batch (DOT_ROW_MAJOR in dot.c) and prefills. At 4-7 rows the tile
 * reuses each decoded row for too few of them (the avx512 build, the int4g64 + int8
 * container's decode step, paired: 0.91x at 4 rows, 0.94-0.96x at 5-7, 1.04x at 8). */
#define TILE_MIN_ROWS 8

/* Output rows three at a time through the tile (each weight row decoded once for all the
 * activation rows it covers, L->fused_tile); the activation rows past its last block and the
 * output rows past the last three go through run_rows. Without the buffer's memory the whole
 * call does (the same bytes either way). */
static void run_tiles(const qlayout *L, const float *x, int64_t n_rows, int64_t x_stride,
                      float *y, int64_t y_stride, int64_t o0, int64_t o1) {
    float *wd = malloc(3 * (size_t)L->in_features * sizeof(float));
    if (wd == NULL) {
        run_rows(L, x, n_rows, x_stride, y, y_stride, o0, o1);
        return;
    }
    int64_t covered = 0, o = o0;
    for (; o + 3 <= o1; o += 3) covered = L->fused_tile(L, o, x, x_stride, n_rows, y, y_stride, wd);
    free(wd);
    if (covered < n_rows)
        run_rows(L, x + covered * x_stride, n_rows - covered, x_stride, y + covered * y_stride,
                 y_stride, o0, o);
    if (o < o1) run_rows(L, x, n_rows, x_stride, y, y_stride, o, o1);
}

/* Which path a call takes depends on the build, the format and the batch size, never on
 * the values: every path performs the same operations per output element. */
static void run(const qlayout *L, const float *x, int64_t n_rows, int64_t x_stride, float *y,
                int64_t y_stride, int64_t o0, int64_t o1) {
    if (L->fused_tile != NULL && n_rows >= TILE_MIN_ROWS)
        run_tiles(L, x, n_rows, x_stride, y, y_stride, o0, o1);
    else if (L->fused_row != NULL)
        run_rows(L, x, n_rows, x_stride, y, y_stride, o0, o1);
    else if (L->fused != NULL && n_rows <= FUSED_MAX_ROWS)
        run_small(L, x, n_rows, x_stride, y, y_stride, o0, o1);
    else
        run_buffered(L, x, n_rows, x_stride, y, y_stride, o0, o1);
}

int coli_q_matmul(int fmt, int group_size, const uint8_t *packed, int64_t packed_len,
                  const float *scales, int64_t n_scales, int64_t out_features,
                  int64_t in_features, const float *x, int64_t n_rows, int64_t x_stride,
                  float *y, int64_t y_stride, int64_t o0, int64_t o1, int flags) {
    qlayout L;
    int rc = coli_qi_layout_init(&L, fmt, group_size, packed, packed_len, scales, n_scales,
                           out_features, in_features);
    if (rc != COLI_Q_OK) return rc;
    if (o0 < 0 || o1 < o0 || o1 > out_features) return COLI_Q_ERANGE;
    if (n_rows < 0) return COLI_Q_ESTRIDE;
    if (n_rows == 0 || o0 == o1) return COLI_Q_OK;
    if (x_stride < in_features || y_stride < out_features) return COLI_Q_ESTRIDE;
    if (x == NULL || y == NULL) return COLI_Q_ENULL;
    if (fmt != COLI_Q_E8_IQ3 || (flags & COLI_Q_X_ROTATED)) {
        run(&L, x, n_rows, x_stride, y, y_stride, o0, o1);
        return COLI_Q_OK;
    }
    float *xr = malloc((size_t)n_rows * (size_t)in_features * sizeof(float));
    if (xr == NULL) return COLI_Q_ENOMEM;
    rc = coli_q_rotate(x, n_rows, x_stride, in_features, xr, in_features);
    if (rc == COLI_Q_OK) run(&L, xr, n_rows, in_features, y, y_stride, o0, o1);
    free(xr);
    return rc;
}
