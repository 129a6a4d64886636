/* A range of decoder layers in one call (spec §3, §4, §5, §7.2): per layer the attention
 * block, then the router and the routed experts (or the dense MLP) folded back into the
 * residual -- the ~15 kernel calls with numpy glue between them that the per-kernel path of
 * accelerated/model.py makes per layer.
 *
 * Every step calls the kernel the per-kernel path calls, with the same arguments, in the
 * same order, so each output element is computed the same way: the bytes equal the
 * per-kernel path's (and so stay independent of the batch and the thread count, sameness
 * kind (c)). What goes is the interpreter between the kernels: argument checks, temporaries,
 * cache row copies, a pool wake-up per small product.
 *
 * Not covered here: rows that attend to a DSA-selected subset of their past (a full indexer
 * layer past index_topk, or a shared layer after one). The caller runs those layers on the
 * per-kernel path, which has the indexer's scoring and top-k. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colibri.h"

static int check_mat(const col_mat *w, size_t rows, size_t cols) {
    if (w->data == NULL || w->rows != rows || w->cols != cols) return COL_EINVAL;
    if (w->fmt == 0 && w->dtype != COL_F32 && w->dtype != COL_BF16 && w->dtype != COL_F16)
        return COL_EDTYPE;
    return COL_OK;
}

size_t col_layer_size(void) { return sizeof(col_layer); }

static int check_layer(const col_layer *L) {
    size_t d = (size_t)L->d, heads = (size_t)L->heads, qk = (size_t)(L->nope + L->rope);
    size_t kvl = (size_t)L->kvl, ql = (size_t)L->q_lora;
    if (L->d <= 0 || L->heads <= 0 || L->nope < 0 || L->rope <= 0 || L->rope % 2 ||
        L->vdim <= 0 || L->kvl <= 0 || L->q_lora < 0 || L->n_router < 0 ||
        L->index_hd < 0 || (L->index_keys && (L->index_hd < L->rope)))
        return COL_EINVAL;
    if (!L->input_norm || !L->post_norm || !L->kv_a_norm || !L->kv_b ||
        (ql && !L->q_a_norm) || (L->index_keys && (!L->ik_norm_w || !L->ik_norm_b)))
        return COL_EINVAL;
    if (L->kv_b_dtype != COL_F32 && L->kv_b_dtype != COL_BF16 && L->kv_b_dtype != COL_F16)
        return COL_EDTYPE;
    int rc = check_mat(&L->q_first, ql ? ql : heads * qk, d);
    if (!rc && ql) rc = check_mat(&L->q_b, heads * qk, ql);
    if (!rc) rc = check_mat(&L->kv_a, kvl + (size_t)L->rope, d);
    if (!rc && L->index_keys) rc = check_mat(&L->wk, (size_t)L->index_hd, d);
    if (!rc) rc = check_mat(&L->o, d, heads * (size_t)L->vdim);
    if (!rc && L->n_router) rc = check_mat(&L->router, (size_t)L->n_router, d);
    return rc;
}

/* A layer's attention block for m rows without DSA selection (spec §3-§5): x [m, d] gets
 * the attention output added in place; h_out [m, d] is post_attention_layernorm(x) and
 * router_out [m, n_router] its router logits (when n_router). Row r's new latent, rope key
 * (and index key) go to row slot[r] of its caches; it attends to rows [0, slot[r]]. cos/sin
 * are [m, rope/2]. */
