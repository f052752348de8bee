/* sse_server.c: a scripted OpenAI-compatible SSE server with known delays, for the load
 * generator's tests and for bench/harness.sh. It answers /v1/completions and
 * /v1/chat/completions (streamed as vLLM frames them: chunked transfer, `data: {...}` events, a
 * final usage chunk when stream_options.include_usage, `data: [DONE]`), and non-streamed requests;
 * serves /metrics with its own TTFT histogram (vLLM's buckets under `tandem_`).
 *
 * Timing: the first token is written --ttft-ms after the request has been read whole, then one
 * token every --itl-ms; --tokens fixes the count (default: the request's max_tokens). The first
 * chunk carries "srv_ttft_us": the server's own request-to-first-chunk delay as measured right
 * before writing it, so a client can subtract it from its TTFT.
 *
 * Failures on purpose (--mode, applied to every request, or to every --fail-every'th one):
 *   500        HTTP 500 with an OpenAI error body
 *   drop       three tokens, then the connection is closed mid-stream
 *   garbage    a `data:` line that is not JSON
 *   nochoices  only a usage chunk and [DONE]
 *   badhttp    a malformed status line
 *   badchunk   a malformed chunk-size line
 *   close      close the connection without answering
 *   hang       never answer
 *   fuzz       a valid stream with random bytes mutated, cut or inserted (--seed)
 *
 * --api-key KEY: requests without "Authorization: Bearer KEY" get 401.
 * Prints "port N" on stdout once listening (--port 0 picks one). Exits on SIGTERM/SIGINT.
 * Test scaffolding: one thread, one libuv loop, no TLS, trusts its client. */
#include "td_error.h"
#include "td_metrics.h"
#include "td_util.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <uv.h>

typedef enum mode {
    M_OK,
    M_500,
    M_DROP,
    M_GARBAGE,
    M_NOCHOICES,
    M_BADHTTP,
    M_BADCHUNK,
    M_CLOSE,
    M_HANG,
    M_FUZZ
} mode_t_;

static const char *const MODE_NAMES[] = {"ok",      "500",      "drop",  "garbage", "nochoices",
                                         "badhttp", "badchunk", "close", "hang",    "fuzz"};

static struct {
    double ttft_ms, itl_ms;
    long tokens; /* < 0: the request's max_tokens */
    mode_t_ mode;
    long fail_every;
    uint64_t seed;
    const char *api_key; /* when set: requests without "Authorization: Bearer KEY" get 401 */
} cfg = {50, 20, -1, M_OK, 0, 1, NULL};

static uv_loop_t *loop;
static uv_tcp_t server;
static uv_signal_t sigs[2];
static uint64_t n_requests;
static td_metrics_t *metrics;
static td_metric_t *m_ttft, *m_gen, *m_prompt, *m_req;
static uint64_t rng_state;

typedef struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    td_buf_t in;  /* bytes of the request being read */
    td_buf_t out; /* bytes to write at the end of this event (one write per event) */
    int handles;
    bool closing, busy;
    /* the request being answered */
    bool chat, stream, usage;
    mode_t_ mode;
    long total, sent; /* tokens to send / sent */
    long prompt_tokens;
    uint64_t t_recv; /* monotonic ns when the request was read whole */
} conn_t;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void freed(uv_handle_t *h)
{
    conn_t *c = h->data;
    if (--c->handles == 0) {
        td_buf_free(&c->in);
        td_buf_free(&c->out);
        free(c);
    }
}

static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    if (c->out.len) { /* what was queued before a scripted close still goes out, best effort */
        uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
        uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        td_buf_reset(&c->out);
    }
    c->closing = true;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, freed);
    uv_close((uv_handle_t *)&c->tcp, freed);
}

typedef struct wreq {
    uv_write_t w;
    char data[];
} wreq_t;

static void write_done(uv_write_t *w, int status)
{
    free(w);
}

