/* bench_main.c: `tandem bench`: flags, the open-loop driver (one libuv loop, a timerfd for
 * sub-millisecond send times), warm-up, the rate sweep, the progress line and the reports. */
#include "../cli.h"
#include "bench.h"
#include "td_error.h"
#include "td_rpc.h"

#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <uv.h>

typedef struct opts {
    const char *host, *endpoint, *model, *api_key, *label, *tokenizer;
    int port;
    bool chat, stream, ignore_eos, save_detailed, scrape, progress, app_timestamps;
    size_t num_prompts;
    double duration;
    double rates[64];
    size_t n_rates;
    double burstiness;
    long max_concurrency;
    uint64_t seed;
    size_t warmups;
    double timeout_s;
    double pcts[16];
    size_t n_pcts;
    td_bench_slo_t slo;
    bool have_slo;
    const char *result_file, *html_file;
    td_bench_workload_opts_t wl;
    bool rpc;                /* --backend rpc / rpc-chat: the router's internal RPC */
    const char *secret_file; /* rpc: the cluster secret */
} opts_t;

/* The state of one phase (warm-up or a measured run). */
typedef struct driver {
    uv_loop_t *loop;
    const opts_t *o;
    const td_bench_backend_t *be;
    void *impl;
    const td_bench_workload_t *wl;
    const td_tokenizer_t *tok;
    bool warmup;
    size_t n;                   /* requests in this phase */
    const double *arrivals;     /* [n] seconds from t0 */
    td_bench_result_t *results; /* [n] in send order */
    size_t *prompt_of;          /* [n] workload prompt each result was sent for */
    size_t arrived, sent, done, errors;
    size_t *ready; /* FIFO of workload prompts ready to send (multi-turn order) */
    size_t ready_head, ready_tail, ready_cap;
    size_t next_prompt; /* single-turn workloads: the next prompt */
    td_buf_t *hist;     /* [num_sessions] chat history, JSON array elements */
    int64_t *hist_tok;  /* [num_sessions] tokens of that history: user messages and answers */
    uint64_t t0;
    int tfd;
    uint64_t armed_ns; /* the timerfd's deadline, CLOCK_MONOTONIC ns; 0 = disarmed */
    uv_poll_t poll;
    uv_check_t check;
    uv_timer_t prog;
    bool tty;
    double last_prog_s;
    int64_t out_tokens, last_out_tokens;
    td_buf_t msg; /* scratch: messages JSON */
    int rc;
} driver_t;

static void dispatch(driver_t *d);

/* Point the timerfd at the next arrival (or disarm it). Setting a timerfd also clears its
 * expirations, so it is never read; it is only set when the deadline changes. */
static void arm(driver_t *d)
{
    uint64_t at = d->arrived < d->n ? d->t0 + (uint64_t)(d->arrivals[d->arrived] * 1e9) : 0;
    if (at == d->armed_ns)
        return;
    struct itimerspec its = {{0, 0}, {(time_t)(at / 1000000000ULL), (long)(at % 1000000000ULL)}};
    timerfd_settime(d->tfd, TFD_TIMER_ABSTIME, &its, NULL); /* at 0: disarm */
    d->armed_ns = at;
}

/* Count the arrivals that are due, send what may be sent, aim the timer at the next one. Runs
 * when the timer fires and after every other loop iteration too (uv_check), so a busy loop
 * sends on time without waking through the timer. */
static void advance(driver_t *d)
{
    double now = (double)(td_now_ns() - d->t0) * 1e-9;
    while (d->arrived < d->n && d->arrivals[d->arrived] <= now)
        d->arrived++;
    dispatch(d);
    arm(d);
}

static void on_timer(uv_poll_t *p, int status, int events)
{
    driver_t *d = p->data;
    d->armed_ns = UINT64_MAX; /* it fired: set it again even for the same deadline */
    advance(d);
}

static void on_check(uv_check_t *c)
{
    advance(c->data);
}

static int msg_escape(td_buf_t *b, const char *role, const char *text, size_t n)
{
    int rc = td_buf_printf(b, "{\"role\": \"%s\", \"content\": ", role);
    rc |= td_buf_append_json_string(b, text, n);
    rc |= td_buf_append_char(b, '}');
    return rc ? TD_ENOMEM : 0;
}

