/* The noaux_tc router (spec §7.1) and the grouping of a step's rows by routed expert (§7.2),
 * which model.py did in numpy per row; both engines' paths (two-call layers and per-kernel)
 * call these, so they agree byte for byte.
 *
 * Each row is routed on its own (its bytes never depend on the batch), with the reference's
 * operations in float32, one rounding each (-ffp-contract=off):
 *   s_e = 1 / (1 + expf(-l_e))      (libm expf: within an ulp of numpy's exp, so the weights
 *                                    stay inside the reference's tolerance)
 *   c_e = s_e + bias_e
 *   groups (n_group > 1): the two largest c_e of each group summed; the topk_group best groups
 *   kept (ties to the lower group), c_e = -inf outside them
 *   chosen = the k largest c_e, ties to the lower id (numpy's stable argsort of -c), ascending
 *   w = s[chosen]; w /= (sum w + 1e-20) when norm (numpy's float32 sum order, below); w *= scale
 */
#include <math.h>
#include <stdlib.h>

#include "colibri.h"

/* numpy's float32 add.reduce over n contiguous values (pairwise_sum for n <= 128): a plain
 * loop under 8, else eight running sums over stride 8 added as a fixed tree, then the tail. */
static float numpy_sum(const float *a, size_t n) {
    if (n < 8) {
        float s = -0.0f; /* numpy starts a float reduction from -0.0 (its identity) */
        for (size_t i = 0; i < n; i++) s = s + a[i];
        return s;
    }
    float r[8];
    for (size_t j = 0; j < 8; j++) r[j] = a[j];
    size_t i = 8;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) r[j] = r[j] + a[i + j];
    float s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) s = s + a[i];
    return s;
}

/* The index of the largest of v[0..n) not yet taken, ties to the lower index. */
static size_t best_free(const float *v, size_t n, const unsigned char *taken) {
    size_t best = n;
    for (size_t i = 0; i < n; i++)
        if (!taken[i] && (best == n || v[i] > v[best])) best = i;
    return best;
}

int col_route(const float *logits, size_t m, size_t n_experts, const float *bias,
              size_t n_group, size_t topk_group, size_t k, int norm, float scale,
              int32_t *chosen, float *weights) {
    if (m == 0) return COL_OK;
    if (logits == NULL || bias == NULL || chosen == NULL || weights == NULL || k == 0 ||
        k > n_experts || n_group == 0 || n_experts % n_group || topk_group == 0 ||
        topk_group > n_group || (n_group > 1 && n_experts / n_group < 2))
        return COL_EINVAL;
    size_t per = n_experts / n_group;
    float *scores = malloc(2 * n_experts * sizeof(float) + n_group * sizeof(float));
    unsigned char *taken = malloc(n_experts + n_group);
    if (scores == NULL || taken == NULL) {
        free(scores);
        free(taken);
        return COL_ENOMEM;
    }
    float *choice = scores + n_experts, *group = choice + n_experts;
    unsigned char *group_taken = taken + n_experts;
    for (size_t r = 0; r < m; r++) {
        const float *l = logits + r * n_experts;
        for (size_t e = 0; e < n_experts; e++) {
            scores[e] = 1.0f / (1.0f + expf(-l[e]));
            choice[e] = scores[e] + bias[e];
        }
        if (n_group > 1) {
            for (size_t g = 0; g < n_group; g++) {
                /* the two largest of the group (a sort's first two: equal values alike) */
                const float *c = choice + g * per;
                size_t a = 0;
                for (size_t i = 1; i < per; i++)
                    if (c[i] > c[a]) a = i;
                size_t b = a == 0 ? 1 : 0;
                for (size_t i = 0; i < per; i++)
                    if (i != a && c[i] > c[b]) b = i;
                group[g] = c[a] + c[b];
                group_taken[g] = 0;
            }
            for (size_t t = 0; t < topk_group; t++)
                group_taken[best_free(group, n_group, group_taken)] = 1;
            for (size_t g = 0; g < n_group; g++)
                if (!group_taken[g])
                    for (size_t i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
        }
        for (size_t e = 0; e < n_experts; e++) taken[e] = 0;
        for (size_t t = 0; t < k; t++) taken[best_free(choice, n_experts, taken)] = 1;
        int32_t *ids = chosen + r * k;
        float *w = weights + r * k;
        size_t n = 0;
        for (size_t e = 0; e < n_experts; e++)
            if (taken[e]) {
                ids[n] = (int32_t)e;
                w[n++] = scores[e];
            }
        if (norm) {
            float denom = numpy_sum(w, k) + 1e-20f;
            for (size_t s = 0; s < k; s++) w[s] = w[s] / denom;
        }
        for (size_t s = 0; s < k; s++) w[s] = w[s] * scale;
    }
    free(scores);
    free(taken);
    return COL_OK;
}

int col_group_rows(const int32_t *chosen, size_t m, size_t k, size_t n_experts,
                   int64_t *used, size_t *n_used, int64_t *start, int64_t *rows,
                   int64_t *slot_row) {
    if (m == 0 || k == 0) {
        *n_used = 0;
        start[0] = 0;
        return COL_OK;
    }
    if (chosen == NULL || used == NULL || n_used == NULL || start == NULL || rows == NULL ||
        slot_row == NULL)
        return COL_EINVAL;
    size_t *count = calloc(n_experts + 1, sizeof(size_t));
    if (count == NULL) return COL_ENOMEM;
    for (size_t i = 0; i < m * k; i++) {
        if (chosen[i] < 0 || (size_t)chosen[i] >= n_experts) {
            free(count);
            return COL_EINVAL;
        }
        count[chosen[i]]++;
    }
    /* A counting sort, stable in (row, slot) order: np.argsort(chosen.ravel(), stable). */
    size_t n = 0;
    int64_t at = 0;
    for (size_t e = 0; e < n_experts; e++) {
        if (!count[e]) continue;
        used[n] = (int64_t)e;
        start[n++] = at;
        size_t c = count[e];
        count[e] = (size_t)at; /* now where expert e's next pair goes */
        at += (int64_t)c;
    }
    start[n] = at;
    for (size_t i = 0; i < m * k; i++) {
        size_t pos = count[chosen[i]]++;
        rows[pos] = (int64_t)(i / k);
        slot_row[i] = (int64_t)pos;
    }
    *n_used = n;
    free(count);
    return COL_OK;
}