/* Write everything queued in c->out: try_write first (no copy), queue a copy of the rest. */
static void flush(conn_t *c)
{
    size_t n = c->out.len;
    if (c->closing || n == 0)
        return;
    const char *p = c->out.data;
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    int k = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    td_buf_reset(&c->out);
    if (k == (int)n)
        return;
    if (k < 0 && k != UV_EAGAIN) {
        conn_close(c);
        return;
    }
    size_t done = k > 0 ? (size_t)k : 0;
    wreq_t *w = malloc(sizeof(*w) + n - done);
    if (!w) {
        conn_close(c);
        return;
    }
    memcpy(w->data, p + done, n - done);
    b = uv_buf_init(w->data, (unsigned)(n - done));
    if (uv_write(&w->w, (uv_stream_t *)&c->tcp, &b, 1, write_done) != 0) {
        free(w);
        conn_close(c);
    }
}

/* Queue `n` bytes; flush() writes them. */
static void send_bytes(conn_t *c, const char *p, size_t n)
{
    if (!c->closing)
        td_buf_append(&c->out, p, n);
}

/* One chunk of the chunked body; in fuzz mode the bytes are mutated first. */
static void send_chunk(conn_t *c, const char *p, size_t n)
{
    char buf[4096];
    if (n + 32 > sizeof(buf))
        return;
    int h = snprintf(buf, sizeof(buf), "%zx\r\n", n);
    memcpy(buf + h, p, n);
    memcpy(buf + h + n, "\r\n", 2);
    size_t len = (size_t)h + n + 2;
    if (c->mode == M_FUZZ && rnd() % 3 == 0) {
        switch (rnd() % 4) {
        case 0:
            buf[rnd() % len] = (char)rnd();
            break; /* flip a byte */
        case 1:
            len = rnd() % len;
            break; /* cut */
        case 2:
            buf[rnd() % len] = "{}[]\":,\\\n\r"[rnd() % 11];
            break;
        case 3:
            if (len + 8 < sizeof(buf)) {
                memmove(buf + 8, buf, len);
                memcpy(buf, "ZZ\r\n{\"\n\n", 8);
                len += 8;
            }
            break;
        }
    }
    send_bytes(c, buf, len);
}

static void send_event(conn_t *c, const char *json)
{
    char ev[4000];
    int n = snprintf(ev, sizeof(ev), "data: %s\n\n", json);
    if (n > 0 && (size_t)n < sizeof(ev))
        send_chunk(c, ev, (size_t)n);
}

static void finish_request(conn_t *c)
{
    c->busy = false;
    td_buf_reset(&c->in);
}

static void tick(uv_timer_t *t);

static void token_json(conn_t *c, long i, char *out, size_t n, uint64_t now)
{
    char extra[128] = "";
    if (i == 0)
        snprintf(extra, sizeof(extra),
                 ",\"srv_ttft_us\":%llu,\"srv_recv_ns\":%llu,\"srv_send_ns\":%llu",
                 (unsigned long long)((now - c->t_recv) / 1000), (unsigned long long)c->t_recv,
                 (unsigned long long)now);
    const char *fin = i + 1 == c->total ? "\"length\"" : "null";
    if (c->chat)
        snprintf(out, n,
                 "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                 "\"model\":\"sse\",\"choices\":[{\"index\":0,\"delta\":{%s\"content\":\" "
                 "w\\u00f6rd%ld\"},\"logprobs\":null,\"finish_reason\":%s}]%s%s}",
                 i == 0 ? "\"role\":\"assistant\"," : "", i, fin, c->usage ? ",\"usage\":null" : "",
                 extra);
    else
        snprintf(
            out, n,
            "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"sse\","
            "\"choices\":[{\"index\":0,\"text\":\" w\\u00f6rd%ld\",\"logprobs\":null,"
            "\"finish_reason\":%s,\"stop_reason\":null}]%s%s}",
            i, fin, c->usage ? ",\"usage\":null" : "", extra);
}

