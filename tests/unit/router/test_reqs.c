/* test_reqs.c: the request state machine (reqs*.c) against scripted workers over real td_rpc
 * connections (router_fixture.h says why): a full decode worker makes the sequence try the next
 * one; a worker lost before the client saw a token is replaced once; after tokens it fails naming
 * the worker (migration off); with migration on, a sequence resumes on another worker with its
 * prompt plus the tokens generated so far, within migration.max_attempts; stage deadlines move a
 * sequence off a worker that stays silent; 503 when no decode worker is available; abort cancels
 * on both workers while the prefill runs; the request deadline; the waiting queue, its order and
 * its limit. */
#include "reqs_impl.h"
#include "router_fixture.h"
#include "td_check.h"

#define DEC TANDEM__ROLE__ROLE_DECODE
#define PRE TANDEM__ROLE__ROLE_PREFILL

static bool prefill_tasks_1(void *arg)
{
    return ((fw_t *)arg)->prefill_tasks >= 1;
}

static bool fw_closed_or_canceled(void *arg)
{
    fw_t *w = arg;
    return w->cancels > 0 || w->closes > 0;
}

static bool got_token(void *arg)
{
    return ((rec_t *)arg)->tokens >= 1;
}

START_TEST(test_enospc_tries_next_decode)
{
    fx_t x;
    fx_start(&x);
    fw_t full, room;
    fw_start(&x, &full, "d-full", DEC, FW_ENOSPC); /* registered first: round robin asks it first */
    fw_start(&x, &room, "d-room", DEC, FW_ACCEPT);
    room.tokens[0] = 0, room.tokens[1] = 1, room.n_tokens = 2, room.finish = true;
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert_msg(r.done, "job failed: %d %s", r.status, r.msg);
    ck_assert_int_eq(full.decode_tasks, 1); /* asked once, refused */
    ck_assert_int_eq(room.decode_tasks, 1); /* then the next one took it */
    ck_assert_int_eq(room.task_first, 3);
    ck_assert_str_eq(r.text, "ab");
    ck_assert_int_eq(r.finishes, 1);
    ck_assert_int_eq(r.why, TD_RESP_STOP);
    ck_assert_uint_eq(x.rt.n_running, 0);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    fw_stop(&full);
    fw_stop(&room);
    fx_stop(&x);
}
END_TEST

/* A decode worker that is draining (drained through another router, or stopping on SIGTERM)
 * refuses a DecodeTask the router sent before it heard: the sequence goes to another worker, and
 * the router takes the refusing one out of rotation until a heartbeat says otherwise. */
START_TEST(test_draining_decode_tries_next)
{
    fx_t x;
    fx_start(&x);
    fw_t busy, room;
    fw_start(&x, &busy, "d-busy", DEC, FW_BUSY); /* registered first: round robin asks it first */
    fw_start(&x, &room, "d-room", DEC, FW_ACCEPT);
    room.tokens[0] = 0, room.n_tokens = 1, room.finish = true;
    for (int i = 0; i < 3; i++) {
        rec_t r;
        ck_assert_int_eq(rec_start(&x, &r, 3 + i), 0);
        ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
        ck_assert_msg(r.done, "job %d failed: %d %s", i, r.status, r.msg);
        ck_assert_str_eq(r.text, "a");
    }
    ck_assert_int_eq(busy.decode_tasks, 1); /* refused once, then out of rotation */
    ck_assert_int_eq(room.decode_tasks, 3);
    ck_assert_uint_eq(x.rt.n_running, 0);
    fw_stop(&busy);
    fw_stop(&room);
    fx_stop(&x);
}
END_TEST

START_TEST(test_enospc_everywhere_waits)
{
    fx_t x;
    fx_start(&x);
    fw_t a, b;
    fw_start(&x, &a, "d-a", DEC, FW_ENOSPC);
    fw_start(&x, &b, "d-b", DEC, FW_ENOSPC);
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &b, 5000));
    fx_run_for(&x, 50);
    /* both refused: it waits instead of failing, and each was asked only once this round */
    ck_assert(!r.done && !r.failed);
    ck_assert_uint_eq(x.rt.n_waiting, 1);
    ck_assert_uint_eq(x.rt.n_running, 0);
    ck_assert_int_eq(a.decode_tasks, 1);
    ck_assert_int_eq(b.decode_tasks, 1);
    /* room appears on d-b: the next kick places it there (d-a, still full, may be asked first) */
    b.mode = FW_ACCEPT;
    b.tokens[0] = 4, b.n_tokens = 1, b.finish = true;
    td_reqs_kick(&x.rt);
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert_msg(r.done, "job failed: %s", r.msg);
    ck_assert_str_eq(r.text, "e");
    ck_assert_int_eq(b.decode_tasks, 2);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    fw_stop(&a);
    fw_stop(&b);
    fx_stop(&x);
}
END_TEST

