/* The routed experts of one MoE layer in one call (spec §7.2): every expert's SwiGLU over the
 * rows routed to it, float or quantized weights, split across the pool by output element.
 *
 * Phases (one pool run each, so every phase sees the whole previous one):
 *   1. gather each expert's rows into a contiguous block (e8: rotate them, once, shared by
 *      gate and up);
 *   2. gate and up of every expert: items = n_experts * 2M output columns;
 *   3. h = silu(g) * u (e8: rotate h, once for down);
 *   4. down of every expert: items = n_experts * D output columns.
 * The gathered rows and h are col_spread_ld rows apart (aligned.c): they are the activations
 * of the products, and rows a whole even number of lines apart slow the 4-8-row tiles.
 * A thread's chunk of items covers consecutive (expert, column) pairs; it calls the product
 * kernel on each expert's share as an output range. Every output element is one dot product
 * in the order its kernel's source fixes (col_dot_f32 for float rows, coli_quant.h's lanes for
 * quantized rows), whatever the thread count, the split or the rows routed with it: a row's
 * result is byte-identical alone or in any batch (sameness kind (c)). */
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "quant/coli_quant.h"

typedef struct {
    const col_mat *mats; /* [n_experts][3]: gate, up, down */
    size_t n_experts, d;
    const size_t *gu_items; /* [n_experts + 1]: prefix sums of 2 m_e (gate | up columns) */
    const size_t *gu_off;   /* [n_experts]: where expert e's [rows, 2 m_e] block starts in gu */
    const size_t *h_off;    /* [n_experts]: where its [rows, m_e] block starts in h */
    const int64_t *start; /* [n_experts + 1] block offsets in rows */
    const int64_t *rows;  /* [start[n]] source rows of x */
    const float *x;
    size_t ldxs; /* col_spread_ld(d): xs's row stride */
    float *xs;   /* [total, ldxs] gathered (rotated for e8) */
    float *gu;   /* per expert [rows, 2 m_e]: gate | up per row */
    float *h;    /* per expert [rows, col_spread_ld(m_e)] */
    float *out; /* [total, d] */
    int status;
} moe_ctx;

static int mat_rows(const col_mat *w, const float *x, size_t n, size_t ldx, float *y,
                    size_t ldy, size_t o0, size_t o1, float *scratch) {
    if (w->fmt == 0 && w->dtype == COL_F32) {
        col_dot_block(w->data, o0, o1, x, n, ldx, w->cols, y, ldy);
        return COL_OK;
    }
    if (w->fmt == 0) {
        for (size_t o = o0; o < o1; o++) {
            int rc = col_row_to_f32(w->data, w->dtype, o, w->cols, scratch);
            if (rc) return rc;
            col_dot_rows(scratch, x, n, ldx, w->cols, y + o, ldy);
        }
        return COL_OK;
    }
    int rc = coli_q_matmul(w->fmt, w->group_size, w->data, w->data_len, w->scales, w->n_scales,
                           (int64_t)w->rows, (int64_t)w->cols, x, (int64_t)n, (int64_t)ldx, y,
                           (int64_t)ldy, (int64_t)o0, (int64_t)o1, COLI_Q_X_ROTATED);
    return rc ? COL_EQUANT_BASE + rc : COL_OK;
}

static int is_e8(const col_mat *w) { return w->fmt == COLI_Q_E8_IQ3; }

static void fail(moe_ctx *c, int rc) {
    if (rc) c->status = rc; /* any failing thread reports a code; all would be the same kind */
}

static void gather_task(void *raw, size_t begin, size_t end) {
    moe_ctx *c = raw;
    for (size_t e = begin; e < end; e++) {
        size_t r0 = (size_t)c->start[e], r1 = (size_t)c->start[e + 1];
        for (size_t r = r0; r < r1; r++)
            memcpy(c->xs + r * c->ldxs, c->x + (size_t)c->rows[r] * c->d,
                   c->d * sizeof(float));
        if (r1 > r0 && is_e8(&c->mats[3 * e])) {
            float *xs = c->xs + r0 * c->ldxs;
            int rc = coli_q_rotate(xs, (int64_t)(r1 - r0), (int64_t)c->ldxs, (int64_t)c->d, xs,
                                   (int64_t)c->ldxs);
            if (rc) fail(c, COL_EQUANT_BASE + rc);
        }
    }
}

