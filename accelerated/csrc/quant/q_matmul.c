/* The fused driver: decode a chunk of a weight row onto the stack, dot it with every row of
 * the batch. The summation order is the one coli_quant.h states; nothing here depends on how
 * many rows the batch has or which output range a call covers. */
#include <stdlib.h>
#include <string.h>

#include "quant/q_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* p[l] += w[j+l] * x[j+l] over the chunk, one FMA per lane step; a short tail is masked. */
static void lanes_dot(const float *w, const float *x, int n, float *p) {
    __m256 acc = _mm256_loadu_ps(p);
    int j = 0;
    for (; j + 8 <= n; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), acc);
    if (j < n) {
        int t = n - j;
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(t), lane);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(w + j, mask), _mm256_maskload_ps(x + j, mask),
                              acc);
    }
    _mm256_storeu_ps(p, acc);
}

/* t[l] += s * p[l]; p[l] = 0 */
static void lanes_scale(float s, float *p, float *t) {
    _mm256_storeu_ps(t, _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_loadu_ps(p),
                                        _mm256_loadu_ps(t)));
    _mm256_storeu_ps(p, _mm256_setzero_ps());
}
#else
static void lanes_dot(const float *w, const float *x, int n, float *p) {
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) p[l] += w[j + l] * x[j + l];
    for (int l = 0; j + l < n; l++) p[l] += w[j + l] * x[j + l];
}

static void lanes_scale(float s, float *p, float *t) {
    for (int l = 0; l < 8; l++) {
        t[l] += s * p[l];
        p[l] = 0.0f;
    }
}
#endif

static float lanes_sum(const float *t) {
    return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

static void run(const qlayout *L, const float *x, int64_t n_rows, int64_t x_stride, float *y,
                int64_t y_stride, int64_t o0, int64_t o1) {
    const int64_t I = L->in_features;
    const int64_t G = L->group;
    float buf[COLI_Q_CHUNK];
    float p[COLI_Q_TILE][8];
    float t[COLI_Q_TILE][8];
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = L->packed + o * L->row_bytes;
        for (int64_t r0 = 0; r0 < n_rows; r0 += COLI_Q_TILE) {
            int nr = (int)(n_rows - r0 < COLI_Q_TILE ? n_rows - r0 : COLI_Q_TILE);
            memset(p, 0, sizeof p);
            memset(t, 0, sizeof t);
            int64_t col = 0;
            while (col < I) {
                int64_t g = col / G;
                int64_t group_end = (g + 1) * G < I ? (g + 1) * G : I;
                int64_t n = group_end - col;
                if (n > COLI_Q_CHUNK) n = COLI_Q_CHUNK;
                L->decode(row, col, (int)n, buf);
                for (int r = 0; r < nr; r++)
                    lanes_dot(buf, x + (r0 + r) * x_stride + col, (int)n, p[r]);
                col += n;
                if (col == group_end) {
                    float s = q_group_scale(L, o, g);
                    for (int r = 0; r < nr; r++) lanes_scale(s, p[r], t[r]);
                }
            }
            for (int r = 0; r < nr; r++) y[(r0 + r) * y_stride + o] = lanes_sum(t[r]);
        }
    }
}

int coli_q_matmul(int fmt, int group_size, const uint8_t *packed, int64_t packed_len,
                  const float *scales, int64_t n_scales, int64_t out_features,
                  int64_t in_features, const float *x, int64_t n_rows, int64_t x_stride,
                  float *y, int64_t y_stride, int64_t o0, int64_t o1, int flags) {
    qlayout L;
    int rc = q_layout_init(&L, fmt, group_size, packed, packed_len, scales, n_scales,
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