START_TEST(test_worker_gone_retries_once)
{
    fx_t x;
    fx_start(&x);
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_HOLD);
    fw_start(&x, &d2, "d2", DEC, FW_HOLD);
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d1, 5000));
    ck_assert_int_eq(d2.decode_tasks, 0);
    /* d1 dies before any token: the sequence moves to d2, the client sees nothing */
    uint64_t first_id = d1.task_id;
    fw_stop(&d1);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d2, 5000));
    ck_assert(!r.done && !r.failed);
    ck_assert_int_eq(d2.task_first, 3);
    ck_assert_uint_ne(d2.task_id, first_id); /* a new attempt has a new router id */
    ck_assert_ptr_null(td_registry_find(&x.rt, "d1"));
    /* d2 dies too: one retry only, so the job fails now, naming the worker */
    fw_stop(&d2);
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 503);
    ck_assert_msg(strstr(r.msg, "decode worker d2 left"), "message: %s", r.msg);
    ck_assert_uint_eq(x.rt.n_running, 0);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    fx_stop(&x);
}
END_TEST

START_TEST(test_worker_gone_retry_succeeds)
{
    fx_t x;
    fx_start(&x);
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_HOLD);
    fw_start(&x, &d2, "d2", DEC, FW_ACCEPT);
    d2.tokens[0] = 2, d2.tokens[1] = 3, d2.n_tokens = 2, d2.finish = true;
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d1, 5000));
    fw_stop(&d1);
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert_msg(r.done, "job failed: %s", r.msg);
    ck_assert_str_eq(r.text, "cd");
    ck_assert_int_eq(d2.decode_tasks, 1);
    fw_stop(&d2);
    fx_stop(&x);
}
END_TEST

START_TEST(test_worker_gone_after_tokens_fails)
{
    fx_t x;
    fx_start(&x);
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_ACCEPT);
    d1.tokens[0] = 0, d1.n_tokens = 1, d1.finish = false; /* one token, then silence */
    fw_start(&x, &d2, "d2", DEC, FW_ACCEPT);
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, got_token, &r, 5000));
    ck_assert_str_eq(r.text, "a");
    fw_stop(&d1);
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    /* the client already has text: no silent restart elsewhere */
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 503);
    ck_assert_msg(strstr(r.msg, "decode worker d1 left while running the request"), "message: %s",
                  r.msg);
    ck_assert_int_eq(d2.decode_tasks, 0);
    fw_stop(&d2);
    fx_stop(&x);
}
END_TEST

/* Migration on: a decode worker that dies after the client has text hands the sequence to
 * another one with the prompt plus every token generated so far; the stream continues from the
 * next token (no duplicate, nothing missing) and usage counts every completion token. */
START_TEST(test_migrate_resumes_after_tokens)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.migrate = true;
    x.rt.cfg.migrate_attempts = 3;
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_ACCEPT);
    d1.tokens[0] = 0, d1.tokens[1] = 4, d1.n_tokens = 2, d1.finish = false; /* "ae", then dies */
    fw_start(&x, &d2, "d2", DEC, FW_ACCEPT);
    d2.tokens[0] = 1, d2.tokens[1] = 2, d2.n_tokens = 2, d2.finish = true;
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, got_token, &r, 5000));
    fx_run_for(&x, 30);
    ck_assert_str_eq(r.text, "ae");
    td_job_t *j = r.job;
    fw_stop(&d1);
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert_msg(r.done, "job failed: %d %s", r.status, r.msg);
    ck_assert_str_eq(r.text, "aebc"); /* d2's tokens follow d1's */
    ck_assert_int_eq(r.tokens, 4);
    ck_assert_int_eq(d2.decode_tasks, 1);
    ck_assert_uint_eq(d2.task_n_tokens, 5); /* prompt [3, 1, 2] + generated [0, 4] */
    ck_assert_uint_eq(d2.task_generated, 2);
    ck_assert_int_eq(d2.task_first, 3);
    ck_assert_int_eq(d2.task_last, 4);
    (void)j;
    ck_assert_uint_eq(x.rt.n_running, 0);
    fw_stop(&d2);
    fx_stop(&x);
}
END_TEST