static void send_one(driver_t *d, size_t pi)
{
    const td_bench_prompt_t *p = &d->wl->prompts[pi];
    size_t slot = d->sent++;
    td_bench_result_t *r = &d->results[slot];
    td_bench_result_init(r);
    /* reserve what the answer will need up front so that streaming it allocates nothing per
     * token (the arrays still grow by doubling if a server sends more) */
    size_t expect = (size_t)TD_MAX(p->output_len, 1);
    r->itl = td_calloc(expect, sizeof(double));
    r->cap_itl = r->itl ? expect : 0;
    td_buf_reserve(&r->text, expect * 8);
    r->sched_s = d->arrivals[slot];
    d->prompt_of[slot] = pi;
    r->prompt_len = p->prompt_len;
    td_bench_request_t req = {d->o->model,   p->text,          NULL,
                              p->output_len, d->o->ignore_eos, d->o->stream};
    int rc = 0;
    if (d->o->chat) {
        td_buf_reset(&d->msg);
        rc |= td_buf_append_char(&d->msg, '[');
        if (p->session >= 0 && !d->warmup && d->hist[p->session].len) {
            rc |= td_buf_append(&d->msg, d->hist[p->session].data, d->hist[p->session].len);
            rc |= td_buf_append_str(&d->msg, ", ");
        }
        rc |= msg_escape(&d->msg, "user", p->text, strlen(p->text));
        rc |= td_buf_append_char(&d->msg, ']');
        req.messages_json = d->msg.data;
    }
    if (p->session >= 0 && p->turn > 0 && !d->warmup) {
        /* prompt tokens of a later turn: every earlier user message and answer (the chat
         * template's own tokens are not counted) */
        r->prompt_len += d->hist_tok[p->session];
    }
    if (rc == 0)
        rc = d->be->submit(d->impl, &req, d->t0, r);
    if (rc != 0) {
        r->send_s = (double)(td_now_ns() - d->t0) * 1e-9;
        td_bench_result_fail(r, TD_BENCH_ERR_CONNECT, "submit: %s", td_err_msg());
        d->done++;
        d->errors++;
        if (d->done == d->n) {
            uv_poll_stop(&d->poll);
            uv_timer_stop(&d->prog);
            uv_check_stop(&d->check);
            uv_stop(d->loop);
        }
    }
}

static bool multi_turn(const driver_t *d)
{
    return d->wl->num_sessions > 0 && !d->warmup;
}

static void dispatch(driver_t *d)
{
    while (d->sent < d->arrived) {
        if (d->o->max_concurrency > 0 && d->be->inflight(d->impl) >= (size_t)d->o->max_concurrency)
            return;
        size_t pi;
        if (multi_turn(d)) {
            if (d->ready_head == d->ready_tail)
                return; /* every session waits for an answer: the arrival waits too */
            pi = d->ready[d->ready_head++];
        } else {
            pi = d->next_prompt++ % d->wl->n;
        }
        send_one(d, pi);
    }
}

static void on_done(td_bench_result_t *r, void *arg)
{
    driver_t *d = arg;
    size_t slot = (size_t)(r - d->results);
    const td_bench_prompt_t *p = &d->wl->prompts[d->prompt_of[slot]];
    if (r->err == TD_BENCH_OK) {
        if (r->usage_completion_tokens >= 0) {
            r->output_len = r->usage_completion_tokens;
        } else if (d->tok) { /* vLLM: count the generated text with the tokenizer */
            td_tokens_t t;
            td_tokens_init(&t);
            td_tokenizer_encode(d->tok, r->text.data ? r->text.data : "", r->text.len, false, &t);
            r->output_len = (int64_t)t.len;
            td_tokens_free(&t);
        } else {
            r->output_len = r->n_chunks;
        }
        d->out_tokens += r->output_len;
    } else {
        d->errors++;
    }
    if (multi_turn(d) && p->session >= 0) {
        td_buf_t *h = &d->hist[p->session];
        if (h->len)
            td_buf_append_str(h, ", ");
        msg_escape(h, "user", p->text, strlen(p->text));
        td_buf_append_str(h, ", ");
        msg_escape(h, "assistant", r->text.data ? r->text.data : "", r->text.len);
        d->hist_tok[p->session] += p->prompt_len + (r->err == TD_BENCH_OK ? r->output_len : 0);
        /* the next turn of this session becomes ready (prompts are turn-major) */
        size_t k = d->prompt_of[slot] + (size_t)d->wl->num_sessions;
        if (k < d->wl->n && d->wl->prompts[k].session == p->session)
            d->ready[d->ready_tail++] = k;
    }
    d->done++;
    if (d->done == d->n) {
        uv_poll_stop(&d->poll);
        uv_timer_stop(&d->prog);
        uv_check_stop(&d->check);
        uv_stop(d->loop); /* idle keep-alive connections would keep the loop running */
        return;
    }
    dispatch(d);
}

static void progress_line(driver_t *d, bool final)
{
    double now = (double)(td_now_ns() - d->t0) * 1e-9;
    double dt = now - d->last_prog_s;
    double tput = dt > 0 ? (double)(d->out_tokens - d->last_out_tokens) / dt : 0;
    d->last_prog_s = now;
    d->last_out_tokens = d->out_tokens;
    const char *ph = d->warmup ? "warm-up" : "run";
    if (d->tty)
        printf("\r\033[K%s %6.1fs  done %zu/%zu  in flight %zu  errors %zu  %.0f tok/s%s", ph, now,
               d->done, d->n, d->be->inflight(d->impl), d->errors, tput, final ? "\n" : "");
    else
        printf("progress: %s t=%.1fs done=%zu/%zu inflight=%zu errors=%zu output_tok_per_s=%.0f\n",
               ph, now, d->done, d->n, d->be->inflight(d->impl), d->errors, tput);
    fflush(stdout);
}

static void on_prog(uv_timer_t *t)
{
    progress_line(t->data, false);
}