static int attention_block(col_pool *pool, const col_layer *L, size_t m, float *x,
                           float *h_out, float *router_out, const float *cos, const float *sin,
                           float *const *latent, float *const *rope_key,
                           float *const *index_key, const size_t *slot) {
    if (L == NULL || x == NULL || h_out == NULL || cos == NULL || sin == NULL ||
        latent == NULL || rope_key == NULL || slot == NULL ||
        (L->index_keys && index_key == NULL) || (L->n_router && router_out == NULL))
        return COL_EINVAL;
    int rc = check_layer(L);
    if (rc) return rc;
    if (m == 0) return COL_OK;
    for (size_t r = 0; r < m; r++)
        if (!latent[r] || !rope_key[r] || (L->index_keys && !index_key[r])) return COL_EINVAL;
    size_t d = (size_t)L->d, heads = (size_t)L->heads, nope = (size_t)L->nope;
    size_t rope = (size_t)L->rope, qk = nope + rope, kvl = (size_t)L->kvl;
    size_t ql = (size_t)L->q_lora, hd = (size_t)L->index_hd, half = rope / 2;
    size_t first_w = ql ? ql : heads * qk, kva_w = kvl + rope;
    size_t sizes[8] = {m * d,                  /* hn: the normed input */
                       m * first_w,            /* q_a's output (or q itself) */
                       m * kva_w,              /* kv_a's output */
                       L->index_keys ? m * hd : 0,
                       ql ? m * ql : 0,        /* q_a normed */
                       ql ? m * heads * qk : 0, /* q */
                       m * heads * (size_t)L->vdim, /* attention's output */
                       m * d};                 /* o's output */
    size_t total = 0, offs[8];
    for (int i = 0; i < 8; i++) { /* each buffer on a 64-byte line: products read them */
        offs[i] = total;
        total += col_pad_floats(sizes[i]);
    }
    float *work = col_alloc_floats(total);
    size_t *seen = malloc(m * sizeof(size_t));
    const int64_t **keep = calloc(m, sizeof(*keep));
    size_t *n_keep = calloc(m, sizeof(size_t));
    if (!work || !seen || !keep || !n_keep) {
        rc = COL_ENOMEM;
        goto done;
    }
    float *hn = work + offs[0], *first = work + offs[1], *kva = work + offs[2];
    float *ik = work + offs[3], *q_resid = work + offs[4], *attn = work + offs[6];
    float *o = work + offs[7];
    float *q = ql ? work + offs[5] : first;

    col_rms_norm(x, m, d, L->input_norm, L->rms_eps, hn);
    /* Every product of hn in one pool run: q_a (or q), kv_a, and the indexer's keys. */
    col_mat firsts[3] = {L->q_first, L->kv_a, L->wk};
    float *outs[3] = {first, kva, ik};
    rc = col_mats_matmul(pool, L->index_keys ? 3 : 2, firsts, hn, m, d, outs);
    if (rc) goto done;
    if (ql) {
        col_rms_norm(first, m, ql, L->q_a_norm, L->latent_eps, q_resid);
        rc = col_mat_matmul(pool, &L->q_b, q_resid, m, ql, q, heads * qk);
        if (rc) goto done;
    }
    col_rope(q + nope, m, heads, heads * qk, qk, rope, cos, sin, (int)L->interleave);
    /* The new cache rows, written where attention reads them (rows of one prefill see the
     * rows before them: all are written before any attends). */
    for (size_t r = 0; r < m; r++) {
        const float *c = kva + r * kva_w;
        col_rms_norm(c, 1, kvl, L->kv_a_norm, L->latent_eps, latent[r] + slot[r] * kvl);
        float *rk = rope_key[r] + slot[r] * rope;
        memcpy(rk, c + kvl, rope * sizeof(float));
        col_rope(rk, 1, 1, rope, rope, rope, cos + r * half, sin + r * half,
                 (int)L->interleave);
        if (L->index_keys) {
            float *key = index_key[r] + slot[r] * hd;
            col_layer_norm(ik + r * hd, 1, hd, L->ik_norm_w, L->ik_norm_b, L->index_eps, key);
            /* The indexer's rope is always interleaved (spec §6). */
            col_rope(key, 1, 1, hd, hd, rope, cos + r * half, sin + r * half, 1);
        }
        seen[r] = slot[r] + 1;
    }
    rc = col_mla_attention(pool, m, heads, nope, rope, (size_t)L->vdim, kvl, q,
                           (const float *const *)latent, (const float *const *)rope_key, seen,
                           keep, n_keep, L->kv_b, (int)L->kv_b_dtype, L->attn_scale, attn);
    if (rc) goto done;
    rc = col_mat_matmul(pool, &L->o, attn, m, heads * (size_t)L->vdim, o, d);
    if (rc) goto done;
    for (size_t i = 0; i < m * d; i++) x[i] = x[i] + o[i];
    col_rms_norm(x, m, d, L->post_norm, L->rms_eps, h_out);
    if (L->n_router) rc = col_mat_matmul(pool, &L->router, h_out, m, d, router_out,
                                         (size_t)L->n_router);
done:
    free(work);
    free(seen);
    free(keep);
    free(n_keep);
    return rc;
}

/* col_moe over h [m, d], then x[r] += sum_s weights[r, s] * y[slot_row[r, s]] (s ascending)
 * + y[extra_row[r]] (the shared expert or a dense MLP; extra_row may be NULL), the sums in
 * that order, one rounding per operation. k may be 0 (a dense layer). */
