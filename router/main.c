/* main.c: tandem-router: options, model metadata (context length, tokenizer, chat template),
 * the three listeners (HTTP API, client RPC, cluster), metrics, and orderly shutdown. */
#include "router.h"
#include "toolparse.h"

#include "auth.h"
#include "td_config.h"
#include "td_config_build.h"
#include "td_error.h"
#include "td_frame.h"
#include "td_log.h"
#include "td_model.h"
#include "td_util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define O(f) offsetof(td_router_cfg_t, f)
static const td_opt_t opts[] = {
    {"model", TD_OPT_STR, O(model), NULL,
     "model directory (config.json, tokenizer.json, "
     "tokenizer_config.json); required",
     0, 0},
    {"served_model_name", TD_OPT_STR, O(served_model_name), NULL,
     "model name clients use (default: the model directory's basename)", 0, 0},
    {"chat_template", TD_OPT_STR, O(chat_template), NULL,
     "Jinja chat template file to use instead of the model's own (its tokenizer_config.json "
     "chat_template or chat_template.jinja)",
     0, 0},
    {"tool_parser", TD_OPT_STR, O(tool_parser), "auto",
     "syntax of the model's tool calls: auto (from the vocabulary, see docs/api.md), "
     "deepseek_v3, llama3_json, qwen3, harmony or none",
     0, 0},
    {"router_id", TD_OPT_STR, O(router_id), NULL,
     "this router's id in status (default: hostname:pid)", 0, 0},
    {"http.listen", TD_OPT_STR, O(http_listen), "127.0.0.1:8000", "HTTP API address (port 0: any)",
     0, 0},
    {"http.api_key", TD_OPT_STR, O(api_key), NULL,
     "when set, HTTP API requests need 'Authorization: Bearer KEY' or 'x-api-key: KEY'", 0, 0},
    {"http.tenant_header", TD_OPT_STR, O(tenant_header), NULL,
     "request header naming the tenant, whose KV cache the request may use; unset: one tenant",
     0, 0},
    {"http.api_keys_file", TD_OPT_STR, O(api_keys_file), NULL,
     "file of API keys, stored hashed, each with its tenant and limits (docs/configuration.md); "
     "reloaded on SIGHUP; unset: no keys (open, or http.api_key)",
     0, 0},
    {"http.limit_window_s", TD_OPT_DOUBLE, O(limit_window_s), "60",
     "the window the key file's rpm and tpm limits count over, seconds (60: per minute)", 0.1,
     86400},
    {"http.admin_listen", TD_OPT_STR, O(admin_listen), NULL,
     "address of a second HTTP listener for /metrics and /health; when set, http.listen no "
     "longer serves /metrics",
     0, 0},
    {"http.max_body", TD_OPT_SIZE, O(max_body), "16M", "largest request body (413 beyond)", 1,
     1e12},
    {"rpc.listen", TD_OPT_STR, O(rpc_listen), "127.0.0.1:8100",
     "internal client RPC address (host:port or unix:/path)", 0, 0},
    {"cluster.listen", TD_OPT_STR, O(cluster_listen), "127.0.0.1:8200",
     "address workers connect to (host:port or unix:/path)", 0, 0},
    {"cluster.secret_file", TD_OPT_STR, O(secret_file), NULL,
     "file holding the cluster secret (else cluster.secret, else "
     "$CREDENTIALS_DIRECTORY/cluster-secret)",
     0, 0},
    {"cluster.secret", TD_OPT_STR, O(secret), NULL, "the cluster secret itself (>= 16 bytes)", 0,
     0},
    {"cluster.secret_previous_file", TD_OPT_STR, O(secret_prev_file), NULL,
     "file holding the previous cluster secret, still accepted from workers and clients while a "
     "rotation is under way (re-read on SIGHUP with the current one; empty: none; unset: "
     "$CREDENTIALS_DIRECTORY/cluster-secret-previous when it exists)",
     0, 0},
    {"cluster.secret_previous", TD_OPT_STR, O(secret_prev), NULL,
     "the previous cluster secret itself (>= 16 bytes)", 0, 0},
    {"cluster.heartbeat_timeout_s", TD_OPT_DOUBLE, O(heartbeat_timeout_s), "2",
     "a worker whose heartbeats stop this long is out of rotation", 0.05, 3600},
    {"placement.policy", TD_OPT_STR, O(policy), "kv_aware",
     "kv_aware (the lowest predicted time to first token, counting the prompt's cached blocks "
     "by the cluster KV index), round_robin, least_loaded or p2c",
     0, 0},
    {"placement.max_queued_tokens", TD_OPT_UINT, O(max_queued_tokens), "0",
     "prefill high-water mark: queued prompt tokens (0: none)", 0, 0},
    {"placement.max_running", TD_OPT_UINT, O(max_running), "0",
     "decode high-water mark: running sequences (0: none)", 0, 0},
    {"placement.max_kv_usage", TD_OPT_DOUBLE, O(max_kv_usage), "0",
     "decode high-water mark: fraction of KV blocks in use (0: none)", 0, 1},
    {"placement.local_prefill_tokens", TD_OPT_UINT, O(local_prefill_tokens), "64",
     "prompts of at most this many tokens are prefilled on the decode worker", 0, 0},
    {"placement.local_cached_share", TD_OPT_DOUBLE, O(local_cached_share), "0.8",
     "a prompt whose cached share on a decode worker is at least this (kv.redis) is prefilled "
     "there, however long",
     0, 1},
    {"placement.prefill_us_per_token", TD_OPT_DOUBLE, O(prefill_us_per_token), "50",
     "kv_aware: prefill microseconds per uncached token until a worker's own is measured (an "
     "EWMA of its PrefillDone compute time)",
     0.001, 1e6},
    {"placement.seq_cost_us", TD_OPT_DOUBLE, O(seq_cost_us), "2000",
     "kv_aware: microseconds one running sequence adds to a decode worker's predicted time to "
     "first token (its batch and KV pressure)",
     0, 1e9},
    {"placement.imbalance", TD_OPT_DOUBLE, O(imbalance), "1.5",
     "kv_aware: a worker loaded above this many times the mean loses its cache affinity", 1,
     1000},
    {"kv.redis", TD_OPT_STR, O(kv_redis), "",
     "host:port of the Redis that holds the cluster KV index (the workers' kv.redis); empty: "
     "placement knows no caches",
     0, 0},
    {"kv.fetch_min_blocks", TD_OPT_UINT, O(fetch_min_blocks), "2",
     "a prefill worker fetches the prompt's cached KV blocks from the worker that holds most of "
     "them (cluster KV index) when it gains at least this many blocks and fetching is not "
     "measured slower than computing them; 0: never",
     0, 0},
    {"admission.max_waiting", TD_OPT_UINT, O(max_waiting), "256",
     "requests that may wait for a worker; beyond, 503 with Retry-After", 0, 0},
    {"admission.request_timeout_s", TD_OPT_DOUBLE, O(request_timeout_s), "600",
     "per-request deadline in seconds (0: none)", 0, 0},
    {"admission.no_worker_wait_s", TD_OPT_DOUBLE, O(no_worker_wait_s), "5",
     "a request that finds no decode worker available (none registered, all draining) waits "
     "this long for one, then gets 503 with Retry-After",
     0, 3600},
    {"admission.max_queue_wait_s", TD_OPT_DOUBLE, O(max_queue_wait_s), "30",
     "a request that no worker has taken after this many seconds in the waiting queue (the "
     "cluster is over capacity) gets 503 with Retry-After instead of waiting on; 0: no limit",
     0, 86400},
    {"migration.enabled", TD_OPT_BOOL, O(migrate), "true",
     "when a decode worker dies, stalls or misses a deadline mid-stream, resume its sequences "
     "elsewhere with the prompt plus every token generated so far (greedy and seeded output "
     "unchanged); off: a sequence is re-placed only before its first token, else it fails",
     0, 0},
    {"migration.max_attempts", TD_OPT_UINT, O(migrate_attempts), "3",
     "re-placements of one sequence after worker failures; one more failure fails the request",
     0, 100},
    {"deadline.reservation_s", TD_OPT_DOUBLE, O(dl_reservation_s), "10",
     "a decode worker that does not answer a DecodeTask (accept or refuse) within this many "
     "seconds loses the sequence to another (0: no deadline)",
     0, 86400},
    {"deadline.prefill_s", TD_OPT_DOUBLE, O(dl_prefill_s), "120",
     "a prefill worker that has not finished a prompt and its KV handoff (PrefillDone) within "
     "this many seconds of the task loses it (0: no deadline)",
     0, 86400},
    {"deadline.kv_handoff_s", TD_OPT_DOUBLE, O(dl_kv_handoff_s), "30",
     "after PrefillDone, the decode worker's first token must come within this many seconds "
     "(0: no deadline)",
     0, 86400},
    {"deadline.first_token_s", TD_OPT_DOUBLE, O(dl_first_token_s), "180",
     "an attempt whose decode worker accepted it but sent no token within this many seconds is "
     "moved (0: no deadline)",
     0, 86400},
    {"deadline.token_stall_s", TD_OPT_DOUBLE, O(dl_token_stall_s), "30",
     "a running sequence whose decode worker sends no token for this many seconds is moved "
     "(0: no deadline); a stopped worker is caught sooner by cluster.heartbeat_timeout_s",
     0, 86400},
    {"shutdown_timeout_s", TD_OPT_DOUBLE, O(shutdown_timeout_s), "10",
     "on SIGTERM, in-flight requests get this long before they are canceled", 0, 0},
    {"metrics.vllm_names", TD_OPT_BOOL, O(vllm_names), "false",
     "/metrics: export the request metrics under vLLM's names (vllm:, model_name label)", 0, 0},
    {"log.level", TD_OPT_STR, O(log_level), "info", "error, warn, info, debug or trace", 0, 0},
    {"log.format", TD_OPT_STR, O(log_format), "logfmt", "logfmt or json", 0, 0},
};
#undef O
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

