/* fuzz_http.c: the HTTP/1.1 server (td_http) fed raw client bytes. Input: everything a
 * client sends on one TCP connection (request lines, headers, sized or chunked bodies, pipelined
 * requests, garbage).
 *
 * One server, created on the first input and reused, listens on 127.0.0.1:0 on a loop that this
 * thread runs; the client is a uv_tcp_t on the same loop. Routes: /health answers inline, /stream streams three chunks across loop turns,
 * /len answers with the body's length and reads every request accessor. How the client sends is
 * chosen by a hash of the input (so a replayed input behaves the same): in one, two or three
 * writes with loop turns between them (the parser sees partial requests), then either a
 * half-close (the server answers every complete request, sees EOF and closes) or, for a quarter of
 * inputs, an abortive close (RST) once the first response bytes arrive (cancels streams).
 *
 * Checked per input, by abort() (a crash to libFuzzer and to fuzz_driver.c): whatever comes back
 * is a sequence of well-formed HTTP/1.x responses (status line "HTTP/1.x DDD reason", header
 * block, a body framed by content-length or chunked encoding), possibly cut short by the close;
 * the client connection ends within 5 s; and a fresh connection still gets 200 "ok" from /health.
 * At exit the server is closed and the loop drained, so LeakSanitizer sees per-connection leaks. */
#include "fuzz.h"
#include "td_http.h"
#include "td_util.h"

#include <ctype.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define CLIENT_TIMEOUT_MS 5000 /* a connection that outlives this is a hang: abort */
#define ABORT_IDLE_MS 2        /* abortive mode: reset after this long without a byte */

static uv_loop_t loop;
static td_http_server_t *server;
static int server_port;

static void die(const char *what, const uint8_t *resp, size_t len)
{
    fprintf(stderr, "fuzz_http: %s\nresponse (%zu bytes): %.*s\n", what, len,
            (int)TD_MIN(len, 2000), resp ? (const char *)resp : "");
    abort();
}

/* ---- routes ------------------------------------------------------------------------------- */

static void h_health(td_http_req_t *r, void *ud)
{
    td_http_respond(r, 200, "text/plain", "ok\n", 3);
}

/* Reads every accessor (on fuzzed method, path, query, headers, body) and answers with the body
 * length. Header values go into the body, never into response headers. */
static void h_len(td_http_req_t *r, void *ud)
{
    size_t ml, pl, ql, bl, hl;
    const char *m = td_http_method(r, &ml);
    const char *p = td_http_path(r, &pl);
    const char *q = td_http_query(r, &ql);
    const char *b = td_http_body(r, &bl);
    const char *ct = td_http_header(r, "Content-Type", &hl);
    char peer[80];
    td_http_peer(r, peer, sizeof(peer));
    unsigned sum = 0; /* touches every byte so ASan checks the lengths */
    for (size_t i = 0; i < ml; i++)
        sum += (unsigned char)m[i];
    for (size_t i = 0; i < pl; i++)
        sum += (unsigned char)p[i];
    for (size_t i = 0; q && i < ql; i++)
        sum += (unsigned char)q[i];
    for (size_t i = 0; i < bl; i++)
        sum += (unsigned char)b[i];
    for (size_t i = 0; ct && i < hl; i++)
        sum += (unsigned char)ct[i];
    char out[160];
    int n =
        snprintf(out, sizeof(out), "%zu %u %s %d\n", bl, sum, peer, td_http_method_is(r, "POST"));
    td_http_add_header(r, "X-Body-Length", "counted");
    td_http_respond(r, 200, "text/plain", out, (size_t)n);
}

/* /stream: three chunks, one per loop turn (a 0 ms timer), then the end. */
typedef struct stream_job {
    uv_timer_t timer;
    td_http_stream_t *st;
    int sent;
} stream_job_t;

static void stream_closed(uv_handle_t *h)
{
    free(h->data);
}

static void stream_tick(uv_timer_t *t)
{
    stream_job_t *j = t->data;
    char ev[32];
    int n = snprintf(ev, sizeof(ev), "data: %d\n\n", j->sent);
    if (td_http_stream_write(j->st, ev, (size_t)n) != 0 || ++j->sent == 3) {
        td_http_stream_end(j->st);
        uv_close((uv_handle_t *)t, stream_closed);
        return;
    }
    uv_timer_start(t, stream_tick, 0, 0);
}

