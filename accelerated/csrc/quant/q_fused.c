/* The avx2 build's register-resident path for the byte-aligned formats (int8-row, int4-row,
 * int4-grouped, fp8): each 8-column vector of weights is decoded into a register and fed
 * straight to the FMA of its lane, with no stack buffer. The lanes, their order and every
 * FMA are those of q_matmul.c's buffered path, so results are the same bytes either way. */
#include <stddef.h>

#include "quant/q_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

#include "quant/coli_quant_tables.h"

static inline __m256 dec8_int8(const uint8_t *row, int64_t c) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
}

/* The byte holding column c's nibble. Columns are never negative: as an unsigned division
 * this is one shift (a signed one took three instructions per use, which with four uses per
 * 32-column block made the int4 loop issue-bound). */
static inline const uint8_t *nibbles_at(const uint8_t *row, int64_t c) {
    return row + (uint64_t)c / 2;
}

/* 4 bytes -> 8 nibbles in column order (nibble k of the little-endian word is column c + k),
 * minus 8: one broadcast load and a variable shift, no shuffle. */
static inline __m256 dec8_int4_at(const uint8_t *b) {
    int32_t word;
    memcpy(&word, b, sizeof word);
    __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i u = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts),
                                 _mm256_set1_epi32(0x0F));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(u, _mm256_set1_epi32(8)));
}

static inline __m256 dec8_int4(const uint8_t *row, int64_t c) {
    return dec8_int4_at(nibbles_at(row, c));
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

#define Q_DEC32_BY_8(NAME, DEC)                                                              \
    static inline void NAME(const uint8_t *row, int64_t c, __m256 w[4]) {                    \
        for (int k = 0; k < 4; k++) w[k] = DEC(row, c + 8 * k);                              \
    }

/* Eight 2-bit fields of a 16-bit word, field k at bits 2k, as int32 lanes. */
static inline __m256i fields2(uint32_t word) {
    __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts),
                            _mm256_set1_epi32(3));
}

/* int2: bytes 2k, 2k+1 of the block hold columns 8k..8k+7; q = u - 2. */
static inline void dec32_int2(const uint8_t *row, int64_t c, __m256 w[4]) {
    const uint8_t *b = row + (uint64_t)c / 4;
    for (int k = 0; k < 4; k++) {
        __m256i u = fields2((uint32_t)b[2 * k] | ((uint32_t)b[2 * k + 1] << 8));
        w[k] = _mm256_cvtepi32_ps(_mm256_sub_epi32(u, _mm256_set1_epi32(2)));
    }
}

/* int3: columns c..c+31 of a 64-column group (c % 64 is 0 or 32): low plane bytes hold 4
 * elements each, high plane bytes 8; q = (low | high << 2) - 4. */
static inline void dec32_int3(const uint8_t *row, int64_t c, __m256 w[4]) {
    const uint8_t *g = row + (uint64_t)c / 64 * 24;
    int e0 = (int)((uint64_t)c % 64);
    __m256i bits = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int k = 0; k < 4; k++) {
        int e = e0 + 8 * k;
        __m256i low = fields2((uint32_t)g[e / 4] | ((uint32_t)g[e / 4 + 1] << 8));
        __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(g[16 + e / 8]), bits),
                                        _mm256_set1_epi32(1));
        __m256i u = _mm256_or_si256(low, _mm256_slli_epi32(high, 2));
        w[k] = _mm256_cvtepi32_ps(_mm256_sub_epi32(u, _mm256_set1_epi32(4)));
    }
}

/* 32 nibbles from column c, as dec8_int4 four times: each register broadcasts the 4 bytes of
 * its columns (a load, no shuffle) and shifts nibble k to lane k. The byte interleave and four
 * 8 -> 32-bit sign extensions this replaced (the same integer values, so the same bits
 * downstream) cost 3 cycles of one of two pipes each on Zen 3 (2-core EPYC Zen 3, avx2,
 * int4-grouped-64 rows of 1024 in L1: 1.42x the GB/s, with Q_DEFINE_FUSED_ROW's unrolled
 * group loops). */
