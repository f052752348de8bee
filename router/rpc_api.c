/* rpc_api.c: the internal client RPC (td_rpc, the cluster secret): GenerateRequest streams
 * TokenChunk frames carrying the client's request id; Cancel; TokenizeRequest; StatusRequest
 * (with drain / undrain; the response is built by status.c). Failures are Error frames carrying the request id. */
#include "router.h"

#include "td_error.h"
#include "td_log.h"
#include "td_msg.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rjob rjob_t;

/* One client connection and the generations it has running. */
typedef struct rconn {
    td_router_t *rt;
    td_rpc_conn_t *conn;
    rjob_t *jobs;
} rconn_t;

struct rjob {
    rconn_t *rc;        /* NULL once the connection is gone */
    uint64_t client_id; /* GenerateRequest.request_id */
    bool want_text;
    td_job_t *job;
    td_tokens_t ids;            /* tokens not yet sent */
    Tandem__TokenLogprob **lps; /* [n_lps] copies for those tokens (logprobs asked) */
    size_t n_lps, cap_lps;
    td_buf_t text; /* text not yet sent */
    rjob_t *next, *prev;
};

static void lp_free(Tandem__TokenLogprob *lp)
{
    if (!lp)
        return;
    free(lp->top_ids);
    free(lp->top_logprobs);
    free(lp);
}

static void pending_reset(rjob_t *r)
{
    for (size_t i = 0; i < r->n_lps; i++)
        lp_free(r->lps[i]);
    r->n_lps = 0;
    r->ids.len = 0;
    td_buf_reset(&r->text);
}

static void rjob_unlink(rjob_t *r)
{
    if (!r->rc)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        r->rc->jobs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->next = r->prev = NULL;
    r->rc = NULL;
}

static void rjob_free(rjob_t *r)
{
    rjob_unlink(r);
    pending_reset(r);
    free(r->lps);
    td_tokens_free(&r->ids);
    td_buf_free(&r->text);
    td_job_free(r->job);
    free(r);
}

/* Send what is pending, with `finish` and usage when the sequence ended. */
static void send_chunk(rjob_t *r, Tandem__Finish finish, const td_seq_t *s)
{
    if (!r->rc || (!r->ids.len && !r->text.len && finish == TANDEM__FINISH__FINISH_NONE))
        return;
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    c.request_id = r->client_id;
    c.n_tokens = r->ids.len;
    c.tokens = r->ids.ids;
    c.n_logprobs = r->n_lps;
    c.logprobs = r->lps;
    c.finish = finish;
    if (r->want_text) {
        c.text.data = (uint8_t *)r->text.data;
        c.text.len = r->text.len;
    }
    if (finish != TANDEM__FINISH__FINISH_NONE && s) {
        c.prompt_tokens = s->prompt_tokens;
        c.cached_tokens = s->cached_tokens;
        c.completion_tokens = s->completion_tokens ? s->completion_tokens : (uint32_t)s->n_tokens;
    }
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_TOKEN_CHUNK;
    f.token_chunk = &c;
    td_rpc_send(r->rc->conn, &f);
    pending_reset(r);
}

static void ev_token(td_job_t *j, int idx, int32_t id, const Tandem__TokenLogprob *lp,
                     const char *text, size_t len)
{
    rjob_t *r = j->ud;
    if (id >= 0) {
        td_tokens_push(&r->ids, id);
        if (lp) {
            if (r->n_lps == r->cap_lps) {
                size_t cap = r->cap_lps ? r->cap_lps * 2 : 16;
                Tandem__TokenLogprob **t = td_reallocarray(r->lps, cap, sizeof(*t));
                if (t) {
                    r->lps = t;
                    r->cap_lps = cap;
                }
            }
            Tandem__TokenLogprob *c = td_calloc(1, sizeof(*c));
            if (c && r->n_lps < r->cap_lps) {
                tandem__token_logprob__init(c);
                c->logprob = lp->logprob;
                size_t n = TD_MIN(lp->n_top_ids, lp->n_top_logprobs);
                c->top_ids = td_calloc(n ? n : 1, sizeof(int32_t));
                c->top_logprobs = td_calloc(n ? n : 1, sizeof(float));
                if (c->top_ids && c->top_logprobs) {
                    memcpy(c->top_ids, lp->top_ids, n * sizeof(int32_t));
                    memcpy(c->top_logprobs, lp->top_logprobs, n * sizeof(float));
                    c->n_top_ids = c->n_top_logprobs = n;
                }
                r->lps[r->n_lps++] = c;
            } else {
                free(c);
            }
        }
    }
    if (r->want_text && len)
        td_buf_append(&r->text, text, len);
}

static void ev_flush(td_job_t *j, int idx)
{
    send_chunk(j->ud, TANDEM__FINISH__FINISH_NONE, NULL);
}

