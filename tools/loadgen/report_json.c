/* report_json.c: the result file with vLLM's keys (vllm/benchmarks/serve.py: benchmark() and
 * main()), so tools that read `vllm bench serve --save-result` files read ours; and the summary
 * table vLLM prints. */
#include "bench.h"
#include "td_error.h"
#include "td_config_build.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int num(td_buf_t *b, const char *key, double v)
{
    if (isnan(v))
        return td_buf_printf(b, "\"%s\": null, ", key);
    if (isinf(v))
        return td_buf_printf(b, "\"%s\": \"inf\", ", key);
    return td_buf_printf(b, "\"%s\": %.17g, ", key, v);
}

static int str(td_buf_t *b, const char *key, const char *v)
{
    int rc = td_buf_printf(b, "\"%s\": ", key);
    if (rc)
        return rc;
    if (!v)
        return td_buf_append_str(b, "null, ");
    if ((rc = td_buf_append_json_string(b, v, strlen(v))))
        return rc;
    return td_buf_append_str(b, ", ");
}

/* p50 -> "50", p99.9 -> "99.9" (vLLM's p_word) */
static void pword(double p, char *out, size_t n)
{
    if (p == floor(p))
        snprintf(out, n, "%d", (int)p);
    else
        snprintf(out, n, "%g", p);
}

static int stats(td_buf_t *b, const char *name, const td_bench_stats_t *s, const double *pcts,
                 size_t np)
{
    char key[64];
    int rc = 0;
    snprintf(key, sizeof(key), "mean_%s_ms", name);
    rc |= num(b, key, s->mean * 1000);
    snprintf(key, sizeof(key), "median_%s_ms", name);
    rc |= num(b, key, s->median * 1000);
    snprintf(key, sizeof(key), "std_%s_ms", name);
    rc |= num(b, key, s->std * 1000);
    for (size_t i = 0; i < np; i++) {
        char pw[32];
        pword(pcts[i], pw, sizeof(pw));
        snprintf(key, sizeof(key), "p%s_%s_ms", pw, name);
        rc |= num(b, key, s->pct[i] * 1000);
    }
    return rc ? TD_ENOMEM : 0;
}

