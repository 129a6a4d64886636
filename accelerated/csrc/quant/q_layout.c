/* Per-format byte arithmetic, decoders and scale lookup (spec/model.md §14), plus the content
 * scan of coli_q_check. Decoders yield the unscaled value q of each weight (w = q * s_group). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quant/coli_quant_tables.h"
#include "quant/q_internal.h"


static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

float coli_qi_e8_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0)
        bits = man ? (sign | (113u << 23) | (man << 13)) : sign;
    else if (exp == 0x1F)
        bits = sign | 0x7F800000u | (man << 13);
    else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Byte -> decoded values tables, built by the preprocessor (no start-up code, no data file). */
#define Q_REP4(M, b) M(b) M((b) + 1) M((b) + 2) M((b) + 3)
#define Q_REP16(M, b) Q_REP4(M, b) Q_REP4(M, (b) + 4) Q_REP4(M, (b) + 8) Q_REP4(M, (b) + 12)
#define Q_REP64(M, b) Q_REP16(M, b) Q_REP16(M, (b) + 16) Q_REP16(M, (b) + 32) Q_REP16(M, (b) + 48)
#define Q_REP256(M) Q_REP64(M, 0) Q_REP64(M, 64) Q_REP64(M, 128) Q_REP64(M, 192)

#define Q_FIELD(b, shift, mask, bias) (float)((((b) >> (shift)) & (mask)) - (bias))
#define Q_INT4(b) {Q_FIELD(b, 0, 15, 8), Q_FIELD(b, 4, 15, 8)},
#define Q_INT2(b) {Q_FIELD(b, 0, 3, 2), Q_FIELD(b, 2, 3, 2), Q_FIELD(b, 4, 3, 2), Q_FIELD(b, 6, 3, 2)},
#define Q_LOW2(b) {Q_FIELD(b, 0, 3, 0), Q_FIELD(b, 2, 3, 0), Q_FIELD(b, 4, 3, 0), Q_FIELD(b, 6, 3, 0)},
#define Q_HIGH1(b)                                                                                \
    {Q_FIELD(b, 0, 1, 0) * 4, Q_FIELD(b, 1, 1, 0) * 4, Q_FIELD(b, 2, 1, 0) * 4,                    \
     Q_FIELD(b, 3, 1, 0) * 4, Q_FIELD(b, 4, 1, 0) * 4, Q_FIELD(b, 5, 1, 0) * 4,                    \
     Q_FIELD(b, 6, 1, 0) * 4, Q_FIELD(b, 7, 1, 0) * 4},
#define Q_SIGN(b)                                                                                 \
    {1 - 2 * Q_FIELD(b, 0, 1, 0), 1 - 2 * Q_FIELD(b, 1, 1, 0), 1 - 2 * Q_FIELD(b, 2, 1, 0),       \
     1 - 2 * Q_FIELD(b, 3, 1, 0), 1 - 2 * Q_FIELD(b, 4, 1, 0), 1 - 2 * Q_FIELD(b, 5, 1, 0),       \
     1 - 2 * Q_FIELD(b, 6, 1, 0), 1 - 2 * Q_FIELD(b, 7, 1, 0)},

static const float LUT_INT4[256][2] = {Q_REP256(Q_INT4)};  /* q = u - 8 per nibble */
static const float LUT_INT2[256][4] = {Q_REP256(Q_INT2)};  /* q = u - 2 per 2-bit field */
static const float LUT_LOW2[256][4] = {Q_REP256(Q_LOW2)};  /* int3 low plane, unbiased */
static const float LUT_HIGH1[256][8] = {Q_REP256(Q_HIGH1)}; /* int3 high plane: bit * 4 */
static const float LUT_SIGN[256][8] = {Q_REP256(Q_SIGN)};  /* e8: bit set -> -1 */

#if defined(__AVX2__)
#include <immintrin.h>

static void decode_int8(const uint8_t *row, int64_t col, int n, float *out) {
    const uint8_t *q = row + col;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(q + j));
        _mm256_storeu_ps(out + j, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
    }
    for (; j < n; j++) out[j] = (float)(int8_t)q[j];
}

/* 16 bytes -> 32 nibbles in column order, minus 8, as 4 x 8 floats. */
static void decode_int4(const uint8_t *row, int64_t col, int n, float *out) {
    const uint8_t *b = row + col / 2;
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + j / 2));
        __m128i lo = _mm_and_si128(v, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        __m128i c0 = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
        __m128i c1 = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
        _mm256_storeu_ps(out + j, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0)));
        _mm256_storeu_ps(out + j + 8,
                         _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8))));
        _mm256_storeu_ps(out + j + 16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1)));
        _mm256_storeu_ps(out + j + 24,
                         _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8))));
    }
    for (; j + 2 <= n; j += 2) memcpy(out + j, LUT_INT4[b[j / 2]], 2 * sizeof(float));
    if (j < n) out[j] = LUT_INT4[b[j / 2]][0];
}
#else
static void decode_int8(const uint8_t *row, int64_t col, int n, float *out) {
    const int8_t *q = (const int8_t *)(row + col);
    for (int j = 0; j < n; j++) out[j] = (float)q[j];
}

