/* http.c: HTTP/1.1 server on libh2o (libuv flavour): exact-path routes, whole bodies, inline and
 * streamed responses, OpenAI-style error bodies. */
#include "td_http.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <ctype.h>
#include <errno.h>
#include <h2o.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "td_rpc.h" /* td_rpc_addr_parse */

typedef struct route {
    char *path;
    size_t path_len;
    td_http_handler_fn fn;
    void *ud;
    struct route *next;
} route_t;

/* The h2o handler registered at "/", which dispatches by exact path. */
typedef struct dispatch {
    h2o_handler_t super; /* must be first: h2o hands this pointer back */
    td_http_server_t *server;
} dispatch_t;

/* h2o's own error answers (413 for a body over the limit, 400 for a broken body framing, 417)
 * are text/plain; this filter turns their body into the OpenAI-style JSON error every other
 * answer has. Registered on every path, including the fallback a request gets when it failed
 * before routing. */
typedef struct errfilter {
    h2o_filter_t super; /* must be first */
} errfilter_t;

typedef struct errstream {
    h2o_ostream_t super; /* must be first */
} errstream_t;

static void json_error(int status, const char *text, size_t len, td_buf_t *out)
{
    const char *code = status == 413 ? "request_too_large" : status == 400 ? "bad_request" : NULL;
    td_buf_append_str(out, "{\"error\":{\"message\":");
    td_buf_append_json_string(out, text, len);
    td_buf_append_str(out, ",\"type\":\"invalid_request_error\",\"param\":null,\"code\":");
    if (code)
        td_buf_printf(out, "\"%s\"}}", code);
    else
        td_buf_append_str(out, "null}}");
}

static void errstream_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t n,
                           h2o_send_state_t state)
{
    if (h2o_send_state_is_in_progress(state)) { /* not h2o's one-piece error: as it is */
        h2o_ostream_send_next(self, req, bufs, n, state);
        return;
    }
    td_buf_t text, out;
    td_buf_init(&text);
    td_buf_init(&out);
    for (size_t i = 0; i < n; i++)
        td_buf_append(&text, bufs[i].base, bufs[i].len);
    if (req->res.status == 413)
        td_buf_printf(&text, " (the limit is %zu bytes)",
                      req->conn->ctx->globalconf->max_request_entity_size);
    json_error(req->res.status, text.data ? text.data : "", text.len, &out);
    h2o_iovec_t body = {NULL, 0};
    if (out.data) {
        body = h2o_strdup(&req->pool, out.data, out.len);
        req->res.content_length = body.len;
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE,
                       H2O_STRLIT("application/json"), 1);
        h2o_ostream_send_next(self, req, &body, 1, state);
    } else {
        h2o_ostream_send_next(self, req, bufs, n, state);
    }
    td_buf_free(&text);
    td_buf_free(&out);
}

static void errfilter_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    ssize_t at = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (req->res.status >= 400 && at >= 0 &&
        h2o_memis(req->res.headers.entries[at].value.base, req->res.headers.entries[at].value.len,
                  H2O_STRLIT("text/plain; charset=utf-8"))) {
        errstream_t *es = (errstream_t *)h2o_add_ostream(req, sizeof(*es), slot);
        es->super.do_send = errstream_send;
        slot = &es->super.next;
    }
    h2o_setup_next_ostream(req, slot);
}

/* picohttpparser (inside libh2o; libh2o-dev ships no header for it): the request-head parser
 * h2o itself runs, used here to recognise garbage before h2o answers it in plain text. */
struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len,
                      const char **path, size_t *path_len, int *minor_version,
                      struct phr_header *headers, size_t *num_headers, size_t last_len);

#define PEEK_MAX (64u << 10) /* bytes of a first request head read before h2o takes over */
#define PEEK_TIMEOUT_MS 10000 /* h2o's own request-head deadline */

