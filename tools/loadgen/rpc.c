/* rpc.c: `tandem bench --backend rpc`: the router's internal RPC as a load target.
 *
 * One authenticated td_rpc connection on the harness's loop carries every request: a
 * GenerateRequest per prompt (its text, or chat messages through the router's template), answered
 * by TokenChunk frames (one per generated token) and a last one with the finish and usage. Times
 * are taken when a frame is read: TTFT at the first frame with tokens, ITL between such frames,
 * E2EL at the last. Requests submitted before the handshake finishes wait for it.
 */
#include "bench.h"
#include "td_error.h"
#include "td_rpc.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct rpc_req {
    struct rpc_req *next;
    uint64_t id;
    td_bench_result_t *r;
    uint64_t t0_ns;   /* the run's start */
    uint64_t sent_ns; /* when the request went out */
    uint64_t last_ns; /* the previous frame with tokens */
    bool sent;
    Tandem__GenerateRequest g; /* kept until sent (strings below are owned) */
    Tandem__Sampling sp;
    char *prompt, *messages;
} rpc_req_t;

typedef struct rpc_impl {
    uv_loop_t *loop;
    td_rpc_client_t *cl;
    td_rpc_conn_t *conn;
    td_bench_done_cb cb;
    void *cb_arg;
    bool chat;
    double timeout_s;
    rpc_req_t *reqs; /* in flight, newest first */
    size_t n;
    uint64_t next_id;
    uv_timer_t timer; /* per-request timeouts */
    bool closing;
    uint64_t closes;   /* on_close calls seen (one per connection attempt) */
    uint64_t attempts; /* connection attempts made, read before td_rpc_client_stop */
    char addr[300];
} rpc_impl_t;

static void req_free(rpc_req_t *q)
{
    free(q->prompt);
    free(q->messages);
    free(q);
}

/* Take q off the list and report it. */
static void req_done(rpc_impl_t *h, rpc_req_t *q)
{
    rpc_req_t **pp = &h->reqs;
    while (*pp && *pp != q)
        pp = &(*pp)->next;
    if (*pp)
        *pp = q->next;
    h->n--;
    td_bench_result_t *r = q->r;
    req_free(q);
    h->cb(r, h->cb_arg);
}

static int req_send(rpc_impl_t *h, rpc_req_t *q)
{
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_GENERATE;
    f.generate = &q->g;
    q->sent_ns = td_now_ns();
    q->r->send_s = (double)(q->sent_ns - q->t0_ns) * 1e-9;
    q->sent = true;
    return td_rpc_send(h->conn, &f);
}

static rpc_req_t *find(rpc_impl_t *h, uint64_t id)
{
    for (rpc_req_t *q = h->reqs; q; q = q->next)
        if (q->id == id)
            return q;
    return NULL;
}

static void on_ready(td_rpc_conn_t *c, void *ud)
{
    rpc_impl_t *h = ud;
    h->conn = c;
    rpc_req_t *next;
    for (rpc_req_t *q = h->reqs; q; q = next) {
        next = q->next;
        if (!q->sent && req_send(h, q) != 0) {
            td_bench_result_fail(q->r, TD_BENCH_ERR_CONNECT, "send: %s", td_err_msg());
            req_done(h, q);
        }
    }
}

static void on_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    rpc_impl_t *h = ud;
    uint64_t now = td_now_ns();
    (void)c;
    if (f->body_case == TANDEM__FRAME__BODY_ERROR) {
        rpc_req_t *q = find(h, f->error->request_id);
        if (q) {
            td_bench_result_fail(q->r, TD_BENCH_ERR_STREAM, "router: %s", f->error->message);
            req_done(h, q);
        }
        return;
    }
    if (f->body_case != TANDEM__FRAME__BODY_TOKEN_CHUNK)
        return;
    const Tandem__TokenChunk *ch = f->token_chunk;
    rpc_req_t *q = find(h, ch->request_id);
    if (!q)
        return;
    td_bench_result_t *r = q->r;
    if (ch->n_tokens > 0) {
        if (r->n_chunks == 0)
            r->ttft = (double)(now - q->sent_ns) * 1e-9;
        else if (td_bench_result_add_itl(r, (double)(now - q->last_ns) * 1e-9) != 0)
            td_bench_result_fail(r, TD_BENCH_ERR_STREAM, "out of memory");
        q->last_ns = now;
        r->n_chunks++;
        r->latency = (double)(now - q->sent_ns) * 1e-9;
    }
    if (ch->text.len)
        td_buf_append(&r->text, ch->text.data, ch->text.len);
    if (ch->finish == TANDEM__FINISH__FINISH_NONE)
        return;
    if (ch->finish == TANDEM__FINISH__FINISH_ABORT)
        td_bench_result_fail(r, TD_BENCH_ERR_STREAM, "aborted: %s",
                             ch->error && *ch->error ? ch->error : "no reason");
    else if (r->n_chunks == 0)
        td_bench_result_fail(r, TD_BENCH_ERR_STREAM, "finished without a token");
    r->usage_completion_tokens = ch->completion_tokens;
    r->output_len = ch->completion_tokens;
    req_done(h, q);
}

static void on_timer_closed(uv_handle_t *t)
{
    free(t->data);
}

/* After close: free once the last connection attempt has reported its end (the library calls
 * on_close for every attempt, and it must still find us then). */
