/* The device math of the CUDA kernels that is not CUDA: per-format element decoding, scale
 * lookup, size rules, float conversions, and the per-lane summation order of the products.
 *
 * Written in the subset of C11 and CUDA C++ that both compilers accept: under nvcc every
 * function is __host__ __device__, under the system cc it is plain static inline C. The .cu
 * kernels include it for their arithmetic; the CPU test suite compiles it with cc (no nvcc,
 * no GPU) into a small shim (tests/support/cuda_shim.c) and checks it, bit for bit, against
 * the CPU library's kernels and the reference's decoders for every format. That is why as
 * much of the index arithmetic as possible lives here and not in the .cu files.
 *
 * Summation order (the CPU library's, csrc/dot.c and csrc/quant/coli_quant.h): a product's
 * output element is one warp; lane l owns the input columns c = l (mod 32).
 *   - float weights: lane l accumulates p += w[c] * x[c] over the whole 32-column blocks
 *     (fused multiply-add where the avx2 build uses FMA), then the tail column of lane l, if
 *     any, with two roundings (the avx2 build's scalar tail);
 *   - quantized weights: per scale group g, lane l sums p += q[c] * x[c] over its columns of
 *     the group in ascending order (q the unscaled decoded value), then t += s_g * p.
 * The lanes then meet in the CPU build's tree (ccu_warp_tree, ccu_orders.h).
 * `fused` selects fmaf (the avx2 build's bits) or a multiply and an add each rounded (the
 * generic build's bits). On the device the products and sums are __fmul_rn / __fadd_rn,
 * which nvcc never contracts; on the host the shim is compiled with -ffp-contract=off. */
#ifndef CCU_FORMATS_H
#define CCU_FORMATS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/coli_quant.h"
#include "quant/q_sizes.h"

#ifdef __CUDACC__
#define CCU_HD static __host__ __device__ inline
#else
#define CCU_HD static inline
#endif

/* Format ordinals, return codes, block constants and size rules are csrc/quant's own
 * (coli_quant.h, q_sizes.h: COLI_Q_*), so the CPU and CUDA libraries cannot disagree on a
 * number. */

/* Float weight dtypes (csrc/colibri.h's COL_F32, COL_BF16, COL_F16). */
enum { CCU_F32 = 0, CCU_BF16 = 1, CCU_F16 = 2 };

#define CCU_ROT_MAX_BLOCK 32768

/* --- exact arithmetic primitives ------------------------------------------------------- */

CCU_HD float ccu_bits_f32(uint32_t b) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
#endif
}

CCU_HD uint32_t ccu_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
#endif
}

CCU_HD float ccu_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

CCU_HD float ccu_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

CCU_HD float ccu_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

/* c + a * b: one rounding (fused) or two. */
CCU_HD float ccu_madd(int fused, float a, float b, float c) {
    return fused ? fmaf(a, b, c) : ccu_add(ccu_mul(a, b), c);
}

/* --- float conversions (all exact) ------------------------------------------------------ */

CCU_HD float ccu_bf16_to_f32(uint16_t h) { return ccu_bits_f32((uint32_t)h << 16); }

/* IEEE half -> float, subnormals exact (csrc/dot.c col_f16_to_f32). */
CCU_HD float ccu_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) return ccu_bits_f32(ccu_f32_bits(ccu_mul((float)man, 0x1p-24f)) | sign);
    if (exp == 31) return ccu_bits_f32(sign | 0x7f800000u | (man << 13));
    return ccu_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* fmt6's fp16 super-scale as colibri decodes it: a subnormal half m reads as
 * 2^-14 (1 + m/1024) (spec §14; csrc/quant/q_layout.c coli_qi_e8_half). */
CCU_HD float ccu_e8_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) return ccu_bits_f32(man ? (sign | (113u << 23) | (man << 13)) : sign);
    if (exp == 0x1f) return ccu_bits_f32(sign | 0x7f800000u | (man << 13));
    return ccu_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* OCP e4m3fn: bias 7, subnormals m * 2^-9, 0x7f / 0xff NaN (the loader refuses them). */
