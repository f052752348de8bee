/* router_fixture.h: a router's registry and request state machine on a real libuv loop, with
 * SCRIPTED workers in the same process that speak the control protocol over real td_rpc
 * connections on loopback (what tests/integration/fake_worker.c does out of process).
 *
 * Why real connections rather than a seam for frames sent to workers: the parts under test
 * (registry.c, reqs*.c) then run exactly as in the daemon, frames are encoded, authenticated and
 * decoded on the way, and a worker "dying" is a real connection closing, which is what the router
 * reacts to. No model, no HTTP: jobs are started with td_job_* directly and their events recorded.
 *
 * Each scripted worker answers a DecodeTask according to its mode (accept, accept and stream a
 * canned list of tokens, or refuse with ENOSPC), a PrefillTask by PrefillDone or not at all, and
 * records every frame the router sends it (tasks, Cancel, Drain, Error) for the test to check.
 */
#ifndef TD_TEST_ROUTER_FIXTURE_H
#define TD_TEST_ROUTER_FIXTURE_H

#include "router.h"

#include "td_error.h"
#include "td_rpc.h"
#include "td_util.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FX_SECRET "router fixture cluster secret"
#define FX_MODEL "test-model"

/* A byte-level BPE vocabulary of single letters: id 0 "a", 1 "b", 2 "c", 3 "d", 4 "e". */
#define FX_TOKENIZER                                                                               \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"normalizer\":null,"              \
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"   \
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"d\":3,\"e\":4},"            \
    "\"merges\":[]},\"added_tokens\":[],\"post_processor\":null,"                                 \
    "\"decoder\":{\"type\":\"ByteLevel\"}}"

/* ---- the router under test ------------------------------------------------------------------ */

typedef struct fx {
    uv_loop_t loop;
    td_router_t rt;
    char cluster_addr[64]; /* where scripted workers connect */
} fx_t;

/* Set up a router with round-robin placement (so the first registered decode worker is asked
 * first), its request state machine and its cluster listener on an ephemeral loopback port. */
static inline void fx_start(fx_t *x)
{
    memset(x, 0, sizeof(*x));
    ck_assert_int_eq(uv_loop_init(&x->loop), 0);
    td_router_t *rt = &x->rt;
    rt->loop = &x->loop;
    rt->cfg.model = FX_MODEL;
    rt->model_name = FX_MODEL;
    rt->id = "test-router";
    rt->cfg.cluster_listen = "127.0.0.1:0";
    rt->cfg.heartbeat_timeout_s = 1.0;
    rt->cfg.max_waiting = 8;
    rt->cfg.local_prefill_tokens = 64;
    rt->cfg.migrate_attempts = 1; /* migration off (tests turn it on), one retry before a token */
    rt->cfg.no_worker_wait_s = 600;
    rt->secret = (uint8_t *)FX_SECRET;
    rt->secret_len = strlen(FX_SECRET);
    rt->max_ctx = 4096;
    ck_assert_msg(td_tokenizer_load_mem(FX_TOKENIZER, strlen(FX_TOKENIZER), NULL, 0, "fx.json",
                                        &rt->tok) == 0,
                  "%s", td_err_msg());
    rt->metrics = td_metrics_new("test_", NULL);
    ck_assert_ptr_nonnull(rt->metrics);
    td_place_limits_t lim = {0};
    td_placer_init(&rt->placer, TD_PLACE_ROUND_ROBIN, &lim, 1);
    ck_assert_int_eq(td_reqs_init(rt), 0);
    ck_assert_int_eq(td_registry_start(rt), 0);
    snprintf(x->cluster_addr, sizeof(x->cluster_addr), "127.0.0.1:%d",
             td_rpc_server_port(rt->cluster));
}