/* ---- helpers shared by the front ends --------------------------------------------------- */

int td_router_token_text(const td_router_t *rt, int32_t id, td_buf_t *out)
{
    return td_tokenizer_decode(rt->tok, &id, 1, false, out);
}

int td_router_chat_render(td_router_t *rt, const td_chat_msgs_t *msgs, const td_chat_opts_t *o,
                          const char *prefill, td_tokens_t *out)
{
    if (!rt->have_chat)
        return td_err_set(TD_ENOTSUP, "this model has no supported chat template: use "
                                      "/v1/completions");
    td_buf_t text;
    td_buf_init(&text);
    int rc = td_chat_render(&rt->chat, msgs, o, &text);
    if (!rc && prefill)
        rc = td_buf_append_str(&text, prefill);
    if (!rc)
        rc = td_tokenizer_encode(rt->tok, text.data ? text.data : "", text.len, false, out);
    td_buf_free(&text);
    return rc;
}

int td_router_chat_tokens(td_router_t *rt, const td_chat_msgs_t *msgs, bool add_gen,
                          bool disable_thinking, td_tokens_t *out)
{
    td_chat_opts_t o = {.add_generation_prompt = add_gen, .disable_thinking = disable_thinking};
    return td_router_chat_render(rt, msgs, &o, NULL, out);
}

