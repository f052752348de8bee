/* test_registry.c: the worker registry (registry.c) against scripted workers over real td_rpc
 * connections (router_fixture.h says why): Hello with a matching and a mismatching KV layout
 * fingerprint, a second Hello, heartbeats refreshing the load, a heartbeat timeout taking a
 * worker out of rotation, and drain / undrain. */
#include "router_fixture.h"
#include "td_check.h"

#define DEC TANDEM__ROLE__ROLE_DECODE
#define PRE TANDEM__ROLE__ROLE_PREFILL

START_TEST(test_hello_fingerprint)
{
    fx_t x;
    fx_start(&x);
    fw_t a, same, other;
    fw_connect(&x, &a, "w-a", DEC, "fp-layout-A", FW_HOLD);
    ck_assert(fx_run_until(&x, fw_registered_cond, &a, 5000));
    td_worker_t *w = td_registry_find(&x.rt, "w-a");
    ck_assert_int_eq(w->role, DEC);
    ck_assert_uint_eq(w->fp_len, strlen("fp-layout-A"));
    ck_assert_uint_eq(w->block_tokens, 16);
    ck_assert_uint_eq(w->total_blocks, 1000);
    ck_assert(w->load.alive);
    ck_assert(td_registry_has_decode(&x.rt));
    /* same model, same layout: accepted (a prefill worker can take its prompts) */
    fw_connect(&x, &same, "w-same", PRE, "fp-layout-A", FW_HOLD);
    ck_assert(fx_run_until(&x, fw_registered_cond, &same, 5000));
    ck_assert_uint_eq(x.rt.n_workers, 2);
    /* same model, another layout: refused with a message naming both, connection closed */
    fw_connect(&x, &other, "w-other", PRE, "fp-layout-B", FW_HOLD);
    ck_assert(fx_run_until(&x, fw_closed_cond, &other, 5000));
    ck_assert_int_eq(other.errors, 1);
    ck_assert_int_eq(other.error_code, TD_EMISMATCH);
    ck_assert_msg(strstr(other.error_msg, "fingerprint") && strstr(other.error_msg, "w-a"),
                  "message: %s", other.error_msg);
    ck_assert_ptr_null(td_registry_find(&x.rt, "w-other"));
    ck_assert_uint_eq(x.rt.n_workers, 2);
    fw_stop(&a);
    fw_stop(&same);
    fw_stop(&other);
    fx_stop(&x);
}
END_TEST

static bool hb_seen(void *arg)
{
    fx_t *x = arg;
    td_worker_t *w = td_registry_find(&x->rt, "d1");
    return w && w->hb_running == 3;
}

START_TEST(test_heartbeat_and_timeout)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.heartbeat_timeout_s = 1.0;
    fw_t d;
    fw_start(&x, &d, "d1", DEC, FW_HOLD);
    td_worker_t *w = td_registry_find(&x.rt, "d1");
    double hello_at = w->last_hb;
    usleep(20000);
    /* a heartbeat refreshes the deadline and replaces the load placement sees */
    Tandem__Load l = TANDEM__LOAD__INIT;
    l.running_sequences = 3;
    l.free_blocks = 700;
    l.total_blocks = 1000;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.seq = 1;
    hb.load = &l;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    fw_send(&d, &f);
    ck_assert(fx_run_until(&x, hb_seen, &x, 5000));
    ck_assert(w->last_hb > hello_at);
    ck_assert_uint_eq(w->load.running, 3);
    ck_assert_uint_eq(w->load.free_blocks, 700);
    /* within the timeout: still in rotation */
    td_registry_sweep(&x.rt, w->last_hb + 0.5);
    ck_assert_ptr_eq(td_registry_find(&x.rt, "d1"), w);
    /* silent past it: out of rotation at once, its connection closed */
    td_registry_sweep(&x.rt, td_now_s() + 5);
    ck_assert_ptr_null(td_registry_find(&x.rt, "d1"));
    ck_assert(!td_registry_has_decode(&x.rt));
    ck_assert(fx_run_until(&x, fw_closed_cond, &d, 5000));
    /* and nothing is sent to it: a new request waits for a decode worker */
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert_uint_eq(x.rt.n_waiting, 1);
    fx_run_for(&x, 30);
    ck_assert_int_eq(d.decode_tasks, 0);
    fw_stop(&d);
    fx_stop(&x);
    ck_assert(r.failed); /* fx_stop ended it */
}
END_TEST

