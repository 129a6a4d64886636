/* Absorbed MLA attention over the latent cache (spec §5), one task per (row, head):
 *
 *   qabs_h    = kv_b_k_h^T q_nope_h                         [kvl]
 *   score_t   = (qabs_h . latent_t + q_rope_h . rope_key_t) * scale
 *   context_h = sum_t softmax(score)_t latent_t              [kvl]
 *   out_h     = kv_b_v_h context_h                           [vdim]
 *
 * A task reads only its own row's cache and query, so rows never affect each other. */
#include <math.h>
#include <stdlib.h>

#include "colibri.h"

typedef struct {
    size_t h, nope, rope, vdim, kvl;
    const float *q;
    const float *const *latent;
    const float *const *rope_key;
    const size_t *seen;
    const int64_t *const *keep;
    const size_t *n_keep;
    const void *kv_b;
    int dtype;
    float scale;
    float *out;
    int status;
} mla_ctx;

/* Row `index` of kv_b as float32: the mapped row itself when stored as f32 (no copy), else
 * converted into `scratch`. */
static const float *kv_b_row(const mla_ctx *c, size_t index, float *scratch) {
    if (c->dtype == COL_F32) return (const float *)c->kv_b + index * c->kvl;
    col_row_to_f32(c->kv_b, c->dtype, index, c->kvl, scratch);
    return scratch;
}

static void mla_task(void *raw, size_t begin, size_t end) {
    mla_ctx *c = raw;
    size_t kvl = c->kvl, qk = c->nope + c->rope;
    size_t max_seen = 0;
    for (size_t t = begin; t < end; t++) {
        size_t r = t / c->h;
        if (c->seen[r] > max_seen) max_seen = c->seen[r];
    }
    float *qabs = malloc(kvl * sizeof(float));
    float *ctx = malloc(kvl * sizeof(float));
    float *wrow = malloc(kvl * sizeof(float));
    float *scores = malloc((max_seen ? max_seen : 1) * sizeof(float));
    if (!qabs || !ctx || !wrow || !scores) {
        c->status = COL_ENOMEM;
        goto done;
    }
    for (size_t t = begin; t < end; t++) {
        size_t r = t / c->h, head = t % c->h;
        const float *qn = c->q + (r * c->h + head) * qk;
        const float *qr = qn + c->nope;
        size_t base = head * (c->nope + c->vdim);
        for (size_t j = 0; j < kvl; j++) qabs[j] = 0.0f;
        for (size_t i = 0; i < c->nope; i++) {
            const float *w = kv_b_row(c, base + i, wrow);
            float qi = qn[i];
            for (size_t j = 0; j < kvl; j++) qabs[j] += qi * w[j];
        }
        const float *lat = c->latent[r], *rk = c->rope_key[r];
        const int64_t *keep = c->keep[r];
        size_t n = keep ? c->n_keep[r] : c->seen[r];
        float mx = -INFINITY;
        for (size_t s = 0; s < n; s++) {
            size_t pos = keep ? (size_t)keep[s] : s;
            float sc = col_dot_f32(qabs, lat + pos * kvl, kvl) + col_dot_f32(qr, rk + pos * c->rope, c->rope);
            sc *= c->scale;
            scores[s] = sc;
            if (sc > mx) mx = sc;
        }
        float sum = 0.0f;
        for (size_t s = 0; s < n; s++) {
            scores[s] = expf(scores[s] - mx);
            sum += scores[s];
        }
        for (size_t j = 0; j < kvl; j++) ctx[j] = 0.0f;
        for (size_t s = 0; s < n; s++) {
            size_t pos = keep ? (size_t)keep[s] : s;
            float p = scores[s] / sum;
            const float *l = lat + pos * kvl;
            for (size_t j = 0; j < kvl; j++) ctx[j] += p * l[j];
        }
        float *o = c->out + r * c->h * c->vdim + head * c->vdim;
        for (size_t v = 0; v < c->vdim; v++)
            o[v] = col_dot_f32(kv_b_row(c, base + c->nope + v, wrow), ctx, kvl);
    }
done:
    free(qabs);
    free(ctx);
    free(wrow);
    free(scores);
}

