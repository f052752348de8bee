/* test_http.c: the HTTP server on a real loop thread, driven by plain blocking sockets from the
 * test: routes, bodies (sized and chunked, Expect: 100-continue), 404/413 error bodies, headers,
 * chunked streaming, keep-alive and pipelining, HEAD, HTTP/1.0, half-closed clients, client
 * cancellation of streams and of watched requests, malformed requests that must not disturb other
 * clients. */
#include "td_http.h"
#include "td_util.h"

#include <arpa/inet.h>
#include "td_check.h"

#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static uv_loop_t loop;
static td_http_server_t *server;
static uv_async_t stop_async;
static _Atomic int port;
static _Atomic int cancels;
static pthread_t thread;

/* streaming: a timer writes one event every 5 ms, then ends; the odd events go through
 * td_http_stream_write_buf in two parts (the first finds the stream's queue empty and hands its
 * storage over, the second is appended behind it), with one buffer reused for every event */
typedef struct sse {
    uv_timer_t timer;
    td_http_stream_t *st;
    int sent, total;
    bool endless;
    td_buf_t buf;
} sse_t;

static void sse_closed(uv_handle_t *h)
{
    sse_t *s = h->data;
    td_buf_free(&s->buf);
    free(s);
}

static int sse_write(sse_t *s)
{
    char ev[64];
    int n = snprintf(ev, sizeof(ev), "data: {\"i\":%d}\n\n", s->sent);
    if (s->sent % 2 == 0)
        return td_http_stream_write(s->st, ev, (size_t)n);
    for (int part = 0; part < 2; part++) {
        size_t from = part ? 6 : 0, to = part ? (size_t)n : 6;
        ck_assert_int_eq(td_buf_append(&s->buf, ev + from, to - from), 0);
        int rc = td_http_stream_write_buf(s->st, &s->buf);
        if (rc)
            return rc;
        ck_assert_uint_eq(s->buf.len, 0);
    }
    return 0;
}

static void sse_tick(uv_timer_t *t)
{
    sse_t *s = t->data;
    if (sse_write(s) != 0 || (!s->endless && ++s->sent == s->total)) {
        td_http_stream_end(s->st);
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, sse_closed);
        return;
    }
    if (s->endless)
        s->sent++;
}

static void sse_cancel(td_http_stream_t *st, void *ud)
{
    atomic_fetch_add(&cancels, 1);
}

static void h_health(td_http_req_t *r, void *ud)
{
    td_http_respond(r, 200, "text/plain", "ok\n", 3);
}

static void h_echo(td_http_req_t *r, void *ud)
{
    if (!td_http_method_is(r, "POST")) {
        td_http_respond_error(r, 405, "invalid_request_error", NULL, NULL, "use POST");
        return;
    }
    size_t len, hl;
    const char *body = td_http_body(r, &len);
    const char *rid = td_http_header(r, "X-Request-Id", &hl);
    if (rid) {
        char v[64];
        snprintf(v, sizeof(v), "%.*s", (int)TD_MIN(hl, 60), rid);
        td_http_add_header(r, "X-Request-Id", v);
    }
    td_http_respond(r, 200, "application/json", body, len);
}

static void h_sse(td_http_req_t *r, void *ud)
{
    sse_t *s = calloc(1, sizeof(*s));
    td_buf_init(&s->buf);
    s->total = 3;
    s->endless = ud != NULL;
    s->st = td_http_stream_start(r, 200, "text/event-stream", sse_cancel, s);
    uv_timer_init(&loop, &s->timer);
    s->timer.data = s;
    uv_timer_start(&s->timer, sse_tick, 5, 5);
}

/* a request answered only when its client leaves (td_http_req_watch) */
static _Atomic int gone;

static void hold_gone(void *ud)
{
    atomic_fetch_add(&gone, 1);
    td_http_respond((td_http_req_t *)ud, 499, "text/plain", "", 0);
}

static void h_hold(td_http_req_t *r, void *ud)
{
    td_http_req_watch(r, hold_gone, r);
}