START_TEST(test_timeout_retries_its_requests)
{
    fx_t x;
    fx_start(&x);
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_HOLD);
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d1, 5000));
    fw_start(&x, &d2, "d2", DEC, FW_HOLD);
    /* only d1 is silent: d2 heartbeats just before the sweep */
    td_registry_find(&x.rt, "d2")->last_hb = td_now_s() + 5;
    td_registry_sweep(&x.rt, td_now_s() + 5);
    ck_assert_ptr_null(td_registry_find(&x.rt, "d1"));
    ck_assert_ptr_nonnull(td_registry_find(&x.rt, "d2"));
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d2, 5000));
    ck_assert_int_eq(d2.task_first, 3);
    ck_assert(!r.failed);
    fw_stop(&d1);
    fw_stop(&d2);
    fx_stop(&x);
}
END_TEST

static bool drained(void *arg)
{
    return ((fw_t *)arg)->drains >= 1;
}

START_TEST(test_drain)
{
    fx_t x;
    fx_start(&x);
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_HOLD); /* first: round robin would ask it first */
    fw_start(&x, &d2, "d2", DEC, FW_HOLD);
    ck_assert_int_eq(td_registry_drain(&x.rt, "d1", true), 0);
    ck_assert(fx_run_until(&x, drained, &d1, 5000));
    ck_assert(d1.drain_on);
    ck_assert(td_registry_find(&x.rt, "d1")->load.draining);
    ck_assert(td_registry_has_decode(&x.rt)); /* d2 still takes work */
    /* a draining worker gets nothing new */
    rec_t r1;
    ck_assert_int_eq(rec_start(&x, &r1, 3), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d2, 5000));
    ck_assert_int_eq(d1.decode_tasks, 0);
    /* both draining: requests wait; undrain puts the waiting one on d1 at once */
    ck_assert_int_eq(td_registry_drain(&x.rt, "d2", true), 0);
    ck_assert(!td_registry_has_decode(&x.rt));
    rec_t r2;
    ck_assert_int_eq(rec_start(&x, &r2, 4), 0);
    ck_assert_uint_eq(x.rt.n_waiting, 1);
    ck_assert_int_eq(td_registry_drain(&x.rt, "d1", false), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d1, 5000));
    ck_assert_int_eq(d1.task_first, 4);
    ck_assert(!d1.drain_on);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    /* unknown worker */
    ck_assert_int_eq(td_registry_drain(&x.rt, "nobody", true), TD_ENOENT);
    ck_assert_msg(strstr(td_err_msg(), "nobody"), "%s", td_err_msg());
    fw_stop(&d1);
    fw_stop(&d2);
    fx_stop(&x);
}
END_TEST

static bool got_error(void *arg)
{
    return ((fw_t *)arg)->errors >= 1;
}

START_TEST(test_second_hello_refused)
{
    fx_t x;
    fx_start(&x);
    fw_t w;
    fw_connect(&x, &w, "w1", DEC, "fp-layout-A", FW_HOLD);
    /* registered: a second Hello on the same connection is a protocol error */
    ck_assert(fx_run_until(&x, fw_registered_cond, &w, 5000));
    fw_hello(&w);
    ck_assert(fx_run_until(&x, got_error, &w, 5000));
    ck_assert_int_eq(w.error_code, TD_EPROTO);
    ck_assert_msg(strstr(w.error_msg, "Hello sent twice"), "message: %s", w.error_msg);
    ck_assert(fx_run_until(&x, fw_closed_cond, &w, 5000));
    ck_assert_ptr_null(td_registry_find(&x.rt, "w1"));
    fw_stop(&w);
    fx_stop(&x);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hello_fingerprint);
    tcase_add_test(tc, test_heartbeat_and_timeout);
    tcase_add_test(tc, test_timeout_retries_its_requests);
    tcase_add_test(tc, test_drain);
    tcase_add_test(tc, test_second_hello_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}