static void ev_finish(td_job_t *j, int idx, td_resp_finish_t why, const char *stop)
{
    send_chunk(j->ud,
               why == TD_RESP_LENGTH ? TANDEM__FINISH__FINISH_LENGTH : TANDEM__FINISH__FINISH_STOP,
               &j->seqs[idx]);
}

static void ev_done(td_job_t *j)
{
    rjob_free(j->ud);
}

static void ev_fail(td_job_t *j, int status, int code, const char *msg)
{
    rjob_t *r = j->ud;
    if (r->rc && status != 499)
        td_msg_send_error(r->rc->conn, r->client_id, code < 0 ? code : TD_EINTERNAL, msg);
    rjob_free(r);
}

static const td_job_ops_t rpc_ops = {ev_token, ev_flush, ev_finish, ev_done, ev_fail};

/* ---- requests ------------------------------------------------------------------------------ */

static void on_generate(rconn_t *rc, const Tandem__GenerateRequest *g)
{
    td_router_t *rt = rc->rt;
    char msg[1024];
    int code = TD_EINVAL;
    td_tokens_t t;
    td_tokens_init(&t);
    rjob_t *r = NULL;
    for (rjob_t *x = rc->jobs; x; x = x->next)
        if (x->client_id == g->request_id) {
            snprintf(msg, sizeof(msg), "request id %llu is already running on this connection",
                     (unsigned long long)g->request_id);
            goto fail;
        }
    int rc2 = 0;
    if (g->n_tokens) {
        size_t vocab = td_tokenizer_vocab_size(rt->tok);
        for (size_t i = 0; i < g->n_tokens && !rc2; i++) {
            if (g->tokens[i] < 0 || (size_t)g->tokens[i] >= vocab)
                rc2 = td_err_set(TD_EINVAL, "tokens[%zu] = %d is outside the vocabulary", i,
                                 g->tokens[i]);
            else
                rc2 = td_tokens_push(&t, g->tokens[i]);
        }
    } else if (g->messages_json && *g->messages_json) {
        td_chat_msgs_t msgs = {0};
        rc2 = td_chat_msgs_parse(&msgs, g->messages_json, strlen(g->messages_json));
        if (!rc2)
            rc2 = td_router_chat_tokens(rt, &msgs, true, false, &t);
        td_chat_msgs_free(&msgs);
    } else if (g->prompt && *g->prompt) {
        rc2 = td_tokenizer_encode(rt->tok, g->prompt, strlen(g->prompt), true, &t);
    } else {
        rc2 = td_err_set(TD_EINVAL, "GenerateRequest needs tokens, prompt or messages_json");
    }
    if (rc2) {
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        code = rc2;
        goto fail;
    }
    const Tandem__Sampling *sp = g->sampling;
    int64_t max_tokens = sp && sp->max_tokens > 0 ? sp->max_tokens : rt->max_ctx - (int64_t)t.len;
    if (t.len >= (size_t)rt->max_ctx || t.len + (uint64_t)max_tokens > (uint64_t)rt->max_ctx) {
        snprintf(msg, sizeof(msg),
                 "This model's maximum context length is %d tokens. However, you requested %zu "
                 "tokens (%zu in the prompt, %lld in the completion).",
                 rt->max_ctx, t.len + (size_t)(max_tokens > 0 ? max_tokens : 0), t.len,
                 (long long)max_tokens);
        goto fail;
    }
    /* the one translation of the proto's settings; it refuses too many stop ids and logprobs
     * out of range, naming the field */
    td_sampling_t p;
    if (td_msg_sampling_from_proto(sp, &p)) {
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        goto fail;
    }
    if (p.temperature < 0) {
        snprintf(msg, sizeof(msg), "sampling.temperature: %g (must be >= 0)", p.temperature);
        goto fail;
    }
    r = td_calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    td_tokens_init(&r->ids);
    td_buf_init(&r->text);
    r->client_id = g->request_id;
    r->want_text = g->want_text;
    r->job = td_job_new(rt, &rpc_ops, r, 1);
    if (!r->job)
        goto oom;
    td_job_t *j = r->job;
    if (td_job_set_sampling(j, &p))
        goto oom;
    j->sp.max_tokens = (int32_t)max_tokens;
    if (td_job_set_tenant(j, g->tenant.data, g->tenant.len) ||
        td_job_set_prompt(j, 0, t.ids, t.len, p.seed) ||
        td_job_set_stop(j, g->stop, g->n_stop))
        goto oom;
    char cid[24];
    snprintf(cid, sizeof(cid), "%llu", (unsigned long long)g->request_id);
    td_job_set_client(j, "rpc", cid, 1);
    int src = td_job_start(j);
    if (src) {
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        code = src;
        goto fail;
    }
    r->rc = rc;
    r->next = rc->jobs;
    if (rc->jobs)
        rc->jobs->prev = r;
    rc->jobs = r;
    td_tokens_free(&t);
    return;
oom:
    snprintf(msg, sizeof(msg), "out of memory");
    code = TD_ENOMEM;
fail:
    td_msg_send_error(rc->conn, g->request_id, code, msg);
    if (r)
        rjob_free(r);
    td_tokens_free(&t);
}

