/* The one dot product every kernel uses, and exact weight-row conversion (spec §1).
 *
 * Summation order (fixed in the source, the same for every caller): element i goes to lane
 * i mod 32; lanes are then added pairwise as a tree (lane j += lane j + 16, + 8, + 4, + 2,
 * + 1). The avx2 variant computes the same lanes with fused multiply-adds (one rounding
 * instead of two), so the two variants agree within kind-(b) tolerance, and each is
 * deterministic on its own. */
#include <string.h>

#include "colibri.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* The avx512 build runs 4-8 activation rows through 16-lane tiles (tile16, below) and every
 * other float product through the avx2 kernels (8-lane registers: for 1-3 rows, memory-bound
 * streams, 16-lane versions measured no faster in the engine); its quantized kernels are the
 * 16-lane ones (quant/q_fused.c). All give the avx2 build's bytes. "avx2" first: the same
 * multiply-add bits as the avx2 build (cuda_model reads it). */
#define COL_ISA "avx2+fma+avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define COL_ISA "avx2+fma"
#else
#define COL_ISA "generic"
#endif

const char *col_version(void) { return "colibri-accelerated 1"; }
const char *col_isa(void) { return COL_ISA; }

const char *col_strerror(int code) {
    switch (code) {
    case COL_OK: return "ok";
    case COL_EINVAL: return "invalid argument";
    case COL_ENOMEM: return "out of memory";
    case COL_EDTYPE: return "unsupported weight dtype";
    case COL_ETHREAD: return "cannot start threads";
    case COL_EMISSING: return "a chosen expert is not resident";
    default: return "unknown error";
    }
}

static float reduce32(float *l) {
    for (size_t s = 16; s >= 1; s /= 2)
        for (size_t j = 0; j < s; j++) l[j] += l[j + s];
    return l[0];
}

#if defined(__AVX2__) && defined(__FMA__)
/* reduce32 on the four lane registers, in registers: the same pairwise adds in the same
 * order (j += j + 16, + 8, + 4, + 2, + 1), so the same bits as storing them and calling
 * reduce32. */
/* The tree's last three levels (j += j + 4, + 2, + 1) on the eight lanes it has left. */
static inline float reduce_last8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

static inline float reduce_regs(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    return reduce_last8(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
}
#endif

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* reduce32 on two 16-lane registers, lo = lanes 0-15 and hi = lanes 16-31: lo + hi is
 * reduce_regs's (a0 + a2 | a1 + a3), its two halves added are its first 8-lane sum, so the
 * same bits. */
static inline float reduce_halves(__m512 lo, __m512 hi) {
    __m512 s = _mm512_add_ps(lo, hi);
    return reduce_last8(_mm256_add_ps(_mm512_castps512_ps256(s),
                                      _mm512_extractf32x8_ps(s, 1)));
}
#endif

float col_dot_f32(const float *a, const float *b, size_t k) {
    float lanes[32];
    size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), a3);
    }
    if (i == k) return reduce_regs(a0, a1, a2, a3);
    _mm256_storeu_ps(lanes, a0);
    _mm256_storeu_ps(lanes + 8, a1);
    _mm256_storeu_ps(lanes + 16, a2);
    _mm256_storeu_ps(lanes + 24, a3);
#else
    for (size_t j = 0; j < 32; j++) lanes[j] = 0.0f;
    for (; i + 32 <= k; i += 32)
        for (size_t j = 0; j < 32; j++) lanes[j] += a[i + j] * b[i + j];
#endif
    for (size_t j = 0; i + j < k; j++) lanes[j] += a[i + j] * b[i + j];
    return reduce32(lanes);
}

