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
    if (c->dtype == COL_F32) {
        col_dot_block(c->w, begin, end, c->x, c->m, c->ldx, c->k, c->out, c->ldo);
        return;
    }
    float *row = malloc(c->k * sizeof(float));
    if (row == NULL) {
        c->status = COL_ENOMEM; /* any failing thread reports; all write the same code */
        return;
    }
    for (size_t n = begin; n < end; n++) {
        col_row_to_f32(c->w, c->dtype, n, c->k, row);
        col_dot_rows(row, c->x, c->m, c->ldx, c->k, c->out + n, c->ldo);
    }
    free(row);
}

int col_matmul(col_pool *pool, const float *x, size_t m, size_t k, size_t ldx, const void *w,
               int dtype, size_t rows, float *out, size_t ldo) {
    if (dtype != COL_F32 && dtype != COL_BF16 && dtype != COL_F16) return COL_EDTYPE;
    if (m == 0 || rows == 0) return COL_OK;
    if (x == NULL || w == NULL || out == NULL || k == 0 || ldx < k || ldo < rows) return COL_EINVAL;
    float *copy;
    if (col_align_rows(&x, m, k, &ldx, &copy)) return COL_ENOMEM;
    mm_ctx c = {x, m, k, ldx, w, dtype, out, ldo, COL_OK};
    /* A small product costs less than waking the pool: the caller computes it alone (which
     * thread computes an element never changes its value). */
    if (rows * k * (m < 4 ? m : 4) < COL_INLINE_WORK)
        mm_task(&c, 0, rows);
    else
        col_pool_run(pool, rows, mm_task, &c);
    free(copy);
    return c.status;
}