static inline void dec32_int4(const uint8_t *row, int64_t c, __m256 w[4]) {
    const uint8_t *b = nibbles_at(row, c);
    for (int k = 0; k < 4; k++) w[k] = dec8_int4_at(b + 4 * k);
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

/* Columns [c, c + n) of a row's partial last block onto the 32 lane partials p: through the
 * chunk-level register path `chunk` where one is given, the rest through the buffered decoder
 * and lane dot -- the chunked path's operations on its lanes, whichever way the block goes. */
static void finish_block(const qlayout *L, const uint8_t *row, int64_t c, int n, const float *x,
                         float *p, q_fused_fn chunk) {
    float buf[32];
    int done = chunk != NULL ? chunk(row, c, n, x + c, p) : 0;
    if (done < n) {
        L->decode(row, c + done, n - done, buf);
        coli_qi_lanes_dot(buf, x + c + done, n - done, c + done, p);
    }
}

/* The whole-row kernels below are written once for a 32-lane block held as QN_W registers of
 * W lanes: W = 8 (avx2: four __m256) or W = 16 (the avx512 build: two __m512, lanes 0..15 and
 * 16..31). Each lane gets the same multiply-adds in the same order either way, and QSUM_W
 * hands coli_qi_sum_lanes the same four 8-lane quarters, so both widths give the same bytes;
 * the wider one needs half the decode, convert and multiply-add instructions (the int4
 * kernel is compute-bound at W = 8). */
#define QV_8 __m256
#define QN_8 4
#define QZERO_8 _mm256_setzero_ps
#define QLOAD_8 _mm256_loadu_ps
#define QSTORE_8 _mm256_storeu_ps
#define QFMA_8 _mm256_fmadd_ps
#define QSET1_8 _mm256_set1_ps
#define QSUM_8(t) coli_qi_sum_lanes(t[0], t[1], t[2], t[3])

/* finish_block on lanes held in registers; scale_into: t[l] += s * a[l]. */
#define Q_DEFINE_LANE_HELPERS(W)                                                              \
    static void tail_block_##W(const qlayout *L, const uint8_t *row, int64_t c, int n,        \
                               const float *x, QV_##W a[QN_##W], q_fused_fn chunk) {          \
        float p[32];                                                                          \
        for (int k = 0; k < QN_##W; k++) QSTORE_##W(p + W * k, a[k]);                        \
        finish_block(L, row, c, n, x, p, chunk);                                              \
        for (int k = 0; k < QN_##W; k++) a[k] = QLOAD_##W(p + W * k);                        \
    }                                                                                         \
    static void scale_into_##W(float s, const QV_##W a[QN_##W], float *t) {                   \
        QV_##W sv = QSET1_##W(s);                                                             \
        for (int k = 0; k < QN_##W; k++)                                                      \
            QSTORE_##W(t + W * k, QFMA_##W(sv, a[k], QLOAD_##W(t + W * k)));                  \
    }

/* a += the whole 32-column block at column c of `row` times x's, lane by lane. */
#define Q_BLOCK_FMA(DEC32, W, c, a)                                                           \
    do {                                                                                      \
        QV_##W w_[QN_##W];                                                                    \
        DEC32(row, (c), w_);                                                                  \
        for (int k = 0; k < QN_##W; k++)                                                      \
            a[k] = QFMA_##W(w_[k], QLOAD_##W(x + (c) + W * k), a[k]);                         \
    } while (0)

/* Whether a row of I columns is whole groups of G = 32, 64 or 128 columns; Q_UNROLLED runs
 * GROUPS (one of the group loops below) with G's block count as a constant, so it unrolls. */
#define Q_WHOLE_GROUPS(I, G) ((I) % (G) == 0 && ((G) == 32 || (G) == 64 || (G) == 128))
#define Q_UNROLLED(GROUPS, DEC32, W, G)                                                       \
    do {                                                                                      \
        if ((G) == 32) {                                                                      \
            GROUPS(DEC32, W, 1)                                                               \
        } else if ((G) == 64) {                                                               \
            GROUPS(DEC32, W, 2)                                                               \
        } else {                                                                              \
            GROUPS(DEC32, W, 4)                                                               \
        }                                                                                     \
    } while (0)

/* The fused row's group loop below for whole groups of NB blocks tiling the row (NB a
 * constant, so the loop unrolls), onto its t from its row, srow, x and I. */
#define Q_GROUPS_OF(DEC32, W, NB)                                                             \
    for (int64_t g0 = 0, g = 0; g0 < I; g0 += 32 * (NB), g++) {                               \
        QV_##W a[QN_##W];                                                                     \
        for (int k = 0; k < QN_##W; k++) a[k] = QZERO_##W();                                  \
        for (int b = 0; b < (NB); b++) Q_BLOCK_FMA(DEC32, W, g0 + 32 * b, a);                 \
        QV_##W s = QSET1_##W(srow[g]);                                                        \
        for (int k = 0; k < QN_##W; k++) t[k] = QFMA_##W(s, a[k], t[k]);                      \
    }

/* One activation row against one weight row, a whole output element: each scale group's
 * partials a (from zero), then t += scale * a, then the 32-lane sum. Groups are multiples of
 * 32 columns, so every group starts on lane 0 and only the row's last group can end in a
 * part of a 32-column block (tail_block: through CHUNK, or the buffered decoder if NULL).
 * Groups of 32, 64 or 128 columns that tile the row take the same steps with the group loop
 * unrolled (Q_GROUPS_OF): its bounds, tail test and branches cost about as much as the
 * blocks' arithmetic (2-core EPYC Zen 3, avx2, int4-grouped-64 rows of 1024 in L1: 1.19x the
 * GB/s with the avx2 dec32_int4). */
#define Q_DEFINE_FUSED_ROW(NAME, DEC32, CHUNK, W)                                             \
    static float NAME(const qlayout *L, int64_t o, const float *x) {                          \
        const uint8_t *row = L->packed + o * L->row_bytes;                                    \
        const float *srow = scale_row(L, o);                                                  \
        const int64_t I = L->in_features, G = L->group;                                       \
        QV_##W t[QN_##W];                                                                     \
        for (int k = 0; k < QN_##W; k++) t[k] = QZERO_##W();                                  \
        if (Q_WHOLE_GROUPS(I, G)) {                                                           \
            Q_UNROLLED(Q_GROUPS_OF, DEC32, W, G);                                             \
            return QSUM_##W(t);                                                               \
        }                                                                                     \
        for (int64_t g0 = 0, g = 0; g0 < I; g0 += G, g++) {                                   \
            int64_t end = g0 + G < I ? g0 + G : I;                                            \
            QV_##W a[QN_##W];                                                                 \
            for (int k = 0; k < QN_##W; k++) a[k] = QZERO_##W();                              \
            int64_t c = g0;                                                                   \
            for (; c + 32 <= end; c += 32) Q_BLOCK_FMA(DEC32, W, c, a);                        \
            if (c < end) { /* a copy, so `a` itself never has its address taken */          \
                QV_##W tail[QN_##W];                                                          \
                for (int k = 0; k < QN_##W; k++) tail[k] = a[k];                              \
                tail_block_##W(L, row, c, (int)(end - c), x, tail, CHUNK);                    \
                for (int k = 0; k < QN_##W; k++) a[k] = tail[k];                              \
            }                                                                                 \
            QV_##W s = QSET1_##W(srow[g]);                                                    \
            for (int k = 0; k < QN_##W; k++) t[k] = QFMA_##W(s, a[k], t[k]);                  \
        }                                                                                     \
        return QSUM_##W(t);                                                                   \
    }

/* Q_BLOCK_FMA for two activation rows x0, x1 from one decoded block: a and b. */
#define Q_BLOCK2_FMA(DEC32, W, c, a, b)                                                       \
    do {                                                                                      \
        QV_##W w_[QN_##W];                                                                    \
        DEC32(row, (c), w_);                                                                  \
        for (int k = 0; k < QN_##W; k++) {                                                    \
            a[k] = QFMA_##W(w_[k], QLOAD_##W(x0 + (c) + W * k), a[k]);                        \
            b[k] = QFMA_##W(w_[k], QLOAD_##W(x1 + (c) + W * k), b[k]);                        \
        }                                                                                     \
    } while (0)

/* Q_GROUPS_OF for the two-row path: each group's lanes of both rows scaled onto t0 and t1. */
#define Q_GROUPS2_OF(DEC32, W, NB)                                                            \
    for (int64_t g0 = 0, g = 0; g0 < I; g0 += 32 * (NB), g++) {                               \
        QV_##W a[QN_##W], b[QN_##W];                                                          \
        for (int k = 0; k < QN_##W; k++) a[k] = b[k] = QZERO_##W();                           \
        for (int blk = 0; blk < (NB); blk++) Q_BLOCK2_FMA(DEC32, W, g0 + 32 * blk, a, b);     \
        scale_into_##W(srow[g], a, t0);                                                       \
        scale_into_##W(srow[g], b, t1);                                                       \
    }

/* Two activation rows against one weight row: each 32-column block is decoded once and fed to
 * both rows' accumulators (per row, the operations of the one-row path with the buffered
 * tail); t0 and t1 get each row's scaled lanes. Whole groups of 32, 64 or 128 columns unroll
 * as in the one-row path (Zen 3, avx2, int4-grouped-64 rows of 1024, 2-8 activation rows:
 * 1.16-1.21x the GB/s in L1 and from memory). */
#define Q_DEFINE_ROW2(NAME, DEC32, W)                                                         \
    static void NAME(const qlayout *L, int64_t o, const float *x0, const float *x1,          \
                     float *t0, float *t1) {                                                  \
        const uint8_t *row = L->packed + o * L->row_bytes;                                    \
        const float *srow = scale_row(L, o);                                                  \
        const int64_t I = L->in_features, G = L->group;                                       \
        if (Q_WHOLE_GROUPS(I, G)) {                                                           \
            Q_UNROLLED(Q_GROUPS2_OF, DEC32, W, G);                                            \
            return;                                                                           \
        }                                                                                     \
        for (int64_t g0 = 0, g = 0; g0 < I; g0 += G, g++) {                                   \
            int64_t end = g0 + G < I ? g0 + G : I;                                            \
            QV_##W a[QN_##W], b[QN_##W];                                                      \
            for (int k = 0; k < QN_##W; k++) a[k] = b[k] = QZERO_##W();                       \
            int64_t c = g0;                                                                   \
            for (; c + 32 <= end; c += 32) Q_BLOCK2_FMA(DEC32, W, c, a, b);                    \
            QV_##W ta[QN_##W], tb[QN_##W];                                                    \
            for (int k = 0; k < QN_##W; k++) ta[k] = a[k], tb[k] = b[k];                      \
            if (c < end) {                                                                    \
                tail_block_##W(L, row, c, (int)(end - c), x0, ta, NULL);                      \
                tail_block_##W(L, row, c, (int)(end - c), x1, tb, NULL);                      \
            }                                                                                 \
            scale_into_##W(srow[g], ta, t0);                                                  \
            scale_into_##W(srow[g], tb, t1);                                                  \
        }                                                                                     \
    }

Q_DEFINE_LANE_HELPERS(8)
/* int2/int3 decode eight columns at a time in either build. */
Q_DEFINE_FUSED_ROW(fused_row_int2, dec32_int2, NULL, 8)
Q_DEFINE_FUSED_ROW(fused_row_int3, dec32_int3, NULL, 8)
Q_DEFINE_ROW2(fused_row2_int2, dec32_int2, 8)
Q_DEFINE_ROW2(fused_row2_int3, dec32_int3, 8)

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The avx512 build: the byte-aligned formats (int8-row, int4-row/grouped, fp8) at W = 16. */
static inline __m256 lo8(__m512 v) { return _mm512_castps512_ps256(v); }
static inline __m256 hi8(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

static inline void dec32z_int8(const uint8_t *row, int64_t c, __m512 w[2]) {
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + c))));
    w[1] = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + c + 16))));
}

/* Columns c .. c + 31 as int8 (low nibble of byte i is column c + 2i, high c + 2i + 1), minus
 * 8, widened sixteen at a time. */
static inline void dec32z_int4(const uint8_t *row, int64_t c, __m512 w[2]) {
    __m128i b = _mm_loadu_si128((const __m128i *)nibbles_at(row, c));
    __m128i nib = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    __m128i lo = _mm_and_si128(b, nib), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nib);
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight)));
    w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight)));
}

