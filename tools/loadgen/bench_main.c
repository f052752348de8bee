/* bench_main.c: `tandem bench`: the defaults, the rate sweep (warm-up, then one measured phase
 * per --request-rate), the server scrape and the reports. The flags are in bench_flags.c, the
 * open-loop driver of one phase in bench_driver.c. */
#include "../cli.h"
#include "bench_cmd_impl.h"
#include "td_error.h"
#include "td_rpc.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

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
                                      .max_total_len = 2048,
                                      .trace_block_tokens = TD_BENCH_TRACE_BLOCK,
                                      .trace_time_scale = 1.0};
    bool help = false;
    if (td__bench_parse_opts(argc, argv, &o, host, sizeof(host), &help) != 0) {
        fprintf(stderr, "tandem bench: %s\n", td_err_msg());
        return 2;
    }
    if (help) {
        td__bench_usage(stdout);
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
    if (o.wl.kind == TD_BENCH_WL_MOONCAKE) {
        const td_bench_trace_stats_t *t = &wl.trace;
        fprintf(stderr,
                "tandem bench: mooncake: %zu requests (file lines %zu-%zu) over %.1f s, %lld "
                "tokens per block; %zu prompts cut to %lld tokens (%lld blocks dropped), %zu "
                "outputs capped to %lld; ideal reuse %.4f (%lld of %lld prompt tokens in a block "
                "seen before)\n",
                wl.n, t->first_line, t->last_line, t->span_s, (long long)o.wl.trace_block_tokens,
                t->truncated, (long long)o.wl.trace_max_input_len, (long long)t->blocks_cut,
                t->outputs_capped, (long long)o.wl.trace_max_output_len,
                t->prompt_tokens ? (double)t->reusable_tokens / (double)t->prompt_tokens : 0.0,
                (long long)t->reusable_tokens, (long long)t->prompt_tokens);
    }
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
            o.wl.kind == TD_BENCH_WL_SHAREGPT || o.wl.kind == TD_BENCH_WL_MOONCAKE)
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
        d.impl = be->open(&loop, &tgt, td__bench_on_done, &d);
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
                td__bench_run_phase(&d);
                for (size_t i = 0; i < nw; i++)
                    td_bench_result_free(&wr[i]);
            }
            free(wa);
            free(wr);
            free(wp);
        }
        if (wl.arrivals) {
            /* a trace: its own arrivals; a finite rate compresses them to that mean rate */
            double f = isfinite(rate) && wl.arrivals[n - 1] > 0
                           ? ((double)n / rate) / wl.arrivals[n - 1]
                           : 1.0;
            for (size_t i = 0; i < n; i++)
                arr[i] = wl.arrivals[i] * f;
        } else if (td_bench_arrivals(n, rate, o.burstiness, o.seed, arr) != 0) {
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
        td__bench_run_phase(&d);
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