/* Items [begin, end) over every expert's 2 m_e gate|up columns, split at expert boundaries. */
static void gate_up_task(void *raw, size_t begin, size_t end) {
    moe_ctx *c = raw;
    float *scratch = malloc(c->d * sizeof(float));
    if (scratch == NULL) {
        fail(c, COL_ENOMEM);
        return;
    }
    size_t e = 0;
    for (size_t i = begin; i < end;) {
        while (c->gu_items[e + 1] <= i) e++;
        size_t m = c->mats[3 * e].rows, per = 2 * m;
        size_t o0 = i - c->gu_items[e];
        size_t o1 = per < o0 + (end - i) ? per : o0 + (end - i);
        size_t r0 = (size_t)c->start[e], n = (size_t)c->start[e + 1] - r0;
        const float *xs = c->xs + r0 * c->ldxs;
        float *y = c->gu + c->gu_off[e];
        if (n) {
            if (o0 < m) { /* gate columns [o0, min(o1, m)) */
                size_t a1 = o1 < m ? o1 : m;
                fail(c, mat_rows(&c->mats[3 * e], xs, n, c->ldxs, y, per, o0, a1, scratch));
            }
            if (o1 > m) { /* up columns, written after the gate's m */
                size_t b0 = o0 > m ? o0 - m : 0;
                fail(c, mat_rows(&c->mats[3 * e + 1], xs, n, c->ldxs, y + m, per, b0, o1 - m,
                                 scratch));
            }
        }
        i += o1 - o0;
    }
    free(scratch);
}

static void act_task(void *raw, size_t begin, size_t end) {
    moe_ctx *c = raw;
    for (size_t e = begin; e < end; e++) {
        size_t r0 = (size_t)c->start[e], r1 = (size_t)c->start[e + 1];
        size_t m = c->mats[3 * e].rows, ldh = col_spread_ld(m);
        float *gu = c->gu + c->gu_off[e], *h = c->h + c->h_off[e];
        for (size_t r = 0; r < r1 - r0; r++)
            col_silu_mul(gu + r * 2 * m, gu + r * 2 * m + m, m, h + r * ldh);
        if (r1 > r0 && is_e8(&c->mats[3 * e + 2])) {
            int rc = coli_q_rotate(h, (int64_t)(r1 - r0), (int64_t)ldh, (int64_t)m, h,
                                   (int64_t)ldh);
            if (rc) fail(c, COL_EQUANT_BASE + rc);
        }
    }
}

static void down_task(void *raw, size_t begin, size_t end) {
    moe_ctx *c = raw;
    size_t per = c->d;
    size_t widest = 1;
    for (size_t e = 0; e < c->n_experts; e++)
        if (c->mats[3 * e].rows > widest) widest = c->mats[3 * e].rows;
    float *scratch = malloc(widest * sizeof(float));
    if (scratch == NULL) {
        fail(c, COL_ENOMEM);
        return;
    }
    for (size_t i = begin; i < end;) {
        size_t e = i / per, o0 = i % per;
        size_t o1 = per < o0 + (end - i) ? per : o0 + (end - i);
        size_t r0 = (size_t)c->start[e], n = (size_t)c->start[e + 1] - r0;
        size_t m = c->mats[3 * e].rows;
        if (n)
            fail(c, mat_rows(&c->mats[3 * e + 2], c->h + c->h_off[e], n, col_spread_ld(m),
                             c->out + r0 * c->d, c->d, o0, o1, scratch));
        i += o1 - o0;
    }
    free(scratch);
}