/* An accepted connection's libuv handle, tagged with its server for the close callback. Until
 * its first request head has arrived the server reads it itself (peek): a head that cannot
 * parse gets an OpenAI-style JSON 400 (h2o would answer plain text); one that parses is handed to
 * h2o with the bytes read so far. */
typedef struct conn {
    uv_tcp_t tcp; /* must be first: h2o closes it with our callback */
    td_http_server_t *server;
    uv_timer_t timer; /* the peek's deadline */
    uv_write_t wreq;  /* the JSON 400 */
    char *peek;       /* [n_peek] bytes read while peeking, PEEK_MAX allocated */
    size_t n_peek;
    int open;         /* handles (tcp, timer) not closed yet; freed at 0 */
    bool peeking;
    struct conn *prev, *next; /* the server's peeking connections */
} conn_t;

struct td_http_server {
    uv_loop_t *loop;
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    uv_tcp_t listener;
    uv_timer_t sentinel; /* waits for h2o's timers to drain, closed last, frees the server */
    bool listening;
    bool closing;
    bool disposed;
    size_t n_conns;
    conn_t *peeking; /* connections whose first request head is still being read */
    route_t *routes;
    struct watch *watches; /* unanswered requests whose client is watched (td_http_req_watch),
                            * oldest first: requests are mostly answered in the order they came,
                            * so unwatch finds its entry within the first few */
    struct watch **watch_tail; /* the last entry's next (or &watches) */
    uv_timer_t watch_timer; /* checks them every WATCH_MS while there are any */
    uv_idle_t flush;        /* active while `dirty` holds streams: writes them next iteration */
    struct td_http_stream *dirty; /* streams with bytes (or their end) queued this iteration */
};

/* A request whose client is checked for having gone (td_http_req_watch). */
typedef struct watch {
    struct watch *next;
    h2o_req_t *req;
    void (*on_gone)(void *ud);
    void *ud;
} watch_t;

#define WATCH_MS 200

struct td_http_stream {
    h2o_generator_t gen; /* must be first: h2o hands this pointer back */
    h2o_req_t *req;
    td_buf_t inflight;   /* bytes h2o is writing; valid until proceed */
    td_buf_t pending;    /* bytes queued behind them */
    bool sending;
    bool user_ended;
    bool h2o_done;
    bool canceled;
    bool dirty; /* on the server's `dirty` list */
    struct td_http_stream *dirty_next;
    td_http_server_t *srv;
    void (*on_cancel)(td_http_stream_t *st, void *ud);
    void *ud;
};

static h2o_req_t *H(td_http_req_t *r)
{
    return (h2o_req_t *)r;
}

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
    }
}

/* ---- requests ----------------------------------------------------------------------------- */

const char *td_http_method(const td_http_req_t *r, size_t *len)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    *len = q->method.len;
    return q->method.base;
}

bool td_http_method_is(const td_http_req_t *r, const char *method)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    return q->method.len == strlen(method) && memcmp(q->method.base, method, q->method.len) == 0;
}

const char *td_http_path(const td_http_req_t *r, size_t *len)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    *len = q->path_normalized.len;
    return q->path_normalized.base;
}

const char *td_http_query(const td_http_req_t *r, size_t *len)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    if (q->query_at == SIZE_MAX) {
        *len = 0;
        return NULL;
    }
    *len = q->path.len - q->query_at - 1;
    return q->path.base + q->query_at + 1;
}

const char *td_http_body(const td_http_req_t *r, size_t *len)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    *len = q->entity.base ? q->entity.len : 0;
    return q->entity.base ? q->entity.base : "";
}

const char *td_http_header(const td_http_req_t *r, const char *name, size_t *len)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    char lower[128];
    size_t n = strlen(name);
    if (n >= sizeof(lower))
        return NULL;
    for (size_t i = 0; i < n; i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    ssize_t at = h2o_find_header_by_str(&q->headers, lower, n, -1);
    if (at < 0)
        return NULL;
    *len = q->headers.entries[at].value.len;
    return q->headers.entries[at].value.base;
}