/* x[r] += the router-weighted sum of row r's expert outputs y[slot_row[r k + s]] (k slots)
 * and y[extra_row[r]] (the shared expert, or a dense layer's MLP with k = 0). */
static void combine_rows(const float *y, size_t m, size_t d, size_t k, const int64_t *slot_row,
                         const float *weights, const int64_t *extra_row, float *x) {
    /* Per element, in slot (ascending expert id) order, then the shared expert, then the
     * residual: the additions numpy made, one rounding each (no fused multiply-add). */
    for (size_t r = 0; r < m; r++) {
        float *xr = x + r * d;
        const float *extra = extra_row ? y + (size_t)extra_row[r] * d : NULL;
        if (k == 0) {
            if (extra)
                for (size_t i = 0; i < d; i++) xr[i] = xr[i] + extra[i];
            continue;
        }
        for (size_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (size_t s = 0; s < k; s++) {
                float w = weights[r * k + s];
                acc = acc + w * y[(size_t)slot_row[r * k + s] * d + i];
            }
            if (extra) acc = acc + extra[i];
            xr[i] = xr[i] + acc;
        }
    }
}

static int moe_residual(col_pool *pool, size_t n_experts, const col_mat *mats,
                        const int64_t *start, const int64_t *rows, const float *h, size_t m,
                        size_t d, size_t k, const int64_t *slot_row, const float *weights,
                        const int64_t *extra_row, float *x) {
    if (x == NULL || (k && (slot_row == NULL || weights == NULL)) || start == NULL) {
        return COL_EINVAL;
    }
    size_t total = n_experts ? (size_t)start[n_experts] : 0;
    for (size_t i = 0; i < m * k; i++)
        if (slot_row[i] < 0 || (size_t)slot_row[i] >= total) return COL_EINVAL;
    if (extra_row)
        for (size_t r = 0; r < m; r++)
            if (extra_row[r] < 0 || (size_t)extra_row[r] >= total) return COL_EINVAL;
    float *y = malloc((total ? total : 1) * d * sizeof(float));
    if (y == NULL) return COL_ENOMEM;
    int rc = col_moe(pool, n_experts, mats, start, rows, h, m, d, y);
    if (!rc) combine_rows(y, m, d, k, slot_row, weights, extra_row, x);
    free(y);
    return rc;
}

/* --- the whole layer: attention, router, grouping and experts in one call -------------- */

/* A routed layer's grouping of its rows by expert (col_group_rows), with the shared expert's
 * block (every row) after the routed ones; ints holds it (free it). */
typedef struct {
    int64_t *ints, *used, *start, *rows, *slot_row, *extra_row;
    size_t n_used, k, pairs, extra;
} grouping;

static int group_layer(const col_layer *L, size_t m, const int32_t *chosen, grouping *g) {
    size_t k = (size_t)L->top_k, n_exp = (size_t)L->n_router;
    g->k = k;
    g->pairs = m * k;
    g->extra = L->shared ? m : 0;
    /* used[n_exp] | start[n_exp + 2] | rows[pairs + m] | slot_row[pairs] | extra_row[m] */
    g->ints = malloc((2 * n_exp + 2 + 2 * g->pairs + 2 * m) * sizeof(int64_t));
    if (g->ints == NULL) return COL_ENOMEM;
    g->used = g->ints;
    g->start = g->used + n_exp;
    g->rows = g->start + n_exp + 2;
    g->slot_row = g->rows + g->pairs + m;
    g->extra_row = g->slot_row + g->pairs;
    g->n_used = 0;
    int rc = col_group_rows(chosen, m, k, n_exp, g->used, &g->n_used, g->start, g->rows,
                            g->slot_row);
    if (!rc && g->extra) { /* the shared expert rides along: every row, the last block */
        for (size_t r = 0; r < m; r++) {
            g->rows[g->pairs + r] = (int64_t)r;
            g->extra_row[r] = (int64_t)(g->pairs + r);
        }
        g->start[g->n_used + 1] = (int64_t)(g->pairs + m);
    }
    return rc;
}

static int routed_args(const col_layer *L, size_t m, const float *h, const int32_t *chosen) {
    if (L == NULL || h == NULL || chosen == NULL || L->n_router <= 0 || L->top_k <= 0 ||
        L->top_k > L->n_router || L->experts == NULL)
        return COL_EINVAL;
    (void)m;
    return COL_OK;
}

