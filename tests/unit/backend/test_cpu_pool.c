/* test_cpu_pool.c: the CPU backend's thread pool (common/backend/cpu/pool.c): every item of a
 * job runs exactly once, in the chunks asked for, on a thread id below the pool's size; a slow
 * thread's share goes to the others; many short jobs in a row (where workers often wake after
 * the caller has run out of chunks) neither lose items nor hang. */
#include "../../../common/backend/cpu/cpu_impl.h"
#include "td_check.h"

#include <check.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MAX_ITEMS 2048

typedef struct job {
    int64_t n, grain;
    int threads;
    _Atomic int count[MAX_ITEMS];
    _Atomic int by_tid[8];
    _Atomic int bad; /* a chunk not on the grain, or a thread id out of range */
    int slow_tid;    /* this thread sleeps in each of its chunks (-1: none) */
} job_t;

static void visit(void *arg, int64_t b, int64_t e, int tid)
{
    job_t *j = arg;
    bool single = j->threads == 1 || j->grain < 1 || j->n <= j->grain;
    if (tid < 0 || tid >= j->threads || b < 0 || e > j->n || b >= e)
        atomic_store(&j->bad, 1);
    else if (!single && (b % j->grain != 0 || e != (b + j->grain < j->n ? b + j->grain : j->n)))
        atomic_store(&j->bad, 1);
    else if (single && j->grain >= 1 && (b != 0 || e != j->n))
        atomic_store(&j->bad, 1);
    for (int64_t i = b; i < e && i < MAX_ITEMS; i++)
        atomic_fetch_add(&j->count[i], 1);
    if (tid >= 0 && tid < 8)
        atomic_fetch_add(&j->by_tid[tid], 1);
    if (tid == j->slow_tid)
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
}

static void run_job(td_cpu_pool_t *p, int threads, int64_t n, int64_t grain, job_t *j)
{
    memset(j, 0, sizeof(*j));
    j->n = n;
    j->grain = grain;
    j->threads = threads;
    j->slow_tid = -1;
    td_cpu_pool_run(p, n, grain, visit, j);
}

START_TEST(test_every_item_once)
{
    static job_t j;
    const int64_t ns[] = {1, 2, 5, 100, 1001, MAX_ITEMS}, grains[] = {0, 1, 3, 7, 64, 5000};
    for (int threads = 1; threads <= 4; threads++) {
        td_cpu_pool_t *p = td_cpu_pool_create(threads);
        ck_assert_ptr_nonnull(p);
        ck_assert_int_eq(td_cpu_pool_threads(p), threads);
        for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
            for (size_t g = 0; g < sizeof(grains) / sizeof(grains[0]); g++) {
                run_job(p, threads, ns[a], grains[g], &j);
                ck_assert_msg(!atomic_load(&j.bad), "threads %d n %lld grain %lld: a bad chunk",
                              threads, (long long)ns[a], (long long)grains[g]);
                for (int64_t i = 0; i < ns[a]; i++)
                    ck_assert_msg(atomic_load(&j.count[i]) == 1,
                                  "threads %d n %lld grain %lld: item %lld ran %d times", threads,
                                  (long long)ns[a], (long long)grains[g], (long long)i,
                                  atomic_load(&j.count[i]));
            }
        td_cpu_pool_free(p);
    }
    /* no pool: one call on the caller */
    run_job(NULL, 1, 10, 3, &j);
    ck_assert_int_eq(atomic_load(&j.by_tid[0]), 1);
    ck_assert_int_eq(atomic_load(&j.count[9]), 1);
}
END_TEST

/* The caller's chunks are slow: the worker takes more than the half a static split would give
 * it. A worker kept off its core by the machine's load can miss once; five tries. */
START_TEST(test_slow_thread_shared_out)
{
    static job_t j;
    td_cpu_pool_t *p = td_cpu_pool_create(2);
    ck_assert_ptr_nonnull(p);
    int best = 0;
    for (int attempt = 0; attempt < 5 && best <= 12; attempt++) {
        memset(&j, 0, sizeof(j));
        j.n = 16;
        j.grain = 1;
        j.threads = 2;
        j.slow_tid = 0;
        td_cpu_pool_run(p, 16, 1, visit, &j);
        ck_assert(!atomic_load(&j.bad));
        for (int i = 0; i < 16; i++)
            ck_assert_int_eq(atomic_load(&j.count[i]), 1);
        int w = atomic_load(&j.by_tid[1]);
        best = w > best ? w : best;
    }
    ck_assert_msg(best > 12, "the worker ran at most %d of 16 chunks beside a slow caller", best);
    td_cpu_pool_free(p);
}
END_TEST

/* Many tiny jobs: workers that wake late find the job closed; none may run a later job's items
 * twice or leave the caller waiting. */
START_TEST(test_many_short_jobs)
{
    static job_t j;
    td_cpu_pool_t *p = td_cpu_pool_create(3);
    ck_assert_ptr_nonnull(p);
    for (int k = 0; k < 20000; k++) {
        int64_t n = 2 + k % 7;
        run_job(p, 3, n, 1 + k % 3, &j);
        ck_assert(!atomic_load(&j.bad));
        for (int64_t i = 0; i < n; i++)
            ck_assert_int_eq(atomic_load(&j.count[i]), 1);
    }
    td_cpu_pool_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu_pool");
    TCase *tc = tcase_create("pool");
    tcase_add_test(tc, test_every_item_once);
    tcase_add_test(tc, test_slow_thread_shared_out);
    tcase_add_test(tc, test_many_short_jobs);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