void td_http_peer(const td_http_req_t *r, char *out, size_t n)
{
    const h2o_req_t *q = (const h2o_req_t *)r;
    struct sockaddr_storage ss;
    socklen_t sl = q->conn->callbacks->get_peername(q->conn, (struct sockaddr *)&ss);
    char host[64] = "?";
    int port = 0;
    if (sl && ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        uv_ip4_name(sin, host, sizeof(host));
        port = ntohs(sin->sin_port);
    } else if (sl && ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(sin6, host, sizeof(host));
        port = ntohs(sin6->sin6_port);
    }
    snprintf(out, n, "%s:%d", host, port);
}

/* ---- responses ---------------------------------------------------------------------------- */

void td_http_add_header(td_http_req_t *r, const char *name, const char *value)
{
    h2o_req_t *q = H(r);
    size_t n = strlen(name);
    char *lower = h2o_mem_alloc_pool(&q->pool, n);
    for (size_t i = 0; i < n; i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    h2o_iovec_t v = h2o_strdup(&q->pool, value, SIZE_MAX);
    h2o_add_header_by_str(&q->pool, &q->res.headers, lower, n, 1, NULL, v.base, v.len);
}

static void set_status(h2o_req_t *q, int status, const char *content_type)
{
    q->res.status = status;
    q->res.reason = reason_phrase(status);
    if (content_type)
        h2o_add_header(&q->pool, &q->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                       strlen(content_type));
}

/* The server a request came to. */
static td_http_server_t *server_of(h2o_req_t *q)
{
    return (td_http_server_t *)((char *)q->conn->ctx - offsetof(td_http_server_t, ctx));
}

/* The request is answered: its client is no longer watched. */
static void unwatch(h2o_req_t *q)
{
    td_http_server_t *s = server_of(q);
    for (watch_t **pp = &s->watches; *pp; pp = &(*pp)->next)
        if ((*pp)->req == q) {
            watch_t *w = *pp;
            *pp = w->next;
            if (s->watch_tail == &w->next)
                s->watch_tail = pp;
            free(w);
            break;
        }
    if (!s->watches)
        uv_timer_stop(&s->watch_timer);
}

/* Whether the client of q closed its connection: h2o reads nothing while a request is being
 * handled, so the socket is peeked (an orderly close reads as 0 bytes; pipelined bytes or
 * nothing yet mean it is still there). */
static bool client_gone(h2o_req_t *q)
{
    h2o_socket_t *sock = q->conn->callbacks->get_socket ? q->conn->callbacks->get_socket(q->conn)
                                                        : NULL;
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    if (fd < 0)
        return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void on_watch(uv_timer_t *t)
{
    td_http_server_t *s = t->data;
    for (;;) {
        watch_t *gone = NULL;
        for (watch_t *w = s->watches; w && !gone; w = w->next)
            if (client_gone(w->req))
                gone = w;
        if (!gone)
            break;
        void (*cb)(void *) = gone->on_gone;
        void *ud = gone->ud;
        unwatch(gone->req); /* once; the callback may answer the request */
        cb(ud);
    }
}

int td_http_req_watch(td_http_req_t *r, void (*on_gone)(void *ud), void *ud)
{
    h2o_req_t *q = H(r);
    td_http_server_t *s = server_of(q);
    watch_t *w = calloc(1, sizeof(*w));
    if (!w)
        return TD_ENOMEM;
    w->req = q;
    w->on_gone = on_gone;
    w->ud = ud;
    *s->watch_tail = w;
    s->watch_tail = &w->next;
    if (!uv_is_active((uv_handle_t *)&s->watch_timer))
        uv_timer_start(&s->watch_timer, on_watch, WATCH_MS, WATCH_MS);
    return 0;
}

void td_http_respond(td_http_req_t *r, int status, const char *content_type, const char *body,
                     size_t len)
{
    h2o_req_t *q = H(r);
    if (server_of(q)->watches)
        unwatch(q);
    set_status(q, status, content_type);
    q->res.content_length = len;
    h2o_send_inline(q, body, len);
}

void td_http_respond_error(td_http_req_t *r, int status, const char *type, const char *param,
                           const char *code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_object *err = json_object_new_object();
    json_object_object_add(err, "message", json_object_new_string(msg));
    json_object_object_add(err, "type", json_object_new_string(type ? type : "invalid_request_error"));
    json_object_object_add(err, "param", param ? json_object_new_string(param) : NULL);
    json_object_object_add(err, "code", code ? json_object_new_string(code) : NULL);
    json_object *root = json_object_new_object();
    json_object_object_add(root, "error", err);
    size_t len;
    const char *text = json_object_to_json_string_length(root, JSON_C_TO_STRING_PLAIN, &len);
    td_http_respond(r, status, "application/json", text, len);
    json_object_put(root);
}

/* ---- streams ------------------------------------------------------------------------------ */

static void stream_maybe_free(td_http_stream_t *st)
{
    if (st->user_ended && st->h2o_done && !st->dirty) {
        td_buf_free(&st->inflight);
        td_buf_free(&st->pending);
        free(st);
    }
}

/* Hand queued bytes to h2o when it is not busy; finish when the user has ended. */
static void stream_flush(td_http_stream_t *st)
{
    if (st->sending || st->h2o_done)
        return;
    if (st->pending.len == 0 && !st->user_ended)
        return;
    if (st->user_ended) {
        /* final chunk: copied into the request's pool, which outlives our buffers */
        h2o_iovec_t buf = {NULL, 0};
        size_t nbufs = 0;
        if (st->pending.len) {
            buf.base = h2o_mem_alloc_pool(&st->req->pool, st->pending.len);
            memcpy(buf.base, st->pending.data, st->pending.len);
            buf.len = st->pending.len;
            nbufs = 1;
        }
        td_buf_reset(&st->pending);
        st->h2o_done = true;
        h2o_send(st->req, &buf, nbufs, H2O_SEND_STATE_FINAL);
        stream_maybe_free(st);
        return;
    }
    td_buf_t t = st->inflight;
    st->inflight = st->pending;
    st->pending = t;
    td_buf_reset(&st->pending);
    st->sending = true;
    h2o_iovec_t buf = h2o_iovec_init(st->inflight.data, st->inflight.len);
    h2o_send(st->req, &buf, 1, H2O_SEND_STATE_IN_PROGRESS);
}

/* Write every stream that queued bytes (or its end) since the last pass: what one loop iteration
 * queued for a response leaves in one write, as the RPC connections do (rpc.c conn_send). */
static void streams_flush(td_http_server_t *s)
{
    uv_idle_stop(&s->flush);
    while (s->dirty) {
        td_http_stream_t *st = s->dirty;
        s->dirty = st->dirty_next;
        st->dirty = false;
        if (st->h2o_done) /* the client went while it was queued */
            stream_maybe_free(st);
        else
            stream_flush(st); /* frees it after its end */
    }
}

static void on_flush(uv_idle_t *h)
{
    streams_flush(h->data);
}

/* Flush st with the others at the start of the next loop iteration. */
static void stream_defer(td_http_stream_t *st)
{
    if (st->dirty)
        return;
    st->dirty = true;
    st->dirty_next = st->srv->dirty;
    st->srv->dirty = st;
    if (!uv_is_active((uv_handle_t *)&st->srv->flush))
        uv_idle_start(&st->srv->flush, on_flush);
}

static void on_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    td_http_stream_t *st = (td_http_stream_t *)g;
    st->sending = false;
    td_buf_reset(&st->inflight);
    stream_flush(st);
}

static void on_stop(h2o_generator_t *g, h2o_req_t *req)
{
    td_http_stream_t *st = (td_http_stream_t *)g;
    st->h2o_done = true;
    st->canceled = true;
    if (!st->user_ended && st->on_cancel)
        st->on_cancel(st, st->ud);
    stream_maybe_free(st);
}

td_http_stream_t *td_http_stream_start(td_http_req_t *r, int status, const char *content_type,
                                       void (*on_cancel)(td_http_stream_t *st, void *ud),
                                       void *ud)
{
    td_http_stream_t *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    if (server_of(H(r))->watches)
        unwatch(H(r));
    st->gen.proceed = on_proceed;
    st->gen.stop = on_stop;
    st->req = H(r);
    st->srv = server_of(H(r));
    st->on_cancel = on_cancel;
    st->ud = ud;
    td_buf_init(&st->inflight);
    td_buf_init(&st->pending);
    set_status(st->req, status, content_type);
    h2o_add_header(&st->req->pool, &st->req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-cache"));
    h2o_start_response(st->req, &st->gen);
    return st;
}

int td_http_stream_write(td_http_stream_t *st, const void *data, size_t len)
{
    if (st->canceled || st->h2o_done)
        return TD_ECANCELED;
    int rc = td_buf_append(&st->pending, data, len);
    if (rc)
        return rc;
    stream_defer(st);
    return 0;
}

int td_http_stream_write_buf(td_http_stream_t *st, td_buf_t *b)
{
    if (st->canceled || st->h2o_done)
        return TD_ECANCELED;
    if (!b->len)
        return 0;
    if (st->pending.len == 0) { /* take b's bytes, give back the empty storage */
        td_buf_t t = st->pending;
        st->pending = *b;
        *b = t;
    } else {
        int rc = td_buf_append(&st->pending, b->data, b->len);
        if (rc)
            return rc;
        td_buf_reset(b);
    }
    stream_defer(st);
    return 0;
}

size_t td_http_stream_pending(const td_http_stream_t *st)
{
    return st->pending.len + st->inflight.len;
}

void td_http_stream_end(td_http_stream_t *st)
{
    st->user_ended = true;
    if (st->h2o_done)
        stream_maybe_free(st);
    else
        stream_defer(st);
}

/* ---- server ------------------------------------------------------------------------------- */

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    td_http_server_t *s = ((dispatch_t *)self)->server;
    for (route_t *r = s->routes; r; r = r->next) {
        if (req->path_normalized.len == r->path_len &&
            memcmp(req->path_normalized.base, r->path, r->path_len) == 0) {
            r->fn((td_http_req_t *)req, r->ud);
            return 0;
        }
    }
    td_http_respond_error((td_http_req_t *)req, 404, "not_found_error", NULL, "not_found",
                          "no route for %.*s", (int)TD_MIN(req->path_normalized.len, 200),
                          req->path_normalized.base);
    return 0;
}

td_http_server_t *td_http_server_new(uv_loop_t *loop, const td_http_opts_t *opts)
{
    td_http_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->loop = loop;
    h2o_config_init(&s->config);
    s->config.max_request_entity_size = opts && opts->max_body ? opts->max_body : 16u << 20;
    const char *name = opts && opts->server_name ? opts->server_name : "tandem";
    s->config.server_name = h2o_strdup(NULL, name, SIZE_MAX);
    h2o_hostconf_t *host =
        h2o_config_register_host(&s->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    dispatch_t *d = (dispatch_t *)h2o_create_handler(path, sizeof(*d));
    d->super.on_req = on_req;
    d->server = s;
    h2o_pathconf_t *paths[] = {path, &host->fallback_path};
    for (size_t i = 0; i < TD_ARRAY_LEN(paths); i++) {
        errfilter_t *f = (errfilter_t *)h2o_create_filter(paths[i], sizeof(*f));
        f->super.on_setup_ostream = errfilter_setup;
    }
    h2o_context_init(&s->ctx, loop, &s->config);
    s->accept_ctx.ctx = &s->ctx;
    s->accept_ctx.hosts = s->config.hosts;
    uv_timer_init(loop, &s->sentinel);
    s->sentinel.data = s;
    s->watch_tail = &s->watches;
    uv_timer_init(loop, &s->watch_timer);
    s->watch_timer.data = s;
    uv_idle_init(loop, &s->flush);
    s->flush.data = s;
    return s;
}

int td_http_route(td_http_server_t *s, const char *path, td_http_handler_fn fn, void *ud)
{
    route_t *r = calloc(1, sizeof(*r));
    if (!r || !(r->path = td_strdup(path))) {
        free(r);
        return TD_ENOMEM;
    }
    r->path_len = strlen(path);
    r->fn = fn;
    r->ud = ud;
    r->next = s->routes;
    s->routes = r;
    return 0;
}

static void server_maybe_free(td_http_server_t *s);

static void conn_handle_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->open > 0)
        return;
    td_http_server_t *s = c->server;
    free(c->peek);
    free(c);
    s->n_conns--;
    server_maybe_free(s);
}