uint64_t td_router_random_seed(void)
{
    uint64_t s = 0;
    if (td_random_bytes(&s, sizeof(s)) != 0)
        s = td_wall_ns();
    return s >> 1; /* keep it representable as a signed 64-bit seed */
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

static void on_sweep(uv_timer_t *t)
{
    td_router_t *rt = t->data;
    double now = td_now_s();
    td_registry_sweep(rt, now);
    td_reqs_sweep(rt, now);
}

static void close_all(td_router_t *rt)
{
    if (rt->http) {
        td_http_server_close(rt->http);
        rt->http = NULL;
    }
    if (rt->admin) {
        td_http_server_close(rt->admin);
        rt->admin = NULL;
    }
    if (rt->hup.data && !uv_is_closing((uv_handle_t *)&rt->hup))
        uv_close((uv_handle_t *)&rt->hup, NULL);
    if (rt->rpc) {
        td_rpc_server_close(rt->rpc);
        rt->rpc = NULL;
    }
    if (rt->cluster) {
        td_rpc_server_close(rt->cluster);
        rt->cluster = NULL;
    }
    td_kvmirror_stop(rt);
    uv_timer_stop(&rt->sweep_timer);
    uv_timer_stop(&rt->stop_timer);
    uv_timer_stop(&rt->defer_timer);
    uv_close((uv_handle_t *)&rt->sweep_timer, NULL);
    uv_close((uv_handle_t *)&rt->stop_timer, NULL);
    uv_close((uv_handle_t *)&rt->defer_timer, NULL);
    if (rt->daemon) {
        td_daemon_close(rt->daemon);
        rt->daemon = NULL;
    }
}

static void on_stop_tick(uv_timer_t *t)
{
    td_router_t *rt = t->data;
    if (rt->jobs && td_now_s() < rt->stop_deadline)
        return;
    if (rt->jobs) {
        TD_LOG_W("shutdown deadline passed: canceling %zu requests", rt->n_jobs);
        td_reqs_abort_all(rt, "the router is shutting down");
    }
    TD_LOG_I("all requests ended: closing");
    close_all(rt);
}

static void on_signal(td_daemon_t *d, int signum, void *ud)
{
    td_router_t *rt = ud;
    if (rt->stopping) {
        TD_LOG_W("second signal: canceling what is still running");
        rt->stop_deadline = 0;
        return;
    }
    rt->stopping = true;
    td_daemon_stopping(d);
    TD_LOG_I("signal %d: no new requests; %zu in flight get %.1f s", signum, rt->n_jobs,
             rt->cfg.shutdown_timeout_s);
    rt->stop_deadline = td_now_s() + rt->cfg.shutdown_timeout_s;
    if (rt->http) { /* stop accepting; connections with requests in flight stay */
        td_http_server_close(rt->http);
        rt->http = NULL;
    }
    /* waiting requests never got a worker: they end now */
    while (rt->wait_head)
        td_job_abort(rt->wait_head->job, 503, "the router is shutting down");
    uv_timer_start(&rt->stop_timer, on_stop_tick, 0, 50);
}

/* The cluster secrets from their options: the current one (required) and, during a rotation,
 * the previous one. 0 or an error (td_err_msg names the option or file). */
static int load_secrets(const td_router_cfg_t *cfg, uint8_t **cur, size_t *cur_len,
                        uint8_t **prev, size_t *prev_len)
{
    *prev = NULL;
    *prev_len = 0;
    int rc = td_rpc_secret_load(cfg->secret, cfg->secret_file, cur, cur_len);
    if (rc)
        return rc;
    const char *file = cfg->secret_prev_file;
    char cred[4096];
    const char *dir = getenv("CREDENTIALS_DIRECTORY");
    if ((!file || !*file) && !(cfg->secret_prev && *cfg->secret_prev) && dir) {
        /* systemd: LoadCredential=cluster-secret-previous:... during a rotation */
        snprintf(cred, sizeof(cred), "%s/cluster-secret-previous", dir);
        if (access(cred, R_OK) == 0)
            file = cred;
    }
    bool prev_file = file && *file;
    if (prev_file && !(cfg->secret_prev && *cfg->secret_prev)) {
        /* an empty file: no rotation under way */
        char *text = NULL;
        size_t n = 0;
        if (td_file_read_all(file, &text, &n) == 0) {
            size_t i = 0;
            while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' ||
                             text[i] == '\r'))
                i++;
            free(text);
            if (i == n)
                prev_file = false;
        }
    }
    if ((cfg->secret_prev && *cfg->secret_prev) || prev_file) {
        rc = td_rpc_secret_load(cfg->secret_prev, file, prev, prev_len);
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof(msg), "%s", td_err_msg());
            free(*cur);
            *cur = NULL;
            return td_err_set(rc, "previous secret: %s", msg);
        }
    }
    return 0;
}

