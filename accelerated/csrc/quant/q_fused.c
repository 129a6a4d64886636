/* The avx2 build's register-resident path for the byte-aligned formats (int8-row, int4-row,
 * int4-grouped, fp8): each 8-column vector of weights is decoded into a register and fed
 * straight to the FMA of its lane, with no stack buffer. The lanes, their order and every
 * FMA are those of q_matmul.c's buffered path, so results are the same bytes either way. */
#include <stddef.h>

#include "quant/q_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

static inline __m256 dec8_int8(const uint8_t *row, int64_t c) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
}

/* 4 bytes -> 8 nibbles in column order (low nibble first), minus 8. */
static inline __m256 dec8_int4(const uint8_t *row, int64_t c) {
    int32_t word;
    memcpy(&word, row + c / 2, sizeof word);
    __m128i v = _mm_cvtsi32_si128(word);
    __m128i mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(v, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    __m128i u = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), _mm_set1_epi8(8));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(u));
}

/* e4m3fn by bit placement: the 7 magnitude bits shifted to f32's exponent/mantissa position
 * read as 2^-120 times the value (subnormals included), so one multiply by 2^120 is exact.
 * Bit-identical to the table (NaN bytes are refused by coli_q_check beforehand). */
static inline __m256 dec8_fp8(const uint8_t *row, int64_t c) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c)));
    __m256i mag = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7F)), 20);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f));
    return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

/* 32 columns at once: int4 unpacks one 16-byte load; the others are four 8-column decodes. */
static inline void dec32_int4(const uint8_t *row, int64_t c, __m256 w[4]) {
    __m128i v = _mm_loadu_si128((const __m128i *)(row + c / 2));
    __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    __m128i lo = _mm_and_si128(v, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    __m128i c0 = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
    __m128i c1 = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8)));
}

#define Q_DEC32_BY_8(NAME, DEC)                                                              \
    static inline void NAME(const uint8_t *row, int64_t c, __m256 w[4]) {                    \
        for (int k = 0; k < 4; k++) w[k] = DEC(row, c + 8 * k);                              \
    }
Q_DEC32_BY_8(dec32_int8, dec8_int8)
Q_DEC32_BY_8(dec32_fp8, dec8_fp8)

#define Q_STEP(DEC, k)                                                                        \
    _mm256_storeu_ps(p + 8 * (k), _mm256_fmadd_ps(DEC(row, col + j), _mm256_loadu_ps(x + j),  \
                                                  _mm256_loadu_ps(p + 8 * (k))))

#define Q_DEFINE_FUSED(NAME, DEC, DEC32)                                                           \
    static int NAME(const uint8_t *row, int64_t col, int n, const float *x, float *p) {      \
        int v = (int)((col / 8) & 3);                                                         \
        int j = 0;                                                                            \
        for (; v != 0 && j + 8 <= n; j += 8, v = (v + 1) & 3) Q_STEP(DEC, v);                 \
        if (v == 0 && j + 32 <= n) {                                                          \
            __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + 8);                      \
            __m256 a2 = _mm256_loadu_ps(p + 16), a3 = _mm256_loadu_ps(p + 24);                \
            for (; j + 32 <= n; j += 32) {                                                    \
                __m256 w[4];                                                                  \
                DEC32(row, col + j, w);                                                       \
                a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x + j), a0);                       \
                a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + j + 8), a1);                   \
                a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + j + 16), a2);                  \
                a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + j + 24), a3);                  \
            }                                                                                 \
            _mm256_storeu_ps(p, a0);                                                          \
            _mm256_storeu_ps(p + 8, a1);                                                      \
            _mm256_storeu_ps(p + 16, a2);                                                     \
            _mm256_storeu_ps(p + 24, a3);                                                     \
        }                                                                                     \
        for (; j + 8 <= n; j += 8, v = (v + 1) & 3) Q_STEP(DEC, v);                           \
        return j;                                                                             \
    }

Q_DEFINE_FUSED(fused_int8, dec8_int8, dec32_int8)
Q_DEFINE_FUSED(fused_int4, dec8_int4, dec32_int4)
Q_DEFINE_FUSED(fused_fp8, dec8_fp8, dec32_fp8)

