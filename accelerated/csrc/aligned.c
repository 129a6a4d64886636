/* Activation buffers on 64-byte boundaries (one cache line, one 16-lane load).
 *
 * Why: in the avx512 build's float tiles for 4-8 activation rows (dot.c tile16) the
 * activations' loads are 8 of a step's 11, and a 64-byte load that starts off a line
 * boundary touches two lines. With activations 16 bytes off (what malloc
 * and numpy give) an 8-row product on 256 MiB of weights read 21.6 GB/s against 33.0 aligned
 * (2-core EPYC Zen 5). Only the activations matter: the weights sit wherever the file
 * put them (a safetensors header is 8-byte aligned), and their loads are 3 in 11.
 *
 * Rows a whole even number of lines apart are copied too (col_spread_ld). The tiles read line
 * o of all 4-8 rows in one inner step; a 4 KiB stride (k = 1024) puts those lines, and the
 * weight rows' (also 4 KiB apart), in one set of the 8-way 32 KiB L1, so a step's 11 lines
 * evict each other and the activations come from L2 on every tile. With an odd number of
 * lines per row, line o of row r falls in set (o + r * lines) mod 64, a different set for
 * each row. Measured on a 2-core EPYC Zen 4 (avx512 build), 8 rows from memory, two threads,
 * paired: k 1024 1.04-1.07x the GB/s, k 2048 about 1.15x; the bench model's 8-row step 1.025x
 * (median of 60 pairs, IQR 1.008-1.052), its 4-row step 1.00x. */
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

#define LINE 64

#define LINE_FLOATS (LINE / sizeof(float))

size_t col_pad_floats(size_t n) { return (n + LINE_FLOATS - 1) / LINE_FLOATS * LINE_FLOATS; }

float *col_alloc_floats(size_t n) {
    size_t bytes = col_pad_floats(n ? n : 1) * sizeof(float);
    return aligned_alloc(LINE, bytes);
}

size_t col_spread_ld(size_t k) {
    size_t ld = col_pad_floats(k);
    return (ld / LINE_FLOATS) % 2 ? ld : ld + LINE_FLOATS;
}

static int rows_spread(size_t ldx) { return (ldx * sizeof(float) / LINE) % 2 == 1; }

int col_rows_aligned(const float *x, size_t ldx) {
    return (uintptr_t)x % LINE == 0 && (ldx * sizeof(float)) % LINE == 0;
}

int col_align_rows(const float **x, size_t m, size_t k, size_t *ldx, float **copy) {
    *copy = NULL;
    if (!col_dot_wants_aligned(m) || (col_rows_aligned(*x, *ldx) && rows_spread(*ldx)))
        return COL_OK;
    size_t ld = col_spread_ld(k);
    float *a = col_alloc_floats(m * ld);
    if (a == NULL) return COL_ENOMEM;
    for (size_t r = 0; r < m; r++) memcpy(a + r * ld, *x + r * *ldx, k * sizeof(float));
    *x = a;
    *ldx = ld;
    *copy = a;
    return COL_OK;
}