/* col is even: chunks start at multiples of 8. */
static void decode_int4(const uint8_t *row, int64_t col, int n, float *out) {
    const uint8_t *b = row + col / 2;
    int j = 0;
    for (; j + 2 <= n; j += 2) memcpy(out + j, LUT_INT4[b[j / 2]], 2 * sizeof(float));
    if (j < n) out[j] = LUT_INT4[b[j / 2]][0];
}
#endif

static void decode_int2(const uint8_t *row, int64_t col, int n, float *out) {
    const uint8_t *b = row + col / 4;
    int j = 0;
    for (; j + 4 <= n; j += 4) memcpy(out + j, LUT_INT2[b[j / 4]], 4 * sizeof(float));
    for (int k = 0; j + k < n; k++) out[j + k] = LUT_INT2[b[j / 4]][k];
}

/* Columns within one 64-column group: q = low + 4 * high - 4. */
static void decode_int3(const uint8_t *row, int64_t col, int n, float *out) {
    const uint8_t *g = row + (col / COLI_Q_INT3_GROUP) * COLI_Q_INT3_GROUP_BYTES;
    int e0 = (int)(col % COLI_Q_INT3_GROUP);
    float low[COLI_Q_INT3_GROUP], high[COLI_Q_INT3_GROUP];
    for (int k = 0; k < 16; k++) memcpy(low + 4 * k, LUT_LOW2[g[k]], 4 * sizeof(float));
    for (int k = 0; k < 8; k++) memcpy(high + 8 * k, LUT_HIGH1[g[16 + k]], 8 * sizeof(float));
    for (int k = 0; k < n; k++) out[k] = (low[e0 + k] + high[e0 + k]) - 4.0f;
}

static void decode_fp8(const uint8_t *row, int64_t col, int n, float *out) {
    const uint8_t *q = row + col;
    for (int j = 0; j < n; j++) out[j] = coli_q_e4m3_lut[q[j]];
}

/* A chunk is one 32-weight sub-block: +-grid/2, the sub-block's db is its group scale. */
static void decode_e8(const uint8_t *row, int64_t col, int n, float *out) {
    (void)n;
    const uint8_t *blk = row + (col / COLI_Q_E8_BLOCK) * COLI_Q_E8_BLOCK_BYTES;
    int ib = (int)((col % COLI_Q_E8_BLOCK) / 32);
    const uint8_t *idx = blk + 8 * ib;
    uint32_t word = le32(blk + 64 + 4 * ib);
    for (int l = 0; l < 4; l++) {
        uint32_t seven = (word >> (7 * l)) & 0x7F;
        uint32_t par = seven ^ (seven >> 4);
        par ^= par >> 2;
        par ^= par >> 1;
        const float *sign = LUT_SIGN[seven | ((par & 1) << 7)];
        const float *g0 = coli_q_iq3_gridf[idx[2 * l]];
        const float *g1 = coli_q_iq3_gridf[idx[2 * l + 1]];
        float *o = out + 8 * l;
        for (int j = 0; j < 4; j++) {
            o[j] = g0[j] * sign[j];
            o[4 + j] = g1[j] * sign[4 + j];
        }
    }
}

float coli_qi_group_scale(const qlayout *L, int64_t o, int64_t g) {
    switch (L->fmt) {
    case COLI_Q_INT8_ROW:
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT2_ROW:
        return L->scales[o];
    case COLI_Q_FP8_E4M3_B128:
        return L->scales[(o / COLI_Q_FP8_BLOCK) * L->groups_per_row + g];
    case COLI_Q_E8_IQ3: {
        const uint8_t *blk = L->packed + o * L->row_bytes + (g / 8) * COLI_Q_E8_BLOCK_BYTES;
        float d = coli_qi_e8_half(le16(blk + 96));
        uint32_t code = le32(blk + 64 + 4 * (g % 8)) >> 28;
        return (d * (0.5f + (float)code)) * 0.5f;
    }
    default: /* int4-grouped, int3-g64 */
        return L->scales[o * L->groups_per_row + g];
    }
}

int coli_q_sizes(int fmt, int group_size, int64_t out_features, int64_t in_features,
                 int64_t *payload_bytes, int64_t *n_scales) {
    return coli_q_size_rule(fmt, group_size, out_features, in_features, payload_bytes,
                            n_scales);
}