CCU_HD float ccu_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b >> 7) << 31;
    uint32_t exp = (b >> 3) & 0xfu, man = b & 7u;
    if (exp == 15 && man == 7) return ccu_bits_f32(sign | 0x7fc00000u);
    if (exp == 0) return ccu_bits_f32(ccu_f32_bits(ccu_mul((float)man, 0x1p-9f)) | sign);
    return ccu_bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

CCU_HD uint32_t ccu_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

CCU_HD uint16_t ccu_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* --- size rules: csrc/quant/q_sizes.h's coli_q_size_rule, the CPU library's own ---- */

/* Columns per scale group: the whole row, gs, 64, one 32-weight e8 sub-block, 128. */
CCU_HD int64_t ccu_q_group(int fmt, int gs, int64_t I) {
    switch (fmt) {
    case COLI_Q_INT4_GROUPED: return gs;
    case COLI_Q_INT3_G64: return COLI_Q_INT3_GROUP;
    case COLI_Q_E8_IQ3: return 32;
    case COLI_Q_FP8_E4M3_B128: return COLI_Q_FP8_BLOCK;
    default: return I;
    }
}

/* A validated quantized matrix as the kernels read it (host or device addresses). */
typedef struct {
    int fmt;
    int64_t out_features, in_features;
    int64_t row_bytes, group, groups_per_row;
    const uint8_t *packed;
    const float *scales;
} ccu_qview;

/* Checks the sizes (not the content: ccu_q_check_content) and fills *v. */
CCU_HD int ccu_qview_init(ccu_qview *v, int fmt, int gs, const uint8_t *packed,
                          int64_t packed_len, const float *scales, int64_t n_scales, int64_t O,
                          int64_t I) {
    int64_t want_bytes = 0, want_scales = 0;
    int rc = coli_q_size_rule(fmt, gs, O, I, &want_bytes, &want_scales);
    if (rc != COLI_Q_OK) return rc;
    if (packed_len != want_bytes) return COLI_Q_EPAYLOAD;
    if (n_scales != want_scales) return COLI_Q_ESCALES;
    if (packed == NULL || scales == NULL) return COLI_Q_ENULL;
    v->fmt = fmt;
    v->out_features = O;
    v->in_features = I;
    v->row_bytes = want_bytes / O;
    v->group = ccu_q_group(fmt, gs, I);
    v->groups_per_row = coli_q_ceil_div(I, v->group);
    v->packed = packed;
    v->scales = scales;
    return COLI_Q_OK;
}

/* What coli_q_check scans beyond the sizes: the e8 tag and finite super-scales, finite
 * scales, no fp8 NaN byte. Host memory only (run before any upload). */
CCU_HD int ccu_q_check_content(const ccu_qview *v, int64_t n_scales) {
    int64_t len = v->row_bytes * v->out_features;
    if (v->fmt == COLI_Q_E8_IQ3) {
        if (v->scales[0] != 6.0f) return COLI_Q_ETAG;
        for (int64_t b = 0; b < len; b += COLI_Q_E8_BLOCK_BYTES)
            if (!isfinite(ccu_e8_half(ccu_le16(v->packed + b + 96)))) return COLI_Q_ENONFINITE;
        return COLI_Q_OK;
    }
    for (int64_t k = 0; k < n_scales; k++)
        if (!isfinite(v->scales[k])) return COLI_Q_ENONFINITE;
    if (v->fmt == COLI_Q_FP8_E4M3_B128)
        for (int64_t k = 0; k < len; k++)
            if ((v->packed[k] & 0x7f) == 0x7f) return COLI_Q_ENAN;
    return COLI_Q_OK;
}

/* --- per-element decoding (spec §14): the unscaled value q, w = q * s_group ------------- */

CCU_HD float ccu_int4_at(const uint8_t *row, int64_t c) {
    uint8_t b = row[c / 2];
    return (float)((int)((c & 1) ? (b >> 4) : (b & 15)) - 8); /* low nibble first */
}

CCU_HD float ccu_int2_at(const uint8_t *row, int64_t c) {
    return (float)((int)((row[c / 4] >> (2 * (c % 4))) & 3) - 2);
}

/* 64-column groups of 24 bytes: 16 bytes of 2-bit low fields, then 8 bytes of high bits;
 * q = (low + 4 high) - 4. */