/* Run one phase to completion. */
static int run_phase(driver_t *d)
{
    d->t0 = td_now_ns();
    d->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (d->tfd < 0)
        return td_err_set(TD_EIO, "timerfd_create failed");
    uv_poll_init(d->loop, &d->poll, d->tfd);
    d->poll.data = d;
    uv_timer_init(d->loop, &d->prog);
    d->prog.data = d;
    d->tty = isatty(1);
    if (d->o->progress)
        uv_timer_start(&d->prog, on_prog, d->tty ? 500 : 5000, d->tty ? 500 : 5000);
    uv_check_init(d->loop, &d->check);
    d->check.data = d;
    uv_check_start(&d->check, on_check);
    uv_unref((uv_handle_t *)&d->check);
    d->armed_ns = 0;
    uv_poll_start(&d->poll, UV_READABLE, on_timer);
    arm(d);
    uv_run(d->loop, UV_RUN_DEFAULT);
    if (d->o->progress)
        progress_line(d, true);
    uv_close((uv_handle_t *)&d->poll, NULL);
    uv_close((uv_handle_t *)&d->prog, NULL);
    uv_close((uv_handle_t *)&d->check, NULL);
    uv_run(d->loop, UV_RUN_NOWAIT); /* the close callbacks */
    close(d->tfd);
    return 0;
}

/* ---- flags ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem bench [options]\n"
            "\n"
            "Open-loop load against an OpenAI-compatible server, measured as `vllm bench serve`\n"
            "measures (same definitions and result-JSON keys).\n"
            "\n"
            "target\n"
            "  --base-url URL            http://HOST:PORT (default http://127.0.0.1:8000)\n"
            "  --endpoint PATH           /v1/completions (default) or /v1/chat/completions\n"
            "  --backend B               openai (default), openai-chat, rpc, rpc-chat (the\n"
            "                            router's internal RPC: --base-url tcp://HOST:RPC_PORT)\n"
            "  --secret-file FILE        rpc: the cluster secret (default $TANDEM_CLUSTER_SECRET)\n"
            "  --model NAME              the request's \"model\" (default \"default\")\n"
            "  --api-key KEY             Authorization: Bearer KEY (default $OPENAI_API_KEY)\n"
            "  --no-stream               ask for whole responses instead of SSE\n"
            "  --timeout S               per-request timeout (default 600; 0 = none)\n"
            "  --app-timestamps          time chunks when the loop reads them, as vLLM's client\n"
            "                            does (default: when the kernel received them)\n"
            "load\n"
            "  --num-prompts N           requests per run (default 1000)\n"
            "  --duration S              instead: rate x S requests per run\n"
            "  --request-rate LIST       req/s, comma-separated sweep, inf = all at once (default "
            "inf)\n"
            "  --burstiness B            Gamma shape: 1 Poisson, inf constant rate (default 1)\n"
            "  --max-concurrency N       cap on requests in flight (default none)\n"
            "  --num-warmups N           requests before each run, not measured (default 0)\n"
            "  --seed N                  arrivals and workload seed (default 0)\n"
            "workload\n"
            "  --dataset-name D          random (default), prefix, multiturn, sharegpt\n"
            "  --dataset-path FILE       ShareGPT JSON\n"
            "  --tokenizer MODEL_DIR     token-exact lengths with this tokenizer.json\n"
            "  --random-input-len N      (default 1024)   --random-output-len N (default 128)\n"
            "  --random-range-ratio R    lengths uniform in [len(1-R), len(1+R)] (default 0)\n"
            "  --random-prefix-len N     tokens shared by every prompt (default 0)\n"
            "  --prefix-groups N         (default 8)  --prefix-prompts-per-group N (default 16)\n"
            "  --prefix-system-len N     (default 512) --prefix-question-len N (default 64)\n"
            "  --sessions N              multi-turn sessions (default 16) --turns N (default 4)\n"
            "  --sharegpt-output-len N   fixed output length for ShareGPT\n"
            "  --ignore-eos              ask the server to generate exactly max_tokens\n"
            "results\n"
            "  --metric-percentiles LIST percentiles to report (default 90,95,99)\n"
            "  --goodput SLO...          ttft:MS tpot:MS e2el:MS (one or more)\n"
            "  --result-file PATH        write the result JSON (a sweep adds -qps<rate>)\n"
            "  --save-detailed           per-request arrays in the JSON\n"
            "  --html PATH               self-contained HTML report with plots\n"
            "  --scrape-metrics          GET the target's /metrics before and after each run\n"
            "  --label TEXT              label in the result file\n"
            "  --no-progress             no progress line\n");
}

static int parse_list(const char *flag, const char *s, double *out, size_t max, size_t *n,
                      bool allow_inf)
{
    char *copy = td_strdup(s), *save = NULL;
    int rc = copy ? 0 : TD_ENOMEM;
    *n = 0;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && rc == 0;
         t = strtok_r(NULL, ",", &save)) {
        double v;
        if (allow_inf && (strcmp(t, "inf") == 0 || strcmp(t, "INF") == 0))
            v = INFINITY;
        else if (td_parse_double(t, &v) != 0 || !isfinite(v))
            rc = td_err_set(TD_EINVAL, "%s: \"%s\" is not a number", flag, t);
        if (rc == 0 && *n == max)
            rc = td_err_set(TD_EINVAL, "%s: at most %zu values", flag, max);
        if (rc == 0)
            out[(*n)++] = v;
    }
    if (rc == 0 && *n == 0)
        rc = td_err_set(TD_EINVAL, "%s: empty list", flag);
    free(copy);
    return rc;
}

static int parse_slo(const char *s, td_bench_slo_t *slo)
{
    const char *colon = strchr(s, ':');
    double v;
    if (!colon || td_parse_double(colon + 1, &v) != 0 || !(v >= 0))
        return td_err_set(TD_EINVAL, "--goodput: \"%s\" is not KEY:MS with MS >= 0", s);
    size_t k = (size_t)(colon - s);
    if (k == 4 && memcmp(s, "ttft", 4) == 0)
        slo->ttft_ms = v;
    else if (k == 4 && memcmp(s, "tpot", 4) == 0)
        slo->tpot_ms = v;
    else if (k == 4 && memcmp(s, "e2el", 4) == 0)
        slo->e2el_ms = v;
    else
        return td_err_set(TD_EINVAL, "--goodput: unknown metric in \"%s\" (ttft, tpot, e2el)", s);
    return 0;
}

static int num_arg(const char *flag, const char *s, int64_t lo, int64_t *out)
{
    if (td_parse_i64(s, out) != 0 || *out < lo)
        return td_err_set(TD_EINVAL, "%s: \"%s\" is not an integer >= %lld", flag, s,
                          (long long)lo);
    return 0;
}

static int dbl_arg(const char *flag, const char *s, bool allow_inf, double *out)
{
    if (allow_inf && strcmp(s, "inf") == 0) {
        *out = INFINITY;
        return 0;
    }
    if (td_parse_double(s, out) != 0 || !isfinite(*out))
        return td_err_set(TD_EINVAL, "%s: \"%s\" is not a number", flag, s);
    return 0;
}

static int parse_url(const char *url, opts_t *o, char *host, size_t hn)
{
    const char *p = url;
    if (td_str_startswith(p, "http://"))
        p += 7;
    else if (td_str_startswith(p, "tcp://")) /* the rpc backend's address */
        p += 6;
    else if (strstr(p, "://"))
        return td_err_set(TD_EINVAL, "--base-url: only http:// (and tcp:// for rpc) is supported (\"%s\")", url);
    const char *colon = strrchr(p, ':'), *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    int port = 80;
    if (colon && (!slash || colon < slash)) {
        char ps[16];
        size_t pl = (size_t)((slash ? slash : p + strlen(p)) - colon - 1);
        int64_t v;
        if (pl == 0 || pl >= sizeof(ps))
            return td_err_set(TD_EINVAL, "--base-url: bad port in \"%s\"", url);
        memcpy(ps, colon + 1, pl);
        ps[pl] = 0;
        if (td_parse_i64(ps, &v) != 0 || v < 1 || v > 65535)
            return td_err_set(TD_EINVAL, "--base-url: bad port in \"%s\"", url);
        port = (int)v;
        len = (size_t)(colon - p);
    }
    if (len == 0 || len >= hn)
        return td_err_set(TD_EINVAL, "--base-url: no host in \"%s\"", url);
    memcpy(host, p, len);
    host[len] = 0;
    o->host = host;
    o->port = port;
    return 0;
}

