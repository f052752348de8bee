/* client.c: the load generator's HTTP/1.1 client on libuv: keep-alive connections opened on
 * demand and reused, one request per connection at a time (no pipelining, as aiohttp does in
 * vLLM's client), chunked or Content-Length bodies, and SSE read as vLLM reads it.
 *
 * Hot path (one read per token chunk): reads land in one loop-wide buffer (every read is consumed
 * inside its callback), lines are parsed in place when they do not straddle reads, chunks are
 * scanned without building JSON trees, and the per-request text and ITL arrays grow by doubling
 * from a size reserved at submit, so a steady stream allocates nothing per token.
 */
#include "client_impl.h"
#include "td_error.h"

#include <errno.h>
#include <linux/net_tstamp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* ---- connection lifetime ---- */

static void conn_free_cb(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->handles > 0)
        return;
    td_bench_client_t *cl = c->cl;
    td_buf_free(&c->wbuf);
    td_buf_free(&c->line);
    td_buf_free(&c->sse);
    td_buf_free(&c->body);
    free(c);
    if (--cl->alive == 0 && cl->closing) {
        td_buf_free(&cl->head);
        free(cl);
    }
}

/* The poll handle is closed: now the socket may be. */
static void poll_closed_cb(uv_handle_t *h)
{
    conn_t *c = h->data;
    close(c->fd);
    c->fd = -1;
    conn_free_cb(h);
}

static void idle_remove(conn_t *c)
{
    for (conn_t **p = &c->cl->idle; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    c->next = NULL;
}

/* Close the connection; it must carry no request. */
void td__bench_conn_close(conn_t *c)
{
    if (c->closing)
        return;
    TD_ASSERT(c->r == NULL);
    c->closing = true;
    td_bench_client_t *cl = c->cl;
    idle_remove(c);
    if (c->all_prev)
        c->all_prev->all_next = c->all_next;
    else
        cl->all = c->all_next;
    if (c->all_next)
        c->all_next->all_prev = c->all_prev;
    cl->nconns--;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, conn_free_cb);
    if (c->has_poll) {
        uv_close((uv_handle_t *)&c->poll, poll_closed_cb);
    } else if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
}

static conn_t *conn_new(td_bench_client_t *cl)
{
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->cl = cl;
    td_buf_init(&c->wbuf);
    td_buf_init(&c->line);
    td_buf_init(&c->sse);
    td_buf_init(&c->body);
    c->fd = -1;
    uv_timer_init(cl->loop, &c->timer);
    c->timer.data = c;
    c->handles = 1;
    c->all_next = cl->all;
    if (cl->all)
        cl->all->all_prev = c;
    cl->all = c;
    cl->nconns++;
    cl->alive++;
    return c;
}

/* The request on `c` is over (r->err says how). Hands the connection back (idle when reusable,
 * else closed) before calling the user's callback, which may submit more work. */
void td__bench_finish(conn_t *c, bool reusable)
{
    td_bench_result_t *r = c->r;
    td_bench_client_t *cl = c->cl;
    c->r = NULL;
    uv_timer_stop(&c->timer);
    cl->inflight--;
    /* a whole response was read (an HTTP error's too): the connection can carry the next one */
    bool whole = r->err == TD_BENCH_OK || r->err == TD_BENCH_ERR_HTTP;
    if (reusable && whole && c->keepalive && !c->writing && !cl->closing) {
        c->next = cl->idle;
        cl->idle = c;
    } else {
        td__bench_conn_close(c);
    }
    cl->cb(r, cl->arg);
}

void td__bench_fail(conn_t *c, td_bench_err_t kind, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    td_bench_result_fail(c->r, kind, "%s", msg);
    td__bench_finish(c, false);
}

static void start_request(conn_t *c);
static int conn_connect(conn_t *c);
static void timeout_cb(uv_timer_t *t);

/* The request's deadline covers connecting too. */
static void arm_timeout(conn_t *c)
{
    if (c->cl->t.timeout_s > 0)
        uv_timer_start(&c->timer, timeout_cb, (uint64_t)(c->cl->t.timeout_s * 1000.0 + 0.5), 0);
}

/* A reused keep-alive connection died before any response byte: the server closed it while it
 * was idle. Send the same request once more on a fresh connection, as HTTP clients do. */
static bool retry_fresh(conn_t *c)
{
    if (!c->reused || c->got_bytes)
        return false;
    td_bench_client_t *cl = c->cl;
    conn_t *n = conn_new(cl);
    if (!n)
        return false;
    td_buf_t tmp = n->wbuf;
    n->wbuf = c->wbuf;
    c->wbuf = tmp;
    n->r = c->r;
    n->stream = c->stream;
    n->chat = c->chat;
    n->send_ns = c->send_ns;
    c->r = NULL;
    arm_timeout(n); /* the retry gets the whole timeout again */
    td__bench_conn_close(c);
    if (conn_connect(n) != 0) {
        c = n; /* report on the new connection */
        td_bench_result_fail(c->r, TD_BENCH_ERR_CONNECT, "connect: %s", td_err_msg());
        td__bench_finish(c, false);
    }
    return true;
}