CCU_HD float ccu_int3_at(const uint8_t *row, int64_t c) {
    const uint8_t *g = row + (c / COLI_Q_INT3_GROUP) * COLI_Q_INT3_GROUP_BYTES;
    int e = (int)(c % COLI_Q_INT3_GROUP);
    float low = (float)((g[e / 4] >> (2 * (e % 4))) & 3);
    float high = (float)(((g[16 + e / 8] >> (e % 8)) & 1) * 4);
    return ccu_sub(ccu_add(low, high), 4.0f);
}

/* The sign byte of 8 lattice weights: 7 stored bits, the 8th makes the parity even. */
CCU_HD uint32_t ccu_e8_sign_byte(uint32_t word, int l) {
    uint32_t seven = (word >> (7 * l)) & 0x7fu;
    uint32_t par = seven ^ (seven >> 4);
    par ^= par >> 2;
    par ^= par >> 1;
    return seven | ((par & 1u) << 7);
}

/* e8/IQ3 super-block of 256 columns in 98 bytes: 64 grid indices, 8 words (4 x 7 sign bits
 * + a 4-bit sub-block scale code each), an fp16 super-scale. grid is the iq3xxs table
 * (doubled magnitudes); q = +-grid / 2. */
CCU_HD float ccu_e8_at(const uint8_t *row, int64_t c, const uint8_t (*grid)[4]) {
    const uint8_t *blk = row + (c / COLI_Q_E8_BLOCK) * COLI_Q_E8_BLOCK_BYTES;
    int j = (int)(c % COLI_Q_E8_BLOCK);
    int ib = j / 32, l = (j % 32) / 8, jj = j % 8;
    uint8_t idx = blk[8 * ib + 2 * l + (jj >= 4)];
    float mag = ccu_mul((float)grid[idx][jj % 4], 0.5f);
    uint32_t sign = ccu_e8_sign_byte(ccu_le32(blk + 64 + 4 * ib), l);
    return ((sign >> jj) & 1u) ? -mag : mag;
}

CCU_HD float ccu_q_at(int fmt, const uint8_t *row, int64_t c, const uint8_t (*grid)[4]) {
    switch (fmt) {
    case COLI_Q_INT8_ROW: return (float)(int8_t)row[c];
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT4_GROUPED: return ccu_int4_at(row, c);
    case COLI_Q_INT2_ROW: return ccu_int2_at(row, c);
    case COLI_Q_INT3_G64: return ccu_int3_at(row, c);
    case COLI_Q_E8_IQ3: return ccu_e8_at(row, c, grid);
    default: return ccu_e4m3_to_f32(row[c]);
    }
}

/* The multiplier of scale group g of output row o (fmt is v->fmt, passed apart so a kernel
 * specialised on it folds the switch away). */
CCU_HD float ccu_q_scale(int fmt, const ccu_qview *v, int64_t o, int64_t g) {
    switch (fmt) {
    case COLI_Q_INT8_ROW:
    case COLI_Q_INT4_ROW:
    case COLI_Q_INT2_ROW: return v->scales[o];
    case COLI_Q_FP8_E4M3_B128: return v->scales[(o / COLI_Q_FP8_BLOCK) * v->groups_per_row + g];
    case COLI_Q_E8_IQ3: {
        const uint8_t *blk = v->packed + o * v->row_bytes + (g / 8) * COLI_Q_E8_BLOCK_BYTES;
        float d = ccu_e8_half(ccu_le16(blk + 96));
        uint32_t code = ccu_le32(blk + 64 + 4 * (g % 8)) >> 28;
        return ccu_mul(ccu_mul(d, ccu_add(0.5f, (float)code)), 0.5f);
    }
    default: return v->scales[o * v->groups_per_row + g];
    }
}

/* --- the lanes of one output element ---------------------------------------------------- */

CCU_HD float ccu_w_at(const void *w, int dtype, int64_t index) {
    if (dtype == CCU_BF16) return ccu_bf16_to_f32(((const uint16_t *)w)[index]);
    if (dtype == CCU_F16) return ccu_f16_to_f32(((const uint16_t *)w)[index]);
    return ((const float *)w)[index];
}

