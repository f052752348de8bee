/* test_fetchhint.c: the cross-worker fetch hint (router/fetchhint.c) against a mirror fed by a
 * real redis-server: the holder with most of the prompt's leading blocks beyond the prefill
 * worker's own, a prefill worker on ties, only live workers of the same layout, the minimum gain,
 * and the measured cost rule (fetching must be quicker than computing). */
#include "router.h"

#include "td_kvredis.h"
#include "td_util.h"

#include "td_check.h"
#include "td_redis.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static uv_loop_t loop;

static void on_state(bool up, bool need_inventory, void *ud)
{
    (void)up, (void)need_inventory, (void)ud;
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

/* A live registered worker of 4-token blocks with layout fingerprint byte `fp`. */
static td_worker_t make(char *id, int role, uint8_t fp)
{
    td_worker_t w = {.id = id,
                     .role = role,
                     .fp_len = 16,
                     .block_tokens = 4,
                     .block_bytes = 1024,
                     .blob = (uint8_t *)id,
                     .blob_len = strlen(id)};
    memset(w.fp, fp, 16);
    w.conn = (td_rpc_conn_t *)&w; /* only compared with NULL here */
    w.load.alive = true;
    return w;
}

START_TEST(test_hint_rule)
{
    char addr[32];
    redis_setup(&loop, addr);
    td_router_t rt;
    memset(&rt, 0, sizeof(rt));
    rt.loop = &loop;
    rt.cfg.kv_redis = addr;
    rt.cfg.fetch_min_blocks = 2;
    ck_assert_int_eq(td_kvmirror_start(&rt), 0);
    enum { P, D, Q, OTHER, DEAD, N };
    td_worker_t w[N] = {
        make("p", TANDEM__ROLE__ROLE_PREFILL, 1), make("d", TANDEM__ROLE__ROLE_DECODE, 1),
        make("q", TANDEM__ROLE__ROLE_PREFILL, 1), make("other", TANDEM__ROLE__ROLE_PREFILL, 2),
        make("dead", TANDEM__ROLE__ROLE_DECODE, 1)};
    w[DEAD].load.alive = false;
    td_worker_t *ws[N];
    for (int i = 0; i < N; i++) {
        ws[i] = &w[i];
        td_kvmirror_worker_up(&rt, &w[i]);
    }
    rt.workers = ws;
    rt.n_workers = N;
    int32_t toks[21]; /* 5 full blocks a worker could take */
    for (int i = 0; i < 21; i++)
        toks[i] = 50 + i;
    td_job_t j = {.log_id = "r-1"};
    td_seq_t s = {.job = &j, .prompt = toks, .n_prompt = 21, .id = 1};
    /* p holds block 0; d and q hold 0-3; "other" (another layout) and "dead" hold all 5 */
    td_kvhash_t h[5], h2[5], root;
    ck_assert_int_eq(td_kvhash_root(w[P].fp, NULL, 0, &root), 0);
    td_kvhash_blocks(toks, 20, 4, &root, h, 5);
    ck_assert_int_eq(td_kvhash_root(w[OTHER].fp, NULL, 0, &root), 0);
    td_kvhash_blocks(toks, 20, 4, &root, h2, 5);
    const int held[N] = {1, 4, 4, 5, 5};
    td_kvredis_t *pub[N];
    for (int i = 0; i < N; i++) {
        td_kvredis_opts_t po = {
            .addr = addr, .ns = "tandem:kv", .worker_id = w[i].id, .on_state = on_state};
        pub[i] = td_kvredis_new(&loop, &po);
        ck_assert(loop_run_until(&loop, (bool (*)(void *))td_kvredis_connected, pub[i], 5000));
        const uint8_t tiers[5] = {0}; /* pool */
        ck_assert_int_eq(
            td_kvredis_publish_inventory(pub[i], tiers, i == OTHER ? h2 : h, (size_t)held[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        probe_t pr = {&rt, &s, &w[i], (uint64_t)held[i] * 4};
        ck_assert(loop_run_until(&loop, cached_is, &pr, 5000));
    }
    Tandem__FetchHint fh;
    /* the most blocks among live workers of p's layout, the prefill one of the tie */
    ck_assert(td_fetchhint_fill(&rt, &s, &w[P], &fh));
    ck_assert_str_eq(fh.holder, "q");
    ck_assert_uint_eq(fh.blocks, 4);
    ck_assert_uint_eq(fh.holder_blob.len, 1);
    ck_assert_mem_eq(fh.holder_blob.data, "q", 1);
    /* the same rule for kv_aware's prediction: 3 blocks past p's own 1, each worker asked once
     * (p itself and the other layout never) */
    uint64_t memo[N], gain;
    memset(memo, 0xff, sizeof(memo));
    ck_assert_ptr_eq(td_fetchhint_pick(&rt, &s, &w[P], 4, memo, &gain), &w[Q]);
    ck_assert_uint_eq(gain, 3);
    ck_assert_uint_eq(memo[D], 16);
    ck_assert_uint_eq(memo[Q], 16);
    ck_assert_uint_eq(memo[P], UINT64_MAX);
    ck_assert_uint_eq(memo[OTHER], UINT64_MAX);
    ck_assert_ptr_eq(td_fetchhint_pick(&rt, &s, &w[Q], 16, memo, &gain), NULL);
    ck_assert_uint_eq(gain, 0);
    /* without q, the decode worker */
    w[Q].conn = NULL;
    ck_assert(td_fetchhint_fill(&rt, &s, &w[P], &fh));
    ck_assert_str_eq(fh.holder, "d");
    /* the gain must reach kv.fetch_min_blocks (3 here); 0 turns hints off */
    rt.cfg.fetch_min_blocks = 4;
    ck_assert(!td_fetchhint_fill(&rt, &s, &w[P], &fh));
    rt.cfg.fetch_min_blocks = 0;
    ck_assert(!td_fetchhint_fill(&rt, &s, &w[P], &fh));
    rt.cfg.fetch_min_blocks = 3;
    ck_assert(td_fetchhint_fill(&rt, &s, &w[P], &fh));
    /* measured: 3 blocks of 1 KiB at 1 MB/s take 3 ms; 12 tokens at 1 ms each take 12 ms: fetch.
     * At 100 us per token computing (1.2 ms) is quicker: no hint */
    w[P].fetch_bps = 1e6;
    w[P].s_per_token = 1e-3;
    ck_assert(td_fetchhint_fill(&rt, &s, &w[P], &fh));
    w[P].s_per_token = 1e-4;
    ck_assert(!td_fetchhint_fill(&rt, &s, &w[P], &fh));
    /* the holder itself never gets a hint toward anyone holding less */
    w[P].s_per_token = 0;
    ck_assert(!td_fetchhint_fill(&rt, &s, &w[D], &fh));
    for (int i = 0; i < N; i++)
        td_kvredis_close(pub[i]);
    free(s.kvh);
    td_kvmirror_stop(&rt);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

START_TEST(test_no_index)
{
    td_router_t rt;
    memset(&rt, 0, sizeof(rt));
    rt.cfg.fetch_min_blocks = 1;
    td_worker_t p = make("p", TANDEM__ROLE__ROLE_PREFILL, 1);
    int32_t toks[9] = {0};
    td_job_t j = {.log_id = "r-1"};
    td_seq_t s = {.job = &j, .prompt = toks, .n_prompt = 9};
    Tandem__FetchHint fh;
    ck_assert(!td_fetchhint_fill(&rt, &s, &p, &fh));
}
END_TEST

static Suite *fetchhint_suite(void)
{
    Suite *s = suite_create("fetchhint");
    TCase *tc = tcase_create("mirror");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hint_rule);
    tcase_add_test(tc, test_no_index);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = td_check_run(fetchhint_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
