/* http.c: the HTTP/1.1 server on libuv (td_http.h): connections, writing, inline and streamed
 * responses, OpenAI-style error bodies, the listener. Requests (heads, bodies, the accessors, the
 * route) are http_parse.c's.
 *
 * A connection is read all the time, also while its request is being handled: bytes of a
 * pipelined request wait in its buffer, and a client that closes or resets is seen at once (its
 * stream is cancelled, a watched request's owner told). Reading is never stopped and restarted per
 * request, so a keep-alive request costs one read and one write system call and no epoll_ctl.
 *
 * Per connection, one request at a time:
 *   HEAD     waiting for a request head (REQ_TIMEOUT_MS from the end of the previous response)
 *   BODY     a Content-Length body arriving
 *   CHUNKED  a chunked body arriving, decoded in place behind the head
 *   HANDLING the request is with its handler: not answered yet, or streaming
 *   LINGER   the last response written, the write side shut down; what the client still sends
 *            is read and dropped until it closes (or LINGER_MS), so the response is not lost to
 *            a reset caused by unread bytes
 * Output gathered in one loop iteration leaves in one write: inline answers at the end of the
 * read callback, everything else from one idle handle per server at the next iteration. */
#include "http_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <json-c/json.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "td_rpc.h" /* td_rpc_addr_parse */

typedef struct write_req {
    uv_write_t req;
    conn_t *c;
    size_t len;
    char data[];
} write_req_t;

static void conn_close(conn_t *c);
static void conn_finish(conn_t *c);
static void conn_defer(conn_t *c);
static void on_flush(uv_idle_t *h);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void server_maybe_free(td_http_server_t *s);

static const char *reason_phrase(int status)
{
    switch (status) {
    case 100: return "Continue";
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
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
    }
}

