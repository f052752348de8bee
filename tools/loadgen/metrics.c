/* metrics.c: vLLM's calculate_metrics (vllm/benchmarks/serve.py), definition for definition. */
#include "bench.h"
#include "td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double td_bench_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    /* numpy.percentile, method "linear": rank (n - 1) p / 100, interpolated */
    double rank = (double)(n - 1) * p / 100.0;
    size_t lo = (size_t)floor(rank);
    if (lo >= n - 1)
        return sorted[n - 1];
    double frac = rank - (double)lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

void td_bench_stats(double *x, size_t n, const double *pcts, size_t n_pcts, td_bench_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->n = n;
    if (n == 0)
        return; /* numpy over `x or 0` gives 0 for every statistic */
    qsort(x, n, sizeof(double), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    out->mean = sum / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (x[i] - out->mean) * (x[i] - out->mean);
    out->std = sqrt(ss / (double)n); /* numpy.std: population (ddof 0) */
    out->median = td_bench_percentile(x, n, 50);
    for (size_t i = 0; i < n_pcts && i < TD_ARRAY_LEN(out->pct); i++)
        out->pct[i] = td_bench_percentile(x, n, pcts[i]);
}

int td_bench_metrics_compute(const td_bench_result_t *results, size_t n, double duration,
                             const double *pcts, size_t n_pcts, const td_bench_slo_t *slo,
                             td_bench_metrics_t *out)
{
    memset(out, 0, sizeof(*out));
    out->n_percentiles = TD_MIN(n_pcts, TD_ARRAY_LEN(out->percentiles));
    memcpy(out->percentiles, pcts, out->n_percentiles * sizeof(double));
    out->duration = duration;
    size_t n_itl = 0;
    for (size_t i = 0; i < n; i++)
        if (results[i].err == TD_BENCH_OK)
            n_itl += results[i].n_itl;
    double *ttft = td_calloc(n + 1, sizeof(double));
    double *tpot = td_calloc(n + 1, sizeof(double));
    double *all_tpot = td_calloc(n + 1, sizeof(double));
    double *e2el = td_calloc(n + 1, sizeof(double));
    double *itl = td_calloc(n_itl + 1, sizeof(double));
    double *added = td_calloc(n + 1, sizeof(double));
    double *lag = td_calloc(n + 1, sizeof(double));
    double *leg1 = td_calloc(n + 1, sizeof(double)), *leg2 = td_calloc(n + 1, sizeof(double));
    int rc = 0;
    if (!ttft || !tpot || !all_tpot || !e2el || !itl || !added || !lag || !leg1 || !leg2) {
        rc = td_err_set(TD_ENOMEM, "out of memory");
        goto out;
    }
    size_t n_ok = 0, n_tpot = 0, k_itl = 0, n_added = 0, n_leg = 0;
    double first_send = INFINITY, last_send = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        const td_bench_result_t *r = &results[i];
        lag[i] = r->send_s - r->sched_s;
        first_send = TD_MIN(first_send, r->send_s);
        last_send = TD_MAX(last_send, r->send_s);
        if (r->err != TD_BENCH_OK) {
            out->failed++;
            out->failed_by_kind[r->err]++;
            continue;
        }
        int64_t olen = r->output_len;
        out->total_output += olen;
        out->total_input += r->prompt_len;
        double t = 0;
        if (olen > 1) {
            t = (r->latency - r->ttft) / (double)(olen - 1);
            tpot[n_tpot++] = t;
        }
        all_tpot[n_ok] = t; /* output_len <= 1 counts as TPOT 0 for goodput */
        ttft[n_ok] = r->ttft;
        e2el[n_ok] = r->latency;
        if (r->n_itl)
            memcpy(itl + k_itl, r->itl, r->n_itl * sizeof(double));
        k_itl += r->n_itl;
        if (r->srv_ttft >= 0)
            added[n_added++] = r->ttft - r->srv_ttft;
        if (r->resp_leg >= -1e-3 && r->req_leg >= -1e-3) {
            leg1[n_leg] = r->req_leg;
            leg2[n_leg++] = r->resp_leg;
        }
        n_ok++;
    }
    out->completed = n_ok;
    if (slo) {
        for (size_t i = 0; i < n_ok; i++) {
            bool good = true;
            if (slo->ttft_ms >= 0 && !(slo->ttft_ms / 1000.0 >= ttft[i]))
                good = false;
            if (slo->tpot_ms >= 0 && !(slo->tpot_ms / 1000.0 >= all_tpot[i]))
                good = false;
            if (slo->e2el_ms >= 0 && !(slo->e2el_ms / 1000.0 >= e2el[i]))
                good = false;
            out->good_completed += good;
        }
    }
    double d = duration > 0 ? duration : NAN;
    out->request_throughput = (double)n_ok / d;
    out->request_goodput = slo ? (double)out->good_completed / d : NAN;
    out->output_throughput = (double)out->total_output / d;
    out->total_token_throughput = (double)(out->total_input + out->total_output) / d;
    td_bench_stats(ttft, n_ok, pcts, out->n_percentiles, &out->ttft);
    td_bench_stats(tpot, n_tpot, pcts, out->n_percentiles, &out->tpot);
    td_bench_stats(itl, k_itl, pcts, out->n_percentiles, &out->itl);
    td_bench_stats(e2el, n_ok, pcts, out->n_percentiles, &out->e2el);
    td_bench_stats(added, n_added, pcts, out->n_percentiles, &out->added_ttft);
    td_bench_stats(lag, n, pcts, out->n_percentiles, &out->send_lag);
    td_bench_stats(leg1, n_leg, pcts, out->n_percentiles, &out->req_leg);
    td_bench_stats(leg2, n_leg, pcts, out->n_percentiles, &out->resp_leg);
    out->send_rate =
        n > 1 && last_send > first_send ? (double)(n - 1) / (last_send - first_send) : NAN;
    {
        /* peak concurrency: at each start, the starts so far minus the ends before it */
        size_t cur = 0;
        double *st = td_calloc(n_ok + 1, sizeof(double)), *en = td_calloc(n_ok + 1, sizeof(double));
        if (st && en) {
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (results[i].err == TD_BENCH_OK) {
                    st[k] = results[i].send_s;
                    en[k++] = results[i].send_s + results[i].latency;
                }
            qsort(st, k, sizeof(double), cmp_double);
            qsort(en, k, sizeof(double), cmp_double);
            size_t j = 0;
            for (size_t i = 0; i < k; i++) {
                while (j < k && en[j] < st[i])
                    j++;
                cur = i + 1 - j;
                out->peak_inflight = TD_MAX(out->peak_inflight, cur);
            }
        }
        free(st);
        free(en);
    }

    /* vLLM's max_output_tokens_per_s and max_concurrent_requests: 1-second bins from the first
     * send; a token per chunk with choices, a request in every bin it was active in */
    double t_min = INFINITY, t_max = 0;
    for (size_t i = 0; i < n; i++)
        if (results[i].err == TD_BENCH_OK) {
            t_min = TD_MIN(t_min, results[i].send_s);
            t_max = TD_MAX(t_max, results[i].send_s + results[i].latency);
        }
    size_t nbins = isfinite(t_min) ? (size_t)ceil(t_max - t_min) + 1 : 1;
    double *tok = td_calloc(nbins, sizeof(double));
    double *conc = td_calloc(nbins, sizeof(double));
    if (!tok || !conc) {
        free(tok);
        free(conc);
        rc = td_err_set(TD_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const td_bench_result_t *r = &results[i];
        if (r->err != TD_BENCH_OK)
            continue;
        double t = r->send_s + r->ttft;
        size_t b = (size_t)TD_MAX(t - t_min, 0.0);
        if (b < nbins)
            tok[b] += 1;
        for (size_t k = 0; k < r->n_itl; k++) {
            t += r->itl[k];
            b = (size_t)TD_MAX(t - t_min, 0.0);
            if (b < nbins)
                tok[b] += 1;
        }
        size_t b0 = (size_t)TD_MAX(r->send_s - t_min, 0.0);
        size_t b1 = (size_t)TD_MAX(r->send_s + r->latency - t_min, 0.0);
        for (size_t k = b0; k <= b1 && k < nbins; k++)
            conc[k] += 1;
    }
    for (size_t k = 0; k < nbins; k++) {
        out->max_output_tokens_per_s = TD_MAX(out->max_output_tokens_per_s, tok[k]);
        out->max_concurrent_requests = TD_MAX(out->max_concurrent_requests, (size_t)conc[k]);
    }
    free(tok);
    free(conc);
out:
    free(ttft);
    free(tpot);
    free(all_tpot);
    free(e2el);
    free(itl);
    free(added);
    free(lag);
    free(leg1);
    free(leg2);
    return rc;
}