#if defined(__AVX2__) && defined(__FMA__)
/* The 2-3-row kernels prefetch each weight row FAR_AHEAD bytes ahead into L2, beside the two
 * lines each step is about to load into L1. Where the rows' activations spill from L1 (k 2048
 * at 2 rows) the weight lines still on their way from memory and the activations read from L2
 * for every weight row compete for the L1's few miss buffers (our reading): one thread, 3
 * rows, read 11.6 GB/s of weights at k 2048 against 22 at k 1024 without it. With the far
 * prefetch (2-core EPYC Zen 4, both builds, paired, same bytes), two threads: k 2048
 * 1.07-1.15x the GB/s at 2 rows and 1.50-1.76x at 3, k 6144 (the hidden size of GLM-5-class
 * models) 1.25-1.33x; one thread at k 2048 x 3 rows 1.7x. Narrower rows (an expert's gate, up
 * and down at k 1024 and 512) kept the near prefetch alone on Zen 4, where the far one
 * measured 0.82-1.19x, within that host's noise; on a 2-core EPYC Zen 5, avx2 build, weights
 * from memory, medians of 15 paired rounds, it gives k 1024 1.06-1.07x (2 rows) and
 * 1.06-1.08x (3 rows), k 512 1.05-1.11x, one and two threads, so every width has it. */
#define FAR_AHEAD 4096

/* The prefetch of the 2-3-row kernels' step at byte offset `at` of the weight row `p`: the two
 * lines it is about to load into L1 and the two FAR_AHEAD bytes on into L2. That address is
 * an integer: it may lie past the row, where a prefetch is harmless but a pointer is not. */
static inline __attribute__((always_inline)) void step_prefetch(const char *p, size_t at) {
    _mm_prefetch(p + at, _MM_HINT_T0);
    _mm_prefetch(p + at + 64, _MM_HINT_T0);
    uintptr_t on = (uintptr_t)p + at + FAR_AHEAD;
    _mm_prefetch((const char *)on, _MM_HINT_T1);
    _mm_prefetch((const char *)(on + 64), _MM_HINT_T1);
}

static void dot_1x2(const float *w, size_t k, const float *x, size_t ldx, float *out,
                    size_t ldo) {
    const float *x0 = x, *x1 = x + ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const char *p = (const char *)w;
    for (size_t i = 0; i < k; i += 32) {
        step_prefetch(p, 4 * i);
        __m256 u0 = _mm256_loadu_ps(w + i), u1 = _mm256_loadu_ps(w + i + 8);
        __m256 u2 = _mm256_loadu_ps(w + i + 16), u3 = _mm256_loadu_ps(w + i + 24);
        a0 = _mm256_fmadd_ps(u0, _mm256_loadu_ps(x0 + i), a0);
        b0 = _mm256_fmadd_ps(u0, _mm256_loadu_ps(x1 + i), b0);
        a1 = _mm256_fmadd_ps(u1, _mm256_loadu_ps(x0 + i + 8), a1);
        b1 = _mm256_fmadd_ps(u1, _mm256_loadu_ps(x1 + i + 8), b1);
        a2 = _mm256_fmadd_ps(u2, _mm256_loadu_ps(x0 + i + 16), a2);
        b2 = _mm256_fmadd_ps(u2, _mm256_loadu_ps(x1 + i + 16), b2);
        a3 = _mm256_fmadd_ps(u3, _mm256_loadu_ps(x0 + i + 24), a3);
        b3 = _mm256_fmadd_ps(u3, _mm256_loadu_ps(x1 + i + 24), b3);
    }
    out[0] = reduce_regs(a0, a1, a2, a3);
    out[ldo] = reduce_regs(b0, b1, b2, b3);
}

static void dot_1x3(const float *w, size_t k, const float *x, size_t ldx, float *out,
                    size_t ldo) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    const char *p = (const char *)w;
    for (size_t i = 0; i < k; i += 32) {
        step_prefetch(p, 4 * i);
        __m256 u = _mm256_loadu_ps(w + i);
        a0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x0 + i), a0);
        b0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x1 + i), b0);
        c0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x2 + i), c0);
        u = _mm256_loadu_ps(w + i + 8);
        a1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x0 + i + 8), a1);
        b1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x1 + i + 8), b1);
        c1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x2 + i + 8), c1);
        u = _mm256_loadu_ps(w + i + 16);
        a2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x0 + i + 16), a2);
        b2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x1 + i + 16), b2);
        c2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x2 + i + 16), c2);
        u = _mm256_loadu_ps(w + i + 24);
        a3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x0 + i + 24), a3);
        b3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x1 + i + 24), b3);
        c3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(x2 + i + 24), c3);
    }
    out[0] = reduce_regs(a0, a1, a2, a3);
    out[ldo] = reduce_regs(b0, b1, b2, b3);
    out[2 * ldo] = reduce_regs(c0, c1, c2, c3);
}

