/* pool.c: the CPU backend's thread pool. Workers sleep on a condition variable and wake for each
 * job generation; the job's items are handed out in chunks from one atomic counter, each thread
 * taking the next chunk when it is done with its last, the caller's thread as well. A worker
 * that wakes after the caller has run out of chunks does nothing, and the caller does not wait
 * for it: on a contended core a thread that is late (or preempted between chunks) costs the job
 * at most the chunk it holds, not its share of the job. Nobody spins: a thread with no chunk left
 * sleeps, the caller on its own condition variable until the workers in the job are done. */
#include "cpu_impl.h"
#include "td_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

struct td_cpu_pool {
    int n;         /* threads including the caller */
    pthread_t *th; /* [n - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t gen; /* job generation: workers look at each job once */
    bool open;    /* the caller is still handing out the job's chunks: a worker may join */
    int active;   /* workers that joined the job and have not finished */
    bool stop;
    td_cpu_job_fn fn;
    void *ctx;
    int64_t items, grain;
    _Atomic int64_t next; /* the first item not yet handed out */
};

typedef struct worker_arg {
    td_cpu_pool_t *p;
    int tid;
} worker_arg_t;

static void run_chunks(td_cpu_pool_t *p, int tid)
{
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&p->next, p->grain, memory_order_relaxed);
        if (b >= p->items)
            return;
        p->fn(p->ctx, b, TD_MIN(p->items, b + p->grain), tid);
    }
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
        if (!p->open) /* the caller has finished this job without us */
            continue;
        p->active++;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0 && !p->open)
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
    atomic_init(&p->next, 0);
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

int td_cpu_pool_threads(const td_cpu_pool_t *p)
{
    return p ? p->n : 1;
}

int64_t td_cpu_pool_grain(const td_cpu_pool_t *p, int64_t n, int per, int64_t align, int64_t min)
{
    int64_t g = n / ((int64_t)td_cpu_pool_threads(p) * per);
    g = TD_MAX(g, min);
    return (g + align - 1) / align * align;
}

void td_cpu_pool_run(td_cpu_pool_t *p, int64_t n, int64_t grain, td_cpu_job_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1) /* one range per thread */
        grain = (n + td_cpu_pool_threads(p) - 1) / td_cpu_pool_threads(p);
    if (!p || p->n == 1 || n <= grain) { /* one thread: the whole range in one call */
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->items = n;
    p->grain = grain;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->open = true;
    p->gen++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    p->open = false;
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