/* dec8_fp8's bit placement on sixteen bytes at a time. */
static inline __m512 dec16z_fp8(const uint8_t *row, int64_t c) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + c)));
    __m512i mag = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7F)), 20);
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p120f));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

static inline void dec32z_fp8(const uint8_t *row, int64_t c, __m512 w[2]) {
    w[0] = dec16z_fp8(row, c);
    w[1] = dec16z_fp8(row, c + 16);
}

#define QV_16 __m512
#define QN_16 2
#define QZERO_16 _mm512_setzero_ps
#define QLOAD_16 _mm512_loadu_ps
#define QSTORE_16 _mm512_storeu_ps
#define QFMA_16 _mm512_fmadd_ps
#define QSET1_16 _mm512_set1_ps
#define QSUM_16(t) coli_qi_sum_lanes(lo8(t[0]), hi8(t[0]), lo8(t[1]), hi8(t[1]))
Q_DEFINE_LANE_HELPERS(16)
#define Q_WIDE 16
#define Q_DEC32_WIDE(FMT) dec32z_##FMT
#else
#define Q_WIDE 8
#define Q_DEC32_WIDE(FMT) dec32_##FMT
#endif

/* Q_DEFINE_* with the width and decoder of this build (macro arguments are expanded first). */
#define Q_FUSED_ROW_AT(NAME, DEC32, CHUNK, W) Q_DEFINE_FUSED_ROW(NAME, DEC32, CHUNK, W)
#define Q_ROW2_AT(NAME, DEC32, W) Q_DEFINE_ROW2(NAME, DEC32, W)
Q_FUSED_ROW_AT(fused_row_int8, Q_DEC32_WIDE(int8), fused_int8, Q_WIDE)
Q_FUSED_ROW_AT(fused_row_int4, Q_DEC32_WIDE(int4), fused_int4, Q_WIDE)
Q_FUSED_ROW_AT(fused_row_fp8, Q_DEC32_WIDE(fp8), fused_fp8, Q_WIDE)
Q_ROW2_AT(fused_row2_int8, Q_DEC32_WIDE(int8), Q_WIDE)
Q_ROW2_AT(fused_row2_int4, Q_DEC32_WIDE(int4), Q_WIDE)
Q_ROW2_AT(fused_row2_fp8, Q_DEC32_WIDE(fp8), Q_WIDE)