/* One lane group's pass over columns i0, i0 + 32, ... < i1 of three weight rows (w0, w0 + k,
 * w0 + 2k) with four activation rows (x0 .. x0 + 3 ldx): the lanes 8g .. 8g + 7 of each of
 * the twelve col_dot_f32s, whose accumulators come from and go back to acc[4 j + r] (weight
 * row j, activation row r). A register stored and loaded again is the same bits, and every
 * lane still adds its products in column order, so the passes may be cut anywhere on a
 * 32-column boundary. Each step loads 7 vectors for 12 multiply-adds (dot_1x2 loads 3 for
 * 2): all 16 ymm registers, and nothing else in the loop but the column index. */
static inline __attribute__((always_inline)) void pass_3x4(const float *w0, size_t k,
                                                           const float *x0, size_t ldx,
                                                           size_t i0, size_t i1, __m256 *acc) {
    const float *w1 = w0 + k, *w2 = w0 + 2 * k;
    const float *x1 = x0 + ldx, *x2 = x0 + 2 * ldx, *x3 = x0 + 3 * ldx;
    __m256 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], b0 = acc[4], b1 = acc[5];
    __m256 b2 = acc[6], b3 = acc[7], c0 = acc[8], c1 = acc[9], c2 = acc[10], c3 = acc[11];
    for (size_t i = i0; i < i1; i += 32) {
        __m256 u = _mm256_loadu_ps(w0 + i), v = _mm256_loadu_ps(w1 + i);
        __m256 t = _mm256_loadu_ps(w2 + i);
/* activation row xr's vector at i times the three weight vectors, into one accumulator each */
#define ROW_STEP(xr, a, b, c)                                                                  \
    do {                                                                                       \
        __m256 y = _mm256_loadu_ps((xr) + i);                                                  \
        a = _mm256_fmadd_ps(u, y, a);                                                          \
        b = _mm256_fmadd_ps(v, y, b);                                                          \
        c = _mm256_fmadd_ps(t, y, c);                                                          \
    } while (0)
        ROW_STEP(x0, a0, b0, c0);
        ROW_STEP(x1, a1, b1, c1);
        ROW_STEP(x2, a2, b2, c2);
        ROW_STEP(x3, a3, b3, c3);
#undef ROW_STEP
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3, acc[4] = b0, acc[5] = b1;
    acc[6] = b2, acc[7] = b3, acc[8] = c0, acc[9] = c1, acc[10] = c2, acc[11] = c3;
}

/* Prefetch into L2 `lines` lines from `at` of three weight rows `row_bytes` apart. `at` is an
 * integer: it may lie past the weights, where a prefetch is harmless but a pointer is not. */
static inline __attribute__((always_inline)) void prefetch_lines(uintptr_t at,
                                                                 size_t row_bytes,
                                                                 size_t lines) {
    for (size_t l = 0; l < lines; l++, at += 64) {
        _mm_prefetch((const char *)at, _MM_HINT_T1);
        _mm_prefetch((const char *)(at + row_bytes), _MM_HINT_T1);
        _mm_prefetch((const char *)(at + 2 * row_bytes), _MM_HINT_T1);
    }
}

/* Columns per run of tile_3x4 when its weights come from memory. */
#define TILE_SEGMENT ((size_t)128)
_Static_assert(TILE_SEGMENT * sizeof(float) == 8 * 64, "tile_3x4 prefetches 8 lines per run");
/* How far into the next tile its prefetch runs ahead of this tile's loads, in bytes. */
#define TILE_PREFETCH_AHEAD ((size_t)2048)