static void on_cancel(rconn_t *rc, const Tandem__Cancel *c)
{
    for (rjob_t *r = rc->jobs; r; r = r->next)
        if (r->client_id == c->request_id) {
            td_job_abort(r->job, 499, "canceled by the client");
            return;
        }
}

static void on_tokenize(rconn_t *rc, const Tandem__TokenizeRequest *q)
{
    td_router_t *rt = rc->rt;
    Tandem__TokenizeResponse resp = TANDEM__TOKENIZE_RESPONSE__INIT;
    resp.request_id = q->request_id;
    td_tokens_t t;
    td_tokens_init(&t);
    td_buf_t text;
    td_buf_init(&text);
    int err;
    if (q->n_ids) {
        err = td_tokenizer_decode(rt->tok, q->ids, q->n_ids, false, &text);
        resp.text.data = (uint8_t *)text.data;
        resp.text.len = text.len;
    } else {
        err = td_tokenizer_encode(rt->tok, q->text ? q->text : "", q->text ? strlen(q->text) : 0,
                                  q->add_special_tokens, &t);
        resp.n_ids = t.len;
        resp.ids = t.ids;
    }
    if (err) {
        td_msg_send_error(rc->conn, q->request_id, err, td_err_msg());
    } else {
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_TOKENIZE_RESPONSE;
        f.tokenize_response = &resp;
        td_rpc_send(rc->conn, &f);
    }
    td_tokens_free(&t);
    td_buf_free(&text);
}

static void on_status(rconn_t *rc, const Tandem__StatusRequest *q)
{
    td_router_t *rt = rc->rt;
    if (q->drain_worker && *q->drain_worker) {
        int err = td_registry_drain(rt, q->drain_worker, !q->undrain);
        if (err) {
            td_msg_send_error(rc->conn, q->request_id, err, td_err_msg());
            return;
        }
    }
    td_status_t st;
    int err = td_status_build(rt, q->with_requests, &st);
    if (err) {
        td_msg_send_error(rc->conn, q->request_id, err, td_err_msg());
    } else {
        st.resp.request_id = q->request_id;
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_STATUS_RESPONSE;
        f.status_response = &st.resp;
        td_rpc_send(rc->conn, &f);
    }
    td_status_free(&st);
}

/* ---- connections --------------------------------------------------------------------------- */

static void c_ready(td_rpc_conn_t *c, void *ud)
{
    rconn_t *rc = td_calloc(1, sizeof(*rc));
    if (!rc) {
        td_rpc_conn_close(c, TD_ENOMEM, "out of memory");
        return;
    }
    rc->rt = ud;
    rc->conn = c;
    td_rpc_conn_set_data(c, rc);
}

static void c_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    rconn_t *rc = td_rpc_conn_get_data(c);
    if (!rc)
        return;
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_GENERATE:
        if (rc->rt->stopping) {
            td_msg_send_error(c, f->generate->request_id, TD_EBUSY, "the router is shutting down");
            break;
        }
        on_generate(rc, f->generate);
        break;
    case TANDEM__FRAME__BODY_CANCEL:
        on_cancel(rc, f->cancel);
        break;
    case TANDEM__FRAME__BODY_TOKENIZE:
        on_tokenize(rc, f->tokenize);
        break;
    case TANDEM__FRAME__BODY_STATUS:
        on_status(rc, f->status);
        break;
    default: {
        char msg[128];
        snprintf(msg, sizeof(msg), "unexpected frame (%d) on the client RPC", (int)f->body_case);
        td_msg_send_error(c, 0, TD_EPROTO, msg);
        break;
    }
    }
}

static void c_close(td_rpc_conn_t *c, int status, void *ud)
{
    rconn_t *rc = td_rpc_conn_get_data(c);
    if (!rc)
        return;
    td_rpc_conn_set_data(c, NULL);
    /* the client is gone: cancel its generations; their fail events find no connection */
    while (rc->jobs) {
        rjob_t *r = rc->jobs;
        rjob_unlink(r);
        td_job_abort(r->job, 499, "the client disconnected");
    }
    free(rc);
}

int td_rpc_api_start(td_router_t *rt)
{
    td_rpc_opts_t o = {0};
    o.secret = rt->secret;
    o.secret_len = rt->secret_len;
    o.cb.on_ready = c_ready;
    o.cb.on_frame = c_frame;
    o.cb.on_close = c_close;
    o.ud = rt;
    return td_rpc_server_start(rt->loop, rt->cfg.rpc_listen, &o, &rt->rpc);
}