static void maybe_free(rpc_impl_t *h)
{
    if (h->closing && h->closes >= h->attempts && !uv_is_closing((uv_handle_t *)&h->timer))
        uv_close((uv_handle_t *)&h->timer, on_timer_closed);
}

static void fail_all(rpc_impl_t *h, td_bench_err_t kind, const char *msg)
{
    while (h->reqs) {
        td_bench_result_fail(h->reqs->r, kind, "%s", msg);
        req_done(h, h->reqs);
    }
}

static void on_close(td_rpc_conn_t *c, int status, void *ud)
{
    rpc_impl_t *h = ud;
    h->closes++;
    if (h->conn == c)
        h->conn = NULL;
    char msg[768];
    snprintf(msg, sizeof(msg), "router connection %s closed: %s", h->addr,
             *td_rpc_conn_reason(c) ? td_rpc_conn_reason(c) : td_strerror(status));
    fail_all(h, TD_BENCH_ERR_CONNECT, msg);
    maybe_free(h);
}

static void on_timer(uv_timer_t *t)
{
    rpc_impl_t *h = t->data;
    uint64_t now = td_now_ns();
    rpc_req_t *next;
    for (rpc_req_t *q = h->reqs; q; q = next) {
        next = q->next;
        if (q->sent && h->timeout_s > 0 && (double)(now - q->sent_ns) * 1e-9 > h->timeout_s) {
            Tandem__Cancel k = TANDEM__CANCEL__INIT;
            k.request_id = q->id;
            Tandem__Frame f = TANDEM__FRAME__INIT;
            f.body_case = TANDEM__FRAME__BODY_CANCEL;
            f.cancel = &k;
            if (h->conn)
                td_rpc_send(h->conn, &f);
            td_bench_result_fail(q->r, TD_BENCH_ERR_TIMEOUT, "no answer within %.1f s",
                                 h->timeout_s);
            req_done(h, q);
        }
    }
}

static void *rpc_open(void *loop, const td_bench_target_t *t, td_bench_done_cb cb, void *arg)
{
    if (!t->secret || t->secret_len == 0) {
        td_err_set(TD_EAUTH, "--backend rpc needs the cluster secret (--secret-file, or "
                             "$TANDEM_CLUSTER_SECRET)");
        return NULL;
    }
    rpc_impl_t *h = td_calloc(1, sizeof(*h));
    if (!h) {
        td_err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    h->loop = loop;
    h->cb = cb;
    h->cb_arg = arg;
    h->chat = t->chat;
    h->timeout_s = t->timeout_s;
    snprintf(h->addr, sizeof(h->addr), "%s:%d", t->host, t->port);
    td_rpc_opts_t o = {.secret = t->secret,
                       .secret_len = t->secret_len,
                       .id = "tandem-bench",
                       .cb = {.on_ready = on_ready, .on_frame = on_frame, .on_close = on_close},
                       .ud = h};
    if (td_rpc_client_start(loop, h->addr, &o, false, &h->cl) != 0) {
        free(h);
        return NULL;
    }
    uv_timer_init(loop, &h->timer);
    h->timer.data = h;
    uv_timer_start(&h->timer, on_timer, 100, 100);
    uv_unref((uv_handle_t *)&h->timer);
    return h;
}

static int rpc_submit(void *impl, const td_bench_request_t *req, uint64_t t0_ns,
                      td_bench_result_t *r)
{
    rpc_impl_t *h = impl;
    if (h->closing || (!h->conn && h->closes > 0))
        return td_err_set(TD_ECLOSED, "the router connection is closed");
    rpc_req_t *q = td_calloc(1, sizeof(*q));
    if (!q)
        return TD_ENOMEM;
    q->id = ++h->next_id;
    q->r = r;
    q->t0_ns = t0_ns;
    tandem__generate_request__init(&q->g);
    tandem__sampling__init(&q->sp);
    q->sp.max_tokens = (int32_t)req->max_tokens;
    q->sp.ignore_eos = req->ignore_eos;
    q->sp.top_p = 1;
    q->sp.logprobs = -1;
    q->g.request_id = q->id;
    q->g.sampling = &q->sp;
    q->g.want_text = true;
    if (h->chat) {
        q->messages = td_strdup(req->messages_json ? req->messages_json : "[]");
        q->g.messages_json = q->messages;
    } else {
        q->prompt = td_strdup(req->prompt ? req->prompt : "");
        q->g.prompt = q->prompt;
    }
    if ((h->chat && !q->messages) || (!h->chat && !q->prompt)) {
        req_free(q);
        return TD_ENOMEM;
    }
    q->next = h->reqs;
    h->reqs = q;
    h->n++;
    if (h->conn && req_send(h, q) != 0) {
        h->reqs = q->next;
        h->n--;
        req_free(q);
        return td_err_set(TD_ECLOSED, "send: %s", td_err_msg());
    }
    return 0;
}

static size_t rpc_inflight(const void *impl)
{
    return ((const rpc_impl_t *)impl)->n;
}

static void rpc_close(void *impl)
{
    rpc_impl_t *h = impl;
    h->closing = true;
    fail_all(h, TD_BENCH_ERR_CONNECT, "canceled");
    h->attempts = td_rpc_client_attempts(h->cl);
    td_rpc_client_stop(h->cl);
    maybe_free(h);
}

const td_bench_backend_t td_bench_backend_rpc = {"rpc", rpc_open, rpc_submit, rpc_inflight,
                                                 rpc_close};
