/* admin.c: a worker's /metrics (Prometheus) and /health endpoints, and its metric handles. */
#include "td_error.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdio.h>

/* The worker's series that mean what vLLM's of the same name mean (metrics.vllm_names). The
 * request-level ones (running, waiting, tokens, successes) are the router's under vLLM's names: a
 * request passes through two workers, so a dashboard summing every target would count it twice.
 * The disk tier has no vLLM counterpart. */
static const char *const vllm_series[] = {
    "kv_cache_usage_perc",
    "num_preemptions_total",
    "prefix_cache_queries_total{tier=\"pool\"}",
    "prefix_cache_hits_total{tier=\"pool\"}",
    NULL,
};

int td_wk_metrics_init(td_worker_t *w)
{
    td_buf_t cl, vl, esc;
    td_buf_init(&cl);
    td_buf_init(&vl);
    td_buf_init(&esc);
    char base[256];
    const char *model = w->cfg.model_name && *w->cfg.model_name
                            ? w->cfg.model_name
                            : td_path_basename(w->cfg.model, base, sizeof(base));
    int rc = td_metrics_escape(model, &esc);
    if (!rc)
        rc = td_buf_printf(&cl, "role=\"%s\"", w->role->name);
    if (!rc)
        rc = td_buf_printf(&vl, "role=\"%s\",model_name=\"%s\"", w->role->name,
                           esc.data ? esc.data : "");
    td_metrics_opts_t mo = {.prefix = "tandem_", .const_labels = cl.data};
    if (w->cfg.vllm_names) {
        mo.vllm_series = vllm_series;
        mo.vllm_labels = vl.data;
    }
    if (!rc && !(w->m.reg = td_metrics_new_opts(&mo)))
        rc = TD_ENOMEM;
    td_buf_free(&cl);
    td_buf_free(&vl);
    td_buf_free(&esc);
    if (rc)
        return td_err_set(TD_ENOMEM, "out of memory");
    td_metrics_t *r = w->m.reg;
    td_wk_metrics_t *m = &w->m;
    m->running = td_metrics_gauge(r, "num_requests_running", "Sequences in the decode batch.",
                                  NULL);
    m->waiting = td_metrics_gauge(r, "num_requests_waiting",
                                  "Sequences prefilling or waiting for their KV.", NULL);
    m->kv_usage = td_metrics_gauge(r, "kv_cache_usage_perc",
                                   "Fraction of KV blocks in use (1 = full).", NULL);
    m->prompt = td_metrics_counter(r, "prompt_tokens_total", "Prompt tokens received.", NULL);
    m->gen = td_metrics_counter(r, "generation_tokens_total", "Tokens generated.", NULL);
    m->step = td_metrics_histogram(r, "engine_step_seconds", "Time of one engine step.", NULL,
                                   td_buckets_tpot, td_buckets_tpot_n);
    m->xfer_bytes = td_metrics_counter(r, "kv_transfer_bytes_total",
                                       "KV bytes moved over the data plane.", "direction=\"out\"");
    m->recv_bytes = td_metrics_counter(r, "kv_transfer_bytes_total",
                                       "KV bytes moved over the data plane.", "direction=\"in\"");
    m->xfer_s = td_metrics_histogram(r, "kv_transfer_seconds",
                                     "Time from a prompt's first KV push to its last "
                                     "acknowledgement.",
                                     NULL, td_buckets_tpot, td_buckets_tpot_n);
    m->tail_s = td_metrics_histogram(r, "kv_handoff_tail_seconds",
                                     "Time from the end of a prompt's computation to the "
                                     "acknowledgement of its last KV push (the part of the "
                                     "handoff that does not overlap compute).",
                                     NULL, td_buckets_tpot, td_buckets_tpot_n);
    m->req_ok = td_metrics_counter(r, "request_success_total", "Requests finished here.", NULL);
    m->req_fail = td_metrics_counter(r, "request_failure_total", "Requests failed here.", NULL);
    m->preempt = td_metrics_counter(r, "num_preemptions_total",
                                    "Sequences preempted for lack of KV blocks (recomputed).",
                                    NULL);
    m->cache_queries = td_metrics_counter(r, "prefix_cache_queries_total",
                                          "Prompt tokens looked up in the prefix cache.",
                                          "tier=\"pool\"");
    m->cache_hits = td_metrics_counter(r, "prefix_cache_hits_total",
                                       "Prompt tokens found in the prefix cache.",
                                       "tier=\"pool\"");
    m->cached_blocks = td_metrics_gauge(r, "kv_cached_blocks",
                                        "Blocks held in the prefix cache.", "tier=\"pool\"");
    m->evictions = td_metrics_counter(r, "kv_cache_evictions_total",
                                      "Cached blocks evicted to make room.", "tier=\"pool\"");
    m->disk_queries = td_metrics_counter(r, "prefix_cache_queries_total",
                                         "Prompt tokens looked up in the prefix cache.",
                                         "tier=\"disk\"");
    m->disk_hits = td_metrics_counter(r, "prefix_cache_hits_total",
                                      "Prompt tokens found in the prefix cache.", "tier=\"disk\"");
    m->disk_files = td_metrics_gauge(r, "kv_cached_blocks", "Blocks held in the prefix cache.",
                                     "tier=\"disk\"");
    m->disk_bytes = td_metrics_gauge(r, "kv_disk_bytes", "Bytes of the disk tier's block files.",
                                     NULL);
    m->disk_enabled = td_metrics_gauge(r, "kv_disk_enabled",
                                       "1 while the disk tier works; 0 once a disk failure turned "
                                       "it off (or when none is configured).",
                                       NULL);
    m->disk_corrupt = td_metrics_counter(r, "kv_disk_corrupt_total",
                                         "Bad block files found and deleted (never served).", NULL);
    m->disk_errors = td_metrics_counter(r, "kv_disk_errors_total",
                                        "Disk tier system call failures.", NULL);
    m->disk_evictions = td_metrics_counter(r, "kv_cache_evictions_total",
                                           "Cached blocks evicted to make room.", "tier=\"disk\"");
    m->computed = td_metrics_counter(r, "prompt_tokens_computed_total",
                                     "Prompt tokens computed here (not taken from a cache or "
                                     "fetched; recomputation after preemption included).",
                                     NULL);
    m->fetch_blocks = td_metrics_counter(r, "kv_fetch_blocks_total",
                                         "KV blocks fetched from other workers' caches "
                                         "(verified, taken instead of computed).",
                                         NULL);
    m->fetch_bytes = td_metrics_counter(r, "kv_fetch_bytes_total",
                                        "Bytes of KV blocks fetched from other workers.", NULL);
    m->fetch_served = td_metrics_counter(r, "kv_fetch_served_blocks_total",
                                         "KV blocks this worker served to other workers' "
                                         "fetches.",
                                         NULL);
    m->fetch_bw = td_metrics_gauge(r, "kv_fetch_bandwidth_bytes_per_second",
                                   "Measured fetch bandwidth (EWMA; 0 until a fetch).", NULL);
    for (int i = 0; i < 6; i++) {
        char lab[64];
        snprintf(lab, sizeof(lab), "reason=\"%s\"", td_wk_fetch_reasons[i]);
        m->fetch_fail[i] = td_metrics_counter(r, "kv_fetch_failures_total",
                                              "Fetches from other workers that failed, by "
                                              "reason (their blocks were computed).",
                                              lab);
        if (!m->fetch_fail[i])
            return td_err_set(TD_ENOMEM, "out of memory");
    }
    if (!m->computed || !m->fetch_blocks || !m->fetch_bytes || !m->fetch_served || !m->fetch_bw)
        return td_err_set(TD_ENOMEM, "out of memory");
    if (!m->cache_queries || !m->cache_hits || !m->cached_blocks || !m->evictions ||
        !m->disk_queries || !m->disk_hits || !m->disk_files || !m->disk_bytes ||
        !m->disk_enabled || !m->disk_corrupt || !m->disk_errors || !m->disk_evictions)
        return td_err_set(TD_ENOMEM, "out of memory");
    if (!m->running || !m->waiting || !m->kv_usage || !m->prompt || !m->gen || !m->step ||
        !m->xfer_bytes || !m->recv_bytes || !m->xfer_s || !m->tail_s || !m->req_ok ||
        !m->req_fail || !m->preempt)
        return td_err_set(TD_ENOMEM, "out of memory");
    return 0;
}

