/* The accelerated engine's C kernels (spec/model.md): one header, every exported function.
 *
 * Determinism: every output element is computed by one thread in an order fixed by the source
 * (explicit lane accumulators, fixed reduction trees), never by the batch size or the thread
 * count, so a row's result is the same bytes alone, in any batch, with 1 or N threads
 * (sameness kind (c), spec/model.md §15). No -ffast-math; -ffp-contract=off.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

/* Error codes: 0 is success; the Python binding raises a named error for each. */
enum {
    COL_OK = 0,
    COL_EINVAL = 1,  /* a size, stride or pointer argument is invalid */
    COL_ENOMEM = 2,  /* scratch memory could not be allocated */
    COL_EDTYPE = 3,  /* a weight dtype code the kernels do not support */
    COL_ETHREAD = 4, /* the thread pool could not be created */
    /* col_decoder_layers: a chosen expert has no descriptor yet (the caller brings it in and
     * finishes the layer with col_layer_routed); not an error. */
    COL_EMISSING = 5,
    /* COL_EQUANT_BASE + c: a quantized kernel refused its matrix with COLI_Q_* code c. */
    COL_EQUANT_BASE = 100,
};

/* Stored weight dtypes: weights stay in these, converted exactly per element (spec §1). */
enum { COL_F32 = 0, COL_BF16 = 1, COL_F16 = 2 };

typedef struct col_pool col_pool;
typedef void (*col_task)(void *ctx, size_t begin, size_t end);

const char *col_version(void);
const char *col_isa(void);
const char *col_strerror(int code);

int col_pool_create(size_t threads, col_pool **out);
void col_pool_destroy(col_pool *pool);
size_t col_pool_threads(const col_pool *pool);
/* Run fn over [0, n) cut into contiguous chunks that the pool's threads and the caller claim
 * as each becomes free (pool.c); returns when every chunk is done. */
void col_pool_run(col_pool *pool, size_t n, col_task fn, void *ctx);
/* Multiply-adds below which a product runs on the calling thread: waking the pool (two
 * context switches on a busy machine) costs more than such a product. */
#define COL_INLINE_WORK ((size_t)1 << 18)

/* Internal helpers shared by the kernels (not exported through the binding). */
float col_dot_f32(const float *a, const float *b, size_t k);
/* out[r] = col_dot_f32(w, x + r * ldx, k) for r < 4, bit for bit, sharing w's loads. */
void col_dot4_f32(const float *w, const float *x, size_t ldx, size_t k, float *out);
/* out[r * ldo] = col_dot_f32(w, x + r * ldx, k) for r < m (four rows at a time). */
void col_dot_rows(const float *w, const float *x, size_t m, size_t ldx, size_t k, float *out,
                  size_t ldo);
/* out[r * ldo + n] = col_dot_f32(w + n * k, x + r * ldx, k) for n0 <= n < n1, r < m: weight
 * rows [n0, n1) of a float32 [*, k] matrix against m activation rows, bit for bit. */
void col_dot_block(const float *w, size_t n0, size_t n1, const float *x, size_t m, size_t ldx,
                   size_t k, float *out, size_t ldo);
int col_row_to_f32(const void *w, int dtype, size_t index, size_t k, float *out);
/* Whether col_dot_block's fastest kernel for m activation rows wants them 64-byte aligned
 * (rows at a 64-byte-aligned address, ldx a multiple of 16): the avx512 build's 16-lane
 * tiles, from 4 rows (more than 8 meet them in blocks of 8). Unaligned rows still give the same bytes, through the avx2 tiles. */
int col_dot_wants_aligned(size_t m);
/* Activation buffers (aligned.c): n floats on a 64-byte boundary (free() them), n rounded up
 * to a whole number of 64-byte lines, and whether rows at x, ldx floats apart, are aligned. */
float *col_alloc_floats(size_t n);
size_t col_pad_floats(size_t n);
int col_rows_aligned(const float *x, size_t ldx);
/* The leading dimension for activation rows of k floats: whole lines, an odd number of them,
 * so the rows' lines spread over the L1's sets (aligned.c). */
size_t col_spread_ld(size_t k);
/* Where col_dot_wants_aligned(m) and x's m rows of k are not aligned, or not spread (an even
 * number of lines apart): copy them to a new buffer, col_spread_ld(k) floats a row (*copy, for
 * the caller to free), and point *x / *ldx at it; else *copy NULL. */
int col_align_rows(const float **x, size_t m, size_t k, size_t *ldx, float **copy);
float col_f16_to_f32(uint16_t h);

/* out[r, n] = x[r, :] . w[n, :] for r < m, n < rows; w is [rows, k] in `dtype`.
 * x rows are ldx floats apart, out rows ldo floats apart. */