static void on_stop(uv_async_t *a)
{
    td_http_server_close(server);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg)
{
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

static void setup(void)
{
    uv_loop_init(&loop);
    td_http_opts_t o = {.max_body = 1024};
    server = td_http_server_new(&loop, &o);
    td_http_route(server, "/health", h_health, NULL);
    td_http_route(server, "/echo", h_echo, NULL);
    td_http_route(server, "/sse", h_sse, NULL);
    td_http_route(server, "/endless", h_sse, (void *)1);
    td_http_route(server, "/hold", h_hold, NULL);
    ck_assert_int_eq(td_http_listen(server, "127.0.0.1:0"), 0);
    port = td_http_port(server);
    ck_assert_int_gt(port, 0);
    uv_async_init(&loop, &stop_async, on_stop);
    pthread_create(&thread, NULL, loop_main, NULL);
}

static void teardown(void)
{
    uv_async_send(&stop_async);
    pthread_join(thread, NULL); /* returns only once every handle is closed */
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Send a request with Connection: close and read the whole response. */
static char *roundtrip(const char *req, size_t req_len)
{
    int fd = dial();
    ck_assert_int_eq(write(fd, req, req_len), (ssize_t)req_len);
    td_buf_t b;
    td_buf_init(&b);
    char tmp[4096];
    ssize_t n;
    while ((n = read(fd, tmp, sizeof(tmp))) > 0)
        td_buf_append(&b, tmp, (size_t)n);
    close(fd);
    return td_buf_steal(&b, NULL);
}

static char *get(const char *path)
{
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     path);
    return roundtrip(req, (size_t)n);
}

/* Decode a chunked body that starts after the header block. */
static char *dechunk(const char *resp)
{
    const char *p = strstr(resp, "\r\n\r\n");
    ck_assert_ptr_nonnull(p);
    p += 4;
    td_buf_t b;
    td_buf_init(&b);
    for (;;) {
        char *end;
        unsigned long n = strtoul(p, &end, 16);
        ck_assert(end != p);
        p = strstr(end, "\r\n") + 2;
        if (n == 0)
            break;
        td_buf_append(&b, p, n);
        p += n + 2;
    }
    return td_buf_steal(&b, NULL);
}

START_TEST(test_routes_and_errors)
{
    char *r = get("/health");
    ck_assert(td_str_startswith(r, "HTTP/1.1 200 OK\r\n"));
    ck_assert_ptr_nonnull(strstr(r, "content-type: text/plain\r\n"));
    ck_assert(td_str_endswith(r, "\r\n\r\nok\n"));
    free(r);
    r = get("/health?verbose=1");
    ck_assert(td_str_startswith(r, "HTTP/1.1 200 OK\r\n"));
    free(r);
    r = get("/nope");
    ck_assert(td_str_startswith(r, "HTTP/1.1 404 Not Found\r\n"));
    ck_assert(td_str_endswith(r, "{\"error\":{\"message\":\"no route for \\/nope\",\"type\":"
                                 "\"not_found_error\",\"param\":null,\"code\":\"not_found\"}}"));
    free(r);
    r = get("/echo");
    ck_assert(td_str_startswith(r, "HTTP/1.1 405 Method Not Allowed\r\n"));
    free(r);
}
END_TEST

START_TEST(test_body_and_headers)
{
    const char body[] = "{\"model\":\"m\",\"prompt\":\"héllo\"}";
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "POST /echo HTTP/1.1\r\nHost: x\r\nX-Request-Id: abc-123\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     strlen(body), body);
    char *r = roundtrip(req, (size_t)n);
    ck_assert(td_str_startswith(r, "HTTP/1.1 200 OK\r\n"));
    ck_assert_ptr_nonnull(strstr(r, "x-request-id: abc-123\r\n"));
    ck_assert(td_str_endswith(r, body));
    free(r);
    /* over max_body: refused before the handler runs */
    td_buf_t big;
    td_buf_init(&big);
    td_buf_printf(&big, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\nConnection: "
                        "close\r\n\r\n");
    for (int i = 0; i < 2000; i++)
        td_buf_append_char(&big, 'a');
    r = roundtrip(big.data, big.len);
    ck_assert(td_str_startswith(r, "HTTP/1.1 413"));
    /* h2o's own answer, as an OpenAI-style JSON body naming the limit */
    ck_assert_msg(strstr(r, "content-type: application/json\r\n") &&
                      strstr(r, "\"code\":\"request_too_large\"") && strstr(r, "1024 bytes"),
                  "%s", r);
    free(r);
    td_buf_free(&big);
}
END_TEST

START_TEST(test_stream)
{
    char *r = get("/sse");
    ck_assert(td_str_startswith(r, "HTTP/1.1 200 OK\r\n"));
    ck_assert_ptr_nonnull(strstr(r, "content-type: text/event-stream\r\n"));
    ck_assert_ptr_nonnull(strstr(r, "transfer-encoding: chunked\r\n"));
    char *body = dechunk(r);
    ck_assert_str_eq(body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\n");
    free(body);
    free(r);
}
END_TEST

START_TEST(test_cancel_and_garbage)
{
    /* a client that leaves mid-stream cancels it */
    int fd = dial();
    const char req[] = "GET /endless HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    char tmp[256];
    ck_assert_int_gt(read(fd, tmp, sizeof(tmp)), 0);
    close(fd);
    for (int i = 0; i < 500 && atomic_load(&cancels) == 0; i++)
        usleep(10000);
    ck_assert_int_eq(atomic_load(&cancels), 1);
    /* garbage gets a 400 with an OpenAI-style JSON body, and the server keeps serving */
    const char junk[] = "\x01\x02 NOT HTTP\r\n\r\n";
    char *r = roundtrip(junk, sizeof(junk) - 1);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 400") &&
                      strstr(r, "content-type: application/json\r\n") &&
                      strstr(r, "\r\n\r\n{\"error\":{\"message\":") &&
                      strstr(r, "\"code\":\"bad_request\"}}"),
                  "%s", r);
    free(r);
    /* a header line without a colon: the same */
    const char badhdr[] = "GET /health HTTP/1.1\r\nno colon here\r\n\r\n";
    r = roundtrip(badhdr, sizeof(badhdr) - 1);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 400") && strstr(r, "{\"error\":"), "%s", r);
    free(r);
    r = get("/health");
    ck_assert(td_str_startswith(r, "HTTP/1.1 200 OK\r\n"));
    free(r);
}
END_TEST