/* The byte-aligned format's kernel of a family PREFIX_int8 / _int4 / _fp8 (int4-row and
 * int4-grouped share one), or NULL for the other formats. */
#define Q_BYTE_ALIGNED(fmt, PREFIX)                                                           \
    ((fmt) == COLI_Q_INT8_ROW                                    ? PREFIX##_int8              \
     : (fmt) == COLI_Q_INT4_ROW || (fmt) == COLI_Q_INT4_GROUPED ? PREFIX##_int4              \
     : (fmt) == COLI_Q_FP8_E4M3_B128                             ? PREFIX##_fp8               \
                                                                 : NULL)

/* Prefills and full decode batches: three weight rows decoded once onto a buffer, then met by
 * the activations a few rows at a time in a register tile. The pair and four-row paths decode
 * every block again for each pair or four of rows, which made decoding most of a 64-row
 * prefill's work. Per output element the operations are the one-row path's: each scale
 * group's partials a from zero over its 32-column blocks in order (one lane group or half of
 * every block per pass, as Q_BLOCK_FMA holds them in a[k]), t = fma(s, a, t) at the group's
 * end, then QSUM_W's 32-lane sum; the decoded values are DEC32's. */
#define Q_DEFINE_DECODE_ROW(NAME, DEC32, W)                                                   \
    static void NAME(const qlayout *L, int64_t o, float *wd) {                                \
        const uint8_t *row = L->packed + o * L->row_bytes;                                    \
        for (int64_t c = 0; c < L->in_features; c += 32) {                                    \
            QV_##W w_[QN_##W];                                                                \
            DEC32(row, c, w_);                                                                \
            for (int k = 0; k < QN_##W; k++) QSTORE_##W(wd + c + W * k, w_[k]);              \
        }                                                                                     \
    }
#define Q_DECODE_ROW_AT(NAME, DEC32, W) Q_DEFINE_DECODE_ROW(NAME, DEC32, W)
Q_DECODE_ROW_AT(decode_row_int8, Q_DEC32_WIDE(int8), Q_WIDE)
Q_DECODE_ROW_AT(decode_row_int4, Q_DEC32_WIDE(int4), Q_WIDE)
Q_DECODE_ROW_AT(decode_row_fp8, Q_DEC32_WIDE(fp8), Q_WIDE)

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* Three or four activation rows x, x + ldx, ... against one weight row, each 32-column block
 * decoded once for all of them (the avx512 build, where up to 8 partials and 8 scaled sums
 * fit in registers): tout[r * 32 + l] gets row r's lane l as the one-row path leaves it. Why:
 * a decode batch's experts mostly get 1-4 of its rows, and pairs decoded every block once per
 * pair, an odd last row alone once more (the int4g64 + int8 container's decode step, paired,
 * 2-core EPYC Zen 4: three rows at once 1.07x at 8 rows, 1.05x at 4). N_ROWS, a constant of
 * each function, is how many. */
#define Q_BLOCKN_FMA(DEC32, W, c)                                                             \
    do {                                                                                      \
        QV_##W w_[QN_##W];                                                                    \
        DEC32(row, (c), w_);                                                                  \
        for (int k = 0; k < QN_##W; k++)                                                      \
            for (int r = 0; r < N_ROWS; r++)                                                  \
                a[r][k] = QFMA_##W(w_[k], QLOAD_##W(x + r * ldx + (c) + W * k), a[r][k]);     \
    } while (0)
#define Q_GROUPN_START(W)                                                                     \
    for (int r = 0; r < N_ROWS; r++)                                                          \
        for (int k = 0; k < QN_##W; k++) a[r][k] = QZERO_##W()
#define Q_GROUPN_END(W, g)                                                                    \
    do {                                                                                      \
        QV_##W s_ = QSET1_##W(srow[g]);                                                       \
        for (int r = 0; r < N_ROWS; r++)                                                      \
            for (int k = 0; k < QN_##W; k++) t[r][k] = QFMA_##W(s_, a[r][k], t[r][k]);        \
    } while (0)
#define Q_GROUPSN_OF(DEC32, W, NB)                                                            \
    for (int64_t g0 = 0, g = 0; g0 < I; g0 += 32 * (NB), g++) {                               \
        Q_GROUPN_START(W);                                                                    \
        for (int b = 0; b < (NB); b++) Q_BLOCKN_FMA(DEC32, W, g0 + 32 * b);                   \
        Q_GROUPN_END(W, g);                                                                   \
    }
#define Q_DEFINE_ROWN(NAME, DEC32, W, N)                                                      \
    static void NAME(const qlayout *L, int64_t o, const float *x, int64_t ldx, float *tout) { \
        enum { N_ROWS = N };                                                                  \
        const uint8_t *row = L->packed + o * L->row_bytes;                                    \
        const float *srow = scale_row(L, o);                                                  \
        const int64_t I = L->in_features, G = L->group;                                       \
        QV_##W t[N_ROWS][QN_##W], a[N_ROWS][QN_##W];                                          \
        for (int r = 0; r < N_ROWS; r++)                                                      \
            for (int k = 0; k < QN_##W; k++) t[r][k] = QZERO_##W();                           \
        if (Q_WHOLE_GROUPS(I, G)) {                                                           \
            Q_UNROLLED(Q_GROUPSN_OF, DEC32, W, G);                                            \
        } else {                                                                              \
            for (int64_t g0 = 0, g = 0; g0 < I; g0 += G, g++) {                               \
                Q_GROUPN_START(W);                                                            \
                for (int64_t c = g0; c < g0 + G; c += 32) Q_BLOCKN_FMA(DEC32, W, c);          \
                Q_GROUPN_END(W, g);                                                           \
            }                                                                                 \
        }                                                                                     \
        for (int r = 0; r < N_ROWS; r++)                                                      \
            for (int k = 0; k < QN_##W; k++) QSTORE_##W(tout + 32 * r + W * k, t[r][k]);      \
    }
Q_DEFINE_ROWN(fused_row3_int8, dec32z_int8, 16, 3)
Q_DEFINE_ROWN(fused_row3_int4, dec32z_int4, 16, 3)
Q_DEFINE_ROWN(fused_row3_fp8, dec32z_fp8, 16, 3)
Q_DEFINE_ROWN(fused_row4_int8, dec32z_int8, 16, 4)
Q_DEFINE_ROWN(fused_row4_int4, dec32z_int4, 16, 4)
Q_DEFINE_ROWN(fused_row4_fp8, dec32z_fp8, 16, 4)

q_fused_row3_fn coli_qi_fused_row3_for(int fmt, int64_t group, int64_t in_features) {
    if (group % 32 != 0 || in_features % group != 0) return NULL;
    return Q_BYTE_ALIGNED(fmt, fused_row3);
}

q_fused_row4_fn coli_qi_fused_row4_for(int fmt, int64_t group, int64_t in_features) {
    if (group % 32 != 0 || in_features % group != 0) return NULL;
    return Q_BYTE_ALIGNED(fmt, fused_row4);
}
#endif

/* Decoded rows wd[0..2] (row stride I) with scales srow[j] against M of x's rows: y[r * ldy
 * + j]. One W-lane part of every 32-column block per pass (part h: lanes W h .. W h + W - 1,
 * a[h] of Q_BLOCK_FMA), as the float tiles walk their weights, with 3 weights, 1 activation,
 * the 3 x M partials and, where a row has several scale groups, the 3 x M scaled sums in
 * registers: rows of one group (int8-row, int4-row) need no scaled sums during the row (t =
 * fma(s, a, 0) once, after it), so they can take more activation rows. The shapes: W = 8
 * (16 ymm registers) 3 x 4 for one group, 3 x 2 for several; W = 16 (32 zmm) 3 x 4 either
 * way (3 x 8 for one group measured 0.98-0.99x in the int4g64 + int8 container's 8-row
 * decode step, 2-core EPYC Zen 4, paired). One definition for both widths: against an avx2
 * tile written apart, the avx2 build's 64-token prefill measured 0.99-1.10x (the host's
 * noise), the avx512 build's 8-row step 1.00x. */
#define Q_DEFINE_QTILE(W, PIN)                                                                \
    static inline __attribute__((always_inline)) void qtile_##W(                              \
        int M, int one_group, const float *wd, int64_t I, int64_t G,                          \
        const float *const srow[3], const float *x, int64_t ldx, float *y, int64_t ldy) {     \
        QV_##W part[3][4][QN_##W];                                                            \
        for (int h = 0; h < QN_##W; h++) {                                                    \
            QV_##W t[3][4];                                                                   \
            _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++)                               \
                _Pragma("GCC unroll 4") for (int r = 0; r < M; r++) t[j][r] = QZERO_##W();    \
            for (int64_t g0 = 0, gi = 0; g0 < I; g0 += G, gi++) {                             \
                QV_##W a[3][4];                                                               \
                _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++)                           \
                    _Pragma("GCC unroll 4") for (int r = 0; r < M; r++) a[j][r] = QZERO_##W(); \
                for (int64_t c = g0 + W * h; c < g0 + G; c += 32) {                           \
                    QV_##W u[3];                                                              \
                    _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++)                       \
                        u[j] = QLOAD_##W(wd + j * I + c);                                     \
                    _Pragma("GCC unroll 4") for (int r = 0; r < M; r++) {                     \
                        QV_##W v = QLOAD_##W(x + r * ldx + c);                                \
                        /* One load into a register for the three weight rows: left alone,  \
                         * gcc folds it into each multiply-add as a memory operand, 15 loads \
                         * a step for 12 multiply-adds (2-core EPYC Zen 4, avx512, the       \
                         * int4g64 container's 64-token prefill 1.17-1.18x this way; the     \
                         * float tile16 has the weights from memory and measured 0.61-0.97x  \
                         * so). */                                                           \
                        __asm__("" : PIN(v));                                                 \
                        _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++)                   \
                            a[j][r] = QFMA_##W(u[j], v, a[j][r]);                             \
                    }                                                                         \
                }                                                                             \
                _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) {                         \
                    QV_##W sv = QSET1_##W(srow[j][gi]);                                       \
                    _Pragma("GCC unroll 4") for (int r = 0; r < M; r++)                       \
                        t[j][r] = QFMA_##W(sv, a[j][r], one_group ? QZERO_##W() : t[j][r]);   \
                }                                                                             \
            }                                                                                 \
            _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++)                               \
                _Pragma("GCC unroll 4") for (int r = 0; r < M; r++) part[j][r][h] = t[j][r];  \
        }                                                                                     \
        for (int j = 0; j < 3; j++)                                                           \
            for (int r = 0; r < M; r++) y[r * ldy + j] = QSUM_##W(part[j][r]);                \
    }