enum {
    O_URL = 256,
    O_ENDPOINT,
    O_BACKEND,
    O_MODEL,
    O_KEY,
    O_SECRET,
    O_NOSTREAM,
    O_TIMEOUT,
    O_NUM,
    O_DUR,
    O_RATE,
    O_BURST,
    O_MAXC,
    O_WARM,
    O_SEED,
    O_DS,
    O_DSPATH,
    O_TOK,
    O_RIN,
    O_ROUT,
    O_RRATIO,
    O_RPREFIX,
    O_PGROUPS,
    O_PPER,
    O_PSYS,
    O_PQ,
    O_SESS,
    O_TURNS,
    O_SGOUT,
    O_IGNEOS,
    O_PCTS,
    O_GOODPUT,
    O_RESULT,
    O_DETAILED,
    O_HTML,
    O_SCRAPE,
    O_LABEL,
    O_NOPROG,
    O_APPTS,
    O_HELP
};

static int parse_opts(int argc, char **argv, opts_t *o, char *host, size_t hn, bool *help)
{
    static const struct option lo[] = {{"base-url", 1, 0, O_URL},
                                       {"endpoint", 1, 0, O_ENDPOINT},
                                       {"backend", 1, 0, O_BACKEND},
                                       {"model", 1, 0, O_MODEL},
                                       {"api-key", 1, 0, O_KEY},
                                       {"secret-file", 1, 0, O_SECRET},
                                       {"no-stream", 0, 0, O_NOSTREAM},
                                       {"timeout", 1, 0, O_TIMEOUT},
                                       {"num-prompts", 1, 0, O_NUM},
                                       {"duration", 1, 0, O_DUR},
                                       {"request-rate", 1, 0, O_RATE},
                                       {"burstiness", 1, 0, O_BURST},
                                       {"max-concurrency", 1, 0, O_MAXC},
                                       {"num-warmups", 1, 0, O_WARM},
                                       {"seed", 1, 0, O_SEED},
                                       {"dataset-name", 1, 0, O_DS},
                                       {"dataset-path", 1, 0, O_DSPATH},
                                       {"tokenizer", 1, 0, O_TOK},
                                       {"random-input-len", 1, 0, O_RIN},
                                       {"random-output-len", 1, 0, O_ROUT},
                                       {"random-range-ratio", 1, 0, O_RRATIO},
                                       {"random-prefix-len", 1, 0, O_RPREFIX},
                                       {"prefix-groups", 1, 0, O_PGROUPS},
                                       {"prefix-prompts-per-group", 1, 0, O_PPER},
                                       {"prefix-system-len", 1, 0, O_PSYS},
                                       {"prefix-question-len", 1, 0, O_PQ},
                                       {"sessions", 1, 0, O_SESS},
                                       {"turns", 1, 0, O_TURNS},
                                       {"sharegpt-output-len", 1, 0, O_SGOUT},
                                       {"ignore-eos", 0, 0, O_IGNEOS},
                                       {"metric-percentiles", 1, 0, O_PCTS},
                                       {"goodput", 1, 0, O_GOODPUT},
                                       {"result-file", 1, 0, O_RESULT},
                                       {"save-detailed", 0, 0, O_DETAILED},
                                       {"html", 1, 0, O_HTML},
                                       {"scrape-metrics", 0, 0, O_SCRAPE},
                                       {"label", 1, 0, O_LABEL},
                                       {"no-progress", 0, 0, O_NOPROG},
                                       {"app-timestamps", 0, 0, O_APPTS},
                                       {"help", 0, 0, O_HELP},
                                       {0, 0, 0, 0}};
    int c, rc = 0;
    int64_t v;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_URL:
            rc = parse_url(optarg, o, host, hn);
            break;
        case O_ENDPOINT:
            o->endpoint = optarg;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "openai") == 0)
                o->chat = false;
            else if (strcmp(optarg, "openai-chat") == 0)
                o->chat = true;
            else if (strcmp(optarg, "rpc") == 0 || strcmp(optarg, "rpc-chat") == 0) {
                o->rpc = true;
                o->chat = strcmp(optarg, "rpc-chat") == 0;
            } else
                rc = td_err_set(TD_EINVAL,
                                "--backend: \"%s\" (openai, openai-chat, rpc, rpc-chat)", optarg);
            break;
        case O_SECRET:
            o->secret_file = optarg;
            break;
        case O_MODEL:
            o->model = optarg;
            break;
        case O_KEY:
            o->api_key = optarg;
            break;
        case O_NOSTREAM:
            o->stream = false;
            break;
        case O_TIMEOUT:
            rc = dbl_arg("--timeout", optarg, false, &o->timeout_s);
            if (rc == 0 && o->timeout_s < 0)
                rc = td_err_set(TD_EINVAL, "--timeout must be >= 0");
            break;
        case O_NUM:
            if ((rc = num_arg("--num-prompts", optarg, 1, &v)) == 0)
                o->num_prompts = (size_t)v;
            break;
        case O_DUR:
            rc = dbl_arg("--duration", optarg, false, &o->duration);
            if (rc == 0 && !(o->duration > 0))
                rc = td_err_set(TD_EINVAL, "--duration must be > 0");
            break;
        case O_RATE:
            rc = parse_list("--request-rate", optarg, o->rates, TD_ARRAY_LEN(o->rates), &o->n_rates,
                            true);
            for (size_t i = 0; rc == 0 && i < o->n_rates; i++)
                if (!(o->rates[i] > 0))
                    rc = td_err_set(TD_EINVAL, "--request-rate: rates must be > 0");
            break;
        case O_BURST:
            rc = dbl_arg("--burstiness", optarg, true, &o->burstiness);
            if (rc == 0 && !(o->burstiness > 0))
                rc = td_err_set(TD_EINVAL, "--burstiness must be > 0");
            break;
        case O_MAXC:
            if ((rc = num_arg("--max-concurrency", optarg, 1, &v)) == 0)
                o->max_concurrency = (long)v;
            break;
        case O_WARM:
            if ((rc = num_arg("--num-warmups", optarg, 0, &v)) == 0)
                o->warmups = (size_t)v;
            break;
        case O_SEED:
            if ((rc = num_arg("--seed", optarg, 0, &v)) == 0)
                o->seed = o->wl.seed = (uint64_t)v;
            break;
        case O_DS:
            if (strcmp(optarg, "random") == 0)
                o->wl.kind = TD_BENCH_WL_RANDOM;
            else if (strcmp(optarg, "prefix") == 0 ||
                     strcmp(optarg, "generated-shared-prefix") == 0)
                o->wl.kind = TD_BENCH_WL_PREFIX;
            else if (strcmp(optarg, "multiturn") == 0)
                o->wl.kind = TD_BENCH_WL_MULTITURN;
            else if (strcmp(optarg, "sharegpt") == 0)
                o->wl.kind = TD_BENCH_WL_SHAREGPT;
            else
                rc = td_err_set(TD_EINVAL,
                                "--dataset-name: \"%s\" (random, prefix, multiturn, "
                                "sharegpt)",
                                optarg);
            break;
        case O_DSPATH:
            o->wl.dataset_path = optarg;
            break;
        case O_TOK:
            o->tokenizer = optarg;
            break;
        case O_RIN:
            rc = num_arg("--random-input-len", optarg, 1, &o->wl.input_len);
            break;
        case O_ROUT:
            rc = num_arg("--random-output-len", optarg, 1, &o->wl.output_len);
            break;
        case O_RRATIO:
            rc = dbl_arg("--random-range-ratio", optarg, false, &o->wl.range_ratio);
            break;
        case O_RPREFIX:
            rc = num_arg("--random-prefix-len", optarg, 0, &o->wl.prefix_len);
            break;
        case O_PGROUPS:
            rc = num_arg("--prefix-groups", optarg, 1, &o->wl.num_groups);
            break;
        case O_PPER:
            rc = num_arg("--prefix-prompts-per-group", optarg, 1, &o->wl.prompts_per_group);
            break;
        case O_PSYS:
            rc = num_arg("--prefix-system-len", optarg, 0, &o->wl.system_prompt_len);
            break;
        case O_PQ:
            rc = num_arg("--prefix-question-len", optarg, 1, &o->wl.question_len);
            break;
        case O_SESS:
            rc = num_arg("--sessions", optarg, 1, &o->wl.num_sessions);
            break;
        case O_TURNS:
            rc = num_arg("--turns", optarg, 1, &o->wl.turns_per_session);
            break;
        case O_SGOUT:
            rc = num_arg("--sharegpt-output-len", optarg, 1, &o->wl.sharegpt_output_len);
            break;
        case O_IGNEOS:
            o->ignore_eos = true;
            break;
        case O_PCTS:
            rc = parse_list("--metric-percentiles", optarg, o->pcts, TD_ARRAY_LEN(o->pcts),
                            &o->n_pcts, false);
            for (size_t i = 0; rc == 0 && i < o->n_pcts; i++)
                if (!(o->pcts[i] > 0 && o->pcts[i] < 100))
                    rc = td_err_set(TD_EINVAL, "--metric-percentiles: values in (0, 100)");
            break;
        case O_GOODPUT:
            /* vLLM takes `--goodput ttft:500 tpot:50`: this value and every following word that
             * is not a flag; a single quoted "ttft:500 tpot:50" works too */
            o->have_slo = true;
            for (char *save = NULL, *t = strtok_r(optarg, " ", &save); t && rc == 0;
                 t = strtok_r(NULL, " ", &save))
                rc = parse_slo(t, &o->slo);
            while (rc == 0 && optind < argc && argv[optind][0] != '-')
                rc = parse_slo(argv[optind++], &o->slo);
            break;
        case O_RESULT:
            o->result_file = optarg;
            break;
        case O_DETAILED:
            o->save_detailed = true;
            break;
        case O_HTML:
            o->html_file = optarg;
            break;
        case O_SCRAPE:
            o->scrape = true;
            break;
        case O_LABEL:
            o->label = optarg;
            break;
        case O_NOPROG:
            o->progress = false;
            break;
        case 'h':
        case O_APPTS:
            o->app_timestamps = true;
            break;
        case O_HELP:
            *help = true;
            return 0;
        default:
            rc = td_err_set(TD_EINVAL, "unknown option (see tandem bench --help)");
        }
    }
    if (rc == 0 && optind < argc)
        rc = td_err_set(TD_EINVAL, "unexpected argument \"%s\"", argv[optind]);
    if (rc == 0 && o->duration > 0)
        for (size_t i = 0; i < o->n_rates; i++)
            if (isinf(o->rates[i]))
                rc = td_err_set(TD_EINVAL, "--duration needs finite --request-rate values");
    if (o->endpoint && td_str_endswith(o->endpoint, "chat/completions"))
        o->chat = true;
    if (rc == 0 && o->wl.kind == TD_BENCH_WL_MULTITURN && !o->chat)
        rc = td_err_set(TD_EINVAL, "--dataset-name multiturn needs --backend openai-chat");
    return rc;
}