/* Read whatever arrives on fd until the peer closes (or the 5 s receive timeout). */
static char *read_all(int fd)
{
    td_buf_t b;
    td_buf_init(&b);
    char tmp[4096];
    ssize_t n;
    while ((n = read(fd, tmp, sizeof(tmp))) > 0)
        td_buf_append(&b, tmp, (size_t)n);
    return td_buf_steal(&b, NULL);
}

static void assert_health_ok(void)
{
    char *r = get("/health");
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && td_str_endswith(r, "\r\n\r\nok\n"),
                  "GET /health after a bad request: %s", r);
    free(r);
}

START_TEST(test_oversize_body_then_next)
{
    /* a sized body over max_body (1024) on a keep-alive connection, with a request pipelined
     * behind it: 413, the connection closes (the body was never read), nothing else answered */
    td_buf_t b;
    td_buf_init(&b);
    td_buf_printf(&b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1025\r\n\r\n");
    for (int i = 0; i < 1025; i++)
        td_buf_append_char(&b, 'a');
    td_buf_printf(&b, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    char *r = roundtrip(b.data, b.len);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 413 "), "%s", r);
    ck_assert_ptr_null(strstr(r + 1, "HTTP/1.1 "));
    free(r);
    assert_health_ok();
    /* a large body behind the refusal: read and dropped, so the 413 is not lost to a reset */
    td_buf_reset(&b);
    td_buf_printf(&b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n");
    while (b.len < 4000000)
        td_buf_append(&b, "abcdefghijklmnopqrstuvwxyz012345", 32);
    r = roundtrip(b.data, b.len);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 413 ") && strstr(r, "request_too_large"), "%s", r);
    free(r);
    /* a chunked body that grows past max_body: 413 too */
    td_buf_reset(&b);
    td_buf_printf(&b, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int c = 0; c < 3; c++) {
        td_buf_printf(&b, "200\r\n");
        for (int i = 0; i < 0x200; i++)
            td_buf_append_char(&b, 'b');
        td_buf_printf(&b, "\r\n");
    }
    td_buf_printf(&b, "0\r\n\r\n");
    r = roundtrip(b.data, b.len);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 413 "), "%s", r);
    free(r);
    assert_health_ok();
    /* exactly max_body is accepted, and the keep-alive connection serves the next request */
    td_buf_reset(&b);
    td_buf_printf(&b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n");
    for (int i = 0; i < 1024; i++)
        td_buf_append_char(&b, 'c');
    td_buf_printf(&b, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    r = roundtrip(b.data, b.len);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n"), "%s", r);
    const char *second = strstr(r + 1, "HTTP/1.1 200 OK\r\n");
    ck_assert_ptr_nonnull(second);
    ck_assert(td_str_endswith(second, "\r\n\r\nok\n"));
    free(r);
    /* a content-length that does not fit in 64 bits, and a negative one: refused */
    const char *huge =
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n"
        "\r\nabc";
    r = roundtrip(huge, strlen(huge));
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 400 ") || td_str_startswith(r, "HTTP/1.1 413 "),
                  "%s", r);
    free(r);
    const char *neg = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\nabc";
    r = roundtrip(neg, strlen(neg));
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 400 "), "%s", r);
    free(r);
    td_buf_free(&b);
    assert_health_ok();
}
END_TEST

START_TEST(test_invalid_request_lines)
{
    static const char *const bad[] = {
        "GET\r\n\r\n",
        "GET /health\r\n\r\n",          /* HTTP/0.9 */
        "GET /health HTTP/2.0\r\n\r\n", /* not HTTP/1.x */
        "GET /health FTP/1.1\r\n\r\n",
        "GET /hea lth HTTP/1.1 x\r\n\r\n",
        "G\x01T /health HTTP/1.1\r\n\r\n",        /* control byte in the method */
        "GET /health HTTP/1.1\r\nHost x\r\n\r\n", /* header without a colon */
        "GET /health HTTP/1.1\r\n: empty-name\r\n\r\n",
        "\xff\xfe\xfd\xfc\r\n\r\n",
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        char *r = roundtrip(bad[i], strlen(bad[i]));
        ck_assert_msg(*r == '\0' || td_str_startswith(r, "HTTP/1.1 400 "), "case %zu: %s", i, r);
        free(r);
    }
    /* h2o lets a NUL through in the target: it must not be cut there and routed to /health */
    const char nul[] = "GET /health\x00x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char *r = roundtrip(nul, sizeof(nul) - 1);
    ck_assert_msg(*r == '\0' || td_str_startswith(r, "HTTP/1.1 400 ") ||
                      td_str_startswith(r, "HTTP/1.1 404 "),
                  "%s", r);
    free(r);
    assert_health_ok();
}
END_TEST

START_TEST(test_slowloris)
{
    /* clients that send part of a header block and stall must not hold up anyone else */
    enum { N_SLOW = 16 };
    int slow[N_SLOW];
    const char part[] = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (int i = 0; i < N_SLOW; i++) {
        slow[i] = dial();
        ck_assert_int_eq(write(slow[i], part, sizeof(part) - 1), (ssize_t)sizeof(part) - 1);
    }
    double t0 = td_now_s();
    for (int i = 0; i < 5; i++)
        assert_health_ok();
    /* a fresh POST with a body is served too */
    const char post[] = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: "
                        "close\r\n\r\nhi";
    char *r = roundtrip(post, sizeof(post) - 1);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && td_str_endswith(r, "\r\n\r\nhi"),
                  "%s", r);
    free(r);
    ck_assert_double_lt(td_now_s() - t0, 3.0); /* each ~1 ms; 3 s only absorbs a loaded host */
    /* the stalled requests were kept, not dropped: finishing them gets them answered */
    const char rest[] = "1\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < N_SLOW; i++) {
        ck_assert_int_eq(write(slow[i], rest, sizeof(rest) - 1), (ssize_t)sizeof(rest) - 1);
        r = read_all(slow[i]);
        ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && td_str_endswith(r, "ok\n"),
                      "slow client %d: %s", i, r);
        free(r);
        close(slow[i]);
    }
}
END_TEST


/* Read from fd until `want` complete responses (by their Content-Length or chunked end) are in. */
static char *read_responses(int fd, int want)
{
    td_buf_t b;
    td_buf_init(&b);
    char tmp[4096];
    for (;;) {
        int seen = 0;
        const char *p = b.data;
        while (p && seen < want) {
            const char *eoh = strstr(p, "\r\n\r\n");
            if (!eoh)
                break;
            const char *cl = strstr(p, "content-length: ");
            if (cl && cl < eoh) {
                size_t n = strtoul(cl + 16, NULL, 10);
                if ((size_t)(b.data + b.len - (eoh + 4)) < n)
                    break;
                p = eoh + 4 + n;
            } else {
                const char *end = strstr(eoh, "\r\n0\r\n\r\n");
                if (!end)
                    break;
                p = end + 7;
            }
            seen++;
        }
        if (seen == want)
            break;
        ssize_t n = read(fd, tmp, sizeof(tmp));
        if (n <= 0)
            break;
        td_buf_append(&b, tmp, (size_t)n);
    }
    return td_buf_steal(&b, NULL);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

START_TEST(test_keepalive_and_pipelining)
{
    /* two requests one after the other on one connection */
    int fd = dial();
    const char h[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(write(fd, h, sizeof(h) - 1), (ssize_t)sizeof(h) - 1);
        char *r = read_responses(fd, 1);
        ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && td_str_endswith(r, "ok\n") &&
                          !strstr(r, "connection: close"),
                      "request %d: %s", i, r);
        free(r);
    }
    /* three pipelined in one write, a streamed one among them: answered in order, then closed */
    const char three[] = "GET /sse HTTP/1.1\r\nHost: x\r\n\r\n"
                         "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                         "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(write(fd, three, sizeof(three) - 1), (ssize_t)sizeof(three) - 1);
    char *r = read_all(fd);
    close(fd);
    const char *sse = strstr(r, "text/event-stream");
    const char *echo = strstr(r, "\r\n\r\nhello");
    const char *health = strstr(r, "\r\n\r\nok\n");
    ck_assert_msg(sse && echo && health && sse < echo && echo < health &&
                      count(r, "HTTP/1.1 200 OK\r\n") == 3 && td_str_endswith(r, "ok\n"),
                  "%s", r);
    char *body = dechunk(r);
    ck_assert(td_str_startswith(body, "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\n"));
    free(body);
    free(r);
}
END_TEST

START_TEST(test_chunked_body_and_expect)
{
    /* a chunked body (with an extension and a trailer) arrives whole, decoded */
    const char req[] = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                       "Connection: close\r\n\r\n"
                       "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    char *r = roundtrip(req, sizeof(req) - 1);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") &&
                      strstr(r, "content-length: 11\r\n") && td_str_endswith(r, "hello world"),
                  "%s", r);
    free(r);
    /* Expect: 100-continue gets the interim answer before the body is sent */
    int fd = dial();
    const char head[] = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                        "Expect: 100-continue\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(write(fd, head, sizeof(head) - 1), (ssize_t)sizeof(head) - 1);
    char tmp[64];
    const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ssize_t n = read(fd, tmp, sizeof(cont) - 1);
    ck_assert_int_eq(n, (ssize_t)sizeof(cont) - 1);
    ck_assert(memcmp(tmp, cont, sizeof(cont) - 1) == 0);
    ck_assert_int_eq(write(fd, "abc", 3), 3);
    r = read_all(fd);
    close(fd);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && td_str_endswith(r, "abc"), "%s", r);
    free(r);
    /* framing a server cannot trust: refused */
    static const char *const bad[] = {
        ("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
         "3\r\nabc\r\n0\r\n\r\n"),
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
        "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: something\r\nContent-Length: 1\r\n\r\na",
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        r = roundtrip(bad[i], strlen(bad[i]));
        ck_assert_msg((td_str_startswith(r, "HTTP/1.1 400 ") || td_str_startswith(r, "HTTP/1.1 417 ")) &&
                          strstr(r, "{\"error\":{\"message\":"),
                      "case %zu: %s", i, r);
        free(r);
    }
    assert_health_ok();
}
END_TEST

