/* test_placement.c: placement policies, high-water marks and the local pending estimate;
 * kv_aware's cache affinity, its imbalance guard, the disk tier and fetches from other workers
 * at their cost, and its least_loaded order without an index. */
#include "placement.h"
#include "td_error.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <string.h>

static void fleet(td_place_load_t *l, size_t n)
{
    memset(l, 0, n * sizeof(*l));
    for (size_t i = 0; i < n; i++) {
        l[i].alive = true;
        l[i].free_blocks = l[i].total_blocks = 100;
    }
}

START_TEST(test_round_robin_skips_ineligible)
{
    td_place_load_t l[4];
    fleet(l, 4);
    l[2].alive = false;
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_ROUND_ROBIN, NULL, 1);
    int seq[6];
    for (int i = 0; i < 6; i++)
        seq[i] = td_place_decode(&p, l, 4, 1);
    int want[6] = {0, 1, 3, 0, 1, 3};
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(seq[i], want[i]);
}
END_TEST

START_TEST(test_least_loaded_and_pending)
{
    td_place_load_t l[3];
    fleet(l, 3);
    td_place_heartbeat(&l[0], 500, 0, 0, 0, false);
    td_place_heartbeat(&l[1], 100, 0, 0, 0, false);
    td_place_heartbeat(&l[2], 300, 0, 0, 0, false);
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_LEAST_LOADED, NULL, 1);
    ck_assert_int_eq(td_place_prefill(&p, l, 3, 150), 1); /* 100 -> 250 pending */
    ck_assert_int_eq(td_place_prefill(&p, l, 3, 100), 1); /* 250 < 300 -> 350 */
    ck_assert_int_eq(td_place_prefill(&p, l, 3, 100), 2); /* now 300 is the least */
    /* a heartbeat supersedes the estimate */
    td_place_heartbeat(&l[1], 0, 0, 0, 0, false);
    ck_assert_uint_eq(l[1].pending_tokens, 0);
    ck_assert_int_eq(td_place_prefill(&p, l, 3, 10), 1);
}
END_TEST

START_TEST(test_high_water_marks)
{
    td_place_load_t l[2];
    fleet(l, 2);
    td_place_limits_t lim = {.max_queued_tokens = 1000, .max_running = 2, .max_kv_usage = 0.5};
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_LEAST_LOADED, &lim, 1);
    /* prefill: an idle worker takes a long prompt; a busy one does not go past its mark */
    ck_assert_int_eq(td_place_prefill(&p, l, 2, 5000), 0);
    ck_assert_int_eq(td_place_prefill(&p, l, 2, 5000), 1);
    ck_assert_int_eq(td_place_prefill(&p, l, 2, 10), -1);
    /* decode: max_running 2 per worker */
    td_place_load_t d[2];
    fleet(d, 2);
    int got[5];
    for (int i = 0; i < 5; i++)
        got[i] = td_place_decode(&p, d, 2, 1);
    ck_assert_int_ne(got[0], -1);
    ck_assert_int_ne(got[3], -1);
    ck_assert_int_eq(got[4], -1);
    /* decode: KV usage mark and block fit */
    fleet(d, 2);
    lim.max_running = 0;
    td_placer_init(&p, TD_PLACE_LEAST_LOADED, &lim, 1);
    ck_assert_int_eq(td_place_decode(&p, d, 2, 60), -1); /* 60% > 50% on either */
    ck_assert_int_ge(td_place_decode(&p, d, 2, 40), 0);
    d[0].draining = d[1].draining = true;
    ck_assert_int_eq(td_place_decode(&p, d, 2, 1), -1);
}
END_TEST

START_TEST(test_p2c_balances)
{
    enum { N = 8 };
    td_place_load_t l[N];
    fleet(l, N);
    for (size_t i = 0; i < N; i++)
        l[i].free_blocks = l[i].total_blocks = 100000;
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_P2C, NULL, 42);
    int count[N] = {0};
    for (int i = 0; i < 8000; i++) {
        int w = td_place_decode(&p, l, N, 1);
        ck_assert_int_ge(w, 0);
        count[w]++;
    }
    /* with the pending estimate p2c keeps every worker within a few of the mean (1000) */
    for (int i = 0; i < N; i++)
        ck_assert_msg(count[i] >= 990 && count[i] <= 1010, "worker %d got %d", i, count[i]);
    /* a worker out of rotation never gets work */
    td_placer_init(&p, TD_PLACE_P2C, NULL, 7);
    fleet(l, N);
    l[3].alive = false;
    for (int i = 0; i < 1000; i++)
        ck_assert_int_ne(td_place_decode(&p, l, N, 1), 3);
    /* a single eligible worker is chosen (fresh fleet: the loop above filled their blocks) */
    fleet(l, N);
    for (size_t i = 0; i < N; i++)
        l[i].alive = i == 5;
    ck_assert_int_eq(td_place_decode(&p, l, N, 1), 5);
    td_place_policy_t pol;
    ck_assert_int_eq(td_place_policy_parse("p2c", &pol), 0);
    ck_assert_int_eq(pol, TD_PLACE_P2C);
    ck_assert_int_eq(td_place_policy_parse("random", &pol), TD_EINVAL);
}
END_TEST