static void h_stream(td_http_req_t *r, void *ud)
{
    stream_job_t *j = calloc(1, sizeof(*j));
    if (!j) {
        td_http_respond(r, 503, "text/plain", "", 0);
        return;
    }
    j->st = td_http_stream_start(r, 200, "text/event-stream", NULL, NULL);
    if (!j->st) {
        free(j);
        return; /* the request stays unanswered: only on out-of-memory */
    }
    uv_timer_init(&loop, &j->timer);
    j->timer.data = j;
    uv_timer_start(&j->timer, stream_tick, 0, 0);
}

/* ---- the server --------------------------------------------------------------------------- */

static void server_shutdown(void)
{
    td_http_server_close(server);
    while (uv_run(&loop, UV_RUN_DEFAULT) != 0) {
    }
    if (uv_loop_close(&loop) != 0)
        fprintf(stderr, "fuzz_http: handles still open at exit\n");
}

static void server_start(void)
{
    signal(SIGPIPE, SIG_IGN); /* as every daemon does */
    uv_loop_init(&loop);
    td_http_opts_t o = {.max_body = 4096, .server_name = "fuzz"};
    server = td_http_server_new(&loop, &o);
    if (!server || td_http_route(server, "/health", h_health, NULL) ||
        td_http_route(server, "/len", h_len, NULL) ||
        td_http_route(server, "/stream", h_stream, NULL) || td_http_listen(server, "127.0.0.1:0")) {
        fprintf(stderr, "fuzz_http: cannot start the server\n");
        abort();
    }
    server_port = td_http_port(server);
    atexit(server_shutdown);
}

/* ---- the client --------------------------------------------------------------------------- */

typedef struct client {
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t writes[3];
    uv_shutdown_t shutdown;
    uv_timer_t timer;    /* CLIENT_TIMEOUT_MS guard, then ABORT_IDLE_MS in abortive mode */
    uv_timer_t pace;     /* 1 ms between pieces, so the server reads each one on its own */
    const uint8_t *data; /* the input: borrowed, valid until the client is done */
    size_t cut[4];       /* write i sends data[cut[i], cut[i+1]) */
    int n_writes, written;
    bool abortive; /* reset once response bytes arrive (or after ABORT_IDLE_MS) */
    bool connected, eof, timed_out, closing;
    int n_closed;  /* handles closed: done at 3 (tcp, timer, pace) */
    td_buf_t resp; /* every byte the server sent */
} client_t;

static void client_handle_closed(uv_handle_t *h)
{
    client_t *c = h->data;
    c->n_closed++;
}

static void client_close(client_t *c, bool reset)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->timer, client_handle_closed);
    uv_close((uv_handle_t *)&c->pace, client_handle_closed);
    if (reset && c->connected && uv_tcp_close_reset(&c->tcp, client_handle_closed) == 0)
        return;
    uv_close((uv_handle_t *)&c->tcp, client_handle_closed);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    static char slab[65536];
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    client_t *c = s->data;
    if (n > 0) {
        td_buf_append(&c->resp, buf->base, (size_t)n);
        if (c->abortive)
            client_close(c, true);
        return;
    }
    if (n < 0) { /* EOF, or a reset by the server */
        c->eof = true;
        client_close(c, false);
    }
}

static void on_timer(uv_timer_t *t)
{
    client_t *c = t->data;
    if (!c->abortive || c->written < c->n_writes) /* else: the ABORT_IDLE_MS reset */
        c->timed_out = true;
    client_close(c, true);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
}

static void on_written(uv_write_t *w, int status)
{
}

static void on_pace(uv_timer_t *t);

