/* client.c: the internal RPC client (td_client.h). */
#include "td_client.h"
#include "td_error.h"
#include "td_rpc.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct cl_req {
    struct cl_req *next;
    uint64_t id;
    td_client_chunk_fn fn;
    void *ud;
    bool done;
    int status;
    char *msg;
} cl_req_t;

struct td_client {
    uv_loop_t loop;
    td_rpc_client_t *rpc;
    td_rpc_conn_t *conn;
    bool ready, closed;
    int close_status;
    char close_msg[256];
    cl_req_t *reqs;
    uint64_t next_id;
    /* the one outstanding unary call (tokenize / status) */
    uint64_t unary_id;
    ProtobufCMessage *unary_out;
    int unary_status;
    char *unary_msg;
    uv_timer_t timer;
    bool timed_out;
};

static cl_req_t *find(td_client_t *c, uint64_t id)
{
    for (cl_req_t *r = c->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

static void finish(cl_req_t *r, int status, const char *msg)
{
    if (r->done)
        return;
    r->done = true;
    r->status = status;
    free(r->msg);
    r->msg = td_strdup(msg ? msg : "");
}

static void send_cancel(td_client_t *c, uint64_t id)
{
    if (!c->conn)
        return;
    Tandem__Cancel k = TANDEM__CANCEL__INIT;
    k.request_id = id;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_CANCEL;
    f.cancel = &k;
    td_rpc_send(c->conn, &f);
}

/* Copy a sub-message out of a frame that is freed after the callback. */
static ProtobufCMessage *copy_msg(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return NULL;
    protobuf_c_message_pack(m, b);
    ProtobufCMessage *out = protobuf_c_message_unpack(m->descriptor, NULL, n, b);
    free(b);
    return out;
}

static void on_frame(td_rpc_conn_t *conn, const Tandem__Frame *f, void *ud)
{
    td_client_t *c = ud;
    (void)conn;
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_TOKEN_CHUNK: {
        cl_req_t *r = find(c, f->token_chunk->request_id);
        if (!r || r->done)
            return;
        if (r->fn && r->fn(f->token_chunk, r->ud)) {
            send_cancel(c, r->id);
            finish(r, TD_ECANCELED, "canceled by the caller");
            return;
        }
        if (f->token_chunk->finish == TANDEM__FINISH__FINISH_ABORT)
            finish(r, TD_ECANCELED,
                   f->token_chunk->error && *f->token_chunk->error ? f->token_chunk->error
                                                                     : "aborted");
        else if (f->token_chunk->finish != TANDEM__FINISH__FINISH_NONE)
            finish(r, 0, NULL);
        return;
    }
    case TANDEM__FRAME__BODY_ERROR: {
        int code = f->error->code < 0 ? f->error->code : TD_EPROTO;
        if (c->unary_id && f->error->request_id == c->unary_id) {
            c->unary_status = code;
            free(c->unary_msg);
            c->unary_msg = td_strdup(f->error->message);
            c->unary_id = 0;
            return;
        }
        cl_req_t *r = find(c, f->error->request_id);
        if (r)
            finish(r, code, f->error->message);
        return;
    }
    case TANDEM__FRAME__BODY_TOKENIZE_RESPONSE:
        if (c->unary_id && f->tokenize_response->request_id == c->unary_id) {
            c->unary_out = copy_msg(&f->tokenize_response->base);
            c->unary_status = c->unary_out ? 0 : TD_ENOMEM;
            c->unary_id = 0;
        }
        return;
    case TANDEM__FRAME__BODY_STATUS_RESPONSE:
        if (c->unary_id && f->status_response->request_id == c->unary_id) {
            c->unary_out = copy_msg(&f->status_response->base);
            c->unary_status = c->unary_out ? 0 : TD_ENOMEM;
            c->unary_id = 0;
        }
        return;
    default:
        return;
    }
}

static void on_ready(td_rpc_conn_t *conn, void *ud)
{
    td_client_t *c = ud;
    c->conn = conn;
    c->ready = true;
}

static void on_close(td_rpc_conn_t *conn, int status, void *ud)
{
    td_client_t *c = ud;
    c->conn = NULL;
    c->closed = true;
    c->close_status = status ? status : TD_ECLOSED;
    snprintf(c->close_msg, sizeof(c->close_msg), "connection to the router closed%s%s",
             *td_rpc_conn_reason(conn) ? ": " : "", td_rpc_conn_reason(conn));
    for (cl_req_t *r = c->reqs; r; r = r->next)
        finish(r, c->close_status, c->close_msg);
    if (c->unary_id) {
        c->unary_status = c->close_status;
        c->unary_id = 0;
    }
}

static void on_timer(uv_timer_t *t)
{
    td_client_t *c = t->data;
    c->timed_out = true;
}

/* Run the loop until `pred` holds or timeout_s passes. 0 or TD_ETIMEDOUT. */
static int run_until(td_client_t *c, bool (*pred)(td_client_t *), double timeout_s)
{
    c->timed_out = false;
    uv_timer_start(&c->timer, on_timer, (uint64_t)(timeout_s * 1000) + 1, 0);
    while (!pred(c) && !c->timed_out)
        uv_run(&c->loop, UV_RUN_ONCE);
    uv_timer_stop(&c->timer);
    return pred(c) ? 0 : TD_ETIMEDOUT;
}

static bool is_ready(td_client_t *c)
{
    return c->ready || c->closed;
}

int td_client_open(const char *addr, const uint8_t *secret, size_t secret_len, const char *id,
                   double timeout_s, td_client_t **out)
{
    *out = NULL;
    td_client_t *c = td_calloc(1, sizeof(*c));
    if (!c)
        return td_err_set(TD_ENOMEM, "out of memory");
    uv_loop_init(&c->loop);
    uv_timer_init(&c->loop, &c->timer);
    c->timer.data = c;
    td_rpc_opts_t o = {.secret = secret,
                       .secret_len = secret_len,
                       .id = id ? id : "client",
                       .handshake_ms = (uint64_t)(timeout_s * 1000),
                       .cb = {.on_ready = on_ready, .on_frame = on_frame, .on_close = on_close},
                       .ud = c};
    int rc = td_rpc_client_start(&c->loop, addr, &o, false, &c->rpc);
    if (rc) {
        td_client_close(c);
        return rc;
    }
    rc = run_until(c, is_ready, timeout_s);
    if (!rc && !c->ready)
        rc = td_err_set(c->close_status, "%s: %s", addr, c->close_msg);
    else if (rc)
        rc = td_err_set(TD_ETIMEDOUT, "%s: no answer within %.1f s", addr, timeout_s);
    if (rc) {
        int keep = rc;
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        td_client_close(c);
        return td_err_set(keep, "%s", msg);
    }
    *out = c;
    return 0;
}

void td_client_close(td_client_t *c)
{
    if (!c)
        return;
    if (c->rpc)
        td_rpc_client_stop(c->rpc);
    uv_close((uv_handle_t *)&c->timer, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    while (c->reqs) {
        cl_req_t *r = c->reqs;
        c->reqs = r->next;
        free(r->msg);
        free(r);
    }
    if (c->unary_out)
        protobuf_c_message_free_unpacked(c->unary_out, NULL);
    free(c->unary_msg);
    free(c);
}

int td_client_generate_start(td_client_t *c, Tandem__GenerateRequest *req, td_client_chunk_fn fn,
                             void *ud)
{
    if (!c->conn)
        return td_err_set(TD_ECLOSED, "%s", c->closed ? c->close_msg : "not connected");
    if (req->request_id == 0)
        req->request_id = ++c->next_id;
    if (find(c, req->request_id))
        return td_err_set(TD_EEXIST, "request id %llu is in use",
                          (unsigned long long)req->request_id);
    cl_req_t *r = td_calloc(1, sizeof(*r));
    if (!r)
        return td_err_set(TD_ENOMEM, "out of memory");
    r->id = req->request_id;
    r->fn = fn;
    r->ud = ud;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_GENERATE;
    f.generate = req;
    int rc = td_rpc_send(c->conn, &f);
    if (rc) {
        free(r);
        return rc;
    }
    r->next = c->reqs;
    c->reqs = r;
    return 0;
}

static bool all_done(td_client_t *c)
{
    for (cl_req_t *r = c->reqs; r; r = r->next)
        if (!r->done)
            return false;
    return true;
}

int td_client_wait(td_client_t *c, double timeout_s)
{
    if (run_until(c, all_done, timeout_s) != 0)
        for (cl_req_t *r = c->reqs; r; r = r->next)
            if (!r->done) {
                send_cancel(c, r->id);
                finish(r, TD_ETIMEDOUT, "no answer in time");
            }
    for (cl_req_t *r = c->reqs; r; r = r->next)
        if (r->status)
            return td_err_set(r->status, "request %llu: %s", (unsigned long long)r->id, r->msg);
    return 0;
}

int td_client_result(td_client_t *c, uint64_t request_id, const char **msg)
{
    cl_req_t *r = find(c, request_id);
    if (!r)
        return TD_ENOENT;
    if (msg)
        *msg = r->msg ? r->msg : "";
    return r->done ? r->status : TD_EAGAIN;
}

int td_client_generate(td_client_t *c, Tandem__GenerateRequest *req, td_client_chunk_fn fn,
                       void *ud, double timeout_s)
{
    int rc = td_client_generate_start(c, req, fn, ud);
    if (rc)
        return rc;
    /* drop finished requests of earlier calls so the result is this one's */
    cl_req_t **pp = &c->reqs;
    while (*pp) {
        cl_req_t *r = *pp;
        if (r->done && r->id != req->request_id) {
            *pp = r->next;
            free(r->msg);
            free(r);
        } else {
            pp = &r->next;
        }
    }
    return td_client_wait(c, timeout_s);
}

static bool unary_done(td_client_t *c)
{
    return c->unary_id == 0;
}

/* Send one request frame and wait for its answer (a copy in c->unary_out). */
static int unary(td_client_t *c, Tandem__Frame *f, uint64_t id, double timeout_s,
                 ProtobufCMessage **out)
{
    *out = NULL;
    if (!c->conn)
        return td_err_set(TD_ECLOSED, "%s", c->closed ? c->close_msg : "not connected");
    c->unary_id = id;
    c->unary_status = 0;
    int rc = td_rpc_send(c->conn, f);
    if (rc) {
        c->unary_id = 0;
        return rc;
    }
    if (run_until(c, unary_done, timeout_s) != 0) {
        c->unary_id = 0;
        return td_err_set(TD_ETIMEDOUT, "no answer within %.1f s", timeout_s);
    }
    if (c->unary_status)
        return td_err_set(c->unary_status, "%s",
                          c->unary_msg ? c->unary_msg : td_strerror(c->unary_status));
    *out = c->unary_out;
    c->unary_out = NULL;
    return 0;
}

int td_client_tokenize(td_client_t *c, const char *text, bool add_special, const int32_t *ids,
                       size_t n_ids, double timeout_s, Tandem__TokenizeResponse **out)
{
    Tandem__TokenizeRequest t = TANDEM__TOKENIZE_REQUEST__INIT;
    t.request_id = ++c->next_id;
    t.text = (char *)(text ? text : "");
    t.add_special_tokens = add_special;
    t.ids = (int32_t *)ids;
    t.n_ids = ids ? n_ids : 0;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_TOKENIZE;
    f.tokenize = &t;
    return unary(c, &f, t.request_id, timeout_s, (ProtobufCMessage **)out);
}

int td_client_status(td_client_t *c, const char *drain_worker, bool undrain, bool with_requests,
                     double timeout_s, Tandem__StatusResponse **out)
{
    Tandem__StatusRequest s = TANDEM__STATUS_REQUEST__INIT;
    s.request_id = ++c->next_id;
    s.drain_worker = (char *)(drain_worker ? drain_worker : "");
    s.undrain = undrain;
    s.with_requests = with_requests;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_STATUS;
    f.status = &s;
    return unary(c, &f, s.request_id, timeout_s, (ProtobufCMessage **)out);
}