/* Run the loop until cond(arg) holds or `ms` pass; returns whether it held. */
typedef bool (*fx_cond_fn)(void *arg);
static inline bool fx_run_until(fx_t *x, fx_cond_fn cond, void *arg, uint64_t ms)
{
    uint64_t end = td_now_ns() + ms * 1000000ull;
    while (!cond(arg) && td_now_ns() < end) {
        uv_run(&x->loop, UV_RUN_NOWAIT);
        usleep(500);
    }
    return cond(arg);
}

/* Run the loop for about `ms` (to show that something does NOT happen). */
static inline void fx_run_for(fx_t *x, uint64_t ms)
{
    uint64_t end = td_now_ns() + ms * 1000000ull;
    while (td_now_ns() < end) {
        uv_run(&x->loop, UV_RUN_NOWAIT);
        usleep(500);
    }
}

/* Close the listener (every worker connection with it), then every handle; the loop must end
 * with nothing left open. */
static inline void fx_stop(fx_t *x)
{
    td_router_t *rt = &x->rt;
    td_reqs_abort_all(rt, "test over");
    td_rpc_server_close(rt->cluster);
    uv_timer_stop(&rt->defer_timer);
    uv_close((uv_handle_t *)&rt->defer_timer, NULL);
    for (int i = 0; i < 4000 && uv_run(&x->loop, UV_RUN_NOWAIT); i++)
        usleep(500);
    ck_assert_int_eq(uv_loop_close(&x->loop), 0);
    ck_assert_uint_eq(rt->n_workers, 0);
    td_reqs_close(rt);
    free(rt->workers);
    td_metrics_free(rt->metrics);
    td_tokenizer_free(rt->tok);
}

/* ---- scripted workers ----------------------------------------------------------------------- */

typedef enum fw_mode {
    FW_ACCEPT, /* decode: DecodeAccept, then the canned tokens (if any); prefill: PrefillDone */
    FW_HOLD,   /* decode: DecodeAccept and nothing more; prefill: never PrefillDone */
    FW_ENOSPC, /* decode: Error{ENOSPC} for every DecodeTask */
    FW_BUSY,   /* decode: Error{EBUSY} (draining, or stopping) for every DecodeTask */
} fw_mode_t;

typedef struct fw {
    fx_t *x;
    char id[32];
    int role; /* TANDEM__ROLE__ROLE_DECODE or _PREFILL */
    const char *fp;
    fw_mode_t mode;
    int32_t tokens[8]; /* canned tokens sent in one TokenChunk after DecodeAccept */
    size_t n_tokens;
    bool finish; /* that chunk ends the sequence (FINISH_STOP) */
    td_rpc_client_t *cl;
    /* what the router sent */
    int ready, closes;
    int decode_tasks, prefill_tasks;
    uint64_t task_id;       /* request id of the last task */
    int32_t task_first;     /* first prompt token of the last task */
    size_t task_n_tokens;   /* tokens of the last DecodeTask (prompt plus resumed ones) */
    int32_t task_last;      /* its last token */
    uint32_t task_generated; /* its `generated` (migration) */
    int32_t firsts[8];      /* first prompt token of each DecodeTask, in arrival order */
    uint64_t cancel_ids[8]; /* [cancels] */
    int cancels;
    int drains;
    bool drain_on;
    int errors, error_code;
    char error_msg[512];
} fw_t;

static inline void fw_send(fw_t *w, Tandem__Frame *f)
{
    td_rpc_conn_t *c = td_rpc_client_conn(w->cl);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(td_rpc_send(c, f), 0);
}

static inline void fw_hello(fw_t *w)
{
    Tandem__KvLayout lay = TANDEM__KV_LAYOUT__INIT;
    lay.fingerprint.data = (uint8_t *)w->fp;
    lay.fingerprint.len = strlen(w->fp);
    lay.block_tokens = 16;
    Tandem__Hello h = TANDEM__HELLO__INIT;
    h.role = w->role;
    h.worker_id = w->id;
    h.model = FX_MODEL;
    h.layout = &lay;
    h.ucx_address.data = (uint8_t *)"blob";
    h.ucx_address.len = 4;
    h.total_blocks = 1000;
    h.max_running = 8;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HELLO;
    f.hello = &h;
    fw_send(w, &f);
}

