/* Whether a stored weight holds only finite values: the loader's content check of every
 * float tensor before a kernel reads it (a NaN or Inf weight is refused with the tensor's
 * name, as the reference refuses it).
 *
 * Why in C, on the pool: routed experts are checked on first use, so the check sits inside
 * the first steps and the first prefill after a load, on weights that come from memory (and
 * fault their pages in) for the first time, where numpy's isfinite on one thread read about
 * 3 GB/s. Here each thread tests the exponent bits of its chunk (all ones: Inf or NaN), a
 * loop the compiler vectorises, so the check reads at the pool's memory bandwidth and the
 * pages fault in on both threads. The f32 bench model, a fresh process each, five of each
 * alternating (2-core EPYC Zen 5, two threads, page cache warm): the first 12-token prefill
 * after load took 113-130 ms with numpy's check (median 118), 82-108 with this one (88) and
 * 66-81 with none (70); the load itself, which checks the dense weights, 44-51, 36-48 and
 * 23-33 ms. What remains is one more pass over weights read from memory for the first time. */
#include <stdatomic.h>
#include <stdint.h>

#include "colibri.h"

/* Values per pool item: big enough that an item's loop runs long, small enough that a
 * 1024-wide tensor still spreads over the threads. */
#define FINITE_BLOCK ((size_t)1 << 14)

typedef struct {
    const void *w;
    int dtype;
    size_t n;
    _Atomic int bad; /* set by whichever chunk meets a non-finite value */
} finite_ctx;

/* 1 if any of the n 32-bit words has every exponent bit set. */
static int any_nonfinite_f32(const uint32_t *v, size_t n) {
    uint32_t hit = 0;
    for (size_t i = 0; i < n; i++) hit |= (uint32_t)((v[i] & 0x7f800000u) == 0x7f800000u);
    return hit != 0;
}

/* The same for 16-bit values whose exponent bits are `mask` (bf16 0x7f80, f16 0x7c00). */
static int any_nonfinite_16(const uint16_t *v, size_t n, uint16_t mask) {
    uint16_t hit = 0;
    for (size_t i = 0; i < n; i++) hit |= (uint16_t)((v[i] & mask) == mask);
    return hit != 0;
}

static void finite_task(void *raw, size_t begin, size_t end) {
    finite_ctx *c = raw;
    if (atomic_load_explicit(&c->bad, memory_order_relaxed)) return;
    size_t lo = begin * FINITE_BLOCK, hi = end * FINITE_BLOCK < c->n ? end * FINITE_BLOCK : c->n;
    int bad;
    if (c->dtype == COL_F32)
        bad = any_nonfinite_f32((const uint32_t *)c->w + lo, hi - lo);
    else
        bad = any_nonfinite_16((const uint16_t *)c->w + lo, hi - lo,
                               c->dtype == COL_BF16 ? 0x7f80u : 0x7c00u);
    if (bad) atomic_store_explicit(&c->bad, 1, memory_order_relaxed);
}

int col_all_finite(col_pool *pool, const void *w, int dtype, size_t n, int *finite) {
    if (finite == NULL || (w == NULL && n > 0)) return COL_EINVAL;
    if (dtype != COL_F32 && dtype != COL_BF16 && dtype != COL_F16) return COL_EDTYPE;
    finite_ctx c = {.w = w, .dtype = dtype, .n = n};
    atomic_init(&c.bad, 0);
    size_t blocks = (n + FINITE_BLOCK - 1) / FINITE_BLOCK;
    if (pool == NULL || n < COL_INLINE_WORK)
        finite_task(&c, 0, blocks);
    else
        col_pool_run(pool, blocks, finite_task, &c);
    *finite = !atomic_load(&c.bad);
    return COL_OK;
}
