/* test_kvmirror.c: the router's mirror of the cluster KV index (kvmirror.c) against a real
 * redis-server: a worker's published blocks become the cached prefix of a prompt hashed by the
 * router's own rule (tenant-salted, the workers' rule), a worker out of rotation loses its
 * entries at once and gets them back when it registers again, and a restarted router rebuilds a
 * mirror of 1M blocks from Redis (the time is printed; the goal is well under a second). */
#include "router.h"

#include "td_kvredis.h"
#include "td_util.h"

#include "td_check.h"
#include "td_redis.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uv_loop_t loop;

static bool run_until(bool (*cond)(void *), void *arg, int ms)
{
    return loop_run_until(&loop, cond, arg, ms);
}

static void router_start(td_router_t *rt, char *addr)
{
    memset(rt, 0, sizeof(*rt));
    rt->loop = &loop;
    rt->cfg.kv_redis = addr;
    ck_assert_int_eq(td_kvmirror_start(rt), 0);
    ck_assert_ptr_nonnull(rt->kvm);
}


typedef struct probe {
    td_router_t *rt;
    td_seq_t *s;
    td_worker_t *w;
    uint64_t want;
} probe_t;

static bool cached_is(void *a)
{
    probe_t *p = a;
    return td_kvmirror_cached(p->rt, p->s, p->w) == p->want;
}

static td_kvredis_t *pub;

/* the publisher's (empty) inventory on connect: its set, which events are appended to */
static void on_state(bool up, bool need_inventory, void *ud)
{
    (void)ud;
    if (up && need_inventory)
        ck_assert_int_eq(td_kvredis_publish_inventory(pub, NULL, NULL, 0), 0);
}

