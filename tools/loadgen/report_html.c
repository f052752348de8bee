/* report_html.c: one self-contained HTML file (inline SVG, no script, no network) a person can
 * read at a glance: a summary table, latency CDFs, TTFT / ITL / throughput over time for every
 * run and, for a sweep, goodput and latency against the request rate. */
#include "bench.h"
#include "td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { W = 600, H = 300, ML = 64, MR = 16, MT = 28, MB = 42, MAX_POINTS = 3000 };

static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                     "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

typedef struct series {
    char name[64];
    double *x, *y; /* [n] owned */
    size_t n;
    bool points; /* scatter instead of a line */
} series_t;

static void series_free(series_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(s[i].x);
        free(s[i].y);
    }
}

static bool series_alloc(series_t *s, size_t n)
{
    s->x = calloc(n ? n : 1, sizeof(double));
    s->y = calloc(n ? n : 1, sizeof(double));
    s->n = 0;
    return s->x && s->y;
}

static double nice_step(double range)
{
    if (!(range > 0))
        return 1;
    double raw = range / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static int chart(td_buf_t *b, const char *title, const char *xl, const char *yl, series_t *s,
                 size_t ns)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i]))
                continue;
            x0 = TD_MIN(x0, s[k].x[i]);
            x1 = TD_MAX(x1, s[k].x[i]);
            y1 = TD_MAX(y1, s[k].y[i]);
            y0 = TD_MIN(y0, s[k].y[i]);
        }
    int rc = td_buf_printf(b,
                           "<figure><svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">"
                           "<text x=\"%d\" y=\"18\" class=\"t\">%s</text>",
                           W, H, W, H, W / 2, title);
    if (!isfinite(x0)) {
        rc |= td_buf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"t\">no data</text></svg></figure>",
                            W / 2, H / 2);
        return rc;
    }
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0)
        y1 = y0 + 1;
    double xs = nice_step(x1 - x0), ys = nice_step(y1 - y0);
    x0 = floor(x0 / xs) * xs;
    x1 = ceil(x1 / xs) * xs;
    y1 = ceil(y1 / ys) * ys;
    double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v)-x0) / (x1 - x0) * pw)
#define PY(v) (MT + ph - ((v)-y0) / (y1 - y0) * ph)
    rc |= td_buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" class=\"f\"/>", ML,
                        MT, pw, ph);
    for (double v = x0; v <= x1 + xs * 1e-9; v += xs)
        rc |= td_buf_printf(b,
                            "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%g\" class=\"g\"/>"
                            "<text x=\"%.1f\" y=\"%g\" class=\"xt\">%g</text>",
                            PX(v), PX(v), MT, MT + ph, PX(v), MT + ph + 14, v);
    for (double v = y0; v <= y1 + ys * 1e-9; v += ys)
        rc |= td_buf_printf(b,
                            "<line x1=\"%d\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" class=\"g\"/>"
                            "<text x=\"%d\" y=\"%.1f\" class=\"yt\">%g</text>",
                            ML, ML + pw, PY(v), PY(v), ML - 4, PY(v) + 4, v);
    rc |= td_buf_printf(b,
                        "<text x=\"%g\" y=\"%d\" class=\"t\">%s</text>"
                        "<text x=\"14\" y=\"%g\" class=\"t\" transform=\"rotate(-90 14 %g)\">"
                        "%s</text>",
                        ML + pw / 2, H - 6, xl, MT + ph / 2, MT + ph / 2, yl);
    for (size_t k = 0; k < ns; k++) {
        const char *col = COLORS[k % TD_ARRAY_LEN(COLORS)];
        size_t stride = s[k].n > MAX_POINTS ? (s[k].n + MAX_POINTS - 1) / MAX_POINTS : 1;
        if (s[k].points) {
            rc |= td_buf_printf(b, "<g fill=\"%s\" fill-opacity=\"0.5\">", col);
            for (size_t i = 0; i < s[k].n; i += stride)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
                    rc |= td_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.6\"/>",
                                        PX(s[k].x[i]), PY(s[k].y[i]));
            rc |= td_buf_append_str(b, "</g>");
        } else {
            rc |= td_buf_printf(b,
                                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
                                "points=\"",
                                col);
            for (size_t i = 0; i < s[k].n; i += stride)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
                    rc |= td_buf_printf(b, "%.1f,%.1f ", PX(s[k].x[i]), PY(s[k].y[i]));
            if (s[k].n && (s[k].n - 1) % stride)
                rc |= td_buf_printf(b, "%.1f,%.1f", PX(s[k].x[s[k].n - 1]), PY(s[k].y[s[k].n - 1]));
            rc |= td_buf_append_str(b, "\"/>");
        }
        rc |= td_buf_printf(b,
                            "<rect x=\"%g\" y=\"%zu\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                            "<text x=\"%g\" y=\"%zu\" class=\"l\">%s</text>",
                            ML + pw - 150, MT + 6 + 14 * k, col, ML + pw - 136, MT + 15 + 14 * k,
                            s[k].name);
    }