int col_mla_attention(col_pool *pool, size_t m, size_t h, size_t nope, size_t rope,
                      size_t vdim, size_t kvl, const float *q, const float *const *latent,
                      const float *const *rope_key, const size_t *seen,
                      const int64_t *const *keep, const size_t *n_keep, const void *kv_b,
                      int dtype, float scale, float *out) {
    if (dtype != COL_F32 && dtype != COL_BF16 && dtype != COL_F16) return COL_EDTYPE;
    if (m == 0) return COL_OK;
    if (!q || !latent || !rope_key || !seen || !keep || !n_keep || !kv_b || !out || h == 0 ||
        kvl == 0)
        return COL_EINVAL;
    for (size_t r = 0; r < m; r++) {
        if (!latent[r] || !rope_key[r] || seen[r] == 0) return COL_EINVAL;
        if (keep[r]) {
            if (n_keep[r] == 0) return COL_EINVAL;
            for (size_t s = 0; s < n_keep[r]; s++)
                if (keep[r][s] < 0 || (size_t)keep[r][s] >= seen[r]) return COL_EINVAL;
        }
    }
    mla_ctx c = {h, nope, rope, vdim, kvl, q, latent, rope_key, seen, keep, n_keep, kv_b,
                 dtype, scale, out, COL_OK};
    col_pool_run(pool, m * h, mla_task, &c);
    return c.status;
}

typedef struct {
    const float *q, *w, *keys;
    size_t nh, hd;
    float scale;
    float *out;
} idx_ctx;

static void idx_task(void *raw, size_t begin, size_t end) {
    idx_ctx *c = raw;
    for (size_t t = begin; t < end; t++) {
        float acc = 0.0f;
        for (size_t h = 0; h < c->nh; h++) {
            float d = col_dot_f32(c->q + h * c->hd, c->keys + t * c->hd, c->hd) * c->scale;
            acc += c->w[h] * (d > 0.0f ? d : 0.0f);
        }
        c->out[t] = acc;
    }
}

int col_index_scores(col_pool *pool, const float *q, const float *w, size_t nh, size_t hd,
                     const float *keys, size_t s, float scale, float *out) {
    if (!q || !w || !keys || !out || nh == 0 || hd == 0) return COL_EINVAL;
    idx_ctx c = {q, w, keys, nh, hd, scale, out};
    col_pool_run(pool, s, idx_task, &c);
    return COL_OK;
}

/* The DSA top-k (spec §6): the best scores first, ties (and equal zeros of either sign) to the
 * earlier position, a NaN after every number -- the order of a stable sort of the negated
 * scores -- then the kept positions ascending. Exact: no arithmetic on the scores. */
typedef struct {
    float score;
    int64_t pos;
} scored;

static int better_first(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    int na = a->score != a->score, nb = b->score != b->score;
    if (na != nb) return na - nb;
    if (!na && a->score > b->score) return -1;
    if (!na && a->score < b->score) return 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

static int ascending(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

int col_index_select(const float *scores, size_t s, size_t topk, int64_t *keep) {
    if (!scores || !keep || topk == 0 || topk > s) return COL_EINVAL;
    scored *order = malloc(s * sizeof(scored));
    if (order == NULL) return COL_ENOMEM;
    for (size_t t = 0; t < s; t++) order[t] = (scored){scores[t], (int64_t)t};
    qsort(order, s, sizeof(scored), better_first);
    for (size_t i = 0; i < topk; i++) keep[i] = order[i].pos;
    free(order);
    qsort(keep, topk, sizeof(int64_t), ascending);
    return COL_OK;
}