int col_moe(col_pool *pool, size_t n_experts, const col_mat *mats, const int64_t *start,
            const int64_t *rows, const float *x, size_t n_x, size_t d, float *out) {
    if (n_experts == 0) return COL_OK;
    if (mats == NULL || start == NULL || rows == NULL || x == NULL || out == NULL || d == 0 ||
        start[0] != 0 || n_experts > ((size_t)1 << 20))
        return COL_EINVAL;
    for (size_t e = 0; e < n_experts; e++) {
        if (start[e + 1] < start[e]) return COL_EINVAL;
        const col_mat *g = &mats[3 * e];
        size_t m = g->rows;
        int e8 = is_e8(g);
        if (m == 0) return COL_EINVAL;
        for (int j = 0; j < 3; j++) {
            const col_mat *w = &mats[3 * e + j];
            size_t want_rows = j == 2 ? d : m, want_cols = j == 2 ? m : d;
            if (w->data == NULL || w->rows != want_rows || w->cols != want_cols ||
                is_e8(w) != e8)
                return COL_EINVAL;
            if (w->fmt == 0 && w->dtype != COL_F32 && w->dtype != COL_BF16 &&
                w->dtype != COL_F16)
                return COL_EDTYPE;
        }
    }
    size_t total = (size_t)start[n_experts];
    for (size_t r = 0; r < total; r++)
        if (rows[r] < 0 || (size_t)rows[r] >= n_x) return COL_EINVAL;
    if (total == 0) return COL_OK;
    size_t *offs = malloc(3 * (n_experts + 1) * sizeof(size_t));
    if (offs == NULL) return COL_ENOMEM;
    size_t *gu_items = offs, *gu_off = offs + n_experts + 1, *h_off = offs + 2 * (n_experts + 1);
    gu_items[0] = gu_off[0] = h_off[0] = 0;
    for (size_t e = 0; e < n_experts; e++) {
        size_t m = mats[3 * e].rows, n = (size_t)(start[e + 1] - start[e]);
        gu_items[e + 1] = gu_items[e] + 2 * m;
        /* Each expert's blocks start on a 64-byte line (aligned.c): its rows are the
         * activations of its products. */
        gu_off[e + 1] = gu_off[e] + col_pad_floats(n * 2 * m);
        h_off[e + 1] = h_off[e] + n * col_spread_ld(m);
    }
    size_t ldxs = col_spread_ld(d);
    float *xs = col_alloc_floats(total * ldxs);
    float *gu = col_alloc_floats(gu_off[n_experts]);
    float *h = col_alloc_floats(h_off[n_experts]);
    if (xs == NULL || gu == NULL || h == NULL) {
        free(xs);
        free(gu);
        free(h);
        free(offs);
        return COL_ENOMEM;
    }
    moe_ctx c = {mats, n_experts, d, gu_items, gu_off, h_off, start, rows, x, ldxs, xs, gu, h,
                 out, COL_OK};
    /* Gathering rows is light next to the products: the caller does it alone unless the batch
     * is large. SwiGLU's activation (an expf per element) always goes to the pool: it follows
     * gate and up, whose threads are still spinning, so it costs no wake-up, and on the
     * caller alone it left the other threads idle (2-core EPYC Zen 5, avx2, 8 rows, paired:
     * the five routed layers' experts 1.03-1.05x, together with the 2-3-row kernels' far
     * prefetch the bench model's 8-row decode step median 1.02x over 30 pairs, one row 1.02x). */
    if (h_off[n_experts] < COL_INLINE_WORK / 4 && total * d < COL_INLINE_WORK)
        gather_task(&c, 0, n_experts);
    else
        col_pool_run(pool, n_experts, gather_task, &c);
    if (c.status == COL_OK) col_pool_run(pool, gu_items[n_experts], gate_up_task, &c);
    if (c.status == COL_OK) col_pool_run(pool, n_experts, act_task, &c);
    if (c.status == COL_OK) col_pool_run(pool, n_experts * d, down_task, &c);
    free(xs);
    free(gu);
    free(h);
    free(offs);
    return c.status;
}

/* --- one product over a col_mat (float or quantized), split by output column ------------- */

typedef struct {
    const col_mat *w;
    const float *x;
    size_t m, ldx;
    float *out;
    size_t ldo;
    int status;
} mat_ctx;

static void mat_task(void *raw, size_t begin, size_t end) {
    mat_ctx *c = raw;
    float *scratch = malloc(c->w->cols * sizeof(float));
    if (scratch == NULL) {
        c->status = COL_ENOMEM;
        return;
    }
    int rc = mat_rows(c->w, c->x, c->m, c->ldx, c->out, c->ldo, begin, end, scratch);
    if (rc) c->status = rc;
    free(scratch);
}