static void on_poll(uv_poll_t *p, int status, int events);

/* Wait for what the connection needs: always input (a server may close an idle connection),
 * output while connecting or while request bytes are left. */
static void update_poll(conn_t *c)
{
    if (c->closing || !c->has_poll)
        return;
    int ev = UV_READABLE | (c->connecting || c->writing ? UV_WRITABLE : 0);
    if (ev != c->poll_events) {
        uv_poll_start(&c->poll, ev, on_poll);
        c->poll_events = ev;
    }
}

/* When the bytes just read reached this host: the kernel's receive timestamp (SO_TIMESTAMPING,
 * software RX, CLOCK_REALTIME) carried to CLOCK_MONOTONIC through "how long ago", so that time
 * the harness's own loop spent before reading does not count; `now` when there is none.
 * "How long ago" is taken against a CLOCK_REALTIME reading bracketed by two monotonic ones, at
 * their midpoint: a thread preempted between the two clocks would otherwise move the arrival by
 * the time it lost (a TTFT below the server's own). A bracket wider than RX_BRACKET_NS is read
 * again, and after a few tries the read's own time `now` is used. */
enum { RX_BRACKET_NS = 20000, RX_TRIES = 4 };

static uint64_t rx_time(struct msghdr *m, uint64_t now)
{
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm; cm = CMSG_NXTHDR(m, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SO_TIMESTAMPING)
            continue;
        struct timespec ts[3], rt;
        memcpy(ts, CMSG_DATA(cm), sizeof(ts));
        if (ts[0].tv_sec == 0 && ts[0].tv_nsec == 0)
            return now;
        for (int i = 0; i < RX_TRIES; i++) {
            uint64_t t1 = td_now_ns();
            clock_gettime(CLOCK_REALTIME, &rt);
            uint64_t t2 = td_now_ns();
            if (t2 - t1 > RX_BRACKET_NS)
                continue;
            int64_t ago = (int64_t)(rt.tv_sec - ts[0].tv_sec) * 1000000000LL +
                          (int64_t)(rt.tv_nsec - ts[0].tv_nsec);
            uint64_t mid = t1 + (t2 - t1) / 2;
            if (ago <= 0 || (uint64_t)ago >= mid)
                return now;
            return TD_MIN(mid - (uint64_t)ago, now);
        }
        return now;
    }
    return now;
}

/* End of input (err 0) or a socket error (errno) while reading. */
static void read_end(conn_t *c, int err)
{
    if (!c->r) {
        td__bench_conn_close(c);
        return;
    }
    if (retry_fresh(c))
        return;
    if (err == 0 && c->st == S_BODY_EOF) {
        c->keepalive = false;
        td__bench_complete(c, td_now_ns());
        return;
    }
    const char *why = err ? strerror(err) : "end of file";
    if (!c->got_bytes)
        td__bench_fail(c, TD_BENCH_ERR_CONNECT, "connection closed before a response (%s)", why);
    else
        td__bench_fail(c, TD_BENCH_ERR_STREAM, "connection closed mid-response (%s)", why);
}

static void do_read(conn_t *c)
{
    td_bench_client_t *cl = c->cl;
    union {
        char buf[CMSG_SPACE(3 * sizeof(struct timespec))];
        struct cmsghdr align;
    } ctl;
    for (;;) {
        struct iovec iov = {cl->rbuf, RBUF_SIZE};
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof(ctl.buf);
        ssize_t n = recvmsg(c->fd, &m, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            read_end(c, errno);
            return;
        }
        if (n == 0) {
            read_end(c, 0);
            return;
        }
        uint64_t now = td_now_ns();
        if (!cl->t.app_timestamps)
            now = rx_time(&m, now);
        if (!c->r) { /* data on an idle connection: not HTTP we understand; drop it */
            td__bench_conn_close(c);
            return;
        }
        c->got_bytes = true;
        td__bench_parse(c, cl->rbuf, (size_t)n, now);
        if ((size_t)n < RBUF_SIZE || c->closing)
            return; /* a short read drained the socket; the poll is level-triggered anyway */
    }
}