int coli_qi_layout_init(qlayout *L, int fmt, int group_size, const uint8_t *packed,
                  int64_t packed_len, const float *scales, int64_t n_scales,
                  int64_t out_features, int64_t in_features) {
    int64_t want_bytes = 0, want_scales = 0;
    int rc = coli_q_sizes(fmt, group_size, out_features, in_features, &want_bytes, &want_scales);
    if (rc != COLI_Q_OK) return rc;
    if (packed_len != want_bytes) return COLI_Q_EPAYLOAD;
    if (n_scales != want_scales) return COLI_Q_ESCALES;
    if (packed == NULL || scales == NULL) return COLI_Q_ENULL;
    if (fmt == COLI_Q_E8_IQ3 && scales[0] != 6.0f) return COLI_Q_ETAG;
    int64_t I = in_features;
    L->fmt = fmt;
    L->out_features = out_features;
    L->in_features = I;
    L->row_bytes = want_bytes / out_features;
    L->packed = packed;
    L->scales = scales;
    switch (fmt) {
    case COLI_Q_INT8_ROW:
        L->group = I;
        L->decode = decode_int8;
        break;
    case COLI_Q_INT4_ROW:
        L->group = I;
        L->decode = decode_int4;
        break;
    case COLI_Q_INT2_ROW:
        L->group = I;
        L->decode = decode_int2;
        break;
    case COLI_Q_INT4_GROUPED:
        L->group = group_size;
        L->decode = decode_int4;
        break;
    case COLI_Q_INT3_G64:
        L->group = COLI_Q_INT3_GROUP;
        L->decode = decode_int3;
        break;
    case COLI_Q_E8_IQ3:
        L->group = 32;
        L->decode = decode_e8;
        break;
    default: /* fp8 */
        L->group = COLI_Q_FP8_BLOCK;
        L->decode = decode_fp8;
        break;
    }
    L->groups_per_row = coli_q_ceil_div(I, L->group);
    L->fused = coli_qi_fused_for(fmt);
    L->fused_row = coli_qi_fused_row_for(fmt, L->group);
    L->fused_row2 = coli_qi_fused_row2_for(fmt, L->group);
    L->fused_row3 = coli_qi_fused_row3_for(fmt, L->group, in_features);
    L->fused_row4 = coli_qi_fused_row4_for(fmt, L->group, in_features);
    L->fused_tile = coli_qi_fused_tile_for(fmt, L->group, in_features);
    return COLI_Q_OK;
}

int coli_q_check(int fmt, int group_size, const uint8_t *packed, int64_t packed_len,
                 const float *scales, int64_t n_scales, int64_t out_features,
                 int64_t in_features) {
    qlayout L;
    int rc = coli_qi_layout_init(&L, fmt, group_size, packed, packed_len, scales, n_scales,
                           out_features, in_features);
    if (rc != COLI_Q_OK) return rc;
    if (fmt == COLI_Q_E8_IQ3) {
        for (int64_t b = 0; b < packed_len; b += COLI_Q_E8_BLOCK_BYTES)
            if (!isfinite(coli_qi_e8_half(le16(packed + b + 96)))) return COLI_Q_ENONFINITE;
        return COLI_Q_OK;
    }
    for (int64_t k = 0; k < n_scales; k++)
        if (!isfinite(scales[k])) return COLI_Q_ENONFINITE;
    if (fmt == COLI_Q_FP8_E4M3_B128)
        for (int64_t k = 0; k < packed_len; k++)
            if ((packed[k] & 0x7F) == 0x7F) return COLI_Q_ENAN;
    return COLI_Q_OK;
}

void coli_q_tables(uint8_t grid_out[1024], float e4m3_out[256]) {
    if (grid_out) memcpy(grid_out, coli_q_iq3_grid, sizeof coli_q_iq3_grid);
    if (e4m3_out) memcpy(e4m3_out, coli_q_e4m3_lut, sizeof coli_q_e4m3_lut);
}

const char *coli_q_strerror(int code) {
    switch (code) {
    case COLI_Q_OK: return "ok";
    case COLI_Q_EFORMAT: return "unknown quantized format";
    case COLI_Q_ESHAPE: return "bad matrix shape for the format";
    case COLI_Q_EPAYLOAD: return "packed byte count does not fit the shape and format";
    case COLI_Q_ESCALES: return "scale count does not fit the shape and format";
    case COLI_Q_EGROUP: return "int4-grouped group size is not 16/32/48/64/96/128/192/256";
    case COLI_Q_ERANGE: return "output range outside [0, out_features]";
    case COLI_Q_ESTRIDE: return "row stride shorter than its row, or negative row count";
    case COLI_Q_ENULL: return "required pointer is NULL";
    case COLI_Q_ENONFINITE: return "non-finite scale";
    case COLI_Q_ENAN: return "fp8 payload holds an e4m3 NaN byte";
    case COLI_Q_ETAG: return "e8 .qs is not the single tag 6.0";
    case COLI_Q_ENOMEM: return "out of memory";
    default: return "unknown error code";
    }
}