static void set_secrets(td_router_t *rt)
{
    if (rt->cluster)
        td_rpc_server_set_secrets(rt->cluster, rt->secret, rt->secret_len, rt->secret_prev,
                                  rt->secret_prev_len);
    if (rt->rpc)
        td_rpc_server_set_secrets(rt->rpc, rt->secret, rt->secret_len, rt->secret_prev,
                                  rt->secret_prev_len);
}

/* SIGHUP: read the key file and the cluster secrets again. What fails to load keeps its old
 * value (and is logged); connections and requests in flight are untouched. */
static void on_hup(uv_signal_t *sig, int signum)
{
    td_router_t *rt = sig->data;
    (void)signum;
    if (rt->access) {
        if (td_access_reload(rt->access) != 0)
            TD_LOG_E("SIGHUP: key file not reloaded, the previous keys stay: %s", td_err_msg());
        else
            TD_LOG_I("SIGHUP: key file %s reloaded: %zu keys, %zu tenant limits",
                     rt->cfg.api_keys_file, rt->access->keys.n_keys,
                     rt->access->keys.n_tenants);
    }
    uint8_t *cur, *prev;
    size_t cur_len, prev_len;
    if (load_secrets(&rt->cfg, &cur, &cur_len, &prev, &prev_len) != 0) {
        TD_LOG_E("SIGHUP: cluster secrets not reloaded, the previous ones stay: %s", td_err_msg());
        return;
    }
    free(rt->secret);
    free(rt->secret_prev);
    rt->secret = cur;
    rt->secret_len = cur_len;
    rt->secret_prev = prev;
    rt->secret_prev_len = prev_len;
    set_secrets(rt);
    TD_LOG_I("SIGHUP: cluster secret reloaded%s",
             prev ? " (the previous one is still accepted)" : "");
}