static void write_some(conn_t *c)
{
    while (c->woff < c->wbuf.len) {
        ssize_t n = send(c->fd, c->wbuf.data + c->woff, c->wbuf.len - c->woff, MSG_NOSIGNAL);
        if (n > 0) {
            c->woff += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        int err = n < 0 ? errno : EPIPE;
        if (retry_fresh(c))
            return;
        td__bench_fail(c, TD_BENCH_ERR_CONNECT, "write: %s", strerror(err));
        return;
    }
    c->writing = c->woff < c->wbuf.len;
    update_poll(c);
}

static void timeout_cb(uv_timer_t *t)
{
    conn_t *c = t->data;
    if (!c->r)
        return;
    td__bench_fail(c, TD_BENCH_ERR_TIMEOUT, "no complete response after %.3f s",
                   c->cl->t.timeout_s);
}

static void start_request(conn_t *c)
{
    c->st = S_STATUS;
    c->status = 0;
    c->remain = 0;
    c->chunked = c->has_len = c->got_bytes = c->first = false;
    c->keepalive = true;
    td_buf_reset(&c->line);
    td_buf_reset(&c->sse);
    td_buf_reset(&c->body);
    c->woff = 0;
    c->writing = true;
    write_some(c);
}

static void connected(conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    c->connecting = false;
    if (err != 0) {
        if (c->r)
            td__bench_fail(c, TD_BENCH_ERR_CONNECT, "connect: %s", strerror(err));
        else
            td__bench_conn_close(c);
        return;
    }
    if (c->r)
        start_request(c);
    else
        update_poll(c);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    conn_t *c = p->data;
    if (c->closing)
        return;
    if (status < 0) {
        if (c->connecting) {
            c->connecting = false;
            if (c->r)
                td__bench_fail(c, TD_BENCH_ERR_CONNECT, "connect: %s", uv_strerror(status));
            else
                td__bench_conn_close(c);
            return;
        }
        read_end(c, -status);
        return;
    }
    if (c->connecting) {
        if (events & (UV_WRITABLE | UV_READABLE))
            connected(c);
        return;
    }
    if ((events & UV_WRITABLE) && c->writing && c->r) {
        write_some(c);
        if (c->closing)
            return;
    }
    if (events & UV_READABLE)
        do_read(c);
}

static int conn_connect(conn_t *c)
{
    td_bench_client_t *cl = c->cl;
    c->fd = socket(cl->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return td_err_set(TD_EIO, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!cl->t.app_timestamps) {
        int fl = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
        setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPING, &fl, sizeof(fl)); /* else app time */
    }
    if (uv_poll_init_socket(cl->loop, &c->poll, c->fd) != 0)
        return td_err_set(TD_EIO, "uv_poll_init_socket failed");
    c->poll.data = c;
    c->has_poll = true;
    c->handles++;
    c->poll_events = 0;
    if (connect(c->fd, (const struct sockaddr *)&cl->addr, cl->addrlen) == 0) {
        connected(c);
        return 0;
    }
    if (errno != EINPROGRESS)
        return td_err_set(TD_ECONNREFUSED, "%s", strerror(errno));
    c->connecting = true;
    update_poll(c);
    return 0;
}

/* ---- public ---- */

td_bench_client_t *td_bench_client_new(void *uv_loop, const td_bench_target_t *t,
                                       td_bench_done_cb cb, void *arg)
{
    td_bench_client_t *cl = calloc(1, sizeof(*cl));
    if (!cl) {
        td_err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    cl->loop = uv_loop;
    cl->t = *t;
    cl->cb = cb;
    cl->arg = arg;
    td_buf_init(&cl->head);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof(port), "%d", t->port);
    int gai = getaddrinfo(t->host, port, &hints, &res);
    if (gai != 0 || !res) {
        td_err_set(TD_EUNREACH, "cannot resolve %s: %s", t->host, gai_strerror(gai));
        free(cl);
        return NULL;
    }
    memcpy(&cl->addr, res->ai_addr, res->ai_addrlen);
    cl->addrlen = (socklen_t)res->ai_addrlen;
    freeaddrinfo(res);
    int rc = td_buf_printf(&cl->head,
                           "POST %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: tandem-bench\r\n"
                           "Content-Type: application/json\r\n",
                           t->path, t->host, t->port);
    if (rc == 0 && t->api_key)
        rc = td_buf_printf(&cl->head, "Authorization: Bearer %s\r\n", t->api_key);
    if (rc != 0) {
        td_buf_free(&cl->head);
        free(cl);
        td_err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    return cl;
}

int td_bench_client_submit(td_bench_client_t *cl, const char *body, size_t len, bool stream,
                           uint64_t t0_ns, td_bench_result_t *r)
{
    bool fresh = false;
    conn_t *c = cl->idle;
    if (c) {
        cl->idle = c->next;
        c->next = NULL;
    } else {
        c = conn_new(cl);
        if (!c)
            return td_err_set(TD_ENOMEM, "out of memory");
        fresh = true;
    }
    td_buf_reset(&c->wbuf);
    int rc = td_buf_append(&c->wbuf, cl->head.data, cl->head.len);
    if (rc == 0)
        rc = td_buf_printf(&c->wbuf, "%sContent-Length: %zu\r\n\r\n",
                           stream ? "Accept: text/event-stream\r\n" : "", len);
    if (rc == 0)
        rc = td_buf_append(&c->wbuf, body, len);
    if (rc != 0) {
        if (fresh)
            td__bench_conn_close(c);
        else {
            c->next = cl->idle;
            cl->idle = c;
        }
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    c->stream = stream;
    c->chat = cl->t.chat;
    c->reused = !fresh;
    c->r = r;
    cl->inflight++;
    arm_timeout(c);
    c->send_ns = td_now_ns();
    r->send_s = (double)(c->send_ns - t0_ns) * 1e-9;
    if (fresh) {
        if (conn_connect(c) != 0)
            td__bench_fail(c, TD_BENCH_ERR_CONNECT, "connect: %s", td_err_msg());
    } else {
        start_request(c);
    }
    return 0;
}

size_t td_bench_client_inflight(const td_bench_client_t *cl)
{
    return cl->inflight;
}

size_t td_bench_client_conns(const td_bench_client_t *cl)
{
    return cl->nconns;
}

void td_bench_client_close(td_bench_client_t *cl)
{
    cl->closing = true;
    while (cl->all) {
        conn_t *c = cl->all;
        if (c->r) {
            td_bench_result_t *r = c->r;
            td_bench_result_fail(r, TD_BENCH_ERR_CONNECT, "canceled");
            c->r = NULL;
            cl->inflight--;
            td__bench_conn_close(c);
            cl->cb(r, cl->arg);
        } else {
            td__bench_conn_close(c);
        }
    }
    if (cl->alive == 0) { /* else the last connection's close callback frees the client */
        td_buf_free(&cl->head);
        free(cl);
    }
}

/* ---- the HTTP backend ---- */

int td_bench_http_body(const td_bench_request_t *req, bool chat, td_buf_t *b)
{
    int rc = td_buf_append_str(b, "{\"model\": ");
    rc |= td_buf_append_json_string(b, req->model ? req->model : "",
                                    req->model ? strlen(req->model) : 0);
    if (chat) {
        rc |= td_buf_printf(b, ", \"messages\": %s, \"max_completion_tokens\": %lld",
                            req->messages_json, (long long)req->max_tokens);
    } else {
        rc |= td_buf_append_str(b, ", \"prompt\": ");
        rc |= td_buf_append_json_string(b, req->prompt, strlen(req->prompt));
        rc |= td_buf_printf(b, ", \"max_tokens\": %lld", (long long)req->max_tokens);
    }
    rc |= td_buf_append_str(b, ", \"temperature\": 0.0");
    if (req->stream)
        rc |= td_buf_append_str(
            b, ", \"stream\": true, \"stream_options\": {\"include_usage\": true}");
    if (req->ignore_eos)
        rc |= td_buf_append_str(b, ", \"ignore_eos\": true");
    rc |= td_buf_append_str(b, "}");
    return rc ? TD_ENOMEM : 0;
}

typedef struct http_impl {
    td_bench_client_t *cl;
    bool chat;
    td_buf_t body; /* scratch for one request body */
} http_impl_t;

static void *http_open(void *loop, const td_bench_target_t *t, td_bench_done_cb cb, void *arg)
{
    http_impl_t *h = calloc(1, sizeof(*h));
    if (!h) {
        td_err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    h->cl = td_bench_client_new(loop, t, cb, arg);
    if (!h->cl) {
        free(h);
        return NULL;
    }
    h->chat = t->chat;
    td_buf_init(&h->body);
    return h;
}

static int http_submit(void *impl, const td_bench_request_t *req, uint64_t t0_ns,
                       td_bench_result_t *r)
{
    http_impl_t *h = impl;
    td_buf_reset(&h->body);
    int rc = td_bench_http_body(req, h->chat, &h->body);
    if (rc)
        return rc;
    return td_bench_client_submit(h->cl, h->body.data, h->body.len, req->stream, t0_ns, r);
}

static size_t http_inflight(const void *impl)
{
    return td_bench_client_inflight(((const http_impl_t *)impl)->cl);
}

static void http_close(void *impl)
{
    http_impl_t *h = impl;
    td_bench_client_close(h->cl);
    td_buf_free(&h->body);
    free(h);
}

const td_bench_backend_t td_bench_backend_http = {"http", http_open, http_submit, http_inflight,
                                                  http_close};