static void end_stream(conn_t *c)
{
    char js[512];
    if (c->usage || c->mode == M_NOCHOICES) {
        snprintf(js, sizeof(js),
                 "{\"id\":\"cmpl-1\",\"object\":\"%s\",\"created\":0,\"model\":\"sse\","
                 "\"choices\":[],\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld,"
                 "\"completion_tokens\":%ld}}",
                 c->chat ? "chat.completion.chunk" : "text_completion", c->prompt_tokens,
                 c->prompt_tokens + c->sent, c->sent);
        send_event(c, js);
    }
    send_event(c, "[DONE]");
    if (c->mode == M_FUZZ && rnd() % 4 == 0) {
        conn_close(c);
        return;
    }
    send_bytes(c, "0\r\n\r\n", 5);
    td_metric_add(m_gen, (double)c->sent);
    td_metric_add(m_prompt, (double)c->prompt_tokens);
    finish_request(c);
}

static void tick_body(conn_t *c)
{
    uint64_t now = td_now_ns();
    if (c->mode == M_NOCHOICES) {
        end_stream(c);
        return;
    }
    if (c->sent == 0) {
        td_metric_observe(m_ttft, (double)(now - c->t_recv) * 1e-9);
        if (c->mode == M_GARBAGE) {
            send_event(c, "{\"choices\": [{\"text\": \"x\"}], oops");
            send_bytes(c, "0\r\n\r\n", 5);
            finish_request(c);
            return;
        }
        if (c->mode == M_BADCHUNK) {
            send_bytes(c, "zz\r\nhello\r\n", 11);
            finish_request(c);
            return;
        }
    }
    if (c->mode == M_DROP && c->sent == 3) {
        conn_close(c);
        return;
    }
    if (!c->stream) {
        char body[1024], head[256];
        int n =
            snprintf(body, sizeof(body),
                     c->chat ? "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\","
                               "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                               "\"content\":\" w\\u00f6rd0 and more\"},\"finish_reason\":"
                               "\"length\"}],\"usage\":{\"prompt_tokens\":%ld,"
                               "\"completion_tokens\":%ld,\"total_tokens\":%ld}}"
                             : "{\"id\":\"cmpl-1\",\"object\":\"text_completion\","
                               "\"choices\":[{\"index\":0,\"text\":\" w\\u00f6rd0 and more\","
                               "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":%ld,"
                               "\"completion_tokens\":%ld,\"total_tokens\":%ld}}",
                     c->prompt_tokens, c->total, c->prompt_tokens + c->total);
        int h = snprintf(head, sizeof(head),
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: %d\r\n\r\n",
                         n);
        send_bytes(c, head, (size_t)h);
        send_bytes(c, body, (size_t)n);
        td_metric_add(m_gen, (double)c->total);
        finish_request(c);
        return;
    }
    char js[1024];
    token_json(c, c->sent, js, sizeof(js), now);
    send_event(c, js);
    c->sent++;
    if (c->sent >= c->total) {
        end_stream(c);
        return;
    }
    uv_update_time(loop); /* the gap counts from this send, even when the loop runs late */
    uv_timer_start(&c->timer, tick, (uint64_t)cfg.itl_ms, 0);
}

static void tick(uv_timer_t *t)
{
    conn_t *c = t->data;
    tick_body(c);
    flush(c);
}

static long json_int(const char *body, const char *key, long dflt)
{
    const char *p = strstr(body, key);
    if (!p)
        return dflt;
    p = strchr(p + strlen(key), ':');
    return p ? strtol(p + 1, NULL, 10) : dflt;
}

static void metrics_answer(conn_t *c)
{
    td_buf_t body, out;
    td_buf_init(&body);
    td_buf_init(&out);
    td_metrics_render(metrics, &body);
    td_buf_printf(&out,
                  "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                  "Content-Length: %zu\r\n\r\n",
                  body.len);
    td_buf_append(&out, body.data, body.len);
    send_bytes(c, out.data, out.len);
    td_buf_free(&body);
    td_buf_free(&out);
    finish_request(c);
}