static int load_model(td_router_t *rt)
{
    td_model_t *m = NULL;
    int rc = td_model_load(rt->cfg.model, &m);
    if (rc)
        return rc;
    rt->max_ctx = m->cfg.max_ctx > 0 ? m->cfg.max_ctx : 4096;
    td_model_free(m);
    rc = td_tokenizer_load(rt->cfg.model, &rt->tok);
    if (rc)
        return rc;
    rt->bos_id = td_tokenizer_special_id(rt->tok, "bos");
    rt->eos_id = td_tokenizer_special_id(rt->tok, "eos");
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", rt->cfg.model);
    if (!rt->cfg.tool_parser || strcmp(rt->cfg.tool_parser, "auto") == 0) {
        rt->tool_fmt = td_tool_fmt_detect(rt->tok);
    } else {
        td_tool_fmt_t f;
        if (td_tool_fmt_from_name(rt->cfg.tool_parser, &f) != 0)
            return td_err_set(TD_EINVAL, "tool_parser: %s", td_err_msg());
        rt->tool_fmt = (int)f;
    }
    TD_LOG_I("tool parser: %s", td_tool_fmt_name((td_tool_fmt_t)rt->tool_fmt));
    rc = td_chat_template_load(&rt->chat, path, rt->cfg.chat_template);
    if (rc == 0) {
        rt->have_chat = true;
    } else if (rc != TD_ENOENT || rt->cfg.chat_template) {
        return rc; /* a template that does not parse, or one asked for explicitly: an error */
    } else {
        TD_LOG_W("no chat template (%s): chat endpoints will answer 400", td_err_msg());
    }
    return 0;
}

/* The router's series that mean what vLLM's of the same name mean (metrics.vllm_names). Its
 * per-worker series (worker_*) have no vLLM counterpart and keep tandem_ names. */