/* Attempts are bounded: with migration.max_attempts 2, the third worker lost fails the request
 * with a message naming the worker and the option. */
START_TEST(test_migrate_attempts_bounded)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.migrate = true;
    x.rt.cfg.migrate_attempts = 2;
    fw_t d[3];
    fw_start(&x, &d[0], "d1", DEC, FW_HOLD);
    fw_start(&x, &d[1], "d2", DEC, FW_HOLD);
    fw_start(&x, &d[2], "d3", DEC, FW_HOLD);
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    for (int i = 0; i < 3; i++) {
        /* whichever live worker holds the sequence now dies */
        int k = -1;
        for (int t = 0; t < 5000 && k < 0; t++) {
            fx_run_for(&x, 1);
            for (int m = 0; m < 3; m++)
                if (d[m].cl && d[m].decode_tasks > 0)
                    k = m;
        }
        ck_assert_int_ge(k, 0);
        ck_assert(!r.done && !r.failed);
        fw_stop(&d[k]);
    }
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 503);
    ck_assert_msg(strstr(r.msg, "left while running") && strstr(r.msg, "migration.max_attempts"),
                  "message: %s", r.msg);
    ck_assert_uint_eq(x.rt.n_running, 0);
    fx_stop(&x);
}
END_TEST

static bool swept_until_ended(void *arg)
{
    rec_t *r = arg;
    fx_t *x = r->ud;
    td_reqs_sweep(&x->rt, td_now_s());
    return r->done || r->failed;
}

/* A decode worker that accepts and then sends nothing (alive, heartbeating) misses the first
 * token deadline: the sequence is canceled there and runs on another worker. */
START_TEST(test_first_token_deadline_moves)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.migrate = true;
    x.rt.cfg.migrate_attempts = 3;
    x.rt.cfg.dl_first_token_s = 0.3;
    fw_t d1, d2;
    fw_start(&x, &d1, "d1", DEC, FW_HOLD);
    fw_start(&x, &d2, "d2", DEC, FW_ACCEPT);
    d2.tokens[0] = 2, d2.n_tokens = 1, d2.finish = true;
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    r.ud = &x;
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d1, 5000));
    double t0 = td_now_s();
    ck_assert(fx_run_until(&x, swept_until_ended, &r, 5000));
    double dt = td_now_s() - t0;
    ck_assert_msg(r.done, "job failed: %s", r.msg);
    ck_assert_str_eq(r.text, "c");
    ck_assert_msg(dt >= 0.25 && dt < 2.0, "moved after %.2f s", dt);
    ck_assert(fx_run_until(&x, fw_closed_or_canceled, &d1, 2000));
    ck_assert_int_eq(d1.cancels, 1);
    ck_assert_uint_eq(d1.cancel_ids[0], d1.task_id);
    ck_assert_ptr_nonnull(td_registry_find(&x.rt, "d1")); /* slow, not gone */
    fw_stop(&d1);
    fw_stop(&d2);
    fx_stop(&x);
}
END_TEST