/* One tile shape of qtile_W, as NAME: activation rows in blocks of M from row *r on. */
#define Q_DEFINE_QTILE_SHAPE(NAME, W, M, ONE_GROUP)                                           \
    static void NAME(const float *wd, int64_t I, int64_t G, const float *const srow[3],      \
                     const float *x, int64_t ldx, int64_t n_x, int64_t *r, float *y,         \
                     int64_t ldy) {                                                           \
        for (; *r + (M) <= n_x; *r += (M))                                                    \
            qtile_##W((M), (ONE_GROUP), wd, I, G, srow, x + *r * ldx, ldx, y + *r * ldy, ldy); \
    }

#define Q_PIN_X(v) "+x"(v)
#define Q_PIN_V(v) "+v"(v)
#if defined(__AVX512F__) && defined(__AVX512BW__)
Q_DEFINE_QTILE(16, Q_PIN_V)
Q_DEFINE_QTILE_SHAPE(qtile_one_group, 16, 4, 1)
Q_DEFINE_QTILE_SHAPE(qtile_groups, 16, 4, 0)
#else
Q_DEFINE_QTILE(8, Q_PIN_X)
Q_DEFINE_QTILE_SHAPE(qtile_one_group, 8, 4, 1)
Q_DEFINE_QTILE_SHAPE(qtile_groups, 8, 2, 0)
#endif

