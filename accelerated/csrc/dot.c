/* The one dot product every kernel uses, and exact weight-row conversion (spec §1).
 *
 * Summation order (fixed in the source, the same for every caller): element i goes to lane
 * i mod 32; lanes are then added pairwise as a tree (lane j += lane j + 16, + 8, + 4, + 2,
 * + 1). The avx2 variant computes the same lanes with fused multiply-adds (one rounding
 * instead of two), so the two variants agree within kind-(b) tolerance, and each is
 * deterministic on its own. */
#include <string.h>

#include "colibri.h"

#if defined(__AVX2__) && defined(__FMA__)
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
    default: return "unknown error";
    }
}

static float reduce32(float *l) {
    for (size_t s = 16; s >= 1; s /= 2)
        for (size_t j = 0; j < s; j++) l[j] += l[j + s];
    return l[0];
}

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