int col_matmul(col_pool *pool, const float *x, size_t m, size_t k, size_t ldx,
               const void *w, int dtype, size_t rows, float *out, size_t ldo);

int col_rms_norm(const float *x, size_t m, size_t d, const float *w, double eps, float *out);
int col_layer_norm(const float *x, size_t m, size_t d, const float *w, const float *b,
                   double eps, float *out);
/* Rotate `d` values at x + r*row_stride + h*head_stride for r < m, h < heads, in place. */
int col_rope(float *x, size_t m, size_t heads, size_t row_stride, size_t head_stride, size_t d,
             const float *cos, const float *sin, int interleaved);
/* out = silu(g) * u, elementwise (SwiGLU). */
int col_silu_mul(const float *g, const float *u, size_t n, float *out);
/* *finite = whether all n values of w (stored as dtype: COL_F32, COL_BF16, COL_F16) are
 * finite; on the pool for a large tensor (finite.c). */
int col_all_finite(col_pool *pool, const void *w, int dtype, size_t n, int *finite);

/* Absorbed MLA over the latent cache for m rows (spec §5). q is [m, h, nope + rope] with the
 * rope part already rotated; per row r: latent[r] [*, kvl], rope_key[r] [*, rope] of which the
 * first seen[r] rows are visible, optionally only the n_keep[r] rows keep[r] (ascending);
 * kv_b is [h * (nope + vdim), kvl] in `dtype`. out is [m, h * vdim]. */
int col_mla_attention(col_pool *pool, size_t m, size_t h, size_t nope, size_t rope,
                      size_t vdim, size_t kvl, const float *q, const float *const *latent,
                      const float *const *rope_key, const size_t *seen,
                      const int64_t *const *keep, const size_t *n_keep, const void *kv_b,
                      int dtype, float scale, float *out);

/* DSA indexer scores of one query (spec §6): q [nh, hd], w [nh] (scaled head weights),
 * keys [s, hd] -> out [s] = sum_h w_h relu(q_h . k_t * scale). */
int col_index_scores(col_pool *pool, const float *q, const float *w, size_t nh, size_t hd,
                     const float *keys, size_t s, float scale, float *out);
/* The DSA selection of one query (spec §6): keep [topk] the positions of the topk best of
 * scores [s] (ties to the earlier position, NaN last), ascending; 0 < topk <= s. */
int col_index_select(const float *scores, size_t s, size_t topk, int64_t *keep);

/* One weight of an expert as col_moe reads it: fmt 0 is a float matrix in `dtype` (COL_F32,
 * COL_BF16, COL_F16) at `data`; otherwise a COLI_Q_* format (coli_quant.h) with its packed
 * bytes at `data` and its .qs floats at `scales` (content checked once by coli_q_check). */
typedef struct {
    int32_t fmt;
    int32_t dtype;
    int32_t group_size;
    int32_t reserved;
    const void *data;
    int64_t data_len;
    const float *scales;
    int64_t n_scales;
    size_t rows, cols;
} col_mat;

/* SwiGLU MLPs of one layer in one call (spec §7.2): routed experts, the shared expert, or a
 * dense MLP. mats is [n_experts][3] (gate [m_e, d], up [m_e, d], down [d, m_e]; m_e may differ
 * per expert); expert e takes the rows rows[start[e] .. start[e+1]) of x [n_x, d] and writes
 * swiglu(x[row]) to out[start[e] + i, :] ([start[n_experts], d]). e8 experts (all three
 * matrices e8) rotate their inputs once per phase. */
int col_moe(col_pool *pool, size_t n_experts, const col_mat *mats, const int64_t *start,
            const int64_t *rows, const float *x, size_t n_x, size_t d, float *out);

/* out[r, o] = x[r, :] . w[o, :] for a float or quantized col_mat (e8: x rotated once), split
 * across the pool by output column. */
int col_mat_matmul(col_pool *pool, const col_mat *w, const float *x, size_t m, size_t ldx,
                   float *out, size_t ldo);

/* outs[i][r, o] = x[r, :] . ws[i][o, :] for n <= 64 weights of the same width that read the
 * same input, in one pool run over all their output columns (each element as col_mat_matmul
 * computes it). outs[i] is [m, ws[i].rows]. */
int col_mats_matmul(col_pool *pool, size_t n, const col_mat *ws, const float *x, size_t m,
                    size_t ldx, float *const *outs);

/* One decoder layer as col_decoder_layers reads it (built once per layer at load; every
 * field 8 bytes or a col_mat, so its layout is the same in the Python binding's record,
 * which col_layer_size lets it check). */