/* Sends the next piece; after the last one, the half-close (or the idle reset). */
static void send_next(client_t *c)
{
    if (c->closing)
        return;
    int i = c->written++;
    size_t from = c->cut[i], to = c->cut[i + 1];
    uv_buf_t b = uv_buf_init((char *)c->data + from, (unsigned)(to - from));
    if (to > from && uv_write(&c->writes[i], (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        client_close(c, false); /* the server already closed: fine */
        return;
    }
    if (c->written < c->n_writes)
        uv_timer_start(&c->pace, on_pace, 1, 0);
    else if (c->abortive)
        uv_timer_start(&c->timer, on_timer, ABORT_IDLE_MS, 0);
    else
        uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown);
}

static void on_pace(uv_timer_t *t)
{
    send_next(t->data);
}

static void on_connect(uv_connect_t *req, int status)
{
    client_t *c = req->data;
    if (status == UV_ECANCELED)
        return; /* closed by the 5 s guard before it connected: reported as a hang */
    if (status != 0) {
        fprintf(stderr, "fuzz_http: connect: %s\n", uv_strerror(status));
        abort();
    }
    c->connected = true;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    send_next(c);
}

/* Sends `data` on one connection and collects the reply: in one piece with a half-close when
 * `plain`, otherwise as the hash `h` picks (see the top of the file). */
static void client_run(client_t *c, const uint8_t *data, size_t size, bool plain, uint64_t h)
{
    memset(c, 0, sizeof(*c));
    td_buf_init(&c->resp);
    c->data = data;
    c->n_writes = plain ? 1 : 1 + (int)(h % 3);
    c->abortive = !plain && (h >> 8) % 4 == 0;
    c->cut[0] = 0;
    c->cut[c->n_writes] = size;
    for (int i = 1; i < c->n_writes; i++) /* increasing split points */
        c->cut[i] = c->cut[i - 1] + (h >> (16 + 8 * i)) % (size - c->cut[i - 1] + 1);
    uv_tcp_init(&loop, &c->tcp);
    uv_timer_init(&loop, &c->timer);
    uv_timer_init(&loop, &c->pace);
    c->tcp.data = c->timer.data = c->pace.data = c->connect.data = c;
    uv_timer_start(&c->timer, on_timer, CLIENT_TIMEOUT_MS, 0);
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", server_port, &sa);
    if (uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&sa, on_connect) != 0)
        abort();
    while (c->n_closed < 3)
        uv_run(&loop, UV_RUN_ONCE);
}

/* ---- response checks ---------------------------------------------------------------------- */

/* Position of "\r\n" at or after p, or NULL. */
static const uint8_t *find_crlf(const uint8_t *p, const uint8_t *end)
{
    for (; p + 1 < end; p++)
        if (p[0] == '\r' && p[1] == '\n')
            return p;
    return NULL;
}

static bool prefix_of(const uint8_t *p, size_t n, const char *full)
{
    size_t fl = strlen(full);
    return memcmp(p, full, TD_MIN(n, fl)) == 0;
}

/* Walks the responses in r[0, n). Each must start with a well-formed status line; a response cut
 * short by the close is accepted. It stops after a response whose body length it cannot know (a
 * HEAD request's, or one without framing, which runs to the close), after a 101 (h2c upgrade), and,
 * when `h2_possible` (a request starting "PRI * HTTP/2", which h2o answers in HTTP/2), at the first
 * bytes that are not "HTTP/1.". */