START_TEST(test_head_http10_halfclose)
{
    /* HEAD: the headers a GET would get, no body */
    const char head[] = "HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char *r = roundtrip(head, sizeof(head) - 1);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && strstr(r, "content-length: 3\r\n") &&
                      td_str_endswith(r, "\r\n\r\n"),
                  "%s", r);
    free(r);
    /* HTTP/1.0: a stream is sent unframed and ended by the close */
    const char old[] = "GET /sse HTTP/1.0\r\n\r\n";
    r = roundtrip(old, sizeof(old) - 1);
    ck_assert_msg(td_str_startswith(r, "HTTP/1.1 200 OK\r\n") && !strstr(r, "transfer-encoding") &&
                      td_str_endswith(r, "\r\n\r\ndata: {\"i\":0}\n\ndata: {\"i\":1}\n\n"
                                         "data: {\"i\":2}\n\n"),
                  "%s", r);
    free(r);
    /* HTTP/1.0 keep-alive on request */
    int fd = dial();
    const char ka[] = "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    ck_assert_int_eq(write(fd, ka, sizeof(ka) - 1), (ssize_t)sizeof(ka) - 1);
    r = read_responses(fd, 1);
    ck_assert_msg(strstr(r, "connection: keep-alive\r\n") && td_str_endswith(r, "ok\n"), "%s", r);
    free(r);
    close(fd);
    /* a client that sends two requests and shuts its side gets both answers, then the close */
    fd = dial();
    const char two[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(write(fd, two, sizeof(two) - 1), (ssize_t)sizeof(two) - 1);
    shutdown(fd, SHUT_WR);
    r = read_all(fd);
    close(fd);
    ck_assert_msg(count(r, "HTTP/1.1 200 OK\r\n") == 2, "%s", r);
    free(r);
}
END_TEST