/* col_dot_f32 of three weight rows with 4 * quads activation rows (quads 1 or 2), bit for
 * bit, through pass_3x4: one lane group (the 8 lanes i mod 32 in 8g .. 8g + 7) of one quad of
 * activation rows at a time, so twelve accumulators stay in registers; the four groups meet
 * in reduce_regs as col_dot_f32's do.
 *
 * `segment` (a multiple of 32) cuts k into runs, and every quad's four passes take one run
 * before the next run starts: the tile's weight rows and activations come to L1 a run at a
 * time (1.5 KiB of weights and 2 KiB per quad for runs of 128 columns) and both quads use
 * the run's weights while they are there, instead of 12 KiB and 16 KiB (k = 1024) per pass,
 * which a second quad or a wider k pushed out of a 32 KiB L1 between passes. Zen 4, two
 * threads from memory, paired, with each quad taking all its runs in turn: runs of 128
 * columns 1.30x the GB/s of whole passes at 8 rows, k 1024, 1.32x at
 * 2048, 1.68x at 6144. A prefill's later blocks, whose weights are already in L2, keep whole
 * passes (`segment` = k): runs there measured 0.94x on a 64-token prefill.
 *
 * When `pf` is not NULL (the next tile's first row; its rows follow each other in memory,
 * as this tile's do) the tile prefetches it into L2 while it computes from L1: a run's
 * passes ask, between them, for the next tile's lines of the same run TILE_PREFETCH_AHEAD
 * bytes on, one or two lines of each of its three rows per pass. A row's lines past its end
 * are the next row's first ones, so across the tiles every line is asked for once, a tile
 * or so ahead. Into L2, not L1:
 * with a 32 KiB L1 (Zen 4) the next tile evicted the activations the passes reuse (4-8 rows of
 * k 1024 from memory, paired: 1.19-1.32x the GB/s of an L1 prefetch). A few prefetches per
 * pass, fixed in the code, instead of a count carried through the inner step, which takes
 * integer registers and branches from it (and with each quad taken through all its runs
 * before the next quad, the second quad meets the weights in L2 again). Paired against that
 * alternative, same bytes, weights
 * from memory (2-core EPYC Zen 5, avx2 build, medians of 15 paired rounds), 8 rows at k 512,
 * 1024, 2048, 6144: one thread 1.14x, 1.27x, 1.19x, 1.10x the GB/s, two threads 1.14x,
 * 1.28x, 1.14x, 1.12x; 4 rows 0.99-1.24x (one) and 1.03-1.05x (two); the bench model's
 * 8-row decode step about 1.04x. The prefetch asking for the next tile's lines of the same
 * run (TILE_PREFETCH_AHEAD 0) read 0.90-0.92x the alternative's GB/s at k 6144 on one
 * thread; 2048 bytes on, 1.05-1.10x, with the other widths unchanged. */