START_TEST(test_prefix_and_rotation)
{
    char addr[32];
    redis_setup(&loop, addr);
    td_router_t rt;
    router_start(&rt, addr);
    /* a decode worker of 4-token blocks, as registry.c makes it from Hello */
    td_worker_t w = {.id = "d0", .fp_len = 16, .block_tokens = 4};
    for (int i = 0; i < 16; i++)
        w.fp[i] = (uint8_t)(i * 7);
    td_kvmirror_worker_up(&rt, &w);
    /* a 17-token prompt of tenant "acme": 4 full blocks a worker could take (16 < 17) */
    int32_t toks[17];
    for (int i = 0; i < 17; i++)
        toks[i] = 100 + i;
    td_job_t j = {.tenant = (uint8_t *)"acme", .tenant_len = 4};
    td_seq_t s = {.job = &j, .prompt = toks, .n_prompt = 17};
    ck_assert_uint_eq(td_kvmirror_cached(&rt, &s, &w), 0);
    /* the worker publishes its first 3 blocks, hashed as common/worker/cache.c hashes them */
    td_kvhash_t h[4], root;
    ck_assert_int_eq(td_kvhash_root(w.fp, "acme", 4, &root), 0);
    ck_assert_uint_eq(td_kvhash_blocks(toks, 16, 4, &root, h, 4), 4);
    td_kvredis_opts_t po = {.addr = addr, .ns = "tandem:kv", .worker_id = "d0",
                            .on_state = on_state};
    pub = td_kvredis_new(&loop, &po);
    ck_assert(run_until((bool (*)(void *))td_kvredis_connected, pub, 5000));
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(td_kvredis_publish(pub, TD_KVREDIS_ADD, 0, &h[i]), 0);
    probe_t p = {&rt, &s, &w, 12};
    ck_assert(run_until(cached_is, &p, 5000));
    /* another tenant's prompt with the same tokens shares nothing */
    td_job_t j2 = {.tenant = (uint8_t *)"other", .tenant_len = 5};
    td_seq_t s2 = {.job = &j2, .prompt = toks, .n_prompt = 17};
    ck_assert_uint_eq(td_kvmirror_cached(&rt, &s2, &w), 0);
    /* an eviction of block 1 leaves a one-block prefix */
    ck_assert_int_eq(td_kvredis_publish(pub, TD_KVREDIS_REMOVE, 0, &h[1]), 0);
    p.want = 4;
    ck_assert(run_until(cached_is, &p, 5000));
    ck_assert_int_eq(td_kvredis_publish(pub, TD_KVREDIS_ADD, 0, &h[1]), 0);
    p.want = 12;
    ck_assert(run_until(cached_is, &p, 5000));
    /* out of rotation: gone from the mirror at once; registered again: read back from Redis */
    td_kvmirror_worker_gone(&rt, &w);
    ck_assert_uint_eq(td_kvmirror_cached(&rt, &s, &w), 0);
    ck_assert_uint_eq(td_kvmirror_blocks(&rt), 0);
    td_kvmirror_worker_up(&rt, &w);
    ck_assert(run_until(cached_is, &p, 5000));
    free(s.kvh); /* what td_job_free does for a job's sequences */
    free(s2.kvh);
    td_kvredis_close(pub);
    td_kvmirror_stop(&rt);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

typedef struct count_probe {
    td_router_t *rt;
    size_t want;
} count_probe_t;

static bool blocks_are(void *a)
{
    count_probe_t *c = a;
    return td_kvmirror_blocks(c->rt) == c->want;
}

/* Run the loop as the router does (blocking in poll, no sleeps between iterations) until cond
 * holds or `ms` pass: a read of megabytes arrives in 16 KiB reads, one per iteration. */
typedef struct fast_wait {
    bool (*cond)(void *);
    void *arg;
} fast_wait_t;

static void on_check(uv_check_t *h)
{
    fast_wait_t *f = h->data;
    if (f->cond(f->arg))
        uv_stop(h->loop);
}

static void on_deadline(uv_timer_t *t)
{
    uv_stop(t->loop);
}

static bool run_until_fast(bool (*cond)(void *), void *arg, int ms)
{
    fast_wait_t f = {cond, arg};
    uv_check_t chk;
    uv_timer_t deadline;
    uv_check_init(&loop, &chk);
    chk.data = &f;
    uv_check_start(&chk, on_check);
    uv_timer_init(&loop, &deadline);
    uv_timer_start(&deadline, on_deadline, (uint64_t)ms, 0);
    if (!cond(arg))
        uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&chk, NULL);
    uv_close((uv_handle_t *)&deadline, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    return cond(arg);
}

/* 1M blocks over 8 workers written straight into Redis, then a router starts and mirrors them. */
START_TEST(test_rebuild_1m)
{
    enum { WORKERS = 8, PER = 125000 };
    redis_port = free_port();
    redis_start();
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    ck_assert(c && !c->err);
    /* each worker's set as its publisher writes it: the header, then one add per block */
    static uint8_t set[TD_KVREDIS_SET_HEADER + PER * TD_KVREDIS_REC];
    for (int wk = 0; wk < WORKERS; wk++) {
        char key[64], id[16];
        snprintf(key, sizeof(key), "tandem:kv:set:d%d", wk);
        snprintf(id, sizeof(id), "d%d", wk);
        td_kvredis_set_header(set, 1000 + (uint64_t)wk);
        for (int i = 0; i < PER; i++) {
            uint8_t *p = set + TD_KVREDIS_SET_HEADER + (size_t)i * TD_KVREDIS_REC;
            uint64_t v = ((uint64_t)wk << 40) | (uint64_t)i;
            uint64_t mix = v + 0x9E3779B97F4A7C15ull; /* splitmix64: uniform, like XXH3 */
            mix = (mix ^ (mix >> 30)) * 0xBF58476D1CE4E5B9ull;
            mix = (mix ^ (mix >> 27)) * 0x94D049BB133111EBull;
            mix ^= mix >> 31;
            p[0] = TD_KVREDIS_ADD;
            p[1] = 0;
            memcpy(p + 2, &mix, 8);
            memcpy(p + 10, &v, 8);
        }
        redisReply *r = redisCommand(c, "SET %s %b", key, set, sizeof(set));
        ck_assert(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
        r = redisCommand(c, "SADD tandem:kv:workers %s", id);
        ck_assert(r && r->type == REDIS_REPLY_INTEGER);
        freeReplyObject(r);
    }
    redisFree(c);
    char addr[32];
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", redis_port);
    td_router_t rt;
    uint64_t t0 = td_now_ns();
    router_start(&rt, addr);
    count_probe_t cp = {&rt, (size_t)WORKERS * PER};
    ck_assert(run_until_fast(blocks_are, &cp, 30000));
    double ms = (double)(td_now_ns() - t0) / 1e6;
    printf("KV index mirror: %zu blocks of %d workers rebuilt from Redis in %.0f ms\n", cp.want,
           WORKERS, ms);
    fflush(stdout);
    ck_assert_msg(ms < 30000, "rebuild took %.0f ms", ms); /* a sanity bound (sanitizers) */
    td_kvmirror_stop(&rt);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kvmirror");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_prefix_and_rotation);
    tcase_add_test(tc, test_rebuild_1m);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