static const char *const vllm_series[] = {
    "time_to_first_token_seconds", "inter_token_latency_seconds",
    "time_per_output_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
    "num_requests_running", "num_requests_waiting", "prompt_tokens_total",
    "generation_tokens_total", "request_success_total", NULL,
};

static int setup_metrics(td_router_t *rt)
{
    td_buf_t lab;
    td_buf_init(&lab);
    td_buf_append_str(&lab, "role=\"router\",model_name=\"");
    td_metrics_escape(rt->model_name, &lab);
    td_buf_append_char(&lab, '"');
    td_metrics_opts_t mo = {.prefix = "tandem_", .const_labels = "role=\"router\""};
    if (rt->cfg.vllm_names) {
        mo.vllm_series = vllm_series;
        mo.vllm_labels = lab.data;
    }
    rt->metrics = lab.data ? td_metrics_new_opts(&mo) : NULL;
    td_buf_free(&lab);
    if (!rt->metrics)
        return TD_ENOMEM;
    td_metrics_t *m = rt->metrics;
    rt->m_ttft = td_metrics_histogram(m, "time_to_first_token_seconds",
                                      "Histogram of time to first token in seconds.", NULL,
                                      td_buckets_ttft, td_buckets_ttft_n);
    rt->m_itl = td_metrics_histogram(m, "inter_token_latency_seconds",
                                     "Histogram of inter-token latency in seconds.", NULL,
                                     td_buckets_tpot, td_buckets_tpot_n);
    rt->m_tpot = td_metrics_histogram(m, "time_per_output_token_seconds",
                                      "Histogram of time per output token in seconds.", NULL,
                                      td_buckets_tpot, td_buckets_tpot_n);
    rt->m_e2e = td_metrics_histogram(m, "e2e_request_latency_seconds",
                                     "Histogram of end to end request latency in seconds.", NULL,
                                     td_buckets_request, td_buckets_request_n);
    rt->m_queue = td_metrics_histogram(m, "request_queue_time_seconds",
                                       "Histogram of time spent waiting for a worker to accept "
                                       "the request.",
                                       NULL, td_buckets_request, td_buckets_request_n);
    rt->m_running_g =
        td_metrics_gauge(m, "num_requests_running", "Number of sequences placed on workers.", NULL);
    rt->m_waiting_g = td_metrics_gauge(m, "num_requests_waiting",
                                       "Number of sequences waiting for a worker.", NULL);
    rt->m_prompt =
        td_metrics_counter(m, "prompt_tokens_total", "Number of prefill tokens processed.", NULL);
    rt->m_gen = td_metrics_counter(m, "generation_tokens_total",
                                   "Number of generation tokens processed.", NULL);
    const char *help = "Count of successfully processed requests.";
    rt->m_ok_stop =
        td_metrics_counter(m, "request_success_total", help, "finished_reason=\"stop\"");
    rt->m_ok_length =
        td_metrics_counter(m, "request_success_total", help, "finished_reason=\"length\"");
    rt->m_ok_abort =
        td_metrics_counter(m, "request_success_total", help, "finished_reason=\"abort\"");
    rt->m_migrations = td_metrics_counter(
        m, "request_migrations_total",
        "Re-placements of a sequence after its worker died, stalled or missed a deadline "
        "(resumed from its generated tokens when it had any).",
        NULL);
    rt->m_shed = td_metrics_counter(m, "requests_shed_total",
                                    "Requests answered 503 after waiting admission.max_queue_wait_s "
                                    "for a worker (the cluster over capacity).",
                                    NULL);
    if (!rt->m_shed || !rt->m_migrations || !rt->m_ttft || !rt->m_itl || !rt->m_tpot || !rt->m_e2e || !rt->m_queue ||
        !rt->m_running_g || !rt->m_waiting_g || !rt->m_prompt || !rt->m_gen || !rt->m_ok_stop ||
        !rt->m_ok_length || !rt->m_ok_abort)
        return TD_ENOMEM;
    return 0;
}