/* Activation rows a warp takes at once: each weight element is read and decoded once for
 * all of them, and each row still gets exactly its own lane arithmetic (the rows never mix),
 * so a row's bits do not depend on which rows share its tile. */
#define CCU_ROW_TILE 8

/* Lane `lane`'s partials p[r] of w[o] . x_r over k columns, for the nr <= CCU_ROW_TILE rows
 * x_r = x + r ldx (w float, bf16 or f16). */
CCU_HD void ccu_f_lanes(const void *w, int dtype, int64_t o, int64_t k, const float *x,
                        int64_t ldx, int nr, int lane, int fused, float *p) {
    int64_t whole = k - k % 32, base = o * k;
    for (int r = 0; r < CCU_ROW_TILE; r++) p[r] = 0.0f;
    for (int64_t c = lane; c < whole; c += 32) {
        float wc = ccu_w_at(w, dtype, base + c);
        for (int r = 0; r < CCU_ROW_TILE; r++)
            if (r < nr) p[r] = ccu_madd(fused, wc, x[r * ldx + c], p[r]);
    }
    if (whole + lane < k) {
        int64_t c = whole + lane;
        float wc = ccu_w_at(w, dtype, base + c);
        for (int r = 0; r < CCU_ROW_TILE; r++)
            if (r < nr) p[r] = ccu_add(p[r], ccu_mul(wc, x[r * ldx + c]));
    }
}

/* One row's partial (ccu_f_lanes with one row). */
CCU_HD float ccu_f_lane(const void *w, int dtype, int64_t o, int64_t k, const float *x,
                        int lane, int fused) {
    float p[CCU_ROW_TILE];
    ccu_f_lanes(w, dtype, o, k, x, k, 1, lane, fused, p);
    return p[0];
}

/* Lane `lane`'s scaled totals t[r] of output row o for the nr <= CCU_ROW_TILE rows
 * x + r ldx (rotated already for e8; fmt is v->fmt). */
CCU_HD void ccu_q_lanes(int fmt, const ccu_qview *v, int64_t o, const float *x, int64_t ldx,
                        int nr, int lane, int fused, const uint8_t (*grid)[4], float *t) {
    const uint8_t *row = v->packed + o * v->row_bytes;
    const int64_t I = v->in_features, G = v->group;
    float p[CCU_ROW_TILE];
    for (int r = 0; r < CCU_ROW_TILE; r++) t[r] = 0.0f;
    for (int64_t g = 0; g < v->groups_per_row; g++) {
        int64_t c0 = g * G, c1 = c0 + G < I ? c0 + G : I;
        int64_t first = c0 + (((int64_t)lane - c0 % 32) % 32 + 32) % 32;
        for (int r = 0; r < CCU_ROW_TILE; r++) p[r] = 0.0f;
        for (int64_t c = first; c < c1; c += 32) {
            float q = ccu_q_at(fmt, row, c, grid);
            for (int r = 0; r < CCU_ROW_TILE; r++)
                if (r < nr) p[r] = ccu_madd(fused, q, x[r * ldx + c], p[r]);
        }
        float s = ccu_q_scale(fmt, v, o, g);
        for (int r = 0; r < CCU_ROW_TILE; r++)
            if (r < nr) t[r] = ccu_madd(fused, s, p[r], t[r]);
    }
}

/* --- fmt6's activation rotation (spec §14 "Rotation"; csrc/quant/q_rotate.c) ------------ */

/* The power-of-two block that starts `rem` columns before the end: rem & -rem, capped. */
CCU_HD int64_t ccu_rot_block(int64_t rem) {
    int64_t size = rem & -rem;
    while (size > CCU_ROT_MAX_BLOCK) size >>= 1;
    return size;
}

/* The next sign byte of a block's xorshift stream (state seeded 417 + block size). */
CCU_HD unsigned ccu_rot_sign_byte(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (unsigned)((*s * 2685821657736338717ull) >> 56);
}

/* One butterfly of span `span` at j: (a[j], a[j + span]) -> (u + v, u - v). */
CCU_HD void ccu_butterfly(float *a, int64_t j, int64_t span) {
    float u = a[j], v = a[j + span];
    a[j] = ccu_add(u, v);
    a[j + span] = ccu_sub(u, v);
}

#endif