static void check_responses(const uint8_t *r, size_t n, bool saw_head, bool h2_possible)
{
    if (n == 0) /* no response at all (r may be NULL: r + 0 would be undefined) */
        return;
    const uint8_t *p = r, *end = r + n;
    while (p < end) {
        size_t left = (size_t)(end - p);
        if (h2_possible && !prefix_of(p, left, "HTTP/1."))
            return;
        if (left < 13) { /* "HTTP/1.1 200 " */
            if (!prefix_of(p, left, "HTTP/1.1 ") && !prefix_of(p, left, "HTTP/1.0 "))
                die("a truncated response does not start with HTTP/1.x", r, n);
            return;
        }
        if (memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ' ||
            !isdigit(p[9]) || !isdigit(p[10]) || !isdigit(p[11]) || p[12] != ' ' || p[9] == '0')
            die("malformed status line", r, n);
        int status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
        const uint8_t *eol = find_crlf(p, end);
        if (!eol)
            return; /* cut short */
        for (const uint8_t *q = p + 13; q < eol; q++)
            if (*q < 0x20 || *q == 0x7f)
                die("control byte in the reason phrase", r, n);
        /* headers */
        long long clen = -1;
        bool chunked = false;
        const uint8_t *h = eol + 2;
        for (;;) {
            const uint8_t *e = find_crlf(h, end);
            if (!e)
                return; /* cut short */
            if (e == h) {
                h += 2;
                break;
            }
            const uint8_t *colon = memchr(h, ':', (size_t)(e - h));
            if (!colon || colon == h)
                die("header line without a name", r, n);
            for (const uint8_t *q = h; q < colon; q++)
                if (!isgraph(*q))
                    die("bad byte in a header name", r, n);
            size_t nl = (size_t)(colon - h);
            const uint8_t *v = colon + 1;
            while (v < e && *v == ' ')
                v++;
            if (nl == 14 && strncasecmp((const char *)h, "content-length", 14) == 0) {
                clen = 0;
                for (; v < e && isdigit(*v); v++)
                    clen = clen * 10 + (*v - '0');
                if (v != e)
                    die("bad content-length in a response", r, n);
            } else if (nl == 17 && strncasecmp((const char *)h, "transfer-encoding", 17) == 0) {
                chunked = (size_t)(e - v) == 7 && strncasecmp((const char *)v, "chunked", 7) == 0;
            }
            h = e + 2;
        }
        if (status == 101)
            return; /* an upgrade (h2c): what follows is not HTTP/1 */
        if (status < 200 || status == 204 || status == 304) {
            p = h;
            continue;
        }
        if (saw_head)
            return; /* a HEAD response has headers only: boundaries unknown from here */
        if (chunked) {
            for (;;) {
                const uint8_t *e = find_crlf(h, end);
                if (!e)
                    return;
                size_t sz = 0;
                const uint8_t *q = h;
                for (; q < e && isxdigit(*q); q++)
                    sz = sz * 16 + (size_t)(isdigit(*q) ? *q - '0' : (tolower(*q) - 'a' + 10));
                if (q == h || q != e)
                    die("bad chunk size line in a response", r, n);
                h = e + 2;
                if ((size_t)(end - h) < sz + 2)
                    return; /* cut short */
                if (memcmp(h + sz, "\r\n", 2) != 0)
                    die("chunk not followed by CRLF", r, n);
                h += sz + 2;
                if (sz == 0)
                    break;
            }
            p = h;
        } else if (clen >= 0) {
            if ((size_t)(end - h) < (size_t)clen)
                return;
            p = h + clen;
        } else {
            return; /* body delimited by the close */
        }
    }
}

static bool contains(const uint8_t *d, size_t n, const char *s)
{
    size_t sl = strlen(s);
    for (size_t i = 0; i + sl <= n; i++)
        if (memcmp(d + i, s, sl) == 0)
            return true;
    return false;
}

static uint64_t fnv1a(const uint8_t *d, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

/* The server must still answer a plain GET on a fresh connection. */
static void check_alive(void)
{
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    client_t c;
    client_run(&c, (const uint8_t *)req, sizeof(req) - 1, true, 0);
    const char *want_head = "HTTP/1.1 200 OK\r\n", *want_tail = "\r\n\r\nok\n";
    size_t tl = strlen(want_tail);
    if (c.timed_out || c.resp.len < strlen(want_head) + tl ||
        memcmp(c.resp.data, want_head, strlen(want_head)) != 0 ||
        memcmp(c.resp.data + c.resp.len - tl, want_tail, tl) != 0)
        die("the server no longer answers GET /health", (const uint8_t *)c.resp.data, c.resp.len);
    td_buf_free(&c.resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!server)
        server_start();
    client_t c;
    client_run(&c, data, size, false, fnv1a(data, size));
    if (c.timed_out)
        die("the server kept a half-closed connection open", (const uint8_t *)c.resp.data,
            c.resp.len);
    check_responses((const uint8_t *)c.resp.data, c.resp.len, contains(data, size, "HEAD"),
                    contains(data, size, "PRI * HTTP/2"));
    td_buf_free(&c.resp);
    check_alive();
    return 0;
}

/* Pipelined requests on one connection: every route, both body framings, a 100-continue. */
void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(b, "GET /health?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: f\r\n\r\n"
                         "POST /len HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\n"
                         "Content-Length: 11\r\n\r\nhello world"
                         "POST /len HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
                         "POST /len HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                         "Content-Length: 2\r\n\r\nok"
                         "GET /stream HTTP/1.1\r\nHost: a\r\nAccept: text/event-stream\r\n\r\n"
                         "GET /missing HTTP/1.1\r\nHost: a\r\n\r\n");
}