/* The scale of group g of row o is srow[g]. */
static const float *scale_row(const qlayout *L, int64_t o) {
    switch (L->fmt) {
    case COLI_Q_INT8_ROW:
    case COLI_Q_INT4_ROW: return L->scales + o;
    case COLI_Q_FP8_E4M3_B128: return L->scales + (o / 128) * L->groups_per_row;
    default: return L->scales + o * L->groups_per_row;
    }
}

/* Groups are multiples of 32 columns, so every group starts on lane 0 and only the row's last
 * group can end in a part of a 32-column block (handled by the chunk-level code). */
#define Q_DEFINE_FUSED_ROW(NAME, DEC32, CHUNK)                                                \
    static void NAME(const qlayout *L, int64_t o, const float *x, float *t) {                 \
        const uint8_t *row = L->packed + o * L->row_bytes;                                    \
        const float *srow = scale_row(L, o);                                                  \
        const int64_t I = L->in_features, G = L->group;                                       \
        __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;                           \
        for (int64_t g0 = 0, g = 0; g0 < I; g0 += G, g++) {                                   \
            int64_t end = g0 + G < I ? g0 + G : I;                                            \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                       \
            int64_t c = g0;                                                                   \
            for (; c + 32 <= end; c += 32) {                                                  \
                __m256 w[4];                                                                  \
                DEC32(row, c, w);                                                             \
                a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x + c), a0);                       \
                a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + c + 8), a1);                   \
                a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + c + 16), a2);                  \
                a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + c + 24), a3);                  \
            }                                                                                 \
            if (c < end) {                                                                    \
                float p[32], buf[32];                                                         \
                _mm256_storeu_ps(p, a0);                                                      \
                _mm256_storeu_ps(p + 8, a1);                                                  \
                _mm256_storeu_ps(p + 16, a2);                                                 \
                _mm256_storeu_ps(p + 24, a3);                                                 \
                int n = (int)(end - c);                                                       \
                int done = CHUNK(row, c, n, x + c, p);                                        \
                if (done < n) {                                                               \
                    L->decode(row, c + done, n - done, buf);                                  \
                    q_lanes_dot(buf, x + c + done, n - done, c + done, p);                    \
                }                                                                             \
                a0 = _mm256_loadu_ps(p);                                                      \
                a1 = _mm256_loadu_ps(p + 8);                                                  \
                a2 = _mm256_loadu_ps(p + 16);                                                 \
                a3 = _mm256_loadu_ps(p + 24);                                                 \
            }                                                                                 \
            __m256 s = _mm256_set1_ps(srow[g]);                                               \
            t0 = _mm256_fmadd_ps(s, a0, t0);                                                  \
            t1 = _mm256_fmadd_ps(s, a1, t1);                                                  \
            t2 = _mm256_fmadd_ps(s, a2, t2);                                                  \
            t3 = _mm256_fmadd_ps(s, a3, t3);                                                  \
        }                                                                                     \
        _mm256_storeu_ps(t, t0);                                                              \
        _mm256_storeu_ps(t + 8, t1);                                                          \
        _mm256_storeu_ps(t + 16, t2);                                                         \
        _mm256_storeu_ps(t + 24, t3);                                                         \
    }

Q_DEFINE_FUSED_ROW(fused_row_int8, dec32_int8, fused_int8)
Q_DEFINE_FUSED_ROW(fused_row_int4, dec32_int4, fused_int4)
Q_DEFINE_FUSED_ROW(fused_row_fp8, dec32_fp8, fused_fp8)

q_fused_row_fn q_fused_row_for(int fmt, int64_t group) {
    if (group % 32 != 0 && fmt != COLI_Q_INT8_ROW && fmt != COLI_Q_INT4_ROW) return NULL;
    switch (fmt) {
    case COLI_Q_INT8_ROW: return fused_row_int8;
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT4_GROUPED: return fused_row_int4;
    case COLI_Q_FP8_E4M3_B128: return fused_row_fp8;
    default: return NULL;
    }
}

q_fused_fn q_fused_for(int fmt) {
    switch (fmt) {
    case COLI_Q_INT8_ROW: return fused_int8;
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT4_GROUPED: return fused_int4;
    case COLI_Q_FP8_E4M3_B128: return fused_fp8;
    default: return NULL;
    }
}
#else
q_fused_fn q_fused_for(int fmt) {
    (void)fmt;
    return NULL;
}

q_fused_row_fn q_fused_row_for(int fmt, int64_t group) {
    (void)fmt;
    (void)group;
    return NULL;
}
#endif