int col_layer_routed(col_pool *pool, const col_layer *L, size_t m, const float *h,
                     const int32_t *chosen, const float *weights, float *x) {
    int rc = routed_args(L, m, h, chosen);
    if (rc || weights == NULL || x == NULL) return rc ? rc : COL_EINVAL;
    if (m == 0) return COL_OK;
    grouping g;
    col_mat *mats = malloc(((size_t)L->n_router + 1) * 3 * sizeof(col_mat));
    rc = mats == NULL ? COL_ENOMEM : group_layer(L, m, chosen, &g);
    if (mats == NULL) return rc;
    for (size_t i = 0; !rc && i < g.n_used; i++) {
        const col_mat *e = L->experts + 3 * (size_t)g.used[i];
        if (e[0].data == NULL || e[1].data == NULL || e[2].data == NULL) rc = COL_EMISSING;
        memcpy(mats + 3 * i, e, 3 * sizeof(col_mat));
    }
    if (!rc && g.extra) memcpy(mats + 3 * g.n_used, L->shared, 3 * sizeof(col_mat));
    if (!rc)
        rc = moe_residual(pool, g.n_used + (g.extra ? 1 : 0), mats, g.start, g.rows, h, m,
                          (size_t)L->d, g.k, g.slot_row, weights, g.extra ? g.extra_row : NULL,
                          x);
    free(g.ints);
    free(mats);
    return rc;
}

int col_layer_experts(col_pool *pool, const col_layer *L, size_t m, const float *h,
                      const int32_t *chosen, float *y, uint8_t *done) {
    int rc = routed_args(L, m, h, chosen);
    if (rc || y == NULL || done == NULL) return rc ? rc : COL_EINVAL;
    if (m == 0) return COL_OK;
    size_t n_exp = (size_t)L->n_router, d = (size_t)L->d;
    grouping g;
    col_mat *mats = malloc((n_exp + 1) * 3 * sizeof(col_mat));
    /* The blocks to run now: sub_start/sub_rows index them, pick[j] is block j's grouping
     * block (n_used for the shared expert's). */
    int64_t *sub = malloc((3 * n_exp + 4 + 2 * m * (size_t)L->top_k + 2 * m) * sizeof(int64_t));
    rc = mats == NULL || sub == NULL ? COL_ENOMEM : group_layer(L, m, chosen, &g);
    if (mats == NULL || sub == NULL) {
        free(mats);
        free(sub);
        return rc;
    }
    int64_t *pick = sub, *sub_start = pick + n_exp + 1, *sub_rows = sub_start + n_exp + 2;
    size_t n_sub = 0, n_rows = 0;
    sub_start[0] = 0;
    for (size_t i = 0; !rc && i <= g.n_used; i++) {
        int shared = i == g.n_used;
        if (shared ? (!g.extra || done[n_exp]) : done[g.used[i]]) continue;
        const col_mat *e = shared ? L->shared : L->experts + 3 * (size_t)g.used[i];
        if (e[0].data == NULL || e[1].data == NULL || e[2].data == NULL) continue;
        memcpy(mats + 3 * n_sub, e, 3 * sizeof(col_mat));
        for (int64_t r = g.start[i]; r < g.start[i + 1]; r++) sub_rows[n_rows++] = g.rows[r];
        pick[n_sub++] = (int64_t)i;
        sub_start[n_sub] = (int64_t)n_rows;
    }
    float *out = rc || n_rows == 0 ? NULL : malloc(n_rows * d * sizeof(float));
    if (!rc && n_rows && out == NULL) rc = COL_ENOMEM;
    if (!rc && n_rows) rc = col_moe(pool, n_sub, mats, sub_start, sub_rows, h, m, d, out);
    for (size_t j = 0; !rc && j < n_sub; j++) { /* each block to its place in y */
        size_t i = (size_t)pick[j], n = (size_t)(sub_start[j + 1] - sub_start[j]);
        memcpy(y + (size_t)g.start[i] * d, out + (size_t)sub_start[j] * d, n * d * sizeof(float));
        done[i == g.n_used ? n_exp : (size_t)g.used[i]] = 1;
    }
    free(out);
    free(sub);
    free(mats);
    free(g.ints);
    return rc;
}

