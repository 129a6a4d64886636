/* fmt6's activation rotation Q^T x (spec/model.md §14 "Rotation"): per power-of-two block,
 * negate the flagged elements, run the unnormalised Walsh-Hadamard butterflies with growing
 * span, multiply by float32(1 / sqrtf(n)). Adds and subtracts of the same pairs in the same
 * order as the reference, so the result is bit-identical to rotate_activations. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "quant/q_internal.h"

#define MAX_ROT_BLOCK 32768

/* colibri's sign stream: byte i of the block's mask from a xorshift seeded 417 + n. */
static void flip_signs(float *a, int64_t n) {
    uint64_t s = 417u + (uint64_t)n;
    for (int64_t i = 0; i < (n + 7) / 8; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        unsigned byte = (unsigned)((s * 2685821657736338717ull) >> 56);
        for (int b = 0; b < 8 && 8 * i + b < n; b++)
            if ((byte >> b) & 1) a[8 * i + b] = -a[8 * i + b];
    }
}

static void butterflies(float *a, int64_t n) {
    for (int64_t span = 1; span < n; span *= 2)
        for (int64_t c = 0; c < n; c += 2 * span)
            for (int64_t j = c; j < c + span; j++) {
                float u = a[j], v = a[j + span];
                a[j] = u + v;
                a[j + span] = u - v;
            }
    float inv = 1.0f / sqrtf((float)n);
    for (int64_t j = 0; j < n; j++) a[j] *= inv;
}

int coli_q_rotate(const float *x, int64_t n_rows, int64_t x_stride, int64_t cols, float *out,
                  int64_t out_stride) {
    if (cols <= 0 || cols > COLI_Q_MAX_DIM) return COLI_Q_ESHAPE;
    if (n_rows < 0) return COLI_Q_ESTRIDE;
    if (n_rows == 0) return COLI_Q_OK;
    if (x_stride < cols || out_stride < cols) return COLI_Q_ESTRIDE;
    if (x == NULL || out == NULL) return COLI_Q_ENULL;
    for (int64_t r = 0; r < n_rows; r++) {
        float *a = out + r * out_stride;
        if (a != x + r * x_stride) memmove(a, x + r * x_stride, (size_t)cols * sizeof(float));
        int64_t off = 0;
        while (off < cols) {
            int64_t rem = cols - off;
            int64_t size = rem & -rem;
            while (size > MAX_ROT_BLOCK) size >>= 1;
            flip_signs(a + off, size);
            butterflies(a + off, size);
            off += size;
        }
    }
    return COLI_Q_OK;
}
