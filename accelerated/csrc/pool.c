/* A persistent pthread pool with dynamic chunks: a run's items are cut into a fixed number
 * of contiguous chunks, long first and short last, that whoever is free claims, the caller
 * included.
 *
 * Why dynamic: on a machine shared with other work a woken worker may not be scheduled for
 * a whole time slice (milliseconds); with one fixed chunk per thread every run would wait for
 * it. Here the caller keeps claiming chunks and waits only for chunks already started, so a
 * late worker costs parallelism, never a stall. Why a short spin before sleeping: the calls
 * of one decode step come a few microseconds apart, and a spinning worker joins the next run
 * without a futex wake-up.
 *
 * Determinism: which thread computes a chunk, and how the items are cut, never changes how an
 * element is computed (every task computes each of its items alone, in an order its source
 * fixes), so results do not depend on the thread count or on scheduling.
 *
 * Claims are lock-free: one 64-bit ticket packs (generation, chunks, next chunk). A claim is
 * a compare-and-swap on the ticket, so it succeeds only while its run is still the current
 * one; fn/ctx/items, written before the ticket is published, are then the run's own. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins for the next run before it sleeps, and how long the caller
 * spins on chunks still running before it yields its core. */
#define SPIN_NS 100000L
/* Chunks per thread: enough that a late or slow thread leaves little behind. */
#define CHUNKS_PER_THREAD 8
#define MAX_CHUNKS 0xFFFFu

struct col_pool {
    size_t n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go;
    pthread_mutex_t run_mu; /* one parallel run at a time, whoever calls */
    _Atomic uint64_t ticket;     /* generation << 32 | chunks << 16 | next chunk */
    _Atomic size_t unfinished;   /* chunks of the current run not yet done */
    _Atomic size_t sleeping;     /* workers blocked on `go` */
    _Atomic int stop;
    _Atomic(col_task) fn;
    _Atomic(void *) ctx;
    _Atomic size_t items;
};

typedef struct {
    col_pool *pool;
    size_t index;
} worker_arg;

static uint32_t t_gen(uint64_t t) { return (uint32_t)(t >> 32); }
static size_t t_chunks(uint64_t t) { return (size_t)((t >> 16) & 0xFFFFu); }
static size_t t_next(uint64_t t) { return (size_t)(t & 0xFFFFu); }

static long elapsed_ns(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000000000L + (now.tv_nsec - since->tv_nsec);
}

/* Where chunk i of `parts` begins: items * (1 - (1 - i / parts)^2), so the chunks shrink
 * toward the end of a run (guided scheduling). Why: a run ends when its last chunk does, and
 * the threads that finish first wait for it, so the last chunks should be short; the first
 * ones are long, so each thread restarts its weight stream no more often than with equal
 * chunks. With 16 chunks the first holds 12 % of the items and the last 0.4 %. Measured
 * against 16 equal chunks on a 2-core EPYC Zen 4, 2 threads, paired, same bytes: the f32
 * bench model's decode step 1.015-1.018x at one row and 1.030-1.034x at 8 (avx512 and avx2
 * builds), the int4g64 container's 1.03x / 1.04x, a 64-token prefill 1.06-1.07x; a cubic
 * curve measured the same as this square, 8 or 32 guided chunks 0.98-1.00x. Exact for any
 * run (items < 2^53): chunk 0 begins at 0, chunk `parts` at `items`, and the starts never
 * decrease, so every item belongs to one chunk. */
static size_t chunk_begin(size_t items, size_t i, size_t parts) {
    double left = (double)(parts - i) / (double)parts;
    return items - (size_t)((double)items * left * left);
}

/* Claim and run chunks of generation `gen` until none is left; 1 if any was run. */
static int work(col_pool *p, uint32_t gen) {
    int ran = 0;
    uint64_t t = atomic_load(&p->ticket);
    while (t_gen(t) == gen && t_next(t) < t_chunks(t)) {
        col_task fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        size_t items = atomic_load_explicit(&p->items, memory_order_relaxed);
        if (!atomic_compare_exchange_weak(&p->ticket, &t, t + 1)) continue; /* t reloaded */
        size_t parts = t_chunks(t), i = t_next(t);
        size_t b = chunk_begin(items, i, parts), e = chunk_begin(items, i + 1, parts);
        if (b < e) fn(ctx, b, e);
        atomic_fetch_sub(&p->unfinished, 1);
        ran = 1;
        t = atomic_load(&p->ticket);
    }
    return ran;
}

static void *worker(void *raw) {
    worker_arg *arg = raw;
    col_pool *p = arg->pool;
    free(arg);
    uint32_t seen = t_gen(atomic_load(&p->ticket));
    for (;;) {
        struct timespec spin_start;
        clock_gettime(CLOCK_MONOTONIC, &spin_start);
        uint64_t t;
        for (unsigned k = 0;; k++) {
            t = atomic_load(&p->ticket);
            if (t_gen(t) != seen || atomic_load(&p->stop)) break;
            cpu_relax();
            if ((k & 63) == 63 && elapsed_ns(&spin_start) > SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleeping, 1);
                while (t_gen(atomic_load(&p->ticket)) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->go, &p->mu);
                atomic_fetch_sub(&p->sleeping, 1);
                pthread_mutex_unlock(&p->mu);
                clock_gettime(CLOCK_MONOTONIC, &spin_start);
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = t_gen(t);
        work(p, seen);
    }
}

int col_pool_create(size_t threads, col_pool **out) {
    if (out == NULL || threads == 0 || threads > 1024) return COL_EINVAL;
    col_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return COL_ENOMEM;
    p->n = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->go, NULL);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->unfinished, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->items, 0);
    p->threads = calloc(threads, sizeof *p->threads);
    if (p->threads == NULL) {
        free(p);
        return COL_ENOMEM;
    }
    for (size_t i = 1; i < threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg == NULL || pthread_create(&p->threads[i], NULL, worker,
                                          (arg->pool = p, arg->index = i, arg)) != 0) {
            free(arg);
            p->n = i; /* join the ones that started */
            col_pool_destroy(p);
            return COL_ETHREAD;
        }
    }
    *out = p;
    return COL_OK;
}

void col_pool_destroy(col_pool *p) {
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->threads);
    free(p);
}

size_t col_pool_threads(const col_pool *p) { return p ? p->n : 1; }

void col_pool_run(col_pool *p, size_t items, col_task fn, void *ctx) {
    if (items == 0) return;
    if (p == NULL || p->n == 1 || items == 1) {
        fn(ctx, 0, items);
        return;
    }
    size_t chunks = p->n * CHUNKS_PER_THREAD;
    if (chunks > items) chunks = items;
    if (chunks > MAX_CHUNKS) chunks = MAX_CHUNKS;
    pthread_mutex_lock(&p->run_mu);
    uint32_t gen = t_gen(atomic_load(&p->ticket)) + 1;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->items, items, memory_order_relaxed);
    atomic_store(&p->unfinished, chunks);
    /* seq_cst store, then the seq_cst load of `sleeping`: a worker about to sleep either sees
     * this generation or is counted (and then woken under the mutex). */
    atomic_store(&p->ticket, ((uint64_t)gen << 32) | ((uint64_t)chunks << 16));
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, gen);
    struct timespec spin_start;
    clock_gettime(CLOCK_MONOTONIC, &spin_start);
    for (unsigned k = 0; atomic_load(&p->unfinished) > 0; k++) {
        cpu_relax();
        if ((k & 63) == 63 && elapsed_ns(&spin_start) > SPIN_NS) sched_yield();
    }
    pthread_mutex_unlock(&p->run_mu);
}