static void tile_3x4(const float *w, size_t k, const float *x, size_t ldx, size_t quads,
                     float *out, size_t ldo, const char *pf, size_t segment) {
    __m256 part[2][4][12];
    size_t row_bytes = k * sizeof(float);
    for (size_t q = 0; q < quads; q++)
        for (size_t g = 0; g < 4; g++)
            for (size_t j = 0; j < 12; j++) part[q][g][j] = _mm256_setzero_ps();
    for (size_t s0 = 0; s0 < k; s0 += segment) {
        size_t s1 = k - s0 < segment ? k : s0 + segment;
        for (size_t q = 0; q < quads; q++)
            for (size_t g = 0; g < 4; g++) {
                if (pf) {
                    /* a run's 8 lines per row shared out over its 4 or 8 passes, each count
                     * a constant of its own copy of the code (a count read in the loop
                     * measured 0.90x at 8 rows) */
                    uintptr_t at = (uintptr_t)pf + sizeof(float) * s0 + TILE_PREFETCH_AHEAD;
                    if (quads == 2)
                        prefetch_lines(at + 64 * (4 * q + g), row_bytes, 1);
                    else
                        prefetch_lines(at + 128 * g, row_bytes, 2);
                }
                pass_3x4(w, k, x + 4 * q * ldx, ldx, s0 + 8 * g, s1, part[q][g]);
            }
    }
    for (size_t q = 0; q < quads; q++)
        for (size_t j = 0; j < 3; j++)
            for (size_t r = 0; r < 4; r++)
                out[(4 * q + r) * ldo + j] =
                    reduce_regs(part[q][0][4 * j + r], part[q][1][4 * j + r],
                                part[q][2][4 * j + r], part[q][3][4 * j + r]);
}

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* col_dot_f32 of R weight rows (R <= 3) with M activation rows (4 <= M <= 8), bit for bit, in
 * 16-lane registers: one half of every 32-lane block (lanes 16 h .. 16 h + 15, which hold
 * col_dot_f32's a0 | a1 for h = 0 and a2 | a3 for h = 1) per pass over k, R x M accumulators
 * (at most 24 of the 32 registers); each lane accumulates the same products in the same order
 * and reduce_halves finishes with col_dot_f32's tree. Why 16 lanes: with 8 rows an 8-lane
 * kernel issues one multiply-add per weight float, and on a 2-vCPU Zen 5 EPYC whose two
 * threads share one core's two FMA pipes (7.4 G FMA instructions/s for one thread or two) that
 * caps it near 30 GB/s of weights, below what memory delivers; 16 lanes halve the
 * instructions. The next tile's `pf_lines` lines at `pf` are prefetched into L2 `per_step` per
 * inner step, as tile_3x4 does (on Zen 4, 4-8 rows: 1.6x / 1.28x the GB/s of an L1 prefetch
 * at 4 / 8 rows; the engine's 8-row step 1.15x).
 * Inlined into one function per (R, M), so the loops over them unroll into registers.
 * x's rows must start on 64-byte lines (col_rows_aligned): a 16-lane load off a line touches
 * two, and the activations' loads are 8 of a step's 11 (8 rows on 256 MiB of weights: 21.6
 * GB/s with rows 16 bytes off, 33.0 aligned); col_dot_block sends other rows to the avx2
 * tiles, and the products align theirs first (col_align_rows). */
static inline __attribute__((always_inline)) void tile16(
    size_t R, size_t M, const float *w, size_t k, const float *x, size_t ldx, float *out,
    size_t ldo, const char *pf, size_t pf_lines, size_t per_step) {
    __m512 part[2][3][8];
    size_t done = 0;
    for (size_t h = 0; h < 2; h++) {
        __m512 acc[3][8];
#pragma GCC unroll 3
        for (size_t j = 0; j < R; j++)
#pragma GCC unroll 8
            for (size_t r = 0; r < M; r++) acc[j][r] = _mm512_setzero_ps();
        for (size_t i = 16 * h; i < k; i += 32) {
            for (size_t q = 0; q < per_step && done < pf_lines; q++)
                _mm_prefetch(pf + 64 * done++, _MM_HINT_T1);
            __m512 u[3];
#pragma GCC unroll 3
            for (size_t j = 0; j < R; j++) u[j] = _mm512_loadu_ps(w + j * k + i);
#pragma GCC unroll 8
            for (size_t r = 0; r < M; r++) {
                __m512 y = _mm512_loadu_ps(x + r * ldx + i);
#pragma GCC unroll 3
                for (size_t j = 0; j < R; j++) acc[j][r] = _mm512_fmadd_ps(u[j], y, acc[j][r]);
            }
        }
#pragma GCC unroll 3
        for (size_t j = 0; j < R; j++)
#pragma GCC unroll 8
            for (size_t r = 0; r < M; r++) part[h][j][r] = acc[j][r];
    }
    for (size_t j = 0; j < R; j++)
        for (size_t r = 0; r < M; r++)
            out[r * ldo + j] = reduce_halves(part[0][j][r], part[1][j][r]);
}

typedef void (*tile16_fn)(const float *, size_t, const float *, size_t, float *, size_t,
                          const char *, size_t, size_t);
#define TILE16_FN(R, M)                                                                     \
    static void tile16_##R##x##M(const float *w, size_t k, const float *x, size_t ldx,       \
                                 float *out, size_t ldo, const char *pf, size_t pf_lines,    \
                                 size_t per_step) {                                          \
        tile16(R, M, w, k, x, ldx, out, ldo, pf, pf_lines, per_step);                        \
    }
#define TILE16_ROWS(R) \
    TILE16_FN(R, 4) TILE16_FN(R, 5) TILE16_FN(R, 6) TILE16_FN(R, 7) TILE16_FN(R, 8)
TILE16_ROWS(1)
TILE16_ROWS(2)
TILE16_ROWS(3)
#define TILE16_ENTRY(R) \
    {NULL, NULL, NULL, NULL, tile16_##R##x4, tile16_##R##x5, tile16_##R##x6, tile16_##R##x7, \
     tile16_##R##x8}
/* [R][M]: the kernel for R weight rows and M activation rows. */
static const tile16_fn TILE16[4][9] = {{NULL}, TILE16_ENTRY(1), TILE16_ENTRY(2),
                                       TILE16_ENTRY(3)};

/* Fewest activation rows the 16-lane tiles take (TILE16 has kernels from 4): fewer stream
 * one weight row at a time, as in the avx2 build (16-lane tiles from 2 or 3 rows measured
 * 0.99-1.01x in the engine). */
#define TILE16_MIN_ROWS 4

/* Weight rows n0 .. n1 against m activation rows (TILE16_MIN_ROWS <= m <= 8, k % 32 == 0),
 * three weight rows at a time, each tile prefetching the next. */
static void dot_block16(const float *w, size_t n0, size_t n1, const float *x, size_t m,
                        size_t ldx, size_t k, float *out, size_t ldo) {
    /* The next tile's lines over this tile's 2 passes x k / 32 inner steps. */
    size_t pf_lines = 3 * k * sizeof(float) / 64, steps = k / 16;
    size_t per_step = (pf_lines + steps - 1) / steps;
    for (size_t n = n0; n < n1;) {
        size_t rows = n1 - n < 3 ? n1 - n : 3;
        const float *wn = w + n * k;
        size_t lines = n + rows + 3 <= n1 ? pf_lines : 0; /* no prefetch past the block */
        TILE16[rows][m](wn, k, x, ldx, out + n, ldo, (const char *)(wn + rows * k), lines,
                        per_step);
        n += rows;
    }
}
#endif

/* Rows r0 .. m of x against weight row wn, two or three at a time (dot_1x2 / dot_1x3, then
 * one col_dot_f32): the row streams once, prefetched a page ahead (FAR_AHEAD). */
static void row_major(const float *wn, size_t k, const float *x, size_t ldx, size_t r0,
                      size_t m, float *out, size_t ldo) {
    size_t r = r0;
    for (; m - r >= 2; r += m - r == 3 || m - r == 5 ? 3 : 2)
        (m - r == 3 || m - r == 5 ? dot_1x3 : dot_1x2)(wn, k, x + r * ldx, ldx, out + r * ldo,
                                                       ldo);
    if (r < m) out[r * ldo] = col_dot_f32(wn, x + r * ldx, k);
}
#endif

/* Weight rows per tile of col_dot_block: a tile stays in L2 while every block of activation
 * rows passes over it. */
#define DOT_TILE_BYTES ((size_t)256 << 10)
/* Up to this many activation rows col_dot_block walks weight rows one at a time. */
#define DOT_ROW_MAJOR 8
/* Activation rows per block when more than DOT_ROW_MAJOR meet one weight tile (a prefill):
 * as many as one 16-lane tile takes, or one 3 x 4 tile's four, whose 16 KiB (k = 1024) stay
 * in a 32 KiB L1 across the weight tile. Measured on a 2-core EPYC Zen 4, k 1024, one thread
 * from memory, paired: the avx2 build 1.53x / 1.26x 2 x 4 register blocks at 16 / 64 rows in
 * blocks of 4, 1.27x / 1.01x in blocks of 8; the avx512 build 1.69x / 1.17x in blocks of 8,
 * 1.62x / 1.10x in blocks of 4 (both builds compared without the later blocks' prefetch,
 * which the avx512 build then kept: 1.02-1.07x). */
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define DOT_BLOCK_ROWS 8
#else
#define DOT_BLOCK_ROWS 4
#endif

int col_dot_wants_aligned(size_t m) {
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
    return m >= TILE16_MIN_ROWS;
#else
    (void)m;
    return 0;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
/* Weight rows n0 .. n1 against 2 <= m <= DOT_ROW_MAJOR activation rows (k % 32 == 0): a
 * decode batch, or one block of a larger product's rows. `from_memory`: the weights are not
 * in cache yet, so each 3 x 4 tile prefetches the next; a block after a tile's first meets
 * weights already in L2, and those prefetches then only cost issue slots (avx2 build, 2-core
 * EPYC Zen 4, k 1024, one thread, paired: 0.66-0.76x the GB/s at 16-64 rows with them). The
 * 16-lane tiles prefetch either way (1.02-1.07x with them there). */
static void dot_block_few(const float *w, size_t n0, size_t n1, const float *x, size_t m,
                          size_t ldx, size_t k, float *out, size_t ldo, int from_memory) {
    size_t n = n0;
#if defined(__AVX512F__)
    if (col_dot_wants_aligned(m) && col_rows_aligned(x, ldx)) {
        dot_block16(w, n0, n1, x, m, ldx, k, out, ldo);
        return;
    }
#endif
    /* Four to eight rows: tiles of three weight rows meet the activations four rows at a
     * time in registers (tile_3x4), the rest of the rows two or three at a time; measured
     * 13.8 vs 11.7 GB/s at 8 rows (dot_1x2 four times per weight row starves on the
     * activations' loads). Fewer rows (an expert's share of a batch): each weight row
     * streams from memory once, in order (row_major). */
    size_t quads = m >= 4 ? m / 4 : 0;
    for (; quads && n + 3 <= n1; n += 3) {
        const float *wn = w + n * k;
        /* no prefetch past the block, nor of weights already in cache */
        const char *next = from_memory && n + 6 <= n1 ? (const char *)(wn + 3 * k) : NULL;
        tile_3x4(wn, k, x, ldx, quads, out + n, ldo, next, from_memory ? TILE_SEGMENT : k);
        for (size_t j = 0; j < 3 && 4 * quads < m; j++)
            row_major(wn + j * k, k, x, ldx, 4 * quads, m, out + n + j, ldo);
    }
    for (; n < n1; n++) row_major(w + n * k, k, x, ldx, 0, m, out + n, ldo);
}
#endif

void col_dot_block(const float *w, size_t n0, size_t n1, const float *x, size_t m, size_t ldx,
                   size_t k, float *out, size_t ldo) {
    if (m == 1) {
        /* One row at a time, no software prefetch: a single sequential stream per thread is
         * what the hardware prefetcher follows best. Measured against two rows in flight with
         * the next pair prefetched, on a 2-core EPYC: 19 vs 17 GB/s on
         * 2048 x 1024 weights, a decode step of the bench model 29.5 vs 32.4 ms. */
        for (size_t n = n0; n < n1; n++) out[n] = col_dot_f32(w + n * k, x, k);
        return;
    }
    /* Many activation rows (a prefill, a large batch): a tile of weight rows, read from memory
     * once, stays in L2 while the activations meet it DOT_BLOCK_ROWS rows at a time through a
     * decode batch's kernels (the 16-lane or 3 x 4 register tiles), rather than every
     * activation row streaming from L2 for each weight row. Only the loop order changes:
     * each element is still one col_dot_f32. */
    size_t tile = DOT_TILE_BYTES / (k * sizeof(float));
    if (tile == 0) tile = 1;
#if defined(__AVX2__) && defined(__FMA__)
    if (k % 32 == 0) {
        if (m <= DOT_ROW_MAJOR) {
            dot_block_few(w, n0, n1, x, m, ldx, k, out, ldo, 1);
            return;
        }
        for (size_t t0 = n0; t0 < n1; t0 += tile) {
            size_t t1 = n1 - t0 < tile ? n1 : t0 + tile;
            for (size_t r = 0; r < m; r += DOT_BLOCK_ROWS) {
                size_t nr = m - r < DOT_BLOCK_ROWS ? m - r : DOT_BLOCK_ROWS;
                if (nr == 1)
                    for (size_t n = t0; n < t1; n++)
                        out[r * ldo + n] = col_dot_f32(w + n * k, x + r * ldx, k);
                else
                    dot_block_few(w, t0, t1, x + r * ldx, nr, ldx, k, out + r * ldo, ldo, r == 0);
            }
        }
        return;
    }
#endif
    for (size_t t0 = n0; t0 < n1; t0 += tile) {
        size_t t1 = n1 - t0 < tile ? n1 : t0 + tile;
        for (size_t r = 0; r < m; r += 4) {
            size_t nr = m - r < 4 ? m - r : 4;
            for (size_t n = t0; n < t1; n++)
                col_dot_rows(w + n * k, x + r * ldx, nr, ldx, k, out + r * ldo + n, ldo);
        }
    }
}

/* Four dot products of one weight row w with x, x + ldx, x + 2 ldx, x + 3 ldx: each is
 * exactly col_dot_f32(w, x_r, k) (the same lanes, the same operations in the same order);
 * only w's loads are shared, so a batch's rows cost one weight read per four rows. */
void col_dot4_f32(const float *w, const float *x, size_t ldx, size_t k, float *out) {
    float lanes[4][32];
    size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    for (int half = 0; half < 2; half++) {
        /* lanes 16 half .. 16 half + 15 of all four rows: 8 accumulators + one weight load */
        size_t o = 16 * (size_t)half;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0,
               d1 = a0;
        for (i = 0; i + 32 <= k; i += 32) {
            __m256 w0 = _mm256_loadu_ps(w + i + o), w1 = _mm256_loadu_ps(w + i + o + 8);
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i + o), a0);
            a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + i + o + 8), a1);
            b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i + o), b0);
            b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + i + o + 8), b1);
            c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x2 + i + o), c0);
            c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x2 + i + o + 8), c1);
            d0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x3 + i + o), d0);
            d1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x3 + i + o + 8), d1);
        }
        _mm256_storeu_ps(lanes[0] + o, a0);
        _mm256_storeu_ps(lanes[0] + o + 8, a1);
        _mm256_storeu_ps(lanes[1] + o, b0);
        _mm256_storeu_ps(lanes[1] + o + 8, b1);
        _mm256_storeu_ps(lanes[2] + o, c0);
        _mm256_storeu_ps(lanes[2] + o + 8, c1);
        _mm256_storeu_ps(lanes[3] + o, d0);
        _mm256_storeu_ps(lanes[3] + o + 8, d1);
    }