/* The activation rows in the build's blocks for rows of one scale group, or of several. */
static int64_t tile_rows(const float *wd, int64_t I, int64_t G, const float *const srow[3],
                         const float *x, int64_t ldx, int64_t n_x, float *y, int64_t ldy) {
    int64_t r = 0;
    (G == I ? qtile_one_group : qtile_groups)(wd, I, G, srow, x, ldx, n_x, &r, y, ldy);
    return r;
}

#define Q_DEFINE_TILE(NAME, DECODE_ROW)                                                       \
    static int64_t NAME(const qlayout *L, int64_t o, const float *x, int64_t ldx,            \
                        int64_t n_x, float *y, int64_t ldy, float *wd) {                      \
        const int64_t I = L->in_features;                                                     \
        const float *srow[3];                                                                 \
        for (int j = 0; j < 3; j++) {                                                         \
            DECODE_ROW(L, o + j, wd + j * I);                                                 \
            srow[j] = scale_row(L, o + j);                                                    \
        }                                                                                     \
        /* The next three rows, into L2 while this tile computes: without, the decode above  \
         * waits on memory each time (2-core EPYC Zen 4, the int4g64 + int8 container, paired: \
         * the 8-row decode step 1.04x in both builds, the 64-token prefill 1.03x; into L1   \
         * instead, 0.98-1.02x of that). */                                                   \
        if (o + 6 <= L->out_features) {                                                       \
            const char *next = (const char *)(L->packed + (o + 3) * L->row_bytes);            \
            for (int64_t b = 0; b < 3 * L->row_bytes; b += 64)                                \
                _mm_prefetch(next + b, _MM_HINT_T1);                                          \
        }                                                                                     \
        return tile_rows(wd, I, L->group, srow, x, ldx, n_x, y + o, ldy);                    \
    }
Q_DEFINE_TILE(fused_tile_int8, decode_row_int8)
Q_DEFINE_TILE(fused_tile_int4, decode_row_int4)
Q_DEFINE_TILE(fused_tile_fp8, decode_row_fp8)