/* Each stage's deadline, checked on a sequence in that stage (td__reqs_stage_late). */
START_TEST(test_stage_deadlines)
{
    td_router_cfg_t c = {0};
    c.dl_reservation_s = 1, c.dl_prefill_s = 2, c.dl_kv_handoff_s = 3, c.dl_first_token_s = 10;
    c.dl_token_stall_s = 4;
    td_worker_t dw = {.id = "dw"}, pw = {.id = "pw"};
    td_seq_t s = {0};
    char why[512];
    s.dw = &dw;
    s.state = TD_SEQ_ACCEPTING;
    s.t_stage = s.t_placed = 100;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 100.9, why, sizeof(why)));
    ck_assert_ptr_nonnull(td__reqs_stage_late(&c, &s, 101.1, why, sizeof(why)));
    ck_assert_msg(strstr(why, "deadline.reservation_s") && strstr(why, "dw"), "%s", why);
    /* remote prefill running */
    s.state = TD_SEQ_RUNNING;
    s.pw = &pw;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 101.9, why, sizeof(why)));
    ck_assert_ptr_nonnull(td__reqs_stage_late(&c, &s, 102.1, why, sizeof(why)));
    ck_assert_msg(strstr(why, "deadline.prefill_s") && strstr(why, "pw"), "%s", why);
    /* PrefillDone came at 105: the handoff's deadline runs from there */
    s.pw = NULL;
    s.got_prefill_done = true;
    s.t_stage = 105;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 107.9, why, sizeof(why)));
    ck_assert_ptr_nonnull(td__reqs_stage_late(&c, &s, 108.1, why, sizeof(why)));
    ck_assert_msg(strstr(why, "deadline.kv_handoff_s") && strstr(why, "prompt was prefilled"),
                  "%s", why);
    /* the first token's deadline counts from the placement */
    c.dl_kv_handoff_s = 0;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 109.9, why, sizeof(why)));
    ck_assert_ptr_nonnull(td__reqs_stage_late(&c, &s, 110.1, why, sizeof(why)));
    ck_assert_msg(strstr(why, "deadline.first_token_s"), "%s", why);
    /* tokens flow: only the stall deadline, from the last token */
    s.n_tokens = 3, s.base_tokens = 1, s.t_last = 200;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 203.9, why, sizeof(why)));
    ck_assert_ptr_nonnull(td__reqs_stage_late(&c, &s, 204.1, why, sizeof(why)));
    ck_assert_msg(strstr(why, "stalled") && strstr(why, "deadline.token_stall_s"), "%s", why);
    /* 0 turns a deadline off */
    c.dl_token_stall_s = 0;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 1e6, why, sizeof(why)));
    /* waiting and finished sequences have no stage deadline */
    s.state = TD_SEQ_WAITING;
    c.dl_reservation_s = 0.001;
    ck_assert_ptr_null(td__reqs_stage_late(&c, &s, 1e6, why, sizeof(why)));
}
END_TEST

/* No decode worker at all: the request gets 503 after admission.no_worker_wait_s, not the
 * request deadline; a worker that registers meanwhile would have taken it. */
START_TEST(test_no_worker_503)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.no_worker_wait_s = 0.3;
    rec_t r;
    double t0 = td_now_s();
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    r.ud = &x;
    ck_assert_uint_eq(x.rt.n_waiting, 1);
    ck_assert(fx_run_until(&x, swept_until_ended, &r, 5000));
    double dt = td_now_s() - t0;
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 503);
    ck_assert_msg(strstr(r.msg, "no decode worker is available") &&
                      strstr(r.msg, "admission.no_worker_wait_s"),
                  "message: %s", r.msg);
    ck_assert_msg(dt >= 0.28 && dt < 2.0, "503 after %.2f s", dt);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    /* with a decode worker that is merely full, it keeps waiting */
    fw_t d;
    fw_start(&x, &d, "d1", DEC, FW_ENOSPC);
    rec_t r2;
    ck_assert_int_eq(rec_start(&x, &r2, 4), 0);
    r2.ud = &x;
    ck_assert(!fx_run_until(&x, swept_until_ended, &r2, 700));
    ck_assert_uint_eq(x.rt.n_waiting + x.rt.n_running, 1); /* waiting, or being asked again */
    fw_stop(&d);
    fx_stop(&x);
}
END_TEST

/* Over capacity: every decode worker is full, so the request waits; after
 * admission.max_queue_wait_s it gets 503 naming the option (not the request deadline's 504). */
START_TEST(test_queue_wait_503)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.max_queue_wait_s = 0.3;
    x.rt.m_shed = td_metrics_counter(x.rt.metrics, "requests_shed_total", "shed", NULL);
    fw_t d;
    fw_start(&x, &d, "d1", DEC, FW_ENOSPC);
    rec_t r;
    double t0 = td_now_s();
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    r.ud = &x;
    ck_assert(fx_run_until(&x, swept_until_ended, &r, 5000));
    double dt = td_now_s() - t0;
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 503);
    ck_assert_msg(strstr(r.msg, "over capacity") && strstr(r.msg, "admission.max_queue_wait_s"),
                  "message: %s", r.msg);
    ck_assert_msg(dt >= 0.28 && dt < 2.0, "503 after %.2f s", dt);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    ck_assert_double_eq(td_metric_value(x.rt.m_shed), 1);
    /* no limit: it keeps waiting */
    x.rt.cfg.max_queue_wait_s = 0;
    rec_t r2;
    ck_assert_int_eq(rec_start(&x, &r2, 4), 0);
    r2.ud = &x;
    ck_assert(!fx_run_until(&x, swept_until_ended, &r2, 700));
    fw_stop(&d);
    fx_stop(&x);
}
END_TEST