/* least_loaded among equals: idle workers take turns (a cluster at low load must not send every
 * request to the lowest-numbered worker); a strictly less loaded worker still wins at once. */
START_TEST(test_least_loaded_ties_rotate)
{
    enum { N = 8, ROUNDS = 80 };
    td_place_load_t l[N];
    fleet(l, N);
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_LEAST_LOADED, NULL, 1);
    td_place_load_t pre[2];
    fleet(pre, 2);
    int count[N] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        int i = td_place_decode(&p, l, N, 1);
        ck_assert_int_ge(i, 0);
        count[i]++;
        /* a prefill choice in between (one placer serves both roles, as in the router) must not
         * move the decode scan */
        ck_assert_int_ge(td_place_prefill(&p, pre, 2, 10), 0);
        td_place_heartbeat(&pre[0], 0, 0, 0, 0, false);
        td_place_heartbeat(&pre[1], 0, 0, 0, 0, false);
        /* the request finishes before the next arrives: every worker idle again */
        for (int k = 0; k < N; k++)
            td_place_heartbeat(&l[k], 0, 0, 100, 100, false);
    }
    for (int k = 0; k < N; k++)
        ck_assert_int_eq(count[k], ROUNDS / N);
    td_place_heartbeat(&l[5], 0, 0, 100, 100, false);
    for (int k = 0; k < N; k++)
        if (k != 5)
            td_place_heartbeat(&l[k], 0, 1, 90, 100, false);
    ck_assert_int_eq(td_place_decode(&p, l, N, 1), 5);
}
END_TEST

/* Equal loads: the worker that holds the prompt's prefix wins, every time (a decode worker that
 * prefills locally, and a prefill worker). */
START_TEST(test_kv_aware_affinity)
{
    td_place_load_t d[3], pf[3];
    fleet(d, 3);
    fleet(pf, 3);
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_KV_AWARE, NULL, 1);
    ck_assert_int_eq(td_place_policy_parse("kv_aware", &p.policy), 0);
    ck_assert_str_eq(td_place_policy_name(p.policy), "kv_aware");
    for (int r = 0; r < 6; r++) {
        for (int k = 0; k < 3; k++) {
            td_place_heartbeat(&d[k], 0, 0, 100, 100, false);
            td_place_heartbeat(&pf[k], 0, 0, 0, 0, false);
            d[k].local = true;
        }
        d[1].cached_tokens = 960;
        pf[2].cached_tokens = 800;
        ck_assert_int_eq(td_place_decode_prompt(&p, d, 3, 70, 1000, 0), 1);
        /* the holder's pending prefill is only what it does not hold */
        ck_assert_uint_eq(d[1].pending_tokens, 40);
        ck_assert_int_eq(td_place_prefill(&p, pf, 3, 1000), 2);
        ck_assert_uint_eq(pf[2].pending_tokens, 200);
    }
    /* a decode worker that would not prefill locally competes with the remote estimate */
    for (int k = 0; k < 3; k++)
        td_place_heartbeat(&d[k], 0, 0, 100, 100, false);
    d[0].local = d[2].local = false;
    d[1].local = true;
    d[1].cached_tokens = 100; /* a little: computing 900 tokens here is slower than remote */
    ck_assert_int_ne(td_place_decode_prompt(&p, d, 3, 70, 1000, 0.01), 1);
}
END_TEST

/* The guard: a holder loaded well above the mean loses its affinity, though its predicted time
 * to first token alone (cached prefix, long prompt) would still have won. */