q_fused_tile_fn coli_qi_fused_tile_for(int fmt, int64_t group, int64_t in_features) {
    if (in_features % 32 != 0 || group % 32 != 0 || in_features % group != 0) return NULL;
    return Q_BYTE_ALIGNED(fmt, fused_tile);
}

static void fused_row2_e8(const qlayout *L, int64_t o, const float *x0, const float *x1,
                          float *t0, float *t1);

q_fused_row2_fn coli_qi_fused_row2_for(int fmt, int64_t group) {
    switch (fmt) {
    case COLI_Q_INT8_ROW: return fused_row2_int8;
    case COLI_Q_INT4_ROW: return fused_row2_int4;
    case COLI_Q_INT4_GROUPED: return group % 32 == 0 ? fused_row2_int4 : NULL;
    case COLI_Q_FP8_E4M3_B128: return fused_row2_fp8;
    case COLI_Q_INT2_ROW: return fused_row2_int2;
    case COLI_Q_INT3_G64: return fused_row2_int3;
    case COLI_Q_E8_IQ3: return fused_row2_e8;
    default: return NULL;
    }
}

/* e8: each 32-weight sub-block is one group; w = grid/2 with the sign bit flipped where set
 * (bit-identical to the buffered decoder's multiply by -1), its scale db from d and code. */
/* The 32 weights of sub-block ib of an e8 super-block, as four vectors, and its scale. */
static inline float e8_sub_block(const uint8_t *blk, float d, int ib, __m256 w[4]) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i sign_bit = _mm256_set1_epi32((int)0x80000000u);
    const uint8_t *idx = blk + 8 * ib;
    uint32_t word;
    memcpy(&word, blk + 64 + 4 * ib, sizeof word);
    for (int l = 0; l < 4; l++) {
        uint32_t seven = (word >> (7 * l)) & 0x7F;
        uint32_t par = seven ^ (seven >> 4);
        par ^= par >> 2;
        par ^= par >> 1;
        __m256i signs = _mm256_set1_epi32((int)(seven | ((par & 1) << 7)));
        __m256i neg = _mm256_cmpeq_epi32(_mm256_and_si256(signs, bit), bit);
        __m256 mag = _mm256_insertf128_ps(
            _mm256_castps128_ps256(_mm_loadu_ps(coli_q_iq3_gridf[idx[2 * l]])),
            _mm_loadu_ps(coli_q_iq3_gridf[idx[2 * l + 1]]), 1);
        w[l] = _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_and_si256(neg, sign_bit)));
    }
    uint32_t code = word >> 28;
    return (d * (0.5f + (float)code)) * 0.5f;
}

/* e8: each 32-weight sub-block is one group; w = grid/2 with the sign bit flipped where set
 * (bit-identical to the buffered decoder's multiply by -1), its scale db from d and code. */
static float fused_row_e8(const qlayout *L, int64_t o, const float *x) {
    const uint8_t *row = L->packed + o * L->row_bytes;
    __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
    for (int64_t b = 0; b < L->in_features / 256; b++) {
        const uint8_t *blk = row + b * 98;
        float d = coli_qi_e8_half((uint16_t)(blk[96] | (blk[97] << 8)));
        for (int ib = 0; ib < 8; ib++) {
            const float *xc = x + b * 256 + ib * 32;
            __m256 w[4];
            __m256 s = _mm256_set1_ps(e8_sub_block(blk, d, ib, w));
            __m256 z = _mm256_setzero_ps();
            t0 = _mm256_fmadd_ps(s, _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xc), z), t0);
            t1 = _mm256_fmadd_ps(s, _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xc + 8), z), t1);
            t2 = _mm256_fmadd_ps(s, _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xc + 16), z), t2);
            t3 = _mm256_fmadd_ps(s, _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xc + 24), z), t3);
        }
    }
    return coli_qi_sum_lanes(t0, t1, t2, t3);
}

static void fused_row2_e8(const qlayout *L, int64_t o, const float *x0, const float *x1,
                          float *t0, float *t1) {
    const uint8_t *row = L->packed + o * L->row_bytes;
    __m256 a[4], b[4];
    for (int k = 0; k < 4; k++) a[k] = b[k] = _mm256_setzero_ps();
    for (int64_t bk = 0; bk < L->in_features / 256; bk++) {
        const uint8_t *blk = row + bk * 98;
        float d = coli_qi_e8_half((uint16_t)(blk[96] | (blk[97] << 8)));
        for (int ib = 0; ib < 8; ib++) {
            int64_t c = bk * 256 + ib * 32;
            __m256 w[4];
            __m256 s = _mm256_set1_ps(e8_sub_block(blk, d, ib, w));
            __m256 z = _mm256_setzero_ps();
            for (int k = 0; k < 4; k++) {
                a[k] = _mm256_fmadd_ps(s, _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x0 + c + 8 * k), z),
                                       a[k]);
                b[k] = _mm256_fmadd_ps(s, _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x1 + c + 8 * k), z),
                                       b[k]);
            }
        }
    }
    for (int k = 0; k < 4; k++) {
        _mm256_storeu_ps(t0 + 8 * k, a[k]);
        _mm256_storeu_ps(t1 + 8 * k, b[k]);
    }
}