/* h2o closes the tcp handle with this (its data pointer is h2o's then). */
static void on_conn_closed(uv_handle_t *h)
{
    conn_t *c = (conn_t *)h;
    h->data = c;
    conn_handle_closed(h);
}

static void peek_unlink(conn_t *c)
{
    if (!c->peeking)
        return;
    c->peeking = false;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->server->peeking = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

/* Close a connection h2o never saw. */
static void peek_close(conn_t *c)
{
    peek_unlink(c);
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
}

static void on_peek_timeout(uv_timer_t *t)
{
    peek_close(t->data);
}

static void on_bad_request_sent(uv_write_t *w, int status)
{
    peek_close(w->data);
}

static void bad_request(conn_t *c)
{
    static const char body[] =
        "{\"error\":{\"message\":\"the request is not HTTP/1.x: its request line or headers "
        "do not parse\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":"
        "\"bad_request\"}}";
    uv_read_stop((uv_stream_t *)&c->tcp);
    /* the response replaces the peeked bytes, which are no longer needed */
    int n = snprintf(c->peek, PEEK_MAX,
                     "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
                     sizeof(body) - 1, body);
    uv_buf_t b = uv_buf_init(c->peek, (unsigned)n);
    c->wreq.data = c;
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_bad_request_sent) != 0)
        peek_close(c);
}