int col_layer_combine(const col_layer *L, size_t m, const int32_t *chosen,
                      const float *weights, const float *y, const uint8_t *done, float *x) {
    int rc = routed_args(L, m, y, chosen);
    if (rc || weights == NULL || x == NULL || done == NULL) return rc ? rc : COL_EINVAL;
    if (m == 0) return COL_OK;
    grouping g;
    rc = group_layer(L, m, chosen, &g);
    for (size_t i = 0; !rc && i < g.n_used; i++)
        if (!done[g.used[i]]) rc = COL_EMISSING;
    if (!rc && g.extra && !done[L->n_router]) rc = COL_EMISSING;
    if (!rc)
        combine_rows(y, m, (size_t)L->d, g.k, g.slot_row, weights,
                     g.extra ? g.extra_row : NULL, x);
    free(g.ints);
    return rc;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A whole decoder layer without DSA selection: the attention block, then a dense layer's MLP,
 * or the router (chosen/weights [m, top_k] out) and, when every chosen expert has a
 * descriptor, col_layer_routed. COL_EMISSING: some chosen expert has none; x holds the
 * attention's residual and h the post-norm input, and the caller finishes with
 * col_layer_routed once it has filled them in. seconds gets the wall seconds of the
 * attention block and of the rest (router and experts). */
static int layer_step(col_pool *pool, const col_layer *L, size_t m, float *x, float *h,
                      const float *cos, const float *sin, float *const *latent,
                      float *const *rope_key, float *const *index_key, const size_t *slot,
                      int32_t *chosen, float *weights, double *seconds) {
    if (L == NULL || (L->n_router && (chosen == NULL || weights == NULL || !L->router_bias ||
                                      L->n_group <= 0 || L->topk_group <= 0 ||
                                      L->top_k <= 0)) ||
        (!L->n_router && L->dense == NULL))
        return COL_EINVAL;
    if (m == 0) return COL_OK;
    size_t n_exp = (size_t)L->n_router;
    float *logits = n_exp ? malloc(m * n_exp * sizeof(float)) : NULL;
    int64_t *every = n_exp ? NULL : malloc((m + 2) * sizeof(int64_t));
    if (n_exp ? logits == NULL : every == NULL) return COL_ENOMEM;
    double t0 = now_s();
    int rc = attention_block(pool, L, m, x, h, logits, cos, sin, latent, rope_key, index_key,
                             slot);
    double t1 = now_s();
    if (!rc && !n_exp) { /* a dense layer: one MLP over every row */
        int64_t start[2] = {0, (int64_t)m};
        for (size_t r = 0; r < m; r++) every[r] = (int64_t)r;
        rc = moe_residual(pool, 1, L->dense, start, every, h, m, (size_t)L->d, 0, NULL, NULL,
                          every, x);
    }
    if (!rc && n_exp) {
        rc = col_route(logits, m, n_exp, L->router_bias, (size_t)L->n_group,
                       (size_t)L->topk_group, (size_t)L->top_k, (int)L->norm_topk,
                       L->routed_scale, chosen, weights);
        if (!rc) rc = col_layer_routed(pool, L, m, h, chosen, weights, x);
    }
    /* the phases PERF/PROF report: attention (with the router), experts */
    seconds[0] = t1 - t0;
    seconds[1] = now_s() - t1;
    free(logits);
    free(every);
    return rc;
}

int col_decoder_layers(col_pool *pool, const col_layer *const *layers, size_t first,
                       size_t end, size_t m, float *x, float *h, const float *cos,
                       const float *sin, float *const *caches, const size_t *slot,
                       size_t top_k, int32_t *chosen, float *weights, double *seconds,
                       size_t *stopped) {
    if (layers == NULL || caches == NULL || stopped == NULL || seconds == NULL || first > end ||
        (top_k && (chosen == NULL || weights == NULL)))
        return COL_EINVAL;
    for (size_t l = first; l < end; l++) {
        const col_layer *L = layers[l];
        if (L == NULL || (L->n_router && L->top_k != (int64_t)top_k)) return COL_EINVAL;
        float *const *c = caches + 3 * m * l; /* latent, rope key, index key: m each */
        double sec[2] = {0.0, 0.0};
        int rc = layer_step(pool, L, m, x, h, cos, sin, c, c + m,
                            L->index_keys ? c + 2 * m : NULL, slot,
                            top_k ? chosen + l * m * top_k : NULL,
                            top_k ? weights + l * m * top_k : NULL, sec);
        seconds[0] += sec[0];
        seconds[1] += sec[1];
        if (rc) {
            *stopped = l;
            return rc;
        }
    }
    *stopped = end;
    return COL_OK;
}