static inline void fw_decode_task(fw_t *w, const Tandem__DecodeTask *t)
{
    w->decode_tasks++;
    w->task_id = t->request_id;
    w->task_first = t->n_tokens ? t->tokens[0] : -1;
    w->task_n_tokens = t->n_tokens;
    w->task_last = t->n_tokens ? t->tokens[t->n_tokens - 1] : -1;
    w->task_generated = t->generated;
    if (w->decode_tasks <= 8)
        w->firsts[w->decode_tasks - 1] = w->task_first;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    if (w->mode == FW_ENOSPC || w->mode == FW_BUSY) {
        Tandem__Error e = TANDEM__ERROR__INIT;
        e.request_id = t->request_id;
        e.code = w->mode == FW_ENOSPC ? TD_ENOSPC : TD_EBUSY;
        e.message = w->mode == FW_ENOSPC ? "no free KV blocks" : "worker is draining";
        f.body_case = TANDEM__FRAME__BODY_ERROR;
        f.error = &e;
        fw_send(w, &f);
        return;
    }
    Tandem__DecodeAccept a = TANDEM__DECODE_ACCEPT__INIT;
    a.request_id = t->request_id;
    a.worker_request_id = 100 + (uint64_t)w->decode_tasks;
    f.body_case = TANDEM__FRAME__BODY_DECODE_ACCEPT;
    f.decode_accept = &a;
    fw_send(w, &f);
    if (w->mode != FW_ACCEPT || !w->n_tokens)
        return;
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    c.request_id = t->request_id;
    c.n_tokens = w->n_tokens;
    c.tokens = w->tokens;
    c.finish = w->finish ? TANDEM__FINISH__FINISH_STOP : TANDEM__FINISH__FINISH_NONE;
    Tandem__Frame cf = TANDEM__FRAME__INIT;
    cf.body_case = TANDEM__FRAME__BODY_TOKEN_CHUNK;
    cf.token_chunk = &c;
    fw_send(w, &cf);
}

static inline void fw_on_ready(td_rpc_conn_t *c, void *ud)
{
    fw_t *w = ud;
    w->ready++;
    fw_hello(w);
}

static inline void fw_on_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    fw_t *w = ud;
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_DECODE_TASK:
        fw_decode_task(w, f->decode_task);
        break;
    case TANDEM__FRAME__BODY_PREFILL_TASK:
        w->prefill_tasks++;
        w->task_id = f->prefill_task->request_id;
        if (w->mode == FW_ACCEPT) {
            Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
            d.request_id = f->prefill_task->request_id;
            Tandem__Frame out = TANDEM__FRAME__INIT;
            out.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
            out.prefill_done = &d;
            fw_send(w, &out);
        }
        break;
    case TANDEM__FRAME__BODY_CANCEL:
        if (w->cancels < 8)
            w->cancel_ids[w->cancels++] = f->cancel->request_id;
        break;
    case TANDEM__FRAME__BODY_DRAIN:
        w->drains++;
        w->drain_on = f->drain->on;
        break;
    case TANDEM__FRAME__BODY_ERROR:
        w->errors++;
        w->error_code = f->error->code;
        snprintf(w->error_msg, sizeof(w->error_msg), "%s",
                 f->error->message ? f->error->message : "");
        break;
    default:
        break;
    }
}

static inline void fw_on_close(td_rpc_conn_t *c, int status, void *ud)
{
    fw_t *w = ud;
    w->closes++;
}

static inline bool fw_registered_cond(void *arg)
{
    fw_t *w = arg;
    return td_registry_find(&w->x->rt, w->id) != NULL;
}

/* The worker has received a DecodeTask. */
static inline bool fw_tasked_cond(void *arg)
{
    return ((fw_t *)arg)->decode_tasks >= 1;
}

static inline bool fw_closed_cond(void *arg)
{
    return ((fw_t *)arg)->closes > 0;
}