START_TEST(test_kv_aware_guard)
{
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_KV_AWARE, NULL, 1);
    td_place_kv_t kv = {.s_per_token = 50e-6, .seq_s = 2e-3, .imbalance = 1.5};
    td_placer_set_kv(&p, &kv);
    /* decode: the holder runs 20 sequences (40 ms), the other none; 900 of 1000 tokens cached:
     * 40 + 5 ms against 50 ms would pick the holder */
    td_place_load_t d[2];
    fleet(d, 2);
    td_place_heartbeat(&d[0], 0, 0, 100, 100, false);
    td_place_heartbeat(&d[1], 0, 20, 100, 100, false);
    d[0].local = d[1].local = true;
    d[1].cached_tokens = 900;
    ck_assert_int_eq(td_place_decode_prompt(&p, d, 2, 10, 1000, 0), 0);
    /* with the guard off (a huge threshold) the cache wins again */
    kv.imbalance = 1000;
    td_placer_set_kv(&p, &kv);
    td_place_heartbeat(&d[0], 0, 0, 100, 100, false);
    ck_assert_int_eq(td_place_decode_prompt(&p, d, 2, 10, 1000, 0), 1);
    /* prefill: the holder has 1000 tokens queued (50 ms), 3900 of a 4000-token prompt cached:
     * 55 ms against 200 ms, yet above 1.5 x the mean it is treated as holding nothing */
    kv.imbalance = 1.5;
    td_placer_set_kv(&p, &kv);
    td_place_load_t pf[2];
    fleet(pf, 2);
    td_place_heartbeat(&pf[0], 0, 0, 0, 0, false);
    td_place_heartbeat(&pf[1], 1000, 0, 0, 0, false);
    pf[1].cached_tokens = 3900;
    ck_assert_int_eq(td_place_prefill(&p, pf, 2, 4000), 0);
    /* loads equal but for one request in flight: no imbalance, the holder keeps its affinity */
    td_place_heartbeat(&d[0], 0, 0, 100, 100, false);
    td_place_heartbeat(&d[1], 0, 1, 100, 100, false);
    ck_assert_int_eq(td_place_decode_prompt(&p, d, 2, 10, 1000, 0), 1);
}
END_TEST

/* A burst sharing one hot prefix held by decode worker 0 (each of its requests computes only a
 * short suffix, so its time estimate stays low): the sequence guard keeps it within 1.5x the
 * mean, and it still takes its share; with the guard off it takes most of them. */
START_TEST(test_kv_aware_hot_prefix)
{
    for (int guard = 1; guard >= 0; guard--) {
        td_placer_t p;
        td_placer_init(&p, TD_PLACE_KV_AWARE, NULL, 1);
        td_place_kv_t kv = {.s_per_token = 50e-6, .seq_s = 2e-3,
                            .imbalance = guard ? 1.5 : 1000};
        td_placer_set_kv(&p, &kv);
        td_place_load_t d[3];
        fleet(d, 3);
        for (int k = 0; k < 3; k++) {
            td_place_heartbeat(&d[k], 0, 0, 1000, 1000, false);
            d[k].local = true;
        }
        int got[3] = {0};
        for (int r = 0; r < 24; r++) {
            d[0].cached_tokens = 192;
            int i = td_place_decode_prompt(&p, d, 3, 14, 208, 0);
            ck_assert_int_ge(i, 0);
            got[i]++;
        }
        int max = TD_MAX(got[0], TD_MAX(got[1], got[2]));
        if (guard) {
            ck_assert_msg(max <= 12, "placed %d %d %d", got[0], got[1], got[2]);
            ck_assert_int_ge(got[0], 8);
        } else {
            ck_assert_int_gt(got[0], 12);
        }
    }
}
END_TEST

/* A prefix held on disk counts, but less than one held in the pool: its load costs the worker's
 * measured seconds per token (at most its prefill cost), half the prefill cost until measured. */
START_TEST(test_kv_aware_disk_tier)
{
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_KV_AWARE, NULL, 1);
    td_place_kv_t kv = {.s_per_token = 100e-6, .seq_s = 2e-3, .imbalance = 1.5};
    td_placer_set_kv(&p, &kv);
    td_place_load_t pf[3];
    fleet(pf, 3);
    for (int r = 0; r < 4; r++) {
        for (int k = 0; k < 3; k++)
            td_place_heartbeat(&pf[k], 0, 0, 0, 0, false);
        /* 0 holds 800 of 1000 tokens on disk, 1 holds 600 in its pool, 2 nothing: 0 costs
         * 200 + 800 x 0.5 = 600 token-times, 1 costs 400 */
        pf[0].cached_tokens = pf[0].cached_slow_tokens = 800;
        pf[1].cached_tokens = 600;
        pf[1].cached_slow_tokens = 0;
        pf[2].cached_tokens = 0;
        ck_assert_int_eq(td_place_prefill(&p, pf, 3, 1000), 1);
        /* measured cheap loads (10 us a token): 200 + 80 beats 400 */
        td_place_heartbeat(&pf[1], 0, 0, 0, 0, false);
        pf[0].slow_s_per_token = 10e-6;
        ck_assert_int_eq(td_place_prefill(&p, pf, 3, 1000), 0);
        /* loads measured dearer than computing cost no more than computing: disk-only worker
         * ties with the empty one, never loses to it */
        for (int k = 0; k < 3; k++)
            td_place_heartbeat(&pf[k], 0, 0, 0, 0, false);
        pf[0].slow_s_per_token = 1;
        pf[1].cached_tokens = 0;
        double t0 = td_place_prefill_ttft(&p, &pf[0], 1000), t2 = td_place_prefill_ttft(&p, &pf[2], 1000);
        ck_assert(t0 <= t2 + 1e-12);
        pf[0].slow_s_per_token = 0;
    }
}
END_TEST