#else
    for (size_t r = 0; r < 4; r++)
        for (size_t j = 0; j < 32; j++) lanes[r][j] = 0.0f;
    for (; i + 32 <= k; i += 32)
        for (size_t r = 0; r < 4; r++)
            for (size_t j = 0; j < 32; j++) lanes[r][j] += w[i + j] * x[r * ldx + i + j];
#endif
    for (size_t r = 0; r < 4; r++) {
        for (size_t j = 0; i + j < k; j++) lanes[r][j] += w[i + j] * x[r * ldx + i + j];
        out[r] = reduce32(lanes[r]);
    }
}

void col_dot_rows(const float *w, const float *x, size_t m, size_t ldx, size_t k, float *out,
                  size_t ldo) {
    size_t r = 0;
    float four[4];
    for (; r + 4 <= m; r += 4) {
        col_dot4_f32(w, x + r * ldx, ldx, k, four);
        for (size_t j = 0; j < 4; j++) out[(r + j) * ldo] = four[j];
    }
    for (; r < m; r++) out[r * ldo] = col_dot_f32(w, x + r * ldx, k);
}

float col_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 0) {
        f = (float)man * 0x1p-24f; /* zero or subnormal: exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* Row `index` of a [*, k] weight as float32 (exact: bf16 and f16 embed in float32). */
int col_row_to_f32(const void *w, int dtype, size_t index, size_t k, float *out) {
    switch (dtype) {
    case COL_F32:
        memcpy(out, (const float *)w + index * k, k * sizeof(float));
        return COL_OK;
    case COL_BF16: {
        const uint16_t *src = (const uint16_t *)w + index * k;
        for (size_t i = 0; i < k; i++) {
            uint32_t bits = (uint32_t)src[i] << 16;
            memcpy(out + i, &bits, 4);
        }
        return COL_OK;
    }
    case COL_F16: {
        const uint16_t *src = (const uint16_t *)w + index * k;
        for (size_t i = 0; i < k; i++) out[i] = col_f16_to_f32(src[i]);
        return COL_OK;
    }
    default:
        return COL_EDTYPE;
    }
}
