/* pool.c: the CPU backend's thread pool: workers sleep on a condition variable and wake for
 * each job generation; the caller runs range 0 itself and waits for the rest. */
#include "cpu_impl.h"
#include "td_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct td_cpu_pool {
    int n;         /* threads including the caller */
    pthread_t *th; /* [n - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t gen; /* job generation: workers run once per increment */
    int pending;  /* workers still running the current job */
    bool stop;
    td_cpu_job_fn fn;
    void *ctx;
    int64_t items;
};

typedef struct worker_arg {
    td_cpu_pool_t *p;
    int tid;
} worker_arg_t;

static void run_range(td_cpu_pool_t *p, int tid)
{
    int64_t b = p->items * tid / p->n, e = p->items * (tid + 1) / p->n;
    if (b < e)
        p->fn(p->ctx, b, e, tid);
}

static void *worker(void *arg)
{
    worker_arg_t wa = *(worker_arg_t *)arg;
    free(arg);
    td_cpu_pool_t *p = wa.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_range(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

td_cpu_pool_t *td_cpu_pool_create(int n_threads)
{
    td_cpu_pool_t *p = td_calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = td_calloc((size_t)p->n, sizeof(pthread_t));
    if (!p->th)
        goto err;
    for (int i = 1; i < p->n; i++) {
        worker_arg_t *a = malloc(sizeof(*a));
        if (!a)
            goto err_threads;
        a->p = p;
        a->tid = i;
        if (pthread_create(&p->th[i - 1], NULL, worker, a) != 0) {
            free(a);
            goto err_threads;
        }
        continue;
    err_threads:
        p->n = i; /* join only the ones started */
        td_cpu_pool_free(p);
        return NULL;
    }
    return p;
err:
    free(p);
    return NULL;
}

void td_cpu_pool_free(td_cpu_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->th[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

void td_cpu_pool_run(td_cpu_pool_t *p, int64_t n, td_cpu_job_fn fn, void *ctx)
{
    if (!p || p->n == 1 || n < 2) {
        if (n > 0)
            fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->items = n;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_range(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