#if !defined(__AVX512F__)
/* q_fused_row4_fn for N = 4 (and q_fused_row3_fn for N = 3) in the avx2 build, one lane
 * group g (the 8 lanes of columns 8g .. 8g + 7 mod 32) per pass: N activation rows' partials
 * and scaled lanes in 2 N registers, each 8-column vector decoded once for the N rows. Lane
 * l still accumulates its columns in ascending order, a group's partials from zero and then
 * t += scale * partial, as in the one-row path. Why: the int4 decode, not the multiply-adds,
 * is what a batch costs, and pairs of rows decoded every block again (Zen 3, avx2,
 * int4-grouped-64 rows of 1024, one thread, 4-8 activation rows: 1.28-1.41x the GB/s of
 * pairs; int4-row 1.11x; for int8 rows, whose decode is cheap, 0.91-1.00x, so int8 keeps
 * pairs; three rows: the int4g64 + int8 container's 8-row step 1.03x, 2-core EPYC Zen 4).
 * The avx512 build's 16-lane Q_DEFINE_ROWN holds whole blocks instead. */
#define Q_DEFINE_LANE_GROUP_ROWS(NAME, DEC8, N)                                               \
    static void NAME(const qlayout *L, int64_t o, const float *x, int64_t ldx, float *t) {  \
        const uint8_t *row = L->packed + o * L->row_bytes;                                    \
        const float *srow = scale_row(L, o);                                                  \
        const int64_t I = L->in_features, G = L->group;                                       \
        for (int g = 0; g < 4; g++) {                                                         \
            __m256 tr[N];                                                                     \
            for (int r = 0; r < (N); r++) tr[r] = _mm256_setzero_ps();                        \
            for (int64_t g0 = 0, gi = 0; g0 < I; g0 += G, gi++) {                             \
                __m256 a[N];                                                                  \
                for (int r = 0; r < (N); r++) a[r] = _mm256_setzero_ps();                     \
                for (int64_t c = g0 + 8 * g; c < g0 + G; c += 32) {                           \
                    __m256 w = DEC8(row, c);                                                  \
                    for (int r = 0; r < (N); r++)                                             \
                        a[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + r * ldx + c), a[r]);    \
                }                                                                             \
                __m256 s = _mm256_set1_ps(srow[gi]);                                          \
                for (int r = 0; r < (N); r++) tr[r] = _mm256_fmadd_ps(s, a[r], tr[r]);        \
            }                                                                                 \
            for (int r = 0; r < (N); r++) _mm256_storeu_ps(t + 32 * r + 8 * g, tr[r]);        \
        }                                                                                     \
    }

Q_DEFINE_LANE_GROUP_ROWS(fused_row4_int4, dec8_int4, 4)
Q_DEFINE_LANE_GROUP_ROWS(fused_row3_int4, dec8_int4, 3)

q_fused_row4_fn coli_qi_fused_row4_for(int fmt, int64_t group, int64_t in_features) {
    if (group % 32 != 0 || in_features % group != 0) return NULL;
    return fmt == COLI_Q_INT4_ROW || fmt == COLI_Q_INT4_GROUPED ? fused_row4_int4 : NULL;
}

q_fused_row3_fn coli_qi_fused_row3_for(int fmt, int64_t group, int64_t in_features) {
    if (group % 32 != 0 || in_features % group != 0) return NULL;
    return fmt == COLI_Q_INT4_ROW || fmt == COLI_Q_INT4_GROUPED ? fused_row3_int4 : NULL;
}
#endif

q_fused_row_fn coli_qi_fused_row_for(int fmt, int64_t group) {
    if (fmt == COLI_Q_INT2_ROW) return fused_row_int2;
    if (fmt == COLI_Q_INT3_G64) return fused_row_int3;
    if (fmt == COLI_Q_E8_IQ3) return fused_row_e8;
    if (group % 32 != 0 && fmt != COLI_Q_INT8_ROW && fmt != COLI_Q_INT4_ROW) return NULL;
    switch (fmt) {
    case COLI_Q_INT8_ROW: return fused_row_int8;
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT4_GROUPED: return fused_row_int4;
    case COLI_Q_FP8_E4M3_B128: return fused_row_fp8;
    default: return NULL;
    }
}

q_fused_fn coli_qi_fused_for(int fmt) {
    switch (fmt) {
    case COLI_Q_INT8_ROW: return fused_int8;
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT4_GROUPED: return fused_int4;
    case COLI_Q_FP8_E4M3_B128: return fused_fp8;
    default: return NULL;
    }
}
#else
q_fused_fn coli_qi_fused_for(int fmt) {
    (void)fmt;
    return NULL;
}

q_fused_row_fn coli_qi_fused_row_for(int fmt, int64_t group) {
    (void)fmt;
    (void)group;
    return NULL;
}

q_fused_row2_fn coli_qi_fused_row2_for(int fmt, int64_t group) {
    (void)fmt;
    (void)group;
    return NULL;
}
#endif

#if !(defined(__AVX2__) && defined(__FMA__))
/* No three-row path or tiles in the generic build. */
q_fused_row3_fn coli_qi_fused_row3_for(int fmt, int64_t group, int64_t in_features) {
    (void)fmt, (void)group, (void)in_features;
    return NULL;
}

q_fused_tile_fn coli_qi_fused_tile_for(int fmt, int64_t group, int64_t in_features) {
    (void)fmt, (void)group, (void)in_features;
    return NULL;
}
#endif

#if !(defined(__AVX2__) && defined(__FMA__))
/* No four-row path in the generic build. */
q_fused_row4_fn coli_qi_fused_row4_for(int fmt, int64_t group, int64_t in_features) {
    (void)fmt, (void)group, (void)in_features;
    return NULL;
}
#endif