START_TEST(test_watch_sees_close)
{
    /* a watched request whose client leaves: its owner is told (reading never stops) */
    int before = atomic_load(&gone);
    int fd = dial();
    const char req[] = "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    usleep(20000);
    ck_assert_int_eq(atomic_load(&gone), before);
    close(fd);
    for (int i = 0; i < 500 && atomic_load(&gone) == before; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&gone), before + 1);
    assert_health_ok();
}
END_TEST


START_TEST(test_pipelined_backlog)
{
    /* a stream, then more pipelined requests than a connection buffers while one is handled
     * (a head's 64 KiB plus max_body): reading pauses, resumes after the stream, and every
     * request is answered in order */
    enum { N = 3000 };
    td_buf_t b;
    td_buf_init(&b);
    td_buf_printf(&b, "GET /sse HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < N; i++)
        td_buf_printf(&b, "GET /health?i=%d HTTP/1.1\r\nHost: x\r\n%s\r\n", i,
                      i == N - 1 ? "Connection: close\r\n" : "");
    ck_assert_uint_gt(b.len, (64u << 10) + 1024);
    int fd = dial();
    /* sent without blocking, reading what comes back meanwhile: the server answers while the
     * client is still sending */
    size_t off = 0;
    td_buf_t got;
    td_buf_init(&got);
    char tmp[65536];
    while (off < b.len) {
        ssize_t w = send(fd, b.data + off, b.len - off, MSG_DONTWAIT);
        if (w > 0)
            off += (size_t)w;
        ssize_t r = recv(fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        if (r > 0)
            td_buf_append(&got, tmp, (size_t)r);
        if (w <= 0 && r <= 0)
            usleep(1000);
    }
    char *rest = read_all(fd);
    close(fd);
    td_buf_append_str(&got, rest);
    free(rest);
    ck_assert_int_eq(count(got.data, "HTTP/1.1 200 OK\r\n"), N + 1);
    ck_assert_int_eq(count(got.data, "\r\n\r\nok\n"), N);
    ck_assert_ptr_nonnull(strstr(got.data, "text/event-stream"));
    ck_assert(strstr(got.data, "text/event-stream") < strstr(got.data, "\r\n\r\nok\n"));
    ck_assert(td_str_endswith(got.data, "ok\n"));
    td_buf_free(&got);
    td_buf_free(&b);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* as every daemon does (td_daemon_start) */
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_routes_and_errors);
    tcase_add_test(tc, test_body_and_headers);
    tcase_add_test(tc, test_stream);
    tcase_add_test(tc, test_cancel_and_garbage);
    tcase_add_test(tc, test_oversize_body_then_next);
    tcase_add_test(tc, test_invalid_request_lines);
    tcase_add_test(tc, test_slowloris);
    tcase_add_test(tc, test_keepalive_and_pipelining);
    tcase_add_test(tc, test_chunked_body_and_expect);
    tcase_add_test(tc, test_head_http10_halfclose);
    tcase_add_test(tc, test_watch_sees_close);
    tcase_add_test(tc, test_pipelined_backlog);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
