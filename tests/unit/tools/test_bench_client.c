/* test_bench_client.c: the load generator's HTTP/SSE client against the scripted server
 * (tests/integration/sse_server.c, path in $TD_SSE_SERVER) with known delays: TTFT/TPOT/ITL
 * within tolerance, keep-alive reuse, every failure kind counted, malformed and fuzzed responses
 * without a crash, the server's /metrics view, and `tandem bench` end to end ($TD_TANDEM), a
 * Mooncake trace replay included. */
#include "bench.h"
#include "td_check.h"
#include "td_error.h"

#include <check.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

typedef struct server {
    pid_t pid;
    int port;
} server_t;

/* Start sse_server with `args` (NULL-terminated); waits for its "port N" line. */
static void server_start(server_t *s, const char *const *args)
{
    const char *path = getenv("TD_SSE_SERVER");
    ck_assert_msg(path != NULL, "TD_SSE_SERVER is not set");
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    const char *argv[32] = {path};
    size_t n = 1;
    for (; args && args[n - 1]; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    s->pid = fork();
    ck_assert_int_ge(s->pid, 0);
    if (s->pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execv(path, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    ck_assert_int_eq(fscanf(f, "port %d", &s->port), 1);
    fclose(f);
}

static void server_stop(server_t *s)
{
    kill(s->pid, SIGTERM);
    int st;
    waitpid(s->pid, &st, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

typedef struct harness {
    uv_loop_t loop;
    void *impl;
    size_t done;
} harness_t;

/* Send `n` requests (all at once, at most `conc` in flight: the rest are sent as earlier ones
 * finish) to `port` and wait for every callback. */
typedef struct batch {
    harness_t h;
    td_bench_result_t *r;
    size_t n, sent, conc;
    td_bench_request_t req;
    uint64_t t0;
} batch_t;

static void batch_done(td_bench_result_t *r, void *arg)
{
    batch_t *b = arg;
    b->h.done++;
    if (b->h.done == b->n)
        uv_stop(&b->h.loop); /* idle keep-alive connections keep the loop alive */
    while (b->sent < b->n && b->sent - b->h.done < b->conc) {
        td_bench_result_init(&b->r[b->sent]);
        ck_assert_int_eq(td_bench_backend_http.submit(b->h.impl, &b->req, b->t0, &b->r[b->sent]),
                         0);
        b->sent++;
    }
}

/* Time chunks when the loop reads them instead of kernel receive timestamps. */
static bool g_app_timestamps;

static td_bench_result_t *run_batch(int port, bool chat, bool stream, size_t n, size_t conc,
                                    double timeout_s, int64_t max_tokens)
{
    batch_t b = {0};
    b.r = calloc(n, sizeof(td_bench_result_t));
    b.n = n;
    b.conc = conc;
    b.req = (td_bench_request_t){
        "m",   "hello there world", "[{\"role\": \"user\", \"content\": \"hi\"}]", max_tokens, true,
        stream};
    uv_loop_init(&b.h.loop);
    td_bench_target_t t = {
        "127.0.0.1",     port,      chat ? "/v1/chat/completions" : "/v1/completions",
        "sk-test",       timeout_s, chat,
        g_app_timestamps};
    b.h.impl = td_bench_backend_http.open(&b.h.loop, &t, batch_done, &b);
    ck_assert_ptr_nonnull(b.h.impl);
    b.t0 = td_now_ns();
    while (b.sent < n && b.sent < conc) {
        td_bench_result_init(&b.r[b.sent]);
        ck_assert_int_eq(td_bench_backend_http.submit(b.h.impl, &b.req, b.t0, &b.r[b.sent]), 0);
        b.sent++;
    }
    uv_run(&b.h.loop, UV_RUN_DEFAULT);
    ck_assert_uint_eq(b.h.done, n);
    td_bench_backend_http.close(b.h.impl);
    uv_run(&b.h.loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&b.h.loop), 0);
    return b.r;
}

static void free_results(td_bench_result_t *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        td_bench_result_free(&r[i]);
    free(r);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

START_TEST(test_known_delays)
{
    /* TTFT 50 ms, then 10 tokens 20 ms apart: TTFT ~50 ms, 9 ITLs of ~20 ms, TPOT ~20 ms.
     * Lower bounds are hard (the server never sends early); upper bounds and the middle of the
     * distribution get slack because this 2-core machine is shared and a process can stall. */
    server_t s;
    const char *args[] = {"--ttft-ms", "50", "--itl-ms", "20", "--tokens", "10", NULL};
    server_start(&s, args);
    for (int mode = 0; mode < 4; mode++) {
        int chat = mode & 1;
        g_app_timestamps = mode >= 2; /* kernel receive timestamps, then the loop's read time */
        const size_t n = 8;
        td_bench_result_t *r = run_batch(s.port, chat, true, n, 4, 10, 10);
        double ttfts[8], tpots[8], itls[8 * 9];
        size_t itl_n = 0;
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(r[i].err == TD_BENCH_OK, "request %zu: %s", i, r[i].error);
            ck_assert_int_eq(r[i].http_status, 200);
            ck_assert_msg(r[i].ttft >= 0.048, "ttft %g", r[i].ttft); /* uv timers: whole ms */
            ck_assert_int_eq(r[i].usage_completion_tokens, 10);
            ck_assert_int_eq(r[i].n_chunks, 10);
            ck_assert_uint_eq(r[i].n_itl, 9);
            double sum = 0;
            for (size_t k = 0; k < r[i].n_itl; k++) {
                ck_assert(r[i].itl[k] >= 0);
                sum += r[i].itl[k];
                itls[itl_n++] = r[i].itl[k];
            }
            /* the ITLs span exactly first chunk to last chunk */
            ck_assert_double_eq_tol(sum, r[i].latency - r[i].ttft, 1e-9);
            ttfts[i] = r[i].ttft;
            tpots[i] = (r[i].latency - r[i].ttft) / 9;
            /* the server's own delay is inside the client's TTFT */
            ck_assert(r[i].srv_ttft >= 0.048 && r[i].srv_ttft <= r[i].ttft);
            ck_assert_ptr_nonnull(strstr(r[i].text.data, " w\xc3\xb6rd0 w\xc3\xb6rd1"));
            ck_assert_ptr_nonnull(strstr(r[i].text.data, "rd9"));
        }
        double mt = median(ttfts, n), mp = median(tpots, n), mi = median(itls, itl_n);
        ck_assert_msg(mt >= 0.048 && mt < 0.100, "median ttft %g", mt);
        ck_assert_msg(mp >= 0.018 && mp < 0.040, "median tpot %g", mp);
        ck_assert_msg(mi >= 0.015 && mi < 0.040, "median itl %g", mi);
        free_results(r, n);
    }
    g_app_timestamps = false;
    /* not streamed: TTFT = E2EL = the whole answer's time, usage from the body */
    td_bench_result_t *r = run_batch(s.port, false, false, 2, 2, 10, 10);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r[i].err == TD_BENCH_OK, "%s", r[i].error);
        ck_assert(r[i].ttft == r[i].latency && r[i].latency >= 0.049 + 9 * 0.019);
        ck_assert_int_eq(r[i].usage_completion_tokens, 10);
        ck_assert_ptr_nonnull(strstr(r[i].text.data, "and more"));
    }
    free_results(r, 2);
    server_stop(&s);
}
END_TEST

START_TEST(test_keepalive_reuse)
{
    server_t s;
    const char *args[] = {"--ttft-ms", "0", "--itl-ms", "0", "--tokens", "2", NULL};
    server_start(&s, args);
    /* 50 requests one at a time reuse one connection */
    batch_t b = {0};
    td_bench_result_t r[50];
    b.r = r;
    b.n = 50;
    b.conc = 1;
    b.req = (td_bench_request_t){"m", "p", NULL, 2, false, true};
    uv_loop_init(&b.h.loop);
    td_bench_target_t t = {"127.0.0.1", s.port, "/v1/completions", NULL, 10, false};
    td_bench_client_t *cl = td_bench_client_new(&b.h.loop, &t, batch_done, &b);
    ck_assert_ptr_nonnull(cl);
    /* drive the raw client: bodies by hand */
    td_buf_t body;
    td_buf_init(&body);
    ck_assert_int_eq(td_bench_http_body(&b.req, false, &body), 0);
    size_t peak = 0;
    for (size_t i = 0; i < 50; i++) {
        td_bench_result_init(&r[i]);
        size_t before = b.h.done;
        ck_assert_int_eq(td_bench_client_submit(cl, body.data, body.len, true, td_now_ns(), &r[i]),
                         0);
        while (b.h.done == before)
            uv_run(&b.h.loop, UV_RUN_ONCE);
        peak = TD_MAX(peak, td_bench_client_conns(cl));
        ck_assert_msg(r[i].err == TD_BENCH_OK, "%s", r[i].error);
    }
    ck_assert_uint_eq(peak, 1);
    td_bench_client_close(cl);
    uv_run(&b.h.loop, UV_RUN_DEFAULT);
    uv_loop_close(&b.h.loop);
    for (size_t i = 0; i < 50; i++)
        td_bench_result_free(&r[i]);
    td_buf_free(&body);
    server_stop(&s);
}
END_TEST

static void expect_all(const char *mode, td_bench_err_t kind, const char *msg_part,
                       double timeout_s)
{
    server_t s;
    const char *args[] = {"--ttft-ms", "1", "--itl-ms", "1", "--tokens", "6", "--mode", mode, NULL};
    server_start(&s, args);
    td_bench_result_t *r = run_batch(s.port, false, true, 6, 3, timeout_s, 6);
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(r[i].err == kind, "mode %s: request %d: kind %s (%s)", mode, i,
                      td_bench_err_name(r[i].err), r[i].error ? r[i].error : "");
        ck_assert_ptr_nonnull(r[i].error);
        ck_assert_msg(strstr(r[i].error, msg_part), "mode %s: message \"%s\"", mode, r[i].error);
    }
    free_results(r, 6);
    server_stop(&s);
}

START_TEST(test_failure_kinds)
{
    expect_all("500", TD_BENCH_ERR_HTTP, "HTTP 500", 10);
    expect_all("drop", TD_BENCH_ERR_STREAM, "mid-response", 10);
    expect_all("garbage", TD_BENCH_ERR_STREAM, "SSE data", 10);
    expect_all("nochoices", TD_BENCH_ERR_STREAM, "never received", 10);
    expect_all("badhttp", TD_BENCH_ERR_STREAM, "status line", 10);
    expect_all("badchunk", TD_BENCH_ERR_STREAM, "chunk size", 10);
    expect_all("close", TD_BENCH_ERR_CONNECT, "before a response", 10);
    expect_all("hang", TD_BENCH_ERR_TIMEOUT, "no complete response", 0.2);

    /* half the requests fail: both halves are counted */
    server_t s;
    const char *args[] = {"--ttft-ms", "1",   "--itl-ms",     "1", "--tokens", "3",
                          "--mode",    "500", "--fail-every", "2", NULL};
    server_start(&s, args);
    td_bench_result_t *r = run_batch(s.port, false, true, 20, 4, 10, 3);
    const double p[] = {99};
    td_bench_metrics_t m;
    ck_assert_int_eq(td_bench_metrics_compute(r, 20, 1.0, p, 1, NULL, &m), 0);
    ck_assert_uint_eq(m.completed + m.failed, 20);
    ck_assert_uint_eq(m.failed_by_kind[TD_BENCH_ERR_HTTP], 10);
    free_results(r, 20);
    server_stop(&s);

    /* the Bearer key reaches the server: the right one passes, a wrong one is a 401 */
    const char *kargs[] = {"--ttft-ms", "1",         "--itl-ms", "1", "--tokens",
                           "2",         "--api-key", "sk-test",  NULL};
    server_start(&s, kargs);
    r = run_batch(s.port, false, true, 2, 2, 10, 2); /* run_batch sends "sk-test" */
    for (int i = 0; i < 2; i++)
        ck_assert_msg(r[i].err == TD_BENCH_OK, "%s", r[i].error);
    free_results(r, 2);
    server_stop(&s);
    const char *wargs[] = {"--ttft-ms", "1",         "--itl-ms", "1", "--tokens",
                           "2",         "--api-key", "sk-other", NULL};
    server_start(&s, wargs);
    r = run_batch(s.port, false, true, 2, 2, 10, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(r[i].err, TD_BENCH_ERR_HTTP);
        ck_assert_int_eq(r[i].http_status, 401);
    }
    free_results(r, 2);
    server_stop(&s);

    /* nothing listening: connect errors */
    int port = s.port; /* the server is gone */
    r = run_batch(port, false, true, 3, 3, 10, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(r[i].err, TD_BENCH_ERR_CONNECT);
    free_results(r, 3);
}
END_TEST

START_TEST(test_fuzzed_responses)
{
    /* valid streams with random bytes flipped, cut or inserted: every request ends with a
     * result, successes are sane, failures carry a kind and a message */
    for (int seed = 1; seed <= 3; seed++) {
        char sd[16];
        snprintf(sd, sizeof(sd), "%d", seed);
        server_t s;
        const char *args[] = {"--ttft-ms", "0",    "--itl-ms", "0", "--tokens", "5",
                              "--mode",    "fuzz", "--seed",   sd,  NULL};
        server_start(&s, args);
        const size_t n = 150;
        td_bench_result_t *r = run_batch(s.port, seed == 2, true, n, 8, 2, 5);
        size_t ok = 0, bad = 0;
        for (size_t i = 0; i < n; i++) {
            if (r[i].err == TD_BENCH_OK) {
                ok++;
                ck_assert(r[i].ttft >= 0 && r[i].latency >= r[i].ttft && r[i].n_chunks >= 1);
            } else {
                bad++;
                ck_assert(r[i].err > TD_BENCH_OK && r[i].err < TD_BENCH_ERR_N_);
                ck_assert_ptr_nonnull(r[i].error);
            }
        }
        ck_assert_uint_eq(ok + bad, n);
        ck_assert_uint_gt(bad, 0); /* the mutations do hit */
        free_results(r, n);
        server_stop(&s);
    }
}
END_TEST

START_TEST(test_server_metrics_agree)
{
    /* client TTFT against the server's own histogram: same bucket (vLLM's TTFT buckets put
     * 50 ms in (40, 60] ms) */
    server_t s;
    const char *args[] = {"--ttft-ms", "50", "--itl-ms", "5", "--tokens", "3", NULL};
    server_start(&s, args);
    td_bench_scrape_t before, after, d;
    ck_assert_int_eq(td_bench_scrape_fetch("127.0.0.1", s.port, NULL, &before), 0);
    td_bench_result_t *r = run_batch(s.port, false, true, 20, 10, 10, 3);
    ck_assert_int_eq(td_bench_scrape_fetch("127.0.0.1", s.port, NULL, &after), 0);
    td_bench_scrape_diff(&before, &after, &d);
    ck_assert_double_eq_tol(d.ttft.total, 20, 1e-9);
    ck_assert_double_eq_tol(d.generation_tokens, 60, 1e-9);
    const double p[] = {50};
    td_bench_metrics_t m;
    td_bench_metrics_compute(r, 20, 1.0, p, 1, NULL, &m);
    ck_assert_uint_eq(m.completed, 20);
    double srv_med = td_bench_hist_quantile(&d.ttft, 0.5);
    /* the bucket that holds the server's median */
    double lo = 0, hi = INFINITY;
    for (size_t i = 0; i < d.ttft.n; i++)
        if (d.ttft.le[i] >= srv_med) {
            hi = d.ttft.le[i];
            lo = i ? d.ttft.le[i - 1] : 0;
            break;
        }
    ck_assert_msg(m.ttft.median > lo && m.ttft.median <= hi + 0.005,
                  "client median %g outside the server's bucket (%g, %g]", m.ttft.median, lo, hi);
    ck_assert_double_eq_tol(d.ttft.sum / d.ttft.total, m.ttft.mean, 0.05);
    free_results(r, 20);
    server_stop(&s);
}
END_TEST

static int run_cmd(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_cli_end_to_end)
{
    const char *tandem = getenv("TD_TANDEM");
    ck_assert_msg(tandem != NULL, "TD_TANDEM is not set");
    server_t s;
    const char *args[] = {"--ttft-ms", "5", "--itl-ms", "2", "--tokens", "4", NULL};
    server_start(&s, args);
    char dir[] = "/tmp/td_bench_cliXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s bench --base-url http://127.0.0.1:%d --num-prompts 30 --request-rate 50,inf "
             "--random-input-len 20 --random-output-len 4 --seed 1 --num-warmups 2 "
             "--max-concurrency 8 --goodput ttft:1000 tpot:500 --metric-percentiles 50,99 "
             "--scrape-metrics --save-detailed --result-file %s/r.json --html %s/r.html "
             "--no-progress > %s/out.txt 2>&1",
             tandem, s.port, dir, dir, dir);
    ck_assert_int_eq(run_cmd(cmd), 0);
    const char *files[] = {"r-qps50.json", "r-qpsinf.json"};
    for (int i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        json_object *o = json_object_from_file(path), *v;
        ck_assert_msg(o != NULL, "%s", path);
        ck_assert(json_object_object_get_ex(o, "completed", &v) && json_object_get_int(v) == 30);
        ck_assert(json_object_object_get_ex(o, "request_goodput", &v) &&
                  json_object_get_double(v) > 0);
        ck_assert(json_object_object_get_ex(o, "p50_ttft_ms", &v));
        ck_assert(json_object_object_get_ex(o, "ttfts", &v) && json_object_array_length(v) == 30);
        ck_assert(json_object_object_get_ex(o, "total_output_tokens", &v) &&
                  json_object_get_int(v) == 120);
        ck_assert(json_object_object_get_ex(o, "server_metrics", &v));
        json_object *k;
        ck_assert(json_object_object_get_ex(v, "ttft_count", &k) && json_object_get_int(k) == 30);
        ck_assert(json_object_object_get_ex(o, "mean_harness_added_ttft_ms", &v));
        /* --max-concurrency 8 holds */
        ck_assert(json_object_object_get_ex(o, "peak_inflight", &v));
        ck_assert_int_le(json_object_get_int(v), 8);
        ck_assert_int_ge(json_object_get_int(v), 1);
        json_object_put(o);
    }
    /* 50 req/s for 30 requests: the run takes about 30 / 50 s */
    json_object *o = json_object_from_file(
                    (snprintf(cmd, sizeof(cmd), "%s/r-qps50.json", dir), cmd)),
                *v;
    json_object_object_get_ex(o, "duration", &v);
    ck_assert_msg(json_object_get_double(v) > 0.55 && json_object_get_double(v) < 3.0, "%g",
                  json_object_get_double(v));
    json_object_put(o);
    char *html = NULL;
    size_t len;
    snprintf(cmd, sizeof(cmd), "%s/r.html", dir);
    ck_assert_int_eq(td_file_read_all(cmd, &html, &len), 0);
    ck_assert_ptr_nonnull(strstr(html, "Goodput") ? html : strstr(html, "goodput"));
    ck_assert_ptr_nonnull(strstr(html, "ITL over time"));
    free(html);
    /* multi-turn chat: each turn's prompt holds the earlier turns and answers */
    snprintf(cmd, sizeof(cmd),
             "%s bench --base-url http://127.0.0.1:%d --backend openai-chat --dataset-name "
             "multiturn --sessions 3 --turns 3 --prefix-question-len 4 --random-output-len 2 "
             "--request-rate 200 --save-detailed --result-file %s/m.json --no-progress "
             "> %s/out.txt 2>&1",
             tandem, s.port, dir, dir);
    ck_assert_int_eq(run_cmd(cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s/m.json", dir);
    o = json_object_from_file(cmd);
    ck_assert_ptr_nonnull(o);
    ck_assert(json_object_object_get_ex(o, "completed", &v) && json_object_get_int(v) == 9);
    ck_assert(json_object_object_get_ex(o, "input_lens", &v));
    int lens[9];
    for (int i = 0; i < 9; i++)
        lens[i] = json_object_get_int(json_object_array_get_idx(v, (size_t)i));
    for (int i = 0; i < 9; i++) /* 4 words, then + (4 + a 4-token answer) per earlier turn */
        ck_assert_msg(lens[i] == 4 + 8 * (i / 3), "input_lens[%d] = %d", i, lens[i]);
    json_object_put(o);
    /* shared-prefix groups, not streamed */
    snprintf(cmd, sizeof(cmd),
             "%s bench --base-url http://127.0.0.1:%d --dataset-name prefix --prefix-groups 2 "
             "--prefix-prompts-per-group 3 --prefix-system-len 20 --prefix-question-len 5 "
             "--random-output-len 3 --no-stream --result-file %s/p.json --no-progress "
             "> %s/out.txt 2>&1",
             tandem, s.port, dir, dir);
    ck_assert_int_eq(run_cmd(cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s/p.json", dir);
    o = json_object_from_file(cmd);
    ck_assert(json_object_object_get_ex(o, "completed", &v) && json_object_get_int(v) == 6);
    ck_assert(json_object_object_get_ex(o, "total_input_tokens", &v) &&
              json_object_get_int(v) == 6 * 25);
    json_object_put(o);
    /* a Mooncake trace: sent at its timestamps (x 0.5: 0, 0.1, 0.1, 0.4 s), prompts from its
     * hash ids (8 words per block, tails scaled); a finite rate rescales the same arrivals */
    snprintf(cmd, sizeof(cmd), "%s/t.jsonl", dir);
    FILE *tf = fopen(cmd, "w");
    ck_assert_ptr_nonnull(tf);
    fputs("{\"timestamp\": 1000, \"input_length\": 1024, \"output_length\": 3, "
          "\"hash_ids\": [0, 1]}\n"
          "{\"timestamp\": 1200, \"input_length\": 600, \"output_length\": 2, "
          "\"hash_ids\": [0, 2]}\n"
          "{\"timestamp\": 1200, \"input_length\": 10, \"output_length\": 2, "
          "\"hash_ids\": [0]}\n"
          "{\"timestamp\": 1800, \"input_length\": 1536, \"output_length\": 9, "
          "\"hash_ids\": [0, 1, 3]}\n",
          tf);
    fclose(tf);
    for (int pass = 0; pass < 2; pass++) {
        snprintf(cmd, sizeof(cmd),
                 "%s bench --base-url http://127.0.0.1:%d --dataset-name mooncake --dataset-path "
                 "%s/t.jsonl --trace-block-tokens 8 --trace-time-scale 0.5 "
                 "--trace-max-output-len 4 %s --save-detailed --result-file %s/t.json "
                 "--no-progress > %s/out.txt 2>&1",
                 tandem, s.port, dir, pass ? "--request-rate 40" : "", dir, dir);
        ck_assert_int_eq(run_cmd(cmd), 0);
        snprintf(cmd, sizeof(cmd), "%s/t.json", dir);
        o = json_object_from_file(cmd);
        ck_assert_ptr_nonnull(o);
        ck_assert(json_object_object_get_ex(o, "completed", &v) && json_object_get_int(v) == 4);
        ck_assert(json_object_object_get_ex(o, "input_lens", &v));
        const int want_in[] = {16, 10, 1, 24}; /* 600 - 512 = 88 -> ceil(88 x 8 / 512) = 2 */
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(json_object_get_int(json_object_array_get_idx(v, (size_t)i)),
                             want_in[i]);
        ck_assert(json_object_object_get_ex(o, "output_lens", &v));
        ck_assert_int_eq(json_object_get_int(json_object_array_get_idx(v, 3)), 4); /* capped */
        ck_assert(json_object_object_get_ex(o, "start_times", &v));
        double t1 = json_object_get_double(json_object_array_get_idx(v, 1)),
               t3 = json_object_get_double(json_object_array_get_idx(v, 3));
        /* pass 0: the trace's 0.2 s and 0.8 s x 0.5; pass 1: rescaled so the 4th is at 4 / 40 */
        double w1 = pass ? 0.025 : 0.1, w3 = pass ? 0.1 : 0.4;
        ck_assert_msg(t1 >= w1 - 0.005 && t1 < w1 + 0.08, "start %g, want %g", t1, w1);
        ck_assert_msg(t3 >= w3 - 0.005 && t3 < w3 + 0.08, "start %g, want %g", t3, w3);
        json_object_put(o);
    }
    snprintf(cmd, sizeof(cmd),
             "grep -q 'mooncake: 4 requests (file lines 1-4).*1 outputs capped to "
             "4; ideal reuse' %s/out.txt",
             dir);
    ck_assert_int_eq(run_cmd(cmd), 0);
    /* a bad line: the error names the file, line and field; exit status 1 */
    snprintf(cmd, sizeof(cmd), "%s/t.jsonl", dir);
    tf = fopen(cmd, "a");
    fputs("{\"timestamp\": 1900, \"input_length\": 5, \"output_length\": 1}\n", tf);
    fclose(tf);
    snprintf(cmd, sizeof(cmd),
             "%s bench --base-url http://127.0.0.1:%d --dataset-name mooncake --dataset-path "
             "%s/t.jsonl > %s/err.txt 2>&1; s=$?; grep -q 't.jsonl:5: field \"hash_ids\" is "
             "missing' %s/err.txt || exit 99; exit $s",
             tandem, s.port, dir, dir, dir);
    ck_assert_int_eq(run_cmd(cmd), 1);
    snprintf(cmd, sizeof(cmd),
             "%s bench --dataset-name mooncake --trace-block-tokens 600 > "
             "%s/err.txt 2>&1",
             tandem, dir);
    ck_assert_int_eq(run_cmd(cmd), 2);
    /* bad flags: a clear message and exit status 2 */
    snprintf(cmd, sizeof(cmd), "%s bench --backend nope > %s/err.txt 2>&1", tandem, dir);
    ck_assert_int_eq(run_cmd(cmd), 2);
    /* the rpc backend without a cluster secret: a runtime error naming what is missing */
    snprintf(cmd, sizeof(cmd),
             "env -u TANDEM_CLUSTER_SECRET -u CREDENTIALS_DIRECTORY %s bench --backend rpc "
             "--base-url tcp://127.0.0.1:1 --num-prompts 1 > %s/err.txt 2>&1",
             tandem, dir);
    ck_assert_int_eq(run_cmd(cmd), 1);
    snprintf(cmd, sizeof(cmd), "%s bench --request-rate 0 > %s/err.txt 2>&1", tandem, dir);
    ck_assert_int_eq(run_cmd(cmd), 2);
    snprintf(cmd, sizeof(cmd), "%s bench --goodput ttft > %s/err.txt 2>&1", tandem, dir);
    ck_assert_int_eq(run_cmd(cmd), 2);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    run_cmd(cmd);
    server_stop(&s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("bench_client");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_known_delays);
    tcase_add_test(tc, test_keepalive_reuse);
    tcase_add_test(tc, test_failure_kinds);
    tcase_add_test(tc, test_fuzzed_responses);
    tcase_add_test(tc, test_server_metrics_agree);
    tcase_add_test(tc, test_cli_end_to_end);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    return td_check_run(suite());
}