static void hand_to_h2o(conn_t *c)
{
    td_http_server_t *s = c->server;
    uv_read_stop((uv_stream_t *)&c->tcp);
    peek_unlink(c);
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_closed);
    if (c->n_peek) {
        h2o_iovec_t room = h2o_buffer_reserve(&sock->input, c->n_peek);
        memcpy(room.base, c->peek, c->n_peek);
        sock->input->size += c->n_peek;
    }
    free(c->peek);
    c->peek = NULL;
    h2o_accept(&s->accept_ctx, sock);
}

static void peek_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    *buf = uv_buf_init(c->peek + c->n_peek, (unsigned)(PEEK_MAX - c->n_peek));
}

static void peek_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = st->data;
    if (nread < 0) {
        peek_close(c);
        return;
    }
    c->n_peek += (size_t)nread;
    if (c->n_peek == 0)
        return;
    static const char h2[] = "PRI * HTTP/2";
    if (c->n_peek >= sizeof(h2) - 1 && memcmp(c->peek, h2, sizeof(h2) - 1) == 0) {
        hand_to_h2o(c); /* h2o answers HTTP/2's preface itself */
        return;
    }
    const char *m, *p;
    size_t ml, pl, nh = 100;
    int minor;
    struct phr_header hdr[100];
    int r = phr_parse_request(c->peek, c->n_peek, &m, &ml, &p, &pl, &minor, hdr, &nh, 0);
    if (r == -1)
        bad_request(c);
    else if (r >= 0 || c->n_peek == PEEK_MAX)
        hand_to_h2o(c);
}