/* The Date header's value (RFC 9110 IMF-fixdate), formatted once a second. */
static const char *http_date(td_http_server_t *s)
{
    static const char wd[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char mo[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != s->date_at) {
        struct tm tm;
        gmtime_r(&now, &tm);
        snprintf(s->date, sizeof(s->date), "%s, %02d %s %04d %02d:%02d:%02d GMT", wd[tm.tm_wday],
                 tm.tm_mday, mo[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        s->date_at = now;
    }
    return s->date;
}

/* ---- connection lifetime ------------------------------------------------------------------ */

/* Freed once its handles are closed, its request answered (its stream ended) and no callback
 * holds it. */
static void conn_maybe_free(conn_t *c)
{
    if (c->open || c->hold || c->dirty || c->state == C_HANDLING)
        return;
    td_http_server_t *s = c->s;
    td_buf_free(&c->in);
    td_buf_free(&c->out);
    td_buf_free(&c->req.raw);
    td_buf_free(&c->req.hdrs);
    td_buf_free(&c->st.pending);
    free(c);
    s->n_conns--;
    server_maybe_free(s);
}

static void on_handle_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    c->open--;
    conn_maybe_free(c);
}

/* Close at once (queued writes are dropped). */
static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = true;
    td_http_server_t *s = c->s;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

void td__http_timer_arm(conn_t *c, uint64_t ms)
{
    if (!c->closing)
        uv_timer_start(&c->timer, on_timeout, ms, 0);
}

/* The client went (EOF or an error): its stream is cancelled, a watched request's owner told. */
static void peer_gone(conn_t *c)
{
    c->peer_eof = true;
    if (c->state != C_HANDLING) {
        if (c->state == C_LINGER && !c->shut_done)
            return; /* the shutdown's callback closes */
        conn_close(c);
        return;
    }
    conn_close(c);
    c->hold++;
    td_http_stream_t *st = &c->st;
    if (st->active) {
        if (!st->canceled) {
            st->canceled = true;
            if (!st->ended && st->on_cancel)
                st->on_cancel(st, st->ud);
        }
    } else if (!c->req.answered && c->req.on_gone) {
        void (*cb)(void *) = c->req.on_gone;
        c->req.on_gone = NULL;
        cb(c->req.gone_ud);
    }
    c->hold--;
    conn_maybe_free(c);
}

/* ---- writing ------------------------------------------------------------------------------ */

static void on_write(uv_write_t *w, int status)
{
    write_req_t *wr = (write_req_t *)w;
    conn_t *c = wr->c;
    c->wq -= wr->len;
    free(wr);
    if (status < 0 && status != UV_ECANCELED && !c->closing)
        peer_gone(c);
}

/* Write iov[0..n): what the kernel takes at once, the rest through one uv_write owning a copy.
 * Bytes keep their order: uv_try_write refuses while an earlier uv_write is queued. */
static void conn_write(conn_t *c, uv_buf_t *iov, unsigned n)
{
    if (c->closing)
        return;
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += iov[i].len;
    if (!total)
        return;
    int w = uv_try_write((uv_stream_t *)&c->tcp, iov, n);
    if (w < 0 && w != UV_EAGAIN) {
        peer_gone(c);
        return;
    }
    size_t done = w > 0 ? (size_t)w : 0;
    if (done == total)
        return;
    write_req_t *wr = malloc(sizeof(*wr) + (total - done));
    if (!wr) {
        TD_LOG_W("http: out of memory for a write of %zu bytes: closing", total - done);
        peer_gone(c);
        return;
    }
    size_t at = 0, skip = done;
    for (unsigned i = 0; i < n; i++) {
        size_t l = iov[i].len;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        memcpy(wr->data + at, iov[i].base + skip, l - skip);
        at += l - skip;
        skip = 0;
    }
    wr->c = c;
    wr->len = at;
    uv_buf_t b = uv_buf_init(wr->data, (unsigned)at);
    if (uv_write(&wr->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
        free(wr);
        peer_gone(c);
        return;
    }
    c->wq += at;
}

void td__http_buf_trim(td_buf_t *b)
{
    td_buf_reset(b);
    if (b->cap > KEEP_CAP)
        td_buf_free(b);
}

static void response_done(conn_t *c);

/* Write what is queued: `out`, then the stream's pending bytes in one chunk, then its end. */
static void conn_flush(conn_t *c)
{
    td_http_stream_t *st = &c->st;
    bool body = st->active && st->pending.len && !st->canceled;
    bool end = st->active && st->ended;
    char tail[16];
    size_t tl = 0;
    if (body && st->chunked) {
        char hex[24];
        int hl = snprintf(hex, sizeof(hex), "%zx\r\n", st->pending.len);
        td_buf_append(&c->out, hex, (size_t)hl);
        memcpy(tail, "\r\n", 2);
        tl = 2;
    }
    if (end && st->chunked && !st->canceled) {
        memcpy(tail + tl, "0\r\n\r\n", 5);
        tl += 5;
    }
    uv_buf_t iov[3];
    unsigned n = 0;
    if (c->out.len)
        iov[n++] = uv_buf_init(c->out.data, (unsigned)c->out.len);
    if (body)
        iov[n++] = uv_buf_init(st->pending.data, (unsigned)st->pending.len);
    if (tl)
        iov[n++] = uv_buf_init(tail, (unsigned)tl);
    c->hold++;
    conn_write(c, iov, n);
    c->hold--;
    td__http_buf_trim(&c->out);
    if (body)
        td__http_buf_trim(&st->pending);
    if (end) {
        st->active = false;
        response_done(c);
    }
}

/* Flush c (and parse what it buffered, if asked) at the next idle pass. */
static void conn_defer(conn_t *c)
{
    if (c->dirty || (c->closing && !c->req.gone_due))
        return;
    c->dirty = true;
    c->dirty_next = c->s->dirty;
    c->s->dirty = c;
    if (!uv_is_active((uv_handle_t *)&c->s->flush))
        uv_idle_start(&c->s->flush, on_flush);
}

static void flush_all(td_http_server_t *s)
{
    uv_idle_stop(&s->flush);
    while (s->dirty) {
        conn_t *c = s->dirty;
        s->dirty = c->dirty_next;
        c->dirty = false;
        c->hold++;
        if (c->req.gone_due) {
            c->req.gone_due = false;
            if (c->state == C_HANDLING && !c->req.answered && c->req.on_gone) {
                void (*cb)(void *) = c->req.on_gone;
                c->req.on_gone = NULL;
                cb(c->req.gone_ud);
            }
        }
        if (!c->closing)
            conn_flush(c);
        if (c->resume && !c->closing) {
            c->resume = false;
            c->parsing = true;
            td__http_process(c);
            c->parsing = false;
            conn_flush(c);
        }
        c->hold--;
        conn_maybe_free(c);
    }
}

static void on_flush(uv_idle_t *h)
{
    flush_all(h->data);
}

/* ---- responses ---------------------------------------------------------------------------- */

static void head_write(conn_t *c, int status, const char *content_type, size_t length,
                       bool chunked)
{
    td_http_req_t *r = &c->req;
    td_buf_t *o = &c->out;
    td_buf_append(o, "HTTP/1.1 ", 9); /* appends, not printf: once per response */
    td_buf_append_i64(o, status);
    td_buf_append_char(o, ' ');
    td_buf_append_str(o, reason_phrase(status));
    td_buf_append_str(o, "\r\ndate: ");
    td_buf_append_str(o, http_date(c->s));
    td_buf_append_str(o, "\r\nserver: ");
    td_buf_append_str(o, c->s->server_name);
    td_buf_append(o, "\r\n", 2);
    if (content_type) {
        td_buf_append_str(o, "content-type: ");
        td_buf_append_str(o, content_type);
        td_buf_append(o, "\r\n", 2);
    }
    if (r->hdrs.len)
        td_buf_append(o, r->hdrs.data, r->hdrs.len);
    if (chunked) {
        td_buf_append_str(o, "transfer-encoding: chunked\r\n");
    } else if (length != SIZE_MAX) {
        td_buf_append_str(o, "content-length: ");
        td_buf_append_i64(o, (int64_t)length);
        td_buf_append(o, "\r\n", 2);
    }
    if (c->s->closing)
        c->keep_alive = false;
    if (!c->keep_alive)
        td_buf_append_str(o, "connection: close\r\n");
    else if (r->http10)
        td_buf_append_str(o, "connection: keep-alive\r\n");
    td_buf_append(o, "\r\n", 2);
    td_buf_reset(&r->hdrs);
}

/* The response is complete (written or queued): next request, or the close. */
static void response_done(conn_t *c)
{
    c->state = C_HEAD;
    c->req.on_gone = NULL;
    c->req.gone_due = false;
    if (c->closing) {
        conn_maybe_free(c);
        return;
    }
    if (!c->keep_alive || c->peer_eof) {
        conn_finish(c);
        return;
    }
    td__http_timer_arm(c, REQ_TIMEOUT_MS);
    if (!c->reading && uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = true; /* paused while a pipelined backlog filled `in` */
    if (c->in.len && !c->parsing) { /* a pipelined request: parsed at the next idle pass */
        c->resume = true;
        conn_defer(c);
    }
}

void td_http_add_header(td_http_req_t *r, const char *name, const char *value)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        td_buf_append_char(&r->hdrs, ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch);
    }
    td_buf_append(&r->hdrs, ": ", 2);
    td_buf_append_str(&r->hdrs, value);
    td_buf_append(&r->hdrs, "\r\n", 2);
}

void td_http_respond(td_http_req_t *r, int status, const char *content_type, const char *body,
                     size_t len)
{
    conn_t *c = r->c;
    r->answered = true;
    r->on_gone = NULL;
    if (!c->closing) {
        head_write(c, status, content_type, len, false);
        if (!r->head_only)
            td_buf_append(&c->out, body, len);
        if (!c->parsing) /* while parsing, the read callback writes when it is done */
            conn_defer(c);
    }
    response_done(c);
}

static void respond_error_v(td_http_req_t *r, int status, const char *type, const char *param,
                            const char *code, const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
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

void td_http_respond_error(td_http_req_t *r, int status, const char *type, const char *param,
                           const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    respond_error_v(r, status, type, param, code, fmt, ap);
    va_end(ap);
}

/* The same OpenAI-style body as td_http_respond_error; response_done sees keep_alive off and
 * closes. */
void td__http_error_close(conn_t *c, int status, const char *code, const char *fmt, ...)
{
    td_http_req_t *r = &c->req;
    c->keep_alive = false;
    r->http10 = r->head_only = false; /* a head that did not parse set neither */
    td_buf_reset(&r->hdrs);
    va_list ap;
    va_start(ap, fmt);
    respond_error_v(r, status, NULL, NULL, code, fmt, ap);
    va_end(ap);
}

int td_http_req_watch(td_http_req_t *r, void (*on_gone)(void *ud), void *ud)
{
    r->on_gone = on_gone;
    r->gone_ud = ud;
    if (r->c->peer_eof) { /* told from the loop, not from inside the caller */
        r->gone_due = true;
        conn_defer(r->c);
    }
    return 0;
}

/* ---- streams ------------------------------------------------------------------------------ */

td_http_stream_t *td_http_stream_start(td_http_req_t *r, int status, const char *content_type,
                                       void (*on_cancel)(td_http_stream_t *st, void *ud),
                                       void *ud)
{
    conn_t *c = r->c;
    td_http_stream_t *st = &c->st;
    r->answered = true;
    r->on_gone = NULL;
    st->c = c;
    st->active = true;
    st->ended = false;
    st->canceled = c->closing;
    st->chunked = !r->http10;
    st->on_cancel = on_cancel;
    st->ud = ud;
    td_buf_reset(&st->pending);
    if (!st->chunked)
        c->keep_alive = false; /* HTTP/1.0: the close ends the body */
    if (!c->closing) {
        td_http_add_header(r, "cache-control", "no-cache");
        head_write(c, status, content_type, SIZE_MAX, st->chunked && !r->head_only);
        if (!c->parsing)
            conn_defer(c);
    }
    if (r->head_only)
        st->canceled = true; /* nothing after the head */
    return st;
}

int td_http_stream_write(td_http_stream_t *st, const void *data, size_t len)
{
    if (st->canceled || !st->active)
        return TD_ECANCELED;
    int rc = td_buf_append(&st->pending, data, len);
    if (rc)
        return rc;
    conn_defer(st->c);
    return 0;
}

int td_http_stream_write_buf(td_http_stream_t *st, td_buf_t *b)
{
    if (st->canceled || !st->active)
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
    conn_defer(st->c);
    return 0;
}

size_t td_http_stream_pending(const td_http_stream_t *st)
{
    return st->pending.len + st->c->wq;
}

void td_http_stream_end(td_http_stream_t *st)
{
    conn_t *c = st->c;
    st->ended = true;
    if (c->closing) { /* nothing goes out: released now */
        st->active = false;
        response_done(c);
        return;
    }
    conn_defer(c);
}

/* Reads land in the server's buffer and are copied into the connection's `in`, which then holds
 * only what is pending (an idle keep-alive connection holds a request's worth, not a read's). */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    *buf = uv_buf_init(c->s->rbuf, READ_BUF);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0) {
        uv_read_stop(stream);
        c->reading = false;
        if (c->state == C_LINGER) {
            c->peer_eof = true;
            if (c->shut_done)
                conn_close(c);
        } else if (nread == UV_EOF && c->state != C_HANDLING) {
            c->peer_eof = true; /* a half close between requests: what is queued still goes */
            conn_finish(c);
        } else {
            peer_gone(c);
        }
        return;
    }
    if (nread == 0 || c->state == C_LINGER) /* LINGER: read to be dropped */
        return;
    if (td_buf_append(&c->in, buf->base, (size_t)nread) != 0) {
        TD_LOG_W("http: out of memory for %zd bytes read: closing", nread);
        peer_gone(c);
        return;
    }
    if (c->state == C_HANDLING) {
        /* bytes of a pipelined request wait; past a whole request's worth, reading pauses */
        if (c->in.len > HEAD_MAX + c->s->max_body) {
            uv_read_stop(stream);
            c->reading = false;
        }
        return;
    }
    if (c->state == C_BODY || c->state == C_CHUNKED)
        td__http_timer_arm(c, REQ_TIMEOUT_MS);
    c->hold++;
    c->parsing = true;
    td__http_process(c);
    c->parsing = false;
    if (!c->closing && (c->out.len || c->st.pending.len))
        conn_flush(c);
    c->hold--;
    conn_maybe_free(c);
}

static void on_linger_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    conn_t *c = req->data;
    c->shut_done = true;
    if (status < 0 || c->peer_eof)
        conn_close(c);
}

