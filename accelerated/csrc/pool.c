/* A persistent pthread pool. Work is split by output element into one contiguous chunk per
 * thread; which thread computes an element never changes how it is computed, so results do
 * not depend on the thread count. */
#include <pthread.h>
#include <stdlib.h>

#include "colibri.h"

struct col_pool {
    size_t n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_mutex_t run_mu; /* one parallel run at a time, whoever calls */
    unsigned long generation;
    size_t pending;
    int stop;
    col_task fn;
    void *ctx;
    size_t items;
};

typedef struct {
    col_pool *pool;
    size_t index;
} worker_arg;

static void chunk(size_t items, size_t parts, size_t i, size_t *begin, size_t *end) {
    *begin = items * i / parts;
    *end = items * (i + 1) / parts;
}

static void *worker(void *raw) {
    worker_arg *arg = raw;
    col_pool *p = arg->pool;
    size_t index = arg->index;
    free(arg);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->stop) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        col_task fn = p->fn;
        void *ctx = p->ctx;
        size_t items = p->items;
        pthread_mutex_unlock(&p->mu);
        size_t b, e;
        chunk(items, p->n, index, &b, &e);
        if (b < e) fn(ctx, b, e);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
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
    pthread_cond_init(&p->done, NULL);
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
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
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
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->items = items;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    size_t b, e;
    chunk(items, p->n, 0, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