static void on_accept(uv_stream_t *listener, int status)
{
    td_http_server_t *s = listener->data;
    if (status != 0 || s->closing)
        return;
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->server = s;
    uv_tcp_init(s->loop, &c->tcp);
    c->tcp.data = c;
    c->open = 1;
    s->n_conns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0 || !(c->peek = malloc(PEEK_MAX))) {
        uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_timer_init(s->loop, &c->timer);
    c->timer.data = c;
    c->open = 2;
    c->peeking = true;
    c->next = s->peeking;
    if (c->next)
        c->next->prev = c;
    s->peeking = c;
    uv_timer_start(&c->timer, on_peek_timeout, PEEK_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, peek_alloc, peek_read) != 0)
        peek_close(c);
}

int td_http_listen(td_http_server_t *s, const char *addr)
{
    td_rpc_addr_t a;
    int rc = td_rpc_addr_parse(addr, &a);
    if (rc)
        return rc;
    if (a.is_unix)
        return td_err_set(TD_ENOTSUP, "%s: HTTP listens on TCP only", addr);
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    s->listening = true;
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&a.sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_accept);
    if (rc < 0)
        return td_err_set(rc == UV_EADDRINUSE ? TD_EBUSY : TD_EIO, "HTTP listen on %s: %s", addr,
                          uv_strerror(rc));
    return 0;
}