static void usage(FILE *out, const void *ud)
{
    (void)ud;
    fprintf(out, "usage: tandem-router --model DIR [--config FILE] [--section.key=value ...]\n\n"
                 "The tandem router: OpenAI/Anthropic HTTP API, internal RPC and worker "
                 "registry.\nOn start it prints one line:\n"
                 "  tandem-router: http=HOST:PORT rpc=HOST:PORT cluster=HOST:PORT"
                 " [admin=HOST:PORT]\n"
                 "SIGHUP reloads the API key file and the cluster secrets.\n\n"
                 "\n");
}

/* "host:port" with the bound port (for the start line). */
static void bound(char *out, size_t n, const char *addr, int port)
{
    if (td_str_startswith(addr, "unix:") || port <= 0) {
        snprintf(out, n, "%s", addr);
        return;
    }
    const char *colon = strrchr(addr, ':');
    int hl = colon ? (int)(colon - addr) : (int)strlen(addr);
    if (td_str_startswith(addr, "tcp://")) {
        addr += 6;
        hl -= 6;
    }
    snprintf(out, n, "%.*s:%d", hl, addr, port);
}

int main(int argc, char **argv)
{
    static td_router_t router;
    td_router_t *rt = &router;
    int code = 1;
    td_daemon_boot_t boot = {.program = "tandem-router",
                             .component = "router",
                             .env_prefix = "TANDEM_ROUTER",
                             .opts = opts,
                             .n_opts = N_OPTS,
                             .cfg = &rt->cfg,
                             .usage = usage};
    if (td_daemon_boot(&boot, argc, argv, &code))
        return code;
    code = 1;
    int rc;
    if (!rt->cfg.model || !*rt->cfg.model) {
        fprintf(stderr, "tandem-router: --model DIR is required (--help lists the options)\n");
        goto out_cfg;
    }
    td_place_policy_t policy;
    if (td_place_policy_parse(rt->cfg.policy, &policy)) {
        fprintf(stderr, "tandem-router: placement.policy: %s\n", td_err_msg());
        goto out_cfg;
    }
    if (rt->cfg.max_kv_usage < 0 || rt->cfg.max_kv_usage > 1) {
        fprintf(stderr, "tandem-router: placement.max_kv_usage must be in [0, 1]\n");
        goto out_cfg;
    }
    if (load_secrets(&rt->cfg, &rt->secret, &rt->secret_len, &rt->secret_prev,
                     &rt->secret_prev_len)) {
        fprintf(stderr, "tandem-router: cluster secret: %s\n", td_err_msg());
        goto out_cfg;
    }
    static td_access_t access;
    if (rt->cfg.api_keys_file && *rt->cfg.api_keys_file) {
        if (td_access_open(&access, rt->cfg.api_keys_file, rt->cfg.limit_window_s)) {
            fprintf(stderr, "tandem-router: http.api_keys_file: %s\n", td_err_msg());
            goto out_model;
        }
        rt->access = &access;
    }
    /* names */
    if (rt->cfg.served_model_name && *rt->cfg.served_model_name) {
        rt->model_name = rt->cfg.served_model_name;
    } else {
        rt->model_name = td_path_basename(rt->cfg.model, rt->name_buf, sizeof(rt->name_buf));
    }
    if (rt->cfg.router_id && *rt->cfg.router_id) {
        rt->id = rt->cfg.router_id;
    } else {
        char host[64] = "localhost";
        gethostname(host, sizeof(host) - 1);
        snprintf(rt->id_buf, sizeof(rt->id_buf), "%s:%d", host, (int)getpid());
        rt->id = rt->id_buf;
    }
    if (load_model(rt)) {
        fprintf(stderr, "tandem-router: model %s: %s\n", rt->cfg.model, td_err_msg());
        goto out_model;
    }
    td_place_limits_t lim = {rt->cfg.max_queued_tokens, (uint32_t)rt->cfg.max_running,
                             rt->cfg.max_kv_usage};
    td_placer_init(&rt->placer, policy, &lim, td_router_random_seed() | 1);
    td_place_kv_t kv = {.s_per_token = rt->cfg.prefill_us_per_token * 1e-6,
                        .seq_s = rt->cfg.seq_cost_us * 1e-6,
                        .imbalance = rt->cfg.imbalance};
    td_placer_set_kv(&rt->placer, &kv);
    rt->loop = uv_default_loop();
    if (setup_metrics(rt) || td_reqs_init(rt)) {
        fprintf(stderr, "tandem-router: out of memory\n");
        goto out_model;
    }
    if (td_kvmirror_start(rt)) {
        fprintf(stderr, "tandem-router: %s\n", td_err_msg());
        goto out_model;
    }
    uv_timer_init(rt->loop, &rt->sweep_timer);
    rt->sweep_timer.data = rt;
    uv_timer_init(rt->loop, &rt->stop_timer);
    rt->stop_timer.data = rt;
    uv_signal_init(rt->loop, &rt->hup);
    rt->hup.data = rt;
    uv_signal_start(&rt->hup, on_hup, SIGHUP);
    uv_unref((uv_handle_t *)&rt->hup);
    rt->daemon = td_daemon_start(rt->loop, on_signal, rt);
    if (!rt->daemon) {
        fprintf(stderr, "tandem-router: out of memory\n");
        goto out_loop;
    }
    if ((rc = td_registry_start(rt)) != 0) {
        fprintf(stderr, "tandem-router: cluster.listen %s: %s\n", rt->cfg.cluster_listen,
                td_err_msg());
        goto out_loop;
    }
    if ((rc = td_rpc_api_start(rt)) != 0) {
        fprintf(stderr, "tandem-router: rpc.listen %s: %s\n", rt->cfg.rpc_listen, td_err_msg());
        goto out_loop;
    }
    if ((rc = td_http_api_start(rt)) != 0) {
        fprintf(stderr, "tandem-router: http.listen %s: %s\n", rt->cfg.http_listen, td_err_msg());
        goto out_loop;
    }
    set_secrets(rt); /* the previous secret, when rotating */
    uv_timer_start(&rt->sweep_timer, on_sweep, 100, 100);
    char h[300], r[300], c[300], a[320] = "";
    bound(h, sizeof(h), rt->cfg.http_listen, td_http_port(rt->http));
    bound(r, sizeof(r), rt->cfg.rpc_listen, td_rpc_server_port(rt->rpc));
    bound(c, sizeof(c), rt->cfg.cluster_listen, td_rpc_server_port(rt->cluster));
    if (rt->admin) {
        char ab[300];
        bound(ab, sizeof(ab), rt->cfg.admin_listen, td_http_port(rt->admin));
        snprintf(a, sizeof(a), " admin=%s", ab);
    }
    printf("tandem-router: http=%s rpc=%s cluster=%s%s\n", h, r, c, a);
    fflush(stdout);
    TD_LOG_I("serving model %s (max_model_len %d) as %s: http=%s rpc=%s cluster=%s%s%s",
             rt->cfg.model, rt->max_ctx, rt->model_name, h, r, c, a,
             rt->access ? " (API keys required)" : "");
    td_daemon_ready(rt->daemon, "serving");
    td_daemon_status(rt->daemon, "http=%s rpc=%s cluster=%s", h, r, c);
    uv_run(rt->loop, UV_RUN_DEFAULT);
    code = 0;
    goto out_run;
out_loop:
    close_all(rt);
out_run:
    /* run until every handle is closed */
    while (uv_run(rt->loop, UV_RUN_DEFAULT))
        ;
    uv_loop_close(rt->loop);
    TD_LOG_I("stopped");
    td_reqs_close(rt);
    free(rt->workers);
    td_metrics_free(rt->metrics);
out_model:
    td_chat_template_free(&rt->chat);
    td_tokenizer_free(rt->tok);
    if (rt->access)
        td_access_close(rt->access);
    free(rt->secret);
    free(rt->secret_prev);
out_cfg:
    td_config_free(opts, N_OPTS, &rt->cfg);
    return code;
}