/* Tokens a prefill worker would fetch from another worker's cache count at the fetch's cost, not
 * the compute's: an emptier worker that can fetch the prefix beats a busy holder; a fetch
 * measured dearer than computing counts as computing; only computed tokens become pending. */
START_TEST(test_kv_aware_fetch)
{
    td_placer_t p;
    td_placer_init(&p, TD_PLACE_KV_AWARE, NULL, 1);
    td_place_kv_t kv = {.s_per_token = 100e-6, .seq_s = 2e-3, .imbalance = 1.5};
    td_placer_set_kv(&p, &kv);
    td_place_load_t pf[2];
    fleet(pf, 2);
    /* 0 holds 800 of 1000 tokens with 2000 queued: 2200 token-times; 1 holds none with 1500
     * queued: 2500 */
    td_place_heartbeat(&pf[0], 2000, 0, 0, 0, false);
    td_place_heartbeat(&pf[1], 1500, 0, 0, 0, false);
    pf[0].cached_tokens = 800;
    ck_assert_int_eq(td_place_prefill(&p, pf, 2, 1000), 0);
    /* 1 could fetch those 800 (unmeasured: half a compute each): 1500 + 200 + 400 = 2100 */
    td_place_heartbeat(&pf[0], 2000, 0, 0, 0, false);
    pf[1].fetch_tokens = 800;
    ck_assert_int_eq(td_place_prefill(&p, pf, 2, 1000), 1);
    ck_assert_uint_eq(pf[1].pending_tokens, 200); /* it computes only what nobody holds */
    /* measured at 90 us a token: 1500 + 200 + 720 = 2420, the holder wins again */
    td_place_heartbeat(&pf[1], 1500, 0, 0, 0, false);
    pf[1].fetch_s_per_token = 90e-6;
    ck_assert_int_eq(td_place_prefill(&p, pf, 2, 1000), 0);
    /* measured dearer than computing: it counts as computing (2500), never more */
    td_place_heartbeat(&pf[0], 2000, 0, 0, 0, false);
    pf[1].fetch_s_per_token = 1;
    double with = td_place_prefill_ttft(&p, &pf[1], 1000);
    pf[1].fetch_tokens = 0;
    ck_assert_double_eq_tol(with, td_place_prefill_ttft(&p, &pf[1], 1000), 1e-12);
}
END_TEST

/* Without an index (nothing cached anywhere) kv_aware chooses exactly as least_loaded does. */
START_TEST(test_kv_aware_no_index)
{
    enum { N = 5, TRIALS = 300 };
    td_placer_t kv, ll;
    td_placer_init(&kv, TD_PLACE_KV_AWARE, NULL, 1);
    td_placer_init(&ll, TD_PLACE_LEAST_LOADED, NULL, 1);
    uint64_t x = 12345;
    for (int t = 0; t < TRIALS; t++) {
        td_place_load_t a[N], b[N];
        fleet(a, N);
        for (int k = 0; k < N; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t running = (uint32_t)(x >> 60), free = 50 + (uint32_t)((x >> 40) % 50);
            uint64_t queued = (x >> 20) % 4 * 100;
            if (t % 2)
                td_place_heartbeat(&a[k], 0, running, free, 100, false);
            else
                td_place_heartbeat(&a[k], queued, 0, 0, 0, false);
        }
        memcpy(b, a, sizeof(a));
        int ik = t % 2 ? td_place_decode_prompt(&kv, a, N, 2, 500, 0) : td_place_prefill(&kv, a, N, 300);
        int il = t % 2 ? td_place_decode(&ll, b, N, 2) : td_place_prefill(&ll, b, N, 300);
        ck_assert_int_eq(ik, il);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("placement");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_round_robin_skips_ineligible);
    tcase_add_test(tc, test_least_loaded_and_pending);
    tcase_add_test(tc, test_high_water_marks);
    tcase_add_test(tc, test_p2c_balances);
    tcase_add_test(tc, test_least_loaded_ties_rotate);
    tcase_add_test(tc, test_kv_aware_affinity);
    tcase_add_test(tc, test_kv_aware_guard);
    tcase_add_test(tc, test_kv_aware_disk_tier);
    tcase_add_test(tc, test_kv_aware_hot_prefix);
    tcase_add_test(tc, test_kv_aware_no_index);
    tcase_add_test(tc, test_kv_aware_fetch);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