static int write_file(const char *path, const td_buf_t *b)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return td_err_set(TD_EIO, "%s: cannot open for writing", path);
    size_t w = fwrite(b->data, 1, b->len, f);
    int bad = fclose(f) != 0 || w != b->len;
    return bad ? td_err_set(TD_EIO, "%s: write failed", path) : 0;
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int td_cmd_bench(int argc, char **argv)
{
    char host[256];
    uint8_t *secret = NULL;
    size_t secret_len = 0;
    opts_t o = {.host = "127.0.0.1",
                .port = 8000,
                .model = "default",
                .stream = true,
                .progress = true,
                .num_prompts = 1000,
                .rates = {INFINITY},
                .n_rates = 1,
                .burstiness = 1.0,
                .timeout_s = 600,
                .pcts = {90, 95, 99},
                .n_pcts = 3,
                .slo = {-1, -1, -1}};
    o.api_key = getenv("OPENAI_API_KEY");
    o.wl = (td_bench_workload_opts_t){.kind = TD_BENCH_WL_RANDOM,
                                      .input_len = 1024,
                                      .output_len = 128,
                                      .num_groups = 8,
                                      .prompts_per_group = 16,
                                      .system_prompt_len = 512,
                                      .question_len = 64,
                                      .num_sessions = 16,
                                      .turns_per_session = 4,
                                      .min_len = 4,
                                      .max_prompt_len = 1024,
                                      .max_total_len = 2048};
    bool help = false;
    if (parse_opts(argc, argv, &o, host, sizeof(host), &help) != 0) {
        fprintf(stderr, "tandem bench: %s\n", td_err_msg());
        return 2;
    }
    if (help) {
        usage(stdout);
        return 0;
    }
    if (!o.endpoint)
        o.endpoint = o.chat ? "/v1/chat/completions" : "/v1/completions";
    else if (td_str_endswith(o.endpoint, "chat/completions"))
        o.chat = true;
    raise_nofile();
    signal(SIGPIPE, SIG_IGN); /* a server that hangs up surfaces as a write error, not a kill */

    td_tokenizer_t *tok = NULL;
    td_bench_workload_t wl = {0};
    td_bench_run_t *runs = calloc(o.n_rates, sizeof(*runs));
    int status = 1, rc = 0;
    uv_loop_t loop;
    uv_loop_init(&loop);
    if (!runs) {
        fprintf(stderr, "tandem bench: out of memory\n");
        goto out;
    }
    if (o.tokenizer && (rc = td_tokenizer_load(o.tokenizer, &tok)) != 0) {
        fprintf(stderr, "tandem bench: --tokenizer: %s\n", td_err_msg());
        goto out;
    }
    size_t max_n = o.num_prompts;
    if (o.duration > 0) {
        max_n = 1;
        for (size_t i = 0; i < o.n_rates; i++)
            max_n = TD_MAX(max_n, (size_t)ceil(o.rates[i] * o.duration));
    }
    o.wl.num_prompts = max_n;
    if ((rc = td_bench_workload_build(&o.wl, tok, &wl)) != 0) {
        fprintf(stderr, "tandem bench: workload: %s\n", td_err_msg());
        goto out;
    }
    if (!tok)
        fprintf(stderr, "tandem bench: no --tokenizer: prompt lengths count words, not tokens\n");
    if (o.wl.kind == TD_BENCH_WL_SHAREGPT)
        fprintf(stderr, "tandem bench: ShareGPT: %zu conversations with two turns read, %zu kept\n",
                wl.sharegpt_seen, wl.sharegpt_kept);
    td_bench_target_t tgt = {o.host,      o.port, o.endpoint,      o.api_key,
                             o.timeout_s, o.chat, o.app_timestamps};
    if (o.rpc && td_rpc_secret_load(getenv("TANDEM_CLUSTER_SECRET"), o.secret_file, &secret,
                                    &secret_len) != 0) {
        fprintf(stderr, "tandem bench: --backend rpc: %s\n", td_err_msg());
        goto out;
    }
    tgt.secret = secret;
    tgt.secret_len = secret_len;
    const td_bench_backend_t *be = o.rpc ? &td_bench_backend_rpc : &td_bench_backend_http;
    const char *backend = o.rpc ? (o.chat ? "rpc-chat" : "rpc") : o.chat ? "openai-chat" : "openai";

    for (size_t ri = 0; ri < o.n_rates; ri++) {
        double rate = o.rates[ri];
        size_t n = o.duration > 0 ? (size_t)ceil(rate * o.duration) : o.num_prompts;
        if (o.wl.kind == TD_BENCH_WL_MULTITURN || o.wl.kind == TD_BENCH_WL_PREFIX ||
            o.wl.kind == TD_BENCH_WL_SHAREGPT)
            n = o.duration > 0 ? TD_MIN(n, wl.n) : wl.n;
        if (o.wl.kind == TD_BENCH_WL_SHAREGPT)
            n = TD_MIN(o.duration > 0 ? (size_t)ceil(rate * o.duration) : o.num_prompts, wl.n);
        td_bench_run_t *run = &runs[ri];
        run->info = (td_bench_run_info_t){backend,
                                          backend,
                                          o.model,
                                          o.tokenizer,
                                          o.label,
                                          n,
                                          rate,
                                          o.burstiness,
                                          o.max_concurrency,
                                          o.have_slo ? &o.slo : NULL,
                                          NULL,
                                          o.app_timestamps ? "app" : "kernel-rx"};
        double *arr = calloc(n, sizeof(double));
        run->results = calloc(n, sizeof(td_bench_result_t));
        size_t *prompt_of = calloc(n, sizeof(size_t));
        size_t *ready = calloc(wl.n + 1, sizeof(size_t));
        td_buf_t *hist = calloc((size_t)wl.num_sessions + 1, sizeof(td_buf_t));
        int64_t *hist_tok = calloc((size_t)wl.num_sessions + 1, sizeof(int64_t));
        if (!arr || !run->results || !prompt_of || !ready || !hist || !hist_tok) {
            free(arr);
            free(prompt_of);
            free(ready);
            free(hist);
            free(hist_tok);
            fprintf(stderr, "tandem bench: out of memory\n");
            goto out;
        }
        run->n = n;
        driver_t d = {.loop = &loop, .o = &o, .be = be, .wl = &wl, .tok = tok};
        td_buf_init(&d.msg);
        d.impl = be->open(&loop, &tgt, on_done, &d);
        if (!d.impl) {
            fprintf(stderr, "tandem bench: %s\n", td_err_msg());
            free(arr);
            free(prompt_of);
            free(ready);
            free(hist);
            free(hist_tok);
            goto out;
        }
        /* warm-up: all at once (within --max-concurrency), not measured */
        if (o.warmups > 0) {
            size_t nw = o.warmups;
            double *wa = calloc(nw, sizeof(double));
            td_bench_result_t *wr = calloc(nw, sizeof(td_bench_result_t));
            size_t *wp = calloc(nw, sizeof(size_t));
            if (wa && wr && wp) {
                d.warmup = true;
                d.n = nw;
                d.arrivals = wa;
                d.results = wr;
                d.prompt_of = wp;
                run_phase(&d);
                for (size_t i = 0; i < nw; i++)
                    td_bench_result_free(&wr[i]);
            }
            free(wa);
            free(wr);
            free(wp);
        }
        if (td_bench_arrivals(n, rate, o.burstiness, o.seed, arr) != 0) {
            fprintf(stderr, "tandem bench: %s\n", td_err_msg());
            free(arr);
            free(prompt_of);
            free(ready);
            free(hist);
            free(hist_tok);
            td_buf_free(&d.msg);
            be->close(d.impl);
            uv_run(&loop, UV_RUN_DEFAULT);
            goto out;
        }
        td_bench_scrape_t before = {0}, after = {0};
        if (o.scrape && td_bench_scrape_fetch(o.host, o.port, o.api_key, &before) != 0)
            fprintf(stderr, "tandem bench: --scrape-metrics: %s\n", td_err_msg());
        for (int64_t s = 0; s < wl.num_sessions; s++) {
            td_buf_init(&hist[s]);
            ready[d.ready_tail++] = (size_t)s; /* turn 0 of session s is prompt s */
        }
        d.warmup = false;
        d.n = n;
        d.arrivals = arr;
        d.results = run->results;
        d.prompt_of = prompt_of;
        d.arrived = d.sent = d.done = d.errors = 0;
        d.next_prompt = 0;
        d.ready = ready;
        d.hist = hist;
        d.hist_tok = hist_tok;
        d.out_tokens = d.last_out_tokens = 0;
        d.last_prog_s = 0;
        if (!o.progress || !isatty(1))
            fprintf(stdout, "run: rate %g req/s, %zu requests\n", rate, n);
        run_phase(&d);
        double duration = (double)(td_now_ns() - d.t0) * 1e-9;
        if (o.scrape && before.ok &&
            td_bench_scrape_fetch(o.host, o.port, o.api_key, &after) == 0) {
            td_bench_scrape_diff(&before, &after, &run->server);
            run->have_server = true;
        }
        be->close(d.impl);
        uv_run(&loop, UV_RUN_DEFAULT);
        td_bench_metrics_compute(run->results, n, duration, o.pcts, o.n_pcts,
                                 o.have_slo ? &o.slo : NULL, &run->m);
        td_bench_report_text(run, stdout);
        fflush(stdout);
        if (o.result_file) {
            td_buf_t j;
            td_buf_init(&j);
            char path[4096];
            if (o.n_rates > 1) {
                const char *dot = strrchr(o.result_file, '.');
                size_t stem = dot ? (size_t)(dot - o.result_file) : strlen(o.result_file);
                char rs[32];
                snprintf(rs, sizeof(rs), isinf(rate) ? "inf" : "%g", rate);
                snprintf(path, sizeof(path), "%.*s-qps%s%s", (int)stem, o.result_file, rs,
                         dot ? dot : "");
            } else {
                snprintf(path, sizeof(path), "%s", o.result_file);
            }
            if (td_bench_report_json(run, o.save_detailed, &j) != 0 || write_file(path, &j) != 0)
                fprintf(stderr, "tandem bench: %s: %s\n", path, td_err_msg());
            td_buf_free(&j);
        }
        for (int64_t s = 0; s < wl.num_sessions; s++)
            td_buf_free(&hist[s]);
        td_buf_free(&d.msg);
        free(arr);
        free(prompt_of);
        free(ready);
        free(hist);
        free(hist_tok);
    }
    if (o.html_file) {
        td_buf_t h;
        td_buf_init(&h);
        if (td_bench_report_html(runs, o.n_rates, &h) != 0 || write_file(o.html_file, &h) != 0)
            fprintf(stderr, "tandem bench: --html: %s\n", td_err_msg());
        td_buf_free(&h);
    }
    status = 0;
out:
    for (size_t ri = 0; runs && ri < o.n_rates; ri++) {
        for (size_t i = 0; runs[ri].results && i < runs[ri].n; i++)
            td_bench_result_free(&runs[ri].results[i]);
        free(runs[ri].results);
    }
    free(runs);
    td_bench_workload_free(&wl);
    td_tokenizer_free(tok);
    free(secret);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return status;
}