/* Connect a scripted worker (not yet registered: that takes its Hello). */
static inline void fw_connect(fx_t *x, fw_t *w, const char *id, int role, const char *fp,
                              fw_mode_t mode)
{
    memset(w, 0, sizeof(*w));
    w->x = x;
    snprintf(w->id, sizeof(w->id), "%s", id);
    w->role = role;
    w->fp = fp;
    w->mode = mode;
    td_rpc_opts_t o = {0};
    o.secret = (const uint8_t *)FX_SECRET;
    o.secret_len = strlen(FX_SECRET);
    o.id = w->id;
    o.cb.on_ready = fw_on_ready;
    o.cb.on_frame = fw_on_frame;
    o.cb.on_close = fw_on_close;
    o.ud = w;
    ck_assert_int_eq(td_rpc_client_start(&x->loop, x->cluster_addr, &o, false, &w->cl), 0);
}

/* Connect a scripted worker and wait until the router has registered it. */
static inline void fw_start(fx_t *x, fw_t *w, const char *id, int role, fw_mode_t mode)
{
    fw_connect(x, w, id, role, "fp-layout-A", mode);
    ck_assert_msg(fx_run_until(x, fw_registered_cond, w, 5000), "worker %s did not register", id);
}

/* The worker goes away (its connection closes); the router notices on its side. */
static inline void fw_stop(fw_t *w)
{
    if (!w->cl)
        return;
    td_rpc_client_stop(w->cl);
    w->cl = NULL;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

/* What a job reported to its front end. */
typedef struct rec {
    td_job_t *job; /* NULL once done or failed (then released) */
    char text[256];
    size_t len;
    int tokens; /* token events with an id */
    int finishes;
    td_resp_finish_t why;
    bool done, failed;
    int status, code;
    char msg[512];
    void *ud; /* the test's (set after rec_start) */
} rec_t;

static inline void rec_token(td_job_t *j, int idx, int32_t id, const Tandem__TokenLogprob *lp,
                             const char *text, size_t len)
{
    rec_t *r = j->ud;
    if (id >= 0)
        r->tokens++;
    ck_assert_uint_lt(r->len + len, sizeof(r->text));
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = 0;
}

static inline void rec_flush(td_job_t *j, int idx)
{
}

static inline void rec_finish(td_job_t *j, int idx, td_resp_finish_t why, const char *stop)
{
    rec_t *r = j->ud;
    r->finishes++;
    r->why = why;
}

static inline void rec_done(td_job_t *j)
{
    rec_t *r = j->ud;
    r->done = true;
    r->job = NULL;
    td_job_free(j);
}

static inline void rec_fail(td_job_t *j, int status, int code, const char *msg)
{
    rec_t *r = j->ud;
    r->failed = true;
    r->status = status;
    r->code = code;
    snprintf(r->msg, sizeof(r->msg), "%s", msg);
    r->job = NULL;
    td_job_free(j);
}

static const td_job_ops_t rec_ops = {rec_token, rec_flush, rec_finish, rec_done, rec_fail};

/* Start a one-sequence job with prompt [first, 1, 2] (first tells jobs apart at the workers).
 * Returns td_job_start's result; on failure the job is already released. */
static inline int rec_start(fx_t *x, rec_t *r, int32_t first)
{
    memset(r, 0, sizeof(*r));
    td_job_t *j = td_job_new(&x->rt, &rec_ops, r, 1);
    ck_assert_ptr_nonnull(j);
    int32_t prompt[3] = {first, 1, 2};
    ck_assert_int_eq(td_job_set_prompt(j, 0, prompt, 3, 0), 0);
    j->sp.max_tokens = 8;
    r->job = j;
    int rc = td_job_start(j);
    if (rc) {
        td_job_free(j);
        r->job = NULL;
    }
    return rc;
}

static inline bool rec_ended_cond(void *arg)
{
    rec_t *r = arg;
    return r->done || r->failed;
}

#endif