#undef PX
#undef PY
    rc |= td_buf_append_str(b, "</svg></figure>\n");
    return rc;
}

/* Append `s` as HTML text (& < > " escaped); "" for NULL. */
static int html_text(td_buf_t *b, const char *s)
{
    int rc = 0;
    for (; s && *s && rc == 0; s++) {
        switch (*s) {
        case '&':
            rc = td_buf_append_str(b, "&amp;");
            break;
        case '<':
            rc = td_buf_append_str(b, "&lt;");
            break;
        case '>':
            rc = td_buf_append_str(b, "&gt;");
            break;
        case '"':
            rc = td_buf_append_str(b, "&quot;");
            break;
        default:
            rc = td_buf_append_char(b, *s);
        }
    }
    return rc;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void rate_name(const td_bench_run_t *r, char *out, size_t n)
{
    if (isinf(r->info.request_rate))
        snprintf(out, n, "rate inf");
    else
        snprintf(out, n, "rate %g/s", r->info.request_rate);
}

/* Empirical CDF of one metric for every run (ms). which: 0 ttft, 1 tpot, 2 itl, 3 e2el. */
static int cdf_chart(td_buf_t *b, const td_bench_run_t *runs, size_t nr, int which,
                     const char *title)
{
    series_t *s = calloc(nr, sizeof(series_t));
    int rc = s ? 0 : TD_ENOMEM;
    for (size_t k = 0; k < nr && rc == 0; k++) {
        const td_bench_run_t *r = &runs[k];
        size_t cap = 0;
        for (size_t i = 0; i < r->n; i++)
            cap += which == 2 ? r->results[i].n_itl : 1;
        double *v = calloc(cap + 1, sizeof(double));
        if (!v || !series_alloc(&s[k], cap)) {
            free(v);
            rc = TD_ENOMEM;
            break;
        }
        size_t m = 0;
        for (size_t i = 0; i < r->n; i++) {
            const td_bench_result_t *q = &r->results[i];
            if (q->err)
                continue;
            if (which == 0)
                v[m++] = q->ttft * 1000;
            else if (which == 1 && q->output_len > 1)
                v[m++] = (q->latency - q->ttft) / (double)(q->output_len - 1) * 1000;
            else if (which == 2)
                for (size_t j = 0; j < q->n_itl; j++)
                    v[m++] = q->itl[j] * 1000;
            else if (which == 3)
                v[m++] = q->latency * 1000;
        }
        qsort(v, m, sizeof(double), cmp_d);
        for (size_t i = 0; i < m; i++) {
            s[k].x[i] = v[i];
            s[k].y[i] = (double)(i + 1) / (double)m;
        }
        s[k].n = m;
        rate_name(r, s[k].name, sizeof(s[k].name));
        free(v);
    }
    if (rc == 0)
        rc = chart(b, title, "milliseconds", "fraction of samples", s, nr);
    if (s)
        series_free(s, nr);
    free(s);
    return rc;
}

static int run_charts(td_buf_t *b, const td_bench_run_t *r)
{
    series_t s[2] = {0};
    size_t n_itl = 0;
    for (size_t i = 0; i < r->n; i++)
        n_itl += r->results[i].n_itl;
    int rc = 0;
    /* TTFT over time */
    if (!series_alloc(&s[0], r->n))
        rc = TD_ENOMEM;
    for (size_t i = 0; rc == 0 && i < r->n; i++)
        if (!r->results[i].err) {
            s[0].x[s[0].n] = r->results[i].send_s;
            s[0].y[s[0].n++] = r->results[i].ttft * 1000;
        }
    snprintf(s[0].name, sizeof(s[0].name), "TTFT");
    s[0].points = true;
    if (rc == 0)
        rc = chart(b, "TTFT over time", "seconds since start (request sent)", "TTFT (ms)", s, 1);
    series_free(s, 1);
    memset(s, 0, sizeof(s));
    /* ITL over time */
    if (rc == 0 && !series_alloc(&s[0], n_itl))
        rc = TD_ENOMEM;
    for (size_t i = 0; rc == 0 && i < r->n; i++) {
        const td_bench_result_t *q = &r->results[i];
        if (q->err)
            continue;
        double t = q->send_s + q->ttft;
        for (size_t k = 0; k < q->n_itl; k++) {
            t += q->itl[k];
            s[0].x[s[0].n] = t;
            s[0].y[s[0].n++] = q->itl[k] * 1000;
        }
    }
    snprintf(s[0].name, sizeof(s[0].name), "ITL");
    s[0].points = true;
    if (rc == 0)
        rc = chart(b, "ITL over time", "seconds since start (chunk received)", "ITL (ms)", s, 1);
    series_free(s, 1);
    memset(s, 0, sizeof(s));
    /* throughput over time: about 40 bins of a round width, rates per second */
    double dur = r->m.duration > 0 ? r->m.duration : 1;
    double bw = nice_step(dur * 5 / 40);
    size_t nb = (size_t)ceil(dur / bw);
    if (nb == 0)
        nb = 1;
    if (rc == 0 && (!series_alloc(&s[0], nb) || !series_alloc(&s[1], nb)))
        rc = TD_ENOMEM;
    for (size_t i = 0; rc == 0 && i < nb; i++) {
        s[0].x[i] = s[1].x[i] = ((double)i + 0.5) * bw;
        s[0].y[i] = s[1].y[i] = 0;
    }
    double w = 1.0 / bw; /* one event in a bin adds 1/bw per second */
    for (size_t i = 0; rc == 0 && i < r->n; i++) {
        const td_bench_result_t *q = &r->results[i];
        if (q->err)
            continue;
        /* the request's output tokens spread over its chunks */
        double per = q->n_chunks ? (double)q->output_len / (double)q->n_chunks : 0;
        double t = q->send_s + q->ttft;
        size_t bi = (size_t)TD_MAX(t / bw, 0.0);
        if (bi < nb)
            s[0].y[bi] += per * w;
        for (size_t k = 0; k < q->n_itl; k++) {
            t += q->itl[k];
            bi = (size_t)TD_MAX(t / bw, 0.0);
            if (bi < nb)
                s[0].y[bi] += per * w;
        }
        bi = (size_t)TD_MAX((q->send_s + q->latency) / bw, 0.0);
        if (bi < nb)
            s[1].y[bi] += w;
    }
    if (rc == 0) {
        char title[96];
        s[0].n = s[1].n = nb;
        snprintf(s[0].name, sizeof(s[0].name), "output tokens/s");
        snprintf(title, sizeof(title), "Output token throughput over time (%g s bins)", bw);
        rc = chart(b, title, "seconds since start", "tokens/s", s, 1);
        snprintf(s[1].name, sizeof(s[1].name), "requests/s");
        snprintf(title, sizeof(title), "Completed requests over time (%g s bins)", bw);
        if (rc == 0)
            rc = chart(b, title, "seconds since start", "requests/s", s + 1, 1);
    }
    series_free(s, 2);
    return rc;
}

static int sweep_charts(td_buf_t *b, const td_bench_run_t *runs, size_t nr)
{
    series_t s[3] = {0};
    int rc = 0;
    for (int k = 0; k < 3; k++)
        if (!series_alloc(&s[k], nr))
            rc = TD_ENOMEM;
    bool slo = runs[0].info.slo != NULL;
    for (size_t i = 0; rc == 0 && i < nr; i++) {
        double x = runs[i].info.request_rate;
        if (!isfinite(x))
            continue;
        s[0].x[s[0].n] = s[1].x[s[1].n] = x;
        s[0].y[s[0].n++] = runs[i].m.request_throughput;
        if (slo)
            s[1].y[s[1].n++] = runs[i].m.request_goodput;
    }
    snprintf(s[0].name, sizeof(s[0].name), "throughput");
    snprintf(s[1].name, sizeof(s[1].name), "goodput");
    if (rc == 0)
        rc = chart(b,
                   slo ? "Request throughput and goodput against request rate"
                       : "Request throughput against request rate (no --goodput given)",
                   "request rate (req/s)", "requests/s", s, slo ? 2 : 1);
    const char *names[] = {"mean TTFT", "p99 TTFT", "mean TPOT", "p99 TPOT", "mean E2EL"};
    for (int chartn = 0; chartn < 2 && rc == 0; chartn++) {
        for (int k = 0; k < 3; k++)
            s[k].n = 0;
        for (size_t i = 0; i < nr; i++) {
            double x = runs[i].info.request_rate;
            if (!isfinite(x))
                continue;
            const td_bench_metrics_t *m = &runs[i].m;
            size_t p99 = m->n_percentiles ? m->n_percentiles - 1 : 0;
            const td_bench_stats_t *st = chartn == 0 ? &m->ttft : &m->tpot;
            s[0].x[s[0].n] = s[1].x[s[1].n] = x;
            s[0].y[s[0].n++] = st->mean * 1000;
            s[1].y[s[1].n++] = (m->n_percentiles ? st->pct[p99] : st->median) * 1000;
        }
        snprintf(s[0].name, sizeof(s[0].name), "%s", names[chartn * 2]);
        snprintf(s[1].name, sizeof(s[1].name), "%s (last pct)", names[chartn * 2 + 1]);
        rc = chart(b, chartn == 0 ? "TTFT against request rate" : "TPOT against request rate",
                   "request rate (req/s)", "milliseconds", s, 2);
    }
    series_free(s, 3);
    return rc;
}

int td_bench_report_html(const td_bench_run_t *runs, size_t nr, td_buf_t *b)
{
    int rc = td_buf_append_str(
        b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tandem bench</title>"
           "<style>body{font:14px sans-serif;margin:20px;color:#222}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
           "text-align:right}figure{display:inline-block;margin:6px}"
           "svg text{font:11px sans-serif}.t{text-anchor:middle;font-weight:bold}"
           ".xt{text-anchor:middle}.yt{text-anchor:end}.g{stroke:#e4e4e4}.f{fill:#fbfbfb;"
           "stroke:#999}.l{font-size:11px}</style></head><body>\n<h1>tandem bench</h1>\n");
    if (nr == 0)
        return rc | td_buf_append_str(b, "<p>no runs</p></body></html>\n");
    const td_bench_run_info_t *in = &runs[0].info;
    rc |= td_buf_printf(b, "<p>endpoint %s, model ", in->backend);
    rc |= html_text(b, in->model_id);
    if (in->label) {
        rc |= td_buf_append_str(b, ", label ");
        rc |= html_text(b, in->label);
    }
    rc |= td_buf_printf(
        b,
        ", %zu prompts per run, burstiness %g, max concurrency %ld%s, chunk times "
        "from %s.</p>\n",
        in->num_prompts, in->burstiness, in->max_concurrency, in->max_concurrency ? "" : " (none)",
        in->timestamps && strcmp(in->timestamps, "app") == 0 ? "the client's reads"
                                                             : "kernel receive timestamps");
    rc |= td_buf_append_str(
        b, "<table><tr><th>rate (req/s)</th><th>completed</th><th>failed</th>"
           "<th>duration (s)</th><th>req/s</th><th>goodput</th><th>output tok/s</th>"
           "<th>mean TTFT ms</th><th>p99 TTFT ms</th><th>mean TPOT ms</th><th>mean ITL ms</th>"
           "<th>mean E2EL ms</th></tr>\n");
    for (size_t i = 0; i < nr; i++) {
        const td_bench_metrics_t *m = &runs[i].m;
        size_t p = m->n_percentiles ? m->n_percentiles - 1 : 0;
        rc |= td_buf_printf(b,
                            "<tr><td>%g</td><td>%zu</td><td>%zu</td><td>%.2f</td><td>%.2f</td>"
                            "<td>%s%.2f</td><td>%.1f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td>"
                            "<td>%.2f</td><td>%.1f</td></tr>\n",
                            runs[i].info.request_rate, m->completed, m->failed, m->duration,
                            m->request_throughput, runs[i].info.slo ? "" : "n/a ",
                            runs[i].info.slo ? m->request_goodput : 0.0, m->output_throughput,
                            m->ttft.mean * 1000, m->ttft.pct[p] * 1000, m->tpot.mean * 1000,
                            m->itl.mean * 1000, m->e2el.mean * 1000);
    }
    rc |= td_buf_append_str(b, "</table>\n");
    if (nr > 1) {
        rc |= td_buf_append_str(b, "<h2>Sweep</h2>\n");
        rc |= sweep_charts(b, runs, nr);
    }
    rc |= td_buf_append_str(b, "<h2>Latency distributions</h2>\n");
    rc |= cdf_chart(b, runs, nr, 0, "TTFT CDF");
    rc |= cdf_chart(b, runs, nr, 1, "TPOT CDF");
    rc |= cdf_chart(b, runs, nr, 2, "ITL CDF");
    rc |= cdf_chart(b, runs, nr, 3, "E2E latency CDF");
    for (size_t i = 0; i < nr; i++) {
        char name[64];
        rate_name(&runs[i], name, sizeof(name));
        rc |= td_buf_printf(b, "<h2>Over time: %s</h2>\n", name);
        rc |= run_charts(b, &runs[i]);
    }
    rc |= td_buf_append_str(b, "</body></html>\n");
    return rc ? TD_ENOMEM : 0;
}