/* A whole request is in c->in: [0, head_len) head, then `blen` body bytes. */
static void handle(conn_t *c, size_t head_len, size_t blen)
{
    const char *req = c->in.data;
    c->busy = true;
    c->t_recv = td_now_ns();
    if (td_str_startswith(req, "GET /metrics")) {
        metrics_answer(c);
        return;
    }
    char *body = td_strndup(req + head_len, blen);
    if (!body) {
        conn_close(c);
        return;
    }
    if (cfg.api_key) {
        char want[300];
        snprintf(want, sizeof(want), "\r\nAuthorization: Bearer %s\r\n", cfg.api_key);
        char *head = td_strndup(req, head_len);
        bool ok = head && strstr(head, want);
        free(head);
        if (!ok) {
            static const char err[] = "{\"error\":{\"message\":\"bad api key\","
                                      "\"type\":\"invalid_request_error\",\"code\":401}}";
            char h401[200];
            int h = snprintf(h401, sizeof(h401),
                             "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                             "Content-Length: %zu\r\n\r\n",
                             sizeof(err) - 1);
            send_bytes(c, h401, (size_t)h);
            send_bytes(c, err, sizeof(err) - 1);
            free(body);
            finish_request(c);
            return;
        }
    }
    uint64_t idx = n_requests++;
    td_metric_add(m_req, 1);
    c->mode = cfg.fail_every > 0 && (idx + 1) % (uint64_t)cfg.fail_every != 0 ? M_OK : cfg.mode;
    if (cfg.mode == M_FUZZ)
        c->mode = M_FUZZ;
    c->chat =
        strstr(req, "/chat/completions") != NULL && strstr(req, "/chat/completions") < req + 64;
    c->stream = strstr(body, "\"stream\": true") || strstr(body, "\"stream\":true");
    c->usage = strstr(body, "\"include_usage\": true") || strstr(body, "\"include_usage\":true");
    long mt = json_int(body, c->chat ? "\"max_completion_tokens\"" : "\"max_tokens\"", 16);
    if (c->chat && !strstr(body, "\"max_completion_tokens\""))
        mt = json_int(body, "\"max_tokens\"", 16);
    c->total = cfg.tokens >= 0 ? cfg.tokens : mt;
    if (c->total < 1)
        c->total = 1;
    c->sent = 0;
    c->prompt_tokens = 1;
    for (const char *p = body; *p; p++)
        c->prompt_tokens += *p == ' ';
    free(body);
    switch (c->mode) {
    case M_500: {
        static const char err[] = "{\"error\":{\"message\":\"scripted failure\",\"type\":"
                                  "\"server_error\",\"code\":500}}";
        char head[200];
        int h = snprintf(head, sizeof(head),
                         "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\n\r\n",
                         sizeof(err) - 1);
        send_bytes(c, head, (size_t)h);
        send_bytes(c, err, sizeof(err) - 1);
        finish_request(c);
        return;
    }
    case M_BADHTTP:
        send_bytes(c, "HTTP/1.1 OK maybe\r\n\r\n", 21);
        conn_close(c);
        return;
    case M_CLOSE:
        conn_close(c);
        return;
    case M_HANG:
        return;
    default:
        break;
    }
    if (c->stream) {
        static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
        send_bytes(c, head, sizeof(head) - 1);
    }
    double delay = c->stream ? cfg.ttft_ms : cfg.ttft_ms + cfg.itl_ms * (double)(c->total - 1);
    uv_update_time(loop);
    uv_timer_start(&c->timer, tick, (uint64_t)(delay + 0.5), 0);
}

static void try_parse(conn_t *c)
{
    if (c->busy || c->closing)
        return;
    const char *end = c->in.data ? strstr(c->in.data, "\r\n\r\n") : NULL;
    if (!end) {
        if (c->in.len > 65536)
            conn_close(c);
        return;
    }
    size_t head_len = (size_t)(end - c->in.data) + 4;
    long cl = 0;
    for (const char *p = c->in.data; p < end; p++)
        if ((*p == 'C' || *p == 'c') && strncasecmp(p, "content-length:", 15) == 0) {
            cl = strtol(p + 15, NULL, 10);
            break;
        }
    if (cl < 0 || cl > 64 * 1024 * 1024) {
        conn_close(c);
        return;
    }
    if (c->in.len < head_len + (size_t)cl)
        return;
    handle(c, head_len, (size_t)cl);
    /* a stream's head goes out with its first chunk: one write, as a busy server's would */
    if (!(c->busy && c->stream && c->mode != M_500))
        flush(c);
}