/* A prefill worker lost after it said the prompt was computed (PrefillDone.computed): the error
 * says the prompt was done and the handoff was not; lost before that, that the prompt was not
 * finished. (No re-placements allowed here, so the reason reaches the client.) */
START_TEST(test_prefill_lost_names_what_failed)
{
    for (int computed = 0; computed < 2; computed++) {
        fx_t x;
        fx_start(&x);
        x.rt.cfg.local_prefill_tokens = 0; /* every prompt goes to a prefill worker */
        x.rt.cfg.migrate_attempts = 0;
        fw_t d, p;
        fw_start(&x, &d, "d1", DEC, FW_HOLD);
        fw_start(&x, &p, "p1", PRE, FW_HOLD);
        rec_t r;
        ck_assert_int_eq(rec_start(&x, &r, 3), 0);
        ck_assert(fx_run_until(&x, prefill_tasks_1, &p, 5000));
        if (computed) {
            Tandem__PrefillDone pd = TANDEM__PREFILL_DONE__INIT;
            pd.request_id = p.task_id;
            pd.computed = true;
            Tandem__Frame f = TANDEM__FRAME__INIT;
            f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
            f.prefill_done = &pd;
            fw_send(&p, &f);
            fx_run_for(&x, 50);
            ck_assert(!r.done && !r.failed); /* progress only */
        }
        fw_stop(&p);
        ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
        ck_assert(r.failed);
        ck_assert_int_eq(r.status, 503);
        if (computed)
            ck_assert_msg(strstr(r.msg, "prefill worker p1 left after computing the prompt") &&
                              strstr(r.msg, "decode worker d1: the handoff failed"),
                          "message: %s", r.msg);
        else
            ck_assert_msg(strstr(r.msg, "prefill worker p1 left before finishing the prompt"),
                          "message: %s", r.msg);
        ck_assert(fx_run_until(&x, fw_closed_or_canceled, &d, 2000)); /* its blocks are freed */
        fw_stop(&d);
        fx_stop(&x);
    }
}
END_TEST

static bool both_canceled(void *arg)
{
    fw_t **w = arg;
    return w[0]->cancels >= 1 && w[1]->cancels >= 1;
}

START_TEST(test_abort_cancels_both_workers)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.local_prefill_tokens = 0; /* every prompt goes to a prefill worker */
    fw_t d, p;
    fw_start(&x, &d, "d1", DEC, FW_HOLD);
    fw_start(&x, &p, "p1", PRE, FW_HOLD); /* never finishes the prefill */
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, prefill_tasks_1, &p, 5000));
    uint64_t id = d.task_id;
    ck_assert_uint_eq(p.task_id, id); /* one router id for both halves */
    td_job_abort(r.job, 499, "the client went away");
    ck_assert(!r.failed); /* reported from the loop, not inside the front end's call */
    fw_t *both[2] = {&d, &p};
    ck_assert(fx_run_until(&x, both_canceled, both, 5000));
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    ck_assert_int_eq(d.cancels, 1);
    ck_assert_int_eq(p.cancels, 1);
    ck_assert_uint_eq(d.cancel_ids[0], id);
    ck_assert_uint_eq(p.cancel_ids[0], id);
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 499);
    ck_assert_int_eq(r.code, TD_ECANCELED);
    ck_assert_str_eq(r.msg, "the client went away");
    ck_assert_uint_eq(x.rt.n_running, 0);
    fw_stop(&d);
    fw_stop(&p);
    fx_stop(&x);
}
END_TEST

START_TEST(test_abort_after_prefill_done_cancels_decode_only)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.local_prefill_tokens = 0;
    fw_t d, p;
    fw_start(&x, &d, "d1", DEC, FW_HOLD);
    fw_start(&x, &p, "p1", PRE, FW_ACCEPT); /* answers PrefillDone at once */
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, prefill_tasks_1, &p, 5000));
    fx_run_for(&x, 50); /* let PrefillDone arrive */
    td_job_abort(r.job, 499, "gone");
    ck_assert(fx_run_until(&x, rec_ended_cond, &r, 5000));
    fx_run_for(&x, 50);
    ck_assert_int_eq(d.cancels, 1);
    ck_assert_int_eq(p.cancels, 0); /* the prefill worker holds nothing any more */
    fw_stop(&d);
    fw_stop(&p);
    fx_stop(&x);
}
END_TEST

static bool has_cancel(void *arg)
{
    return ((fw_t *)arg)->cancels >= 1;
}

