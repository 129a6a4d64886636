/* Dense products x @ w.T over weights in their stored dtype (spec §1, §10).
 *
 * Threads split the weight's rows; each thread takes every activation row in turn on a weight
 * row while it is in L1, so each weight byte comes from memory once per step however many rows
 * the batch has. out[r, n] is always col_dot_f32(w[n], x[r]): its bytes depend on neither the
 * batch nor the thread split. */
#include <stdlib.h>

#include "colibri.h"

typedef struct {
    const float *x;
    size_t m, k, ldx;
    const void *w;
    int dtype;
    float *out;
    size_t ldo;
    int status;
} mm_ctx;

static void mm_task(void *raw, size_t begin, size_t end) {
    mm_ctx *c = raw;
    float *row = NULL;
    if (c->dtype != COL_F32) {
        row = malloc(c->k * sizeof(float));
        if (row == NULL) {
            c->status = COL_ENOMEM; /* any failing thread reports; all write the same code */
            return;
        }
    }
    for (size_t n = begin; n < end; n++) {
        const float *wn;
        if (row == NULL) {
            wn = (const float *)c->w + n * c->k;
        } else {
            col_row_to_f32(c->w, c->dtype, n, c->k, row);
            wn = row;
        }
        for (size_t r = 0; r < c->m; r++) c->out[r * c->ldo + n] = col_dot_f32(wn, c->x + r * c->ldx, c->k);
    }
    free(row);
}

int col_matmul(col_pool *pool, const float *x, size_t m, size_t k, size_t ldx, const void *w,
               int dtype, size_t rows, float *out, size_t ldo) {
    if (dtype != COL_F32 && dtype != COL_BF16 && dtype != COL_F16) return COL_EDTYPE;
    if (m == 0 || rows == 0) return COL_OK;
    if (x == NULL || w == NULL || out == NULL || k == 0 || ldx < k || ldo < rows) return COL_EINVAL;
    mm_ctx c = {x, m, k, ldx, w, dtype, out, ldo, COL_OK};
    col_pool_run(pool, rows, mm_task, &c);
    return c.status;
}