int td_bench_report_json(const td_bench_run_t *run, bool detailed, td_buf_t *b)
{
    const td_bench_run_info_t *in = &run->info;
    const td_bench_metrics_t *m = &run->m;
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof(date), "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    int rc = td_buf_append_str(b, "{");
    rc |= str(b, "date", date);
    rc |= str(b, "endpoint_type", in->endpoint_type);
    rc |= str(b, "backend", in->backend);
    rc |= str(b, "label", in->label);
    rc |= str(b, "model_id", in->model_id);
    rc |= str(b, "tokenizer_id", in->tokenizer_id);
    rc |= str(b, "timestamps", in->timestamps);
    rc |= td_buf_printf(b, "\"num_prompts\": %zu, ", in->num_prompts);
    rc |= num(b, "request_rate", in->request_rate);
    rc |= num(b, "burstiness", in->burstiness);
    if (in->max_concurrency > 0)
        rc |= td_buf_printf(b, "\"max_concurrency\": %ld, ", in->max_concurrency);
    else
        rc |= td_buf_append_str(b, "\"max_concurrency\": null, ");
    rc |= num(b, "duration", m->duration);
    rc |= td_buf_printf(b, "\"completed\": %zu, \"failed\": %zu, ", m->completed, m->failed);
    rc |= td_buf_append_str(b, "\"failed_by_kind\": {");
    for (int k = 1; k < TD_BENCH_ERR_N_; k++)
        rc |= td_buf_printf(b, "%s\"%s\": %zu", k > 1 ? ", " : "",
                            td_bench_err_name((td_bench_err_t)k), m->failed_by_kind[k]);
    rc |= td_buf_append_str(b, "}, ");
    rc |= td_buf_printf(b, "\"total_input_tokens\": %lld, \"total_output_tokens\": %lld, ",
                        (long long)m->total_input, (long long)m->total_output);
    rc |= num(b, "request_throughput", m->request_throughput);
    rc |= num(b, "request_goodput", in->slo ? m->request_goodput : NAN);
    rc |= num(b, "output_throughput", m->output_throughput);
    rc |= num(b, "total_token_throughput", m->total_token_throughput);
    rc |= num(b, "max_output_tokens_per_s", m->max_output_tokens_per_s);
    rc |= td_buf_printf(b, "\"max_concurrent_requests\": %zu, ", m->max_concurrent_requests);
    /* tandem's own additions: true peak of streams in flight, the achieved send rate and the
     * harness's lag behind the arrival schedule */
    rc |= td_buf_printf(b, "\"peak_inflight\": %zu, ", m->peak_inflight);
    rc |= num(b, "achieved_send_rate", m->send_rate);
    if (in->slo) {
        rc |= td_buf_append_str(b, "\"goodput_slo_ms\": {");
        const char *sep = "";
        if (in->slo->ttft_ms >= 0) {
            rc |= td_buf_printf(b, "\"ttft\": %.17g", in->slo->ttft_ms);
            sep = ", ";
        }
        if (in->slo->tpot_ms >= 0) {
            rc |= td_buf_printf(b, "%s\"tpot\": %.17g", sep, in->slo->tpot_ms);
            sep = ", ";
        }
        if (in->slo->e2el_ms >= 0)
            rc |= td_buf_printf(b, "%s\"e2el\": %.17g", sep, in->slo->e2el_ms);
        rc |= td_buf_append_str(b, "}, ");
    }
    rc |= stats(b, "ttft", &m->ttft, m->percentiles, m->n_percentiles);
    rc |= stats(b, "tpot", &m->tpot, m->percentiles, m->n_percentiles);
    rc |= stats(b, "itl", &m->itl, m->percentiles, m->n_percentiles);
    rc |= stats(b, "e2el", &m->e2el, m->percentiles, m->n_percentiles);
    rc |= stats(b, "send_lag", &m->send_lag, m->percentiles, m->n_percentiles);
    if (m->added_ttft.n)
        rc |= stats(b, "harness_added_ttft", &m->added_ttft, m->percentiles, m->n_percentiles);
    if (m->resp_leg.n) {
        rc |= stats(b, "request_leg", &m->req_leg, m->percentiles, m->n_percentiles);
        rc |= stats(b, "response_leg", &m->resp_leg, m->percentiles, m->n_percentiles);
    }
    if (run->have_server) {
        const td_bench_scrape_t *s = &run->server;
        rc |= td_buf_append_str(b, "\"server_metrics\": {");
        rc |= num(b, "ttft_count", s->ttft.total);
        rc |= num(b, "mean_ttft_ms", s->ttft.total > 0 ? s->ttft.sum / s->ttft.total * 1000 : NAN);
        rc |= num(b, "median_ttft_ms", td_bench_hist_quantile(&s->ttft, 0.5) * 1000);
        rc |= num(b, "p90_ttft_ms", td_bench_hist_quantile(&s->ttft, 0.9) * 1000);
        rc |= num(b, "p99_ttft_ms", td_bench_hist_quantile(&s->ttft, 0.99) * 1000);
        rc |= num(b, "mean_e2el_ms", s->e2e.total > 0 ? s->e2e.sum / s->e2e.total * 1000 : NAN);
        rc |= num(b, "mean_itl_ms", s->itl.total > 0 ? s->itl.sum / s->itl.total * 1000 : NAN);
        rc |= num(b, "mean_tpot_ms", s->tpot.total > 0 ? s->tpot.sum / s->tpot.total * 1000 : NAN);
        rc |= num(b, "prompt_tokens", s->prompt_tokens);
        rc |= num(b, "generation_tokens", s->generation_tokens);
        if (rc == 0)
            b->data[b->len -= 2] = 0; /* the last ", " */
        rc |= td_buf_append_str(b, "}, ");
    }
    if (detailed) {
        rc |= td_buf_append_str(b, "\"input_lens\": [");
        for (size_t i = 0; i < run->n; i++)
            rc |= td_buf_printf(b, "%s%lld", i ? ", " : "", (long long)run->results[i].prompt_len);
        rc |= td_buf_append_str(b, "], \"output_lens\": [");
        for (size_t i = 0; i < run->n; i++)
            rc |= td_buf_printf(b, "%s%lld", i ? ", " : "",
                                (long long)(run->results[i].err ? 0 : run->results[i].output_len));
        rc |= td_buf_append_str(b, "], \"ttfts\": [");
        for (size_t i = 0; i < run->n; i++)
            rc |= td_buf_printf(b, "%s%.17g", i ? ", " : "", run->results[i].ttft);
        rc |= td_buf_append_str(b, "], \"itls\": [");
        for (size_t i = 0; i < run->n; i++) {
            rc |= td_buf_append_str(b, i ? ", [" : "[");
            for (size_t k = 0; k < run->results[i].n_itl; k++)
                rc |= td_buf_printf(b, "%s%.17g", k ? ", " : "", run->results[i].itl[k]);
            rc |= td_buf_append_str(b, "]");
        }
        rc |= td_buf_append_str(b, "], \"start_times\": [");
        for (size_t i = 0; i < run->n; i++)
            rc |= td_buf_printf(b, "%s%.17g", i ? ", " : "", run->results[i].send_s);
        rc |= td_buf_append_str(b, "], \"generated_texts\": [");
        for (size_t i = 0; i < run->n; i++) {
            if (i)
                rc |= td_buf_append_str(b, ", ");
            rc |= td_buf_append_json_string(
                b, run->results[i].text.data ? run->results[i].text.data : "",
                run->results[i].text.len);
        }
        rc |= td_buf_append_str(b, "], \"errors\": [");
        for (size_t i = 0; i < run->n; i++) {
            const char *e = run->results[i].error ? run->results[i].error : "";
            if (i)
                rc |= td_buf_append_str(b, ", ");
            rc |= td_buf_append_json_string(b, e, strlen(e));
        }
        rc |= td_buf_append_str(b, "], ");
    }
    rc |= td_buf_printf(b, "\"tandem_version\": \"%s\"}\n", TD_VERSION);
    return rc ? TD_ENOMEM : 0;
}

void td_bench_report_text(const td_bench_run_t *run, FILE *f)
{
    const td_bench_metrics_t *m = &run->m;
    fprintf(f, "============ Serving Benchmark Result ============\n");
    fprintf(f, "%-40s %-10zu\n", "Successful requests:", m->completed);
    fprintf(f, "%-40s %-10zu\n", "Failed requests:", m->failed);
    if (m->failed)
        for (int k = 1; k < TD_BENCH_ERR_N_; k++)
            if (m->failed_by_kind[k])
                fprintf(f, "  %-38s %-10zu\n", td_bench_err_name((td_bench_err_t)k),
                        m->failed_by_kind[k]);
    if (run->info.max_concurrency > 0)
        fprintf(f, "%-40s %-10ld\n", "Maximum request concurrency:", run->info.max_concurrency);
    fprintf(f, "%-40s %-10g\n", "Request rate configured (RPS):", run->info.request_rate);
    fprintf(f, "%-40s %-10.2f\n", "Benchmark duration (s):", m->duration);
    fprintf(f, "%-40s %-10lld\n", "Total input tokens:", (long long)m->total_input);
    fprintf(f, "%-40s %-10lld\n", "Total generated tokens:", (long long)m->total_output);
    fprintf(f, "%-40s %-10.2f\n", "Request throughput (req/s):", m->request_throughput);
    if (run->info.slo)
        fprintf(f, "%-40s %-10.2f\n", "Request goodput (req/s):", m->request_goodput);
    fprintf(f, "%-40s %-10.2f\n", "Output token throughput (tok/s):", m->output_throughput);
    fprintf(f, "%-40s %-10.2f\n",
            "Peak output token throughput (tok/s):", m->max_output_tokens_per_s);
    fprintf(f, "%-40s %-10zu\n", "Peak concurrent requests:", m->max_concurrent_requests);
    fprintf(f, "%-40s %-10zu\n", "Peak streams in flight:", m->peak_inflight);
    fprintf(f, "%-40s %-10.2f\n", "Achieved send rate (req/s):", m->send_rate);
    fprintf(f, "%-40s %-10.3f\n", "Mean send lag (ms):", m->send_lag.mean * 1000);
    if (m->n_percentiles)
        fprintf(f, "%-40s %-10.3f\n",
                "Max-percentile send lag (ms):", m->send_lag.pct[m->n_percentiles - 1] * 1000);
    fprintf(f, "%-40s %-10.2f\n", "Total Token throughput (tok/s):", m->total_token_throughput);
    struct {
        const char *title, *abbr;
        const td_bench_stats_t *s;
    } rows[] = {{"Time to First Token", "TTFT", &m->ttft},
                {"Time per Output Token (excl. 1st token)", "TPOT", &m->tpot},
                {"Inter-token Latency", "ITL", &m->itl},
                {"End-to-end Latency", "E2EL", &m->e2el},
                {"Added TTFT (client TTFT - server's own delay)", "added TTFT", &m->added_ttft},
                {"  of which: client send -> server read the request", "req leg", &m->req_leg},
                {"  of which: server wrote 1st chunk -> client read it", "resp leg", &m->resp_leg}};
    for (size_t r = 0; r < TD_ARRAY_LEN(rows); r++) {
        if ((r == 4 && m->added_ttft.n == 0) || (r > 4 && m->resp_leg.n == 0))
            continue;
        char key[64];
        fprintf(f, "%s\n", "");
        fprintf(f, "%-50s\n", rows[r].title);
        snprintf(key, sizeof(key), "Mean %s (ms):", rows[r].abbr);
        fprintf(f, "%-40s %-10.3f\n", key, rows[r].s->mean * 1000);
        snprintf(key, sizeof(key), "Median %s (ms):", rows[r].abbr);
        fprintf(f, "%-40s %-10.3f\n", key, rows[r].s->median * 1000);
        for (size_t i = 0; i < m->n_percentiles; i++) {
            char pw[32];
            pword(m->percentiles[i], pw, sizeof(pw));
            snprintf(key, sizeof(key), "P%s %s (ms):", pw, rows[r].abbr);
            fprintf(f, "%-40s %-10.3f\n", key, rows[r].s->pct[i] * 1000);
        }
    }
    if (run->have_server) {
        const td_bench_scrape_t *s = &run->server;
        fprintf(f, "\nServer-side view (/metrics, difference over the run)\n");
        fprintf(f, "%-40s %-10.0f (client: %zu)\n", "TTFT observations:", s->ttft.total,
                m->completed);
        if (s->ttft.total > 0) {
            fprintf(f, "%-40s %-10.3f (client: %.3f)\n",
                    "Mean TTFT (ms):", s->ttft.sum / s->ttft.total * 1000, m->ttft.mean * 1000);
            fprintf(f, "%-40s %-10.3f (bucket interpolation)\n",
                    "Median TTFT (ms):", td_bench_hist_quantile(&s->ttft, 0.5) * 1000);
            fprintf(f, "%-40s %-10.3f (bucket interpolation)\n",
                    "P99 TTFT (ms):", td_bench_hist_quantile(&s->ttft, 0.99) * 1000);
        }
        fprintf(f, "%-40s %-10.0f (client: %lld)\n", "Prompt tokens:", s->prompt_tokens,
                (long long)m->total_input);
        fprintf(f, "%-40s %-10.0f (client: %lld)\n", "Generation tokens:", s->generation_tokens,
                (long long)m->total_output);
    }
    fprintf(f, "==================================================\n");
}
