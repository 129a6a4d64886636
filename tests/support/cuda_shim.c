/* Host build of the CUDA kernels' device math (accelerated/cuda/ccu_formats.h), compiled by
 * tests/support/cuda_shim.py with the system cc: each export runs, lane by lane on the CPU,
 * exactly the per-lane arithmetic and reduction tree a GPU warp runs, so the tests can hold
 * it against the CPU library's kernels bit for bit without nvcc or a GPU. */
#include "ccu_formats.h"

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

/* y[r, o] for r < m: the warp's 32 lanes over tiles of `tile` rows (1..CCU_ROW_TILE), then
 * each row's shuffle tree (x rotated already for e8). */
int shim_q_matmul(int fmt, int gs, const uint8_t *packed, int64_t len, const float *scales,
                  int64_t n_scales, int64_t O, int64_t I, const uint8_t (*grid)[4],
                  const float *x, int64_t m, float *y, int fused, int tile) {
    ccu_qview v;
    int rc = ccu_qview_init(&v, fmt, gs, packed, len, scales, n_scales, O, I);
    if (rc != COLI_Q_OK) return rc;
    float t[32][CCU_ROW_TILE], lanes[32];
    for (int64_t r0 = 0; r0 < m; r0 += tile) {
        int nr = (int)(m - r0 < tile ? m - r0 : tile);
        for (int64_t o = 0; o < O; o++) {
            for (int l = 0; l < 32; l++)
                ccu_q_lanes(fmt, &v, o, x + r0 * I, I, nr, l, fused, grid, t[l]);
            for (int r = 0; r < nr; r++) {
                for (int l = 0; l < 32; l++) lanes[l] = t[l][r];
                y[(r0 + r) * O + o] = ccu_warp_sum(lanes, 1);
            }
        }
    }
    return COLI_Q_OK;
}

void shim_f_matmul(const void *w, int dtype, int64_t rows, int64_t k, const float *x,
                   int64_t m, float *y, int fused, int tile) {
    float p[32][CCU_ROW_TILE], lanes[32];
    for (int64_t r0 = 0; r0 < m; r0 += tile) {
        int nr = (int)(m - r0 < tile ? m - r0 : tile);
        for (int64_t o = 0; o < rows; o++) {
            for (int l = 0; l < 32; l++) ccu_f_lanes(w, dtype, o, k, x + r0 * k, k, nr, l, fused, p[l]);
            for (int r = 0; r < nr; r++) {
                for (int l = 0; l < 32; l++) lanes[l] = p[l][r];
                y[(r0 + r) * rows + o] = ccu_warp_sum(lanes, 0);
            }
        }
    }
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