int td_http_port(const td_http_server_t *s)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (!s->listening || uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static void on_sentinel_closed(uv_handle_t *h)
{
    td_http_server_t *s = h->data;
    for (route_t *r = s->routes, *n; r; r = n) {
        n = r->next;
        free(r->path);
        free(r);
    }
    free(s->config.server_name.base); /* ours (h2o_strdup), not freed by h2o_config_dispose */
    h2o_config_dispose(&s->config);
    free(s);
}

static bool h2o_idle(h2o_context_t *c)
{
    h2o_timeout_t *t[] = {&c->zero_timeout,       &c->one_sec_timeout,
                                &c->hundred_ms_timeout, &c->handshake_timeout,
                                &c->http1.req_timeout,  &c->http2.idle_timeout,
                                &c->http2.graceful_shutdown_timeout, &c->proxy.io_timeout};
    for (size_t i = 0; i < TD_ARRAY_LEN(t); i++)
        if (!h2o_linklist_is_empty(&t[i]->_entries))
            return false;
    return true;
}

/* h2o_context_dispose requires every h2o timeout to be idle (graceful shutdown keeps one armed
 * for a while after the last connection closes), so the sentinel polls until they are. */
static void on_sentinel(uv_timer_t *t)
{
    td_http_server_t *s = t->data;
    if (!h2o_idle(&s->ctx))
        return;
    uv_timer_stop(t);
    s->disposed = true;
    streams_flush(s); /* streams whose connection closed with bytes queued: freed here */
    /* libuv runs close callbacks newest first: closing the sentinel before h2o closes its own
     * timers makes the sentinel's callback (which frees the server) run after theirs. */
    uv_close((uv_handle_t *)&s->sentinel, on_sentinel_closed);
    uv_close((uv_handle_t *)&s->flush, NULL); /* its close runs before the sentinel's */
    h2o_context_dispose(&s->ctx);
}

static void server_maybe_free(td_http_server_t *s)
{
    if (!s->closing || s->disposed || s->n_conns || s->listening)
        return;
    if (!uv_is_active((uv_handle_t *)&s->sentinel))
        uv_timer_start(&s->sentinel, on_sentinel, 0, 20);
}

static void on_listener_closed(uv_handle_t *h)
{
    td_http_server_t *s = h->data;
    s->listening = false;
    server_maybe_free(s);
}

void td_http_server_close(td_http_server_t *s)
{
    if (!s || s->closing)
        return;
    s->closing = true;
    while (s->watches) {
        watch_t *w = s->watches;
        s->watches = w->next;
        free(w);
    }
    s->watch_tail = &s->watches;
    uv_close((uv_handle_t *)&s->watch_timer, NULL); /* closes long before the sentinel */
    h2o_context_request_shutdown(&s->ctx);
    while (s->peeking) /* connections that have sent no request yet */
        peek_close(s->peeking);
    if (s->listening)
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    else
        server_maybe_free(s);
}