typedef struct {
    int64_t d, heads, nope, rope, vdim, kvl;
    int64_t q_lora;     /* 0: no q_a (q_first is q's projection itself) */
    int64_t index_hd;   /* the indexer's head width (its keys are cached when index_keys) */
    int64_t index_keys; /* a full indexer layer: compute and cache this step's index keys */
    int64_t interleave; /* RoPE of q and the rope key: interleaved pairs (spec §4) */
    int64_t n_router;   /* routed experts: router logits wanted (0 for a dense layer) */
    int64_t kv_b_dtype;
    /* the router (spec §7.1; when n_router): groups, groups kept, experts per row, norm */
    int64_t n_group, topk_group, top_k, norm_topk;
    double rms_eps, latent_eps, index_eps;
    float attn_scale, routed_scale;
    const float *input_norm, *post_norm, *q_a_norm, *kv_a_norm, *ik_norm_w, *ik_norm_b;
    const void *kv_b;
    const float *router_bias;
    /* [n_router][3] gate, up, down per routed expert, data NULL where the caller has not
     * brought the expert in yet; shared: [3] or NULL; dense: [3] (a dense layer) or NULL */
    const col_mat *experts, *shared, *dense;
    col_mat q_first, q_b, kv_a, wk, o, router;
} col_layer;

size_t col_layer_size(void);

/* noaux_tc routing of m rows (route.c): logits [m, n_experts] -> chosen [m, k] (ascending
 * expert ids) and weights [m, k]; each row on its own, the reference's float32 operations. */
int col_route(const float *logits, size_t m, size_t n_experts, const float *bias,
              size_t n_group, size_t topk_group, size_t k, int norm, float scale,
              int32_t *chosen, float *weights);

/* The (row, slot) pairs of chosen [m, k] grouped by expert, stably (route.c): used[n_used]
 * the distinct experts ascending, start[n_used + 1] their blocks, rows[m k] each pair's row,
 * slot_row[m k] where each pair landed. */
int col_group_rows(const int32_t *chosen, size_t m, size_t k, size_t n_experts,
                   int64_t *used, size_t *n_used, int64_t *start, int64_t *rows,
                   int64_t *slot_row);

/* col_layer_routed in two halves, so a caller can run the experts it holds while it reads
 * the others. col_layer_experts writes, into y [m top_k + m, d] (rows grouped by expert as
 * col_layer_routed groups them, the shared expert's block last), the outputs of every chosen
 * expert that has a descriptor and whose done[e] is 0, and of the shared expert while
 * done[n_router] is 0, and sets their done flags; col_layer_combine, once every chosen
 * expert (and the shared one) is done, adds the weighted sum to x (COL_EMISSING before).
 * Called in any number of rounds they give col_layer_routed's bytes. */
int col_layer_experts(col_pool *pool, const col_layer *L, size_t m, const float *h,
                      const int32_t *chosen, float *y, uint8_t *done);
int col_layer_combine(const col_layer *L, size_t m, const int32_t *chosen,
                      const float *weights, const float *y, const uint8_t *done, float *x);

/* Decoder layers [first, end) over m rows without DSA selection, in one call: per layer the
 * attention block (spec §3-§5: row r's new latent, rope key and index key go to row slot[r]
 * of its caches and it attends to rows [0, slot[r]]; cos/sin [m, rope/2]), then a dense
 * layer's MLP, or the router (col_route) and, when every chosen expert has a descriptor,
 * col_layer_routed; x [m, d] updated in place (h: an [m, d] scratch). layers[l] and
 * caches[3 m l + j m + r] (row r's latent (j 0), rope-key (1) and index-key (2, full
 * indexer layers) cache of layer l) are read for l in [first, end); chosen/weights
 * [end, m, top_k] (dense layers' blocks untouched). seconds [2] accumulates the attention's
 * and the rest's wall seconds. On a non-zero status *stopped is the layer that returned it;
 * COL_EMISSING (some chosen expert has no descriptor yet): x holds that layer's attention
 * residual and h its post-norm input; finish it with col_layer_routed once the experts are
 * filled in, then continue from *stopped + 1. On success *stopped is end. */
int col_decoder_layers(col_pool *pool, const col_layer *const *layers, size_t first,
                       size_t end, size_t m, float *x, float *h, const float *cos,
                       const float *sin, float *const *caches, const size_t *slot,
                       size_t top_k, int32_t *chosen, float *weights, double *seconds,
                       size_t *stopped);

/* x += the routed experts' weighted outputs (+ the shared expert) over h: rows grouped by
 * expert (col_group_rows), each expert read once for all its rows (col_moe), the weighted sum
 * per element in slot (ascending expert id) order, then the shared expert, then x. */
int col_layer_routed(col_pool *pool, const col_layer *L, size_t m, const float *h,
                     const int32_t *chosen, const float *weights, float *x);

#endif