void td_wk_metrics_free(td_worker_t *w)
{
    td_metrics_free(w->m.reg);
    w->m.reg = NULL;
}

static void http_metrics(td_http_req_t *r, void *ud)
{
    td_worker_t *w = ud;
    Tandem__Load l = TANDEM__LOAD__INIT;
    td_wk_fill_load(w, &l); /* refreshes the load gauges */
    td_buf_t b;
    td_buf_init(&b);
    if (td_metrics_render(w->m.reg, &b) != 0)
        td_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
    else
        td_http_respond(r, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    td_buf_free(&b);
}

static void http_health(td_http_req_t *r, void *ud)
{
    td_worker_t *w = ud;
    bool any = false;
    for (int i = 0; i < w->n_routers; i++)
        any |= w->routers[i].conn != NULL;
    char body[256];
    int n = snprintf(body, sizeof(body),
                     "{\"status\":\"%s\",\"role\":\"%s\",\"id\":\"%s\",\"routers_connected\":%s}",
                     w->draining ? "draining" : "ok", w->role->name, w->cfg.id,
                     any ? "true" : "false");
    td_http_respond(r, w->draining ? 503 : 200, "application/json", body, (size_t)n);
}

int td_wk_admin_start(td_worker_t *w)
{
    td_http_opts_t ho = {.max_body = 1 << 16};
    if (!(w->http = td_http_server_new(w->loop, &ho)) ||
        td_http_route(w->http, "/metrics", http_metrics, w) ||
        td_http_route(w->http, "/health", http_health, w))
        return td_err_set(TD_ENOMEM, "out of memory");
    return td_http_listen(w->http, w->cfg.http_listen);
}