START_TEST(test_deadline_504)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.request_timeout_s = 5;
    fw_t d;
    fw_start(&x, &d, "d1", DEC, FW_HOLD);
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), 0);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d, 5000));
    td_reqs_sweep(&x.rt, td_now_s() + 1); /* before the deadline: nothing */
    ck_assert(!r.failed && !r.done);
    td_reqs_sweep(&x.rt, td_now_s() + 6);
    ck_assert(r.failed);
    ck_assert_int_eq(r.status, 504);
    ck_assert_int_eq(r.code, TD_ETIMEDOUT);
    ck_assert_msg(strstr(r.msg, "request_timeout_s"), "message: %s", r.msg);
    ck_assert(fx_run_until(&x, has_cancel, &d, 5000));
    ck_assert_uint_eq(d.cancel_ids[0], d.task_id);
    fw_stop(&d);
    fx_stop(&x);
}
END_TEST

static bool ended_2(void *arg)
{
    rec_t *r = arg;
    return rec_ended_cond(&r[0]) && rec_ended_cond(&r[1]);
}

START_TEST(test_waiting_queue_order_and_limit)
{
    fx_t x;
    fx_start(&x);
    x.rt.cfg.max_waiting = 2;
    rec_t r[3];
    /* no decode worker: sequences wait, up to max_waiting */
    ck_assert_int_eq(rec_start(&x, &r[0], 3), 0);
    ck_assert_int_eq(rec_start(&x, &r[1], 4), 0);
    ck_assert_uint_eq(x.rt.n_waiting, 2);
    /* the queue is full: the front end answers 503 (http_api.c maps TD_EBUSY); no event ran */
    ck_assert_int_eq(rec_start(&x, &r[2], 0), TD_EBUSY);
    ck_assert_msg(strstr(td_err_msg(), "2 requests are already waiting"), "%s", td_err_msg());
    ck_assert(!r[2].failed && !r[2].done);
    ck_assert_uint_eq(x.rt.n_waiting, 2);
    ck_assert_uint_eq(x.rt.n_jobs, 2);
    /* a decode worker registers: the waiting sequences go to it in arrival order */
    fw_t d;
    fw_connect(&x, &d, "d1", DEC, "fp-layout-A", FW_HOLD);
    ck_assert(fx_run_until(&x, fw_tasked_cond, &d, 5000));
    fx_run_for(&x, 50);
    ck_assert_int_eq(d.decode_tasks, 2);
    ck_assert_int_eq(d.firsts[0], 3);
    ck_assert_int_eq(d.firsts[1], 4);
    ck_assert_uint_eq(x.rt.n_waiting, 0);
    ck_assert_uint_eq(x.rt.n_running, 2);
    td_reqs_abort_all(&x.rt, "done");
    ck_assert(ended_2(r));
    fw_stop(&d);
    fx_stop(&x);
}
END_TEST

START_TEST(test_shutdown_refuses_new_jobs)
{
    fx_t x;
    fx_start(&x);
    x.rt.stopping = true;
    rec_t r;
    ck_assert_int_eq(rec_start(&x, &r, 3), TD_EBUSY);
    ck_assert_msg(strstr(td_err_msg(), "shutting down"), "%s", td_err_msg());
    ck_assert_uint_eq(x.rt.n_jobs, 0);
    x.rt.stopping = false;
    fx_stop(&x);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("reqs");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_enospc_tries_next_decode);
    tcase_add_test(tc, test_enospc_everywhere_waits);
    tcase_add_test(tc, test_draining_decode_tries_next);
    tcase_add_test(tc, test_worker_gone_retries_once);
    tcase_add_test(tc, test_worker_gone_retry_succeeds);
    tcase_add_test(tc, test_worker_gone_after_tokens_fails);
    tcase_add_test(tc, test_migrate_resumes_after_tokens);
    tcase_add_test(tc, test_migrate_attempts_bounded);
    tcase_add_test(tc, test_first_token_deadline_moves);
    tcase_add_test(tc, test_stage_deadlines);
    tcase_add_test(tc, test_no_worker_503);
    tcase_add_test(tc, test_queue_wait_503);
    tcase_add_test(tc, test_prefill_lost_names_what_failed);
    tcase_add_test(tc, test_abort_cancels_both_workers);
    tcase_add_test(tc, test_abort_after_prefill_done_cancels_decode_only);
    tcase_add_test(tc, test_deadline_504);
    tcase_add_test(tc, test_waiting_queue_order_and_limit);
    tcase_add_test(tc, test_shutdown_refuses_new_jobs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}