/* The last response: write what is queued, shut the write side down, drop what the client still
 * sends until it closes. */
static void conn_finish(conn_t *c)
{
    if (c->closing || c->state == C_LINGER)
        return;
    c->state = C_LINGER;
    c->hold++;
    conn_flush(c);
    c->hold--;
    if (c->closing)
        return;
    td_buf_reset(&c->in);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_linger_timeout, LINGER_MS, 0);
    if (!c->reading && !c->peer_eof &&
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = true;
}

/* ---- server ------------------------------------------------------------------------------- */

static void on_accept(uv_stream_t *listener, int status)
{
    td_http_server_t *s = listener->data;
    if (status != 0 || s->closing)
        return;
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->s = s;
    c->req.c = c;
    c->st.c = c;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open = 2;
    c->next = s->conns;
    if (c->next)
        c->next->prev = c;
    s->conns = c;
    s->n_conns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    td__http_timer_arm(c, REQ_TIMEOUT_MS);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    c->reading = true;
}

td_http_server_t *td_http_server_new(uv_loop_t *loop, const td_http_opts_t *opts)
{
    td_http_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->loop = loop;
    s->max_body = opts && opts->max_body ? opts->max_body : 16u << 20;
    s->server_name = td_strdup(opts && opts->server_name ? opts->server_name : "tandem");
    if (!s->server_name) {
        free(s);
        return NULL;
    }
    if (!(s->rbuf = malloc(READ_BUF))) {
        free(s->server_name);
        free(s);
        return NULL;
    }
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

static void on_flush_closed(uv_handle_t *h)
{
    td_http_server_t *s = h->data;
    for (route_t *r = s->routes, *n; r; r = n) {
        n = r->next;
        free(r->path);
        free(r);
    }
    free(s->server_name);
    free(s->rbuf);
    free(s);
}

static void server_maybe_free(td_http_server_t *s)
{
    if (!s->closing || s->n_conns || s->listening || s->flush_closed)
        return;
    s->flush_closed = true;
    uv_close((uv_handle_t *)&s->flush, on_flush_closed);
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
    /* connections between requests close now; one handling a request closes after its answer */
    for (conn_t *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (c->state == C_HANDLING)
            c->keep_alive = false;
        else
            conn_close(c);
    }
    if (s->listening)
        uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    else
        server_maybe_free(s);
}