static void on_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
    static char buf[65536];
    b->base = buf;
    b->len = sizeof(buf);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    conn_t *c = s->data;
    if (n < 0) {
        conn_close(c);
        return;
    }
    if (n == 0)
        return;
    if (c->busy) /* pipelined bytes: this server answers one request at a time */
        return;
    td_buf_append(&c->in, b->base, (size_t)n);
    try_parse(c);
}

static void on_conn(uv_stream_t *srv, int status)
{
    if (status != 0)
        return;
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    td_buf_init(&c->in);
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    c->handles = 2;
    if (uv_accept(srv, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_signal(uv_signal_t *s, int sig)
{
    uv_stop(loop);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"port", 1, 0, 'p'},   {"ttft-ms", 1, 0, 't'}, {"itl-ms", 1, 0, 'i'},
        {"tokens", 1, 0, 'n'}, {"mode", 1, 0, 'm'},    {"fail-every", 1, 0, 'f'},
        {"seed", 1, 0, 's'},   {"api-key", 1, 0, 'k'}, {0, 0, 0, 0}};
    int port = 0, c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'p':
            port = atoi(optarg);
            break;
        case 't':
            cfg.ttft_ms = atof(optarg);
            break;
        case 'i':
            cfg.itl_ms = atof(optarg);
            break;
        case 'n':
            cfg.tokens = atol(optarg);
            break;
        case 'f':
            cfg.fail_every = atol(optarg);
            break;
        case 's':
            cfg.seed = strtoull(optarg, NULL, 10);
            break;
        case 'k':
            cfg.api_key = optarg;
            break;
        case 'm': {
            size_t k = 0;
            while (k < TD_ARRAY_LEN(MODE_NAMES) && strcmp(optarg, MODE_NAMES[k]) != 0)
                k++;
            if (k == TD_ARRAY_LEN(MODE_NAMES)) {
                fprintf(stderr, "sse_server: unknown --mode %s\n", optarg);
                return 2;
            }
            cfg.mode = (mode_t_)k;
            break;
        }
        default:
            fprintf(stderr, "usage: sse_server [--port N] [--ttft-ms MS] [--itl-ms MS] "
                            "[--tokens N] [--mode MODE] [--fail-every K] [--seed N] "
                            "[--api-key KEY]\n");
            return 2;
        }
    }
    rng_state = cfg.seed;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    metrics = td_metrics_new("tandem_", "role=\"sse_server\"");
    m_ttft = td_metrics_histogram(metrics, "time_to_first_token_seconds",
                                  "request read to first chunk written", NULL, td_buckets_ttft,
                                  td_buckets_ttft_n);
    m_gen = td_metrics_counter(metrics, "generation_tokens_total", "tokens sent", NULL);
    m_prompt = td_metrics_counter(metrics, "prompt_tokens_total", "prompt words", NULL);
    m_req = td_metrics_counter(metrics, "requests_total", "requests", NULL);
    loop = uv_default_loop();
    uv_tcp_init(loop, &server);
    struct sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", port, &addr);
    if (uv_tcp_bind(&server, (const struct sockaddr *)&addr, 0) != 0 ||
        uv_listen((uv_stream_t *)&server, 4096, on_conn) != 0) {
        fprintf(stderr, "sse_server: cannot listen on port %d\n", port);
        return 1;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    uv_tcp_getsockname(&server, (struct sockaddr *)&ss, &len);
    printf("port %d\n", ntohs(((struct sockaddr_in *)&ss)->sin_port));
    fflush(stdout);
    uv_signal_init(loop, &sigs[0]);
    uv_signal_start(&sigs[0], on_signal, SIGTERM);
    uv_signal_init(loop, &sigs[1]);
    uv_signal_start(&sigs[1], on_signal, SIGINT);
    uv_run(loop, UV_RUN_DEFAULT);
    fprintf(stderr, "sse_server: %llu requests\n", (unsigned long long)n_requests);
    td_metrics_free(metrics);
    return 0;
}