int col_mat_matmul(col_pool *pool, const col_mat *w, const float *x, size_t m, size_t ldx,
                   float *out, size_t ldo) {
    if (w == NULL || x == NULL || out == NULL || w->data == NULL || ldx < w->cols ||
        ldo < w->rows)
        return COL_EINVAL;
    if (w->fmt == 0 && w->dtype != COL_F32 && w->dtype != COL_BF16 && w->dtype != COL_F16)
        return COL_EDTYPE;
    if (m == 0 || w->rows == 0) return COL_OK;
    mat_ctx c = {w, x, m, ldx, out, ldo, COL_OK};
    float *xr = NULL;
    if (w->fmt == 0 && w->dtype == COL_F32 &&
        col_align_rows(&c.x, m, w->cols, &c.ldx, &xr))
        return COL_ENOMEM;
    if (is_e8(w)) { /* rotate once, not once per thread's share */
        xr = col_alloc_floats(m * w->cols);
        if (xr == NULL) return COL_ENOMEM;
        int rc = coli_q_rotate(x, (int64_t)m, (int64_t)ldx, (int64_t)w->cols, xr,
                               (int64_t)w->cols);
        if (rc) {
            free(xr);
            return COL_EQUANT_BASE + rc;
        }
        c.x = xr;
        c.ldx = w->cols;
    }
    col_pool_run(pool, w->rows, mat_task, &c);
    free(xr);
    return c.status;
}

/* --- several products over one input in one pool run ------------------------------------- */

typedef struct {
    size_t n;
    const col_mat *ws;
    const size_t *first; /* [n + 1]: prefix sums of the weights' output rows */
    const float *x, *xr; /* xr: x rotated, for e8 weights (else NULL) */
    size_t m, ldx;
    float *const *outs;
    size_t widest;
    int status;
} mats_ctx;

static void mats_task(void *raw, size_t begin, size_t end) {
    mats_ctx *c = raw;
    float *scratch = malloc(c->widest * sizeof(float));
    if (scratch == NULL) {
        c->status = COL_ENOMEM;
        return;
    }
    size_t i = 0;
    for (size_t item = begin; item < end;) {
        while (c->first[i + 1] <= item) i++;
        const col_mat *w = &c->ws[i];
        size_t o0 = item - c->first[i];
        size_t o1 = w->rows < o0 + (end - item) ? w->rows : o0 + (end - item);
        const float *x = is_e8(w) ? c->xr : c->x;
        size_t ldx = is_e8(w) ? w->cols : c->ldx;
        int rc = mat_rows(w, x, c->m, ldx, c->outs[i], w->rows, o0, o1, scratch);
        if (rc) c->status = rc;
        item += o1 - o0;
    }
    free(scratch);
}

int col_mats_matmul(col_pool *pool, size_t n, const col_mat *ws, const float *x, size_t m,
                    size_t ldx, float *const *outs) {
    if (n == 0 || m == 0) return COL_OK;
    if (ws == NULL || x == NULL || outs == NULL || n > 64) return COL_EINVAL;
    size_t first[65], widest = 1;
    first[0] = 0;
    int any_e8 = 0, any_f32 = 0;
    for (size_t i = 0; i < n; i++) {
        const col_mat *w = &ws[i];
        if (w->data == NULL || outs[i] == NULL || ldx < w->cols || w->cols != ws[0].cols)
            return COL_EINVAL;
        if (w->fmt == 0 && w->dtype != COL_F32 && w->dtype != COL_BF16 && w->dtype != COL_F16)
            return COL_EDTYPE;
        first[i + 1] = first[i] + w->rows;
        if (w->cols > widest) widest = w->cols;
        any_e8 |= is_e8(w);
        any_f32 |= w->fmt == 0 && w->dtype == COL_F32;
    }
    mats_ctx c = {n, ws, first, x, NULL, m, ldx, outs, widest, COL_OK};
    float *xr = NULL, *copy = NULL;
    if (any_f32 && col_align_rows(&c.x, m, ws[0].cols, &c.ldx, &copy)) return COL_ENOMEM;
    if (any_e8) { /* rotate once for every e8 weight */
        xr = col_alloc_floats(m * ws[0].cols);
        int rc = xr == NULL ? COL_ENOMEM
                            : coli_q_rotate(x, (int64_t)m, (int64_t)ldx, (int64_t)ws[0].cols,
                                            xr, (int64_t)ws[0].cols);
        if (rc) {
            free(xr);
            free(copy);
            return xr == NULL ? rc : COL_EQUANT_BASE + rc;
        }
        c.xr = xr;
    }
    /* Small ones (a decode step's kv_a, the indexer's keys and head weights) join the big
     * one's pool run instead of each running alone on the caller. */
    if (first[n] * ws[0].cols * (m < 4 ? m : 4) < COL_INLINE_WORK)
        mats_task(&c, 0, first[n]);
    else
        col_pool_run(pool, first[n], mats_task, &c);
    free(xr);
    free(copy);
    return c.status;
}
