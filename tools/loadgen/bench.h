/* bench.h: `tandem bench`, the load generator: arrivals, workloads, the HTTP client, metrics and
 * reports. One thread, one libuv loop.
 *
 * The definitions follow vLLM's `vllm bench serve` (vllm/benchmarks/serve.py and
 * vllm/benchmarks/lib/endpoint_request_func.py) so that figures and result files compare one to
 * one: Gamma arrivals with burstiness and the N/rate rescale, TTFT at the first chunk that carries
 * `choices`, ITL between such chunks, TPOT = (E2EL - TTFT) / (output_len - 1), population std,
 * numpy's linear-interpolation percentiles, goodput as requests meeting every SLO given.
 */
#ifndef TD_BENCH_H
#define TD_BENCH_H

#include "td_rng.h"
#include "td_tokenizer.h"
#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- random numbers and arrivals (arrivals.c) ---- */

/* Distributions drawn from td_rng.h's seeded generator (td_rng_seed, td_rng_next,
 * td_rng_uniform), so a seed gives the same workload and schedule on every machine. */
/* Uniform integer in [lo, hi] (inclusive). */
int64_t td_bench_rng_range(td_rng_t *r, int64_t lo, int64_t hi);
/* Standard normal (Box-Muller). */
double td_bench_rng_normal(td_rng_t *r);
/* Gamma(shape, scale) by Marsaglia and Tsang (shape < 1 through the shape + 1 boost). */
double td_bench_rng_gamma(td_rng_t *r, double shape, double scale);

/* Send times of `n` requests, as vLLM's get_request computes them: inter-arrival gaps drawn from
 * Gamma(shape = burstiness, scale = 1 / (rate x burstiness)) (mean 1/rate; burstiness 1 is a
 * Poisson process, larger is more regular, INFINITY a constant rate), accumulated, then rescaled
 * so the last request is sent at exactly n / rate. A rate of INFINITY sends everything at 0.
 * `out[n]` receives seconds from the start of the run, non-decreasing.
 * 0 or TD_EINVAL (n < 1, rate <= 0, burstiness <= 0, NaN). */
int td_bench_arrivals(size_t n, double rate, double burstiness, uint64_t seed, double *out);

/* ---- workloads (workload.c) ---- */

typedef enum td_bench_workload_kind {
    TD_BENCH_WL_RANDOM,
    TD_BENCH_WL_PREFIX,    /* shared-prefix groups */
    TD_BENCH_WL_MULTITURN, /* chat sessions; each turn extends the conversation with the answer */
    TD_BENCH_WL_SHAREGPT,
    TD_BENCH_WL_MOONCAKE, /* a Mooncake trace (workload_trace.c): prompts from its prefix block
                             ids, arrivals from its timestamps */
} td_bench_workload_kind_t;

typedef struct td_bench_workload_opts {
    td_bench_workload_kind_t kind;
    size_t num_prompts; /* requests to build (random, sharegpt); derived for prefix/multi-turn */
    uint64_t seed;
    /* random */
    int64_t input_len;  /* tokens */
    int64_t output_len; /* tokens */
    double range_ratio; /* lengths uniform in [len x (1 - r), len x (1 + r)] */
    int64_t prefix_len; /* tokens shared by every prompt (random) */
    /* prefix groups */
    int64_t num_groups, prompts_per_group;
    int64_t system_prompt_len, question_len; /* tokens */
    /* multi-turn */
    int64_t num_sessions, turns_per_session;
    /* sharegpt */
    const char *dataset_path;
    int64_t sharegpt_output_len; /* > 0: fixed output length instead of the dataset's */
    int64_t min_len, max_prompt_len, max_total_len; /* vLLM's is_valid_sequence (4, 1024, 2048) */
    /* mooncake (dataset_path is the trace) */
    int64_t trace_block_tokens;   /* tokens synthesized per hash id, 1..512 (the trace's 512) */
    double trace_time_scale;      /* arrival times (from the first replayed request) x this */
    int64_t trace_start;          /* requests (non-blank lines) skipped at the start */
    int64_t trace_limit;          /* requests replayed, 0 = to the end */
    int64_t trace_max_input_len;  /* > 0: prompts cut to this many tokens, by whole blocks */
    int64_t trace_max_output_len; /* > 0: output lengths capped to this */
} td_bench_workload_opts_t;

/* One prompt of a workload. */
typedef struct td_bench_prompt {
    char *text;         /* prompt text, NUL-terminated, owned */
    int64_t prompt_len; /* prompt tokens (exact with a tokenizer, else counted words) */
    int64_t output_len; /* max_tokens to ask for */
    int32_t session;    /* multi-turn: the session index; -1 otherwise */
    int32_t turn;       /* multi-turn: the turn in its session, 0-based; -1 otherwise */
} td_bench_prompt_t;

/* What a trace replay did to the trace (mooncake). */
typedef struct td_bench_trace_stats {
    size_t first_line, last_line; /* 1-based file lines of the first and last request replayed */
    size_t truncated;             /* prompts cut to trace_max_input_len */
    int64_t blocks_cut;           /* hash ids those cuts dropped */
    size_t outputs_capped;        /* output lengths cut to trace_max_output_len */
    int64_t prompt_tokens;        /* synthesized prompt tokens (blocks x block tokens + tails) */
    int64_t reusable_tokens;      /* of those, in a block whose id an earlier request replayed:
                                     the trace's own ideal reuse (an upper bound for a cache) */
    double span_s;                /* the last arrival, seconds (time scale applied) */
} td_bench_trace_stats_t;

typedef struct td_bench_workload {
    td_bench_prompt_t *prompts; /* [n] in send order (multi-turn: turn-major) */
    size_t n;
    int64_t num_sessions;                /* multi-turn only */
    bool exact_lengths;                  /* lengths came from a tokenizer */
    size_t sharegpt_seen, sharegpt_kept; /* ShareGPT entries read and kept by the filter */
    double *arrivals;             /* mooncake: [n] send times from the trace, seconds; else NULL */
    td_bench_trace_stats_t trace; /* mooncake only */
} td_bench_workload_t;

/* Build a workload. `tok` may be NULL: prompts are then made of words from a fixed list and
 * lengths count words (exact_lengths false); ShareGPT then counts whitespace-separated words.
 * 0, TD_EINVAL (options; td_err_msg names the flag), TD_ENOENT/TD_EPARSE (dataset file), TD_ENOMEM.
 */
int td_bench_workload_build(const td_bench_workload_opts_t *o, const td_tokenizer_t *tok,
                            td_bench_workload_t *out);
/* Free the prompts; `w` is left empty (freeing twice is harmless). */
void td_bench_workload_free(td_bench_workload_t *w);

/* ---- Mooncake traces (workload_trace.c) ---- */

#define TD_BENCH_TRACE_BLOCK 512 /* tokens per hash id in the trace format */

/* One request of a trace file, as the file says it. */
typedef struct td_bench_trace_req {
    int64_t timestamp_ms, input_length, output_length;
    int64_t *hash_ids; /* [n_ids], n_ids = ceil(input_length / 512), each >= 0 */
    size_t n_ids;
    size_t line; /* 1-based line in the file */
} td_bench_trace_req_t;

typedef struct td_bench_trace {
    td_bench_trace_req_t *reqs;
    size_t n;
} td_bench_trace_t;

/* Parse `len` bytes of a Mooncake trace (JSON lines; blank lines skipped), skipping the first
 * `start` requests and keeping at most `limit` (0 = all). Every kept line must be one JSON object
 * with integer timestamp (>= 0, non-decreasing), input_length and output_length (>= 1) and
 * hash_ids (ceil(input_length / 512) integers >= 0). 0, TD_EPARSE (the message is
 * "NAME:LINE: ..." and names the field), or TD_ENOMEM; on error `out` is left empty. */
int td_bench_trace_parse(const char *name, const char *data, size_t len, size_t start, size_t limit,
                         td_bench_trace_t *out);
void td_bench_trace_free(td_bench_trace_t *t);

/* workload.c's prompt words, shared with workload_trace.c */
extern const char *const td__bench_words[];
extern const size_t td__bench_n_words;
/* The mooncake workload (td_bench_workload_build's case for it). */
int td__bench_build_trace(const td_bench_workload_opts_t *o, const td_tokenizer_t *tok,
                          td_bench_workload_t *w);

/* ---- one request's outcome (vLLM's RequestFuncOutput) ---- */

typedef enum td_bench_err {
    TD_BENCH_OK = 0,
    TD_BENCH_ERR_CONNECT, /* connect failed or the connection dropped before a response */
    TD_BENCH_ERR_HTTP,    /* a status other than 200 */
    TD_BENCH_ERR_STREAM,  /* malformed HTTP/SSE/JSON, dropped mid-body, or no chunk with choices */
    TD_BENCH_ERR_TIMEOUT, /* --timeout passed */
    TD_BENCH_ERR_N_
} td_bench_err_t;

const char *td_bench_err_name(td_bench_err_t e); /* "connect", "http", "stream", "timeout" */

typedef struct td_bench_result {
    td_bench_err_t err;
    int http_status;       /* 0 when no status line arrived */
    char *error;           /* owned message, NULL on success */
    double send_s;         /* when the request was written, seconds since the run started */
    double sched_s;        /* when the arrival process scheduled it (same clock); send_s - sched_s
                              is the harness's own lag (plus waiting for --max-concurrency) */
    double ttft;           /* seconds from send to the first chunk with choices */
    double latency;        /* seconds from send to the last chunk with choices (vLLM's E2EL) */
    double *itl;           /* [n_itl] seconds between consecutive chunks with choices */
    size_t n_itl, cap_itl; /* entries used / allocated */
    int64_t prompt_len;    /* tokens, from the workload (vLLM counts input on the client side) */
    int64_t usage_completion_tokens; /* from the final usage chunk or body; -1 when absent */
    int64_t output_len; /* tokens: usage, else the tokenizer on the text, else chunk count */
    int64_t n_chunks;   /* chunks with choices */
    td_buf_t text;      /* generated text */
    double srv_ttft;    /* scripted test server only: its own request-to-first-byte delay, s;
                           -1 when the server did not say */
    double req_leg;     /* scripted server: client send -> server has the request, s (-1) */
    double resp_leg;    /* scripted server: server wrote the first chunk -> client read it, s
                           (-1); the harness's own receive delay plus loopback */
} td_bench_result_t;

/* A result before its request is sent: no error, no data, usage and server figures at -1. */
void td_bench_result_init(td_bench_result_t *r);
/* Free the error, ITL array and text (the struct itself is the caller's). */
void td_bench_result_free(td_bench_result_t *r);
/* Record an error (first one wins). */
void td_bench_result_fail(td_bench_result_t *r, td_bench_err_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Append one inter-token latency (seconds). 0 or TD_ENOMEM. */
int td_bench_result_add_itl(td_bench_result_t *r, double v);

/* ---- SSE and response JSON scanning (sse.c): no allocation ---- */

/* What one `data:` payload (a chat or completions chunk, or a whole non-streamed body) says. */
typedef struct td_bench_chunk {
    bool has_choices;          /* "choices" is a non-empty array */
    const char *text;          /* choices[0].text, .delta.content or .message.content: raw JSON
                                  string contents (escapes not undone), or NULL */
    size_t text_len;           /* bytes at text */
    int64_t completion_tokens; /* usage.completion_tokens, -1 when absent */
    int64_t srv_ttft_us;       /* "srv_ttft_us" (scripted server), -1 when absent */
    int64_t srv_recv_ns;       /* "srv_recv_ns": CLOCK_MONOTONIC when the server had the request */
    int64_t srv_send_ns;       /* "srv_send_ns": CLOCK_MONOTONIC when it wrote this chunk */
} td_bench_chunk_t;

/* Scan one JSON object. 0 or TD_EPARSE (not one valid JSON object; the message says where). */
int td_bench_chunk_scan(const char *json, size_t len, td_bench_chunk_t *out);
/* Append the JSON string contents `s` (escapes undone, \u surrogate pairs joined) to `out`.
 * 0, TD_EPARSE or TD_ENOMEM. */
int td_bench_json_unescape(const char *s, size_t n, td_buf_t *out);

/* ---- backends: HTTP (client.c); RPC later ---- */

/* One request as the driver describes it; a backend turns it into its wire form. */
typedef struct td_bench_request {
    const char *model;         /* "model" field */
    const char *prompt;        /* completions: the prompt text */
    const char *messages_json; /* chat: a JSON array of messages */
    int64_t max_tokens;
    bool ignore_eos;
    bool stream;
} td_bench_request_t;

typedef struct td_bench_target {
    const char *host; /* numeric or resolvable name */
    int port;
    const char *path;    /* "/v1/completions" or "/v1/chat/completions" */
    const char *api_key; /* sent as "Authorization: Bearer KEY", or NULL */
    double timeout_s;    /* per request, 0 = none */
    bool chat;           /* chat completions body and SSE deltas */
    bool app_timestamps; /* stamp chunks when the loop reads them (as vLLM's client does)
                            instead of when the kernel received them (SO_TIMESTAMPING) */
    const uint8_t *secret; /* rpc backend: the cluster secret, secret_len bytes */
    size_t secret_len;
} td_bench_target_t;

/* Called once per submitted request when it is over (success or failure); `r` is the result
 * passed to submit, now filled. May submit more requests. */
typedef void (*td_bench_done_cb)(td_bench_result_t *r, void *arg);

/* What the driver needs of a target protocol. The HTTP client below is one; the internal RPC
 * (`--backend rpc`) will be another, built on the control-plane client library. */
typedef struct td_bench_backend {
    const char *name;
    /* Open a client on `uv_loop`. NULL with td_err_msg on failure. */
    void *(*open)(void *uv_loop, const td_bench_target_t *t, td_bench_done_cb cb, void *arg);
    /* Start one request; `r` must stay valid until the callback. 0 or a TD_E* code (then no
     * callback). r->send_s is measured from `t0_ns`. */
    int (*submit)(void *impl, const td_bench_request_t *req, uint64_t t0_ns, td_bench_result_t *r);
    size_t (*inflight)(const void *impl);
    /* Fail what is in flight (callbacks run) and free the client once its handles closed. */
    void (*close)(void *impl);
} td_bench_backend_t;

extern const td_bench_backend_t td_bench_backend_http;
/* The router's internal RPC (rpc.c): GenerateRequest frames over one authenticated connection,
 * TokenChunk frames timed as they are read (one frame per token: TTFT, ITL, E2EL as for SSE). */
extern const td_bench_backend_t td_bench_backend_rpc;

/* Append the OpenAI request body for `req` (completions or chat) to `out`. 0 or TD_ENOMEM. */
int td_bench_http_body(const td_bench_request_t *req, bool chat, td_buf_t *out);

typedef struct td_bench_client td_bench_client_t;

/* A client on `loop`: keep-alive connections to one target, opened on demand, reused when idle.
 * The address is resolved here (blocking, once). NULL with td_err_msg on failure. */
td_bench_client_t *td_bench_client_new(void *uv_loop, const td_bench_target_t *t,
                                       td_bench_done_cb cb, void *arg);
/* POST `body` (`len` bytes of JSON, copied); `stream` says whether SSE is expected. `r` is the
 * caller's and must stay valid until the callback; its send_s is measured from `t0_ns`.
 * 0 or TD_ENOMEM (then no callback). A connect failure is reported through the callback. */
int td_bench_client_submit(td_bench_client_t *cl, const char *body, size_t len, bool stream,
                           uint64_t t0_ns, td_bench_result_t *r);
/* Requests in flight. */
size_t td_bench_client_inflight(const td_bench_client_t *cl);
/* Connections currently open. */
size_t td_bench_client_conns(const td_bench_client_t *cl);
/* Close every connection (in-flight requests fail with TD_BENCH_ERR_CONNECT "canceled", their
 * callbacks run) and free the client once the handles are closed; run the loop afterwards. */
void td_bench_client_close(td_bench_client_t *cl);

/* ---- metrics (metrics.c) ---- */

typedef struct td_bench_stats {
    double mean, median, std; /* seconds; 0 when there are no samples (numpy's `x or 0`) */
    double pct[16];           /* seconds, at the percentiles requested */
    size_t n;
} td_bench_stats_t;

typedef struct td_bench_slo {
    double ttft_ms, tpot_ms, e2el_ms; /* < 0: not part of the goodput definition */
} td_bench_slo_t;

typedef struct td_bench_metrics {
    size_t completed, failed;
    size_t failed_by_kind[TD_BENCH_ERR_N_];
    int64_t total_input, total_output;
    double duration;                                                      /* seconds */
    double request_throughput, output_throughput, total_token_throughput; /* per second */
    double request_goodput; /* requests meeting every SLO per second; NAN without SLOs */
    size_t good_completed;
    td_bench_stats_t ttft, tpot, itl, e2el;
    double percentiles[16]; /* the percentiles, e.g. 50, 90, 95, 99 */
    size_t n_percentiles;
    double max_output_tokens_per_s; /* largest 1-second bin of output chunks */
    size_t max_concurrent_requests;
    td_bench_stats_t added_ttft; /* client TTFT minus the scripted server's own (n = 0 if none) */
    td_bench_stats_t send_lag;   /* send_s - sched_s over every request sent */
    td_bench_stats_t req_leg, resp_leg; /* the two legs of added_ttft (scripted server only) */
    size_t peak_inflight;               /* most successful requests in flight at one instant */
    double send_rate; /* requests sent per second between the first and last send */
} td_bench_metrics_t;

/* numpy.percentile (linear interpolation) of sorted `x[n]` at p in [0, 100]; 0 when n is 0. */
double td_bench_percentile(const double *sorted, size_t n, double p);
/* mean, median, population std and percentiles of `x[n]` (sorted in place). */
void td_bench_stats(double *x, size_t n, const double *pcts, size_t n_pcts, td_bench_stats_t *out);

/* vLLM's calculate_metrics over results[n] of a run that took `duration` seconds. Output tokens
 * of a successful request are its output_len; a failed request counts 0 output and no input.
 * `slo` may be NULL. 0 or TD_ENOMEM. */
int td_bench_metrics_compute(const td_bench_result_t *results, size_t n, double duration,
                             const double *pcts, size_t n_pcts, const td_bench_slo_t *slo,
                             td_bench_metrics_t *out);

/* ---- /metrics scraping (scrape.c) ---- */

typedef struct td_bench_prom_hist {
    double le[64];    /* bucket upper bounds, seconds, +Inf last */
    double count[64]; /* cumulative counts per bound */
    size_t n;
    double sum, total;
    bool found;
} td_bench_prom_hist_t;

typedef struct td_bench_scrape {
    td_bench_prom_hist_t ttft, e2e, itl, tpot; /* *time_to_first_token_seconds,
                                                  *e2e_request_latency_seconds,
                                                  *inter_token_latency_seconds,
                                                  *time_per_output_token_seconds: summed over
                                                  series */
    double prompt_tokens, generation_tokens;   /* *prompt_tokens_total, *generation_tokens_total */
    bool ok;
} td_bench_scrape_t;

/* Parse Prometheus text (tandem_ or vllm: prefixes). 0 or TD_EPARSE. */
int td_bench_scrape_parse(const char *text, size_t len, td_bench_scrape_t *out);
/* GET http://host:port/metrics (blocking, 5 s timeout) and parse it. 0 or a TD_E* code. */
int td_bench_scrape_fetch(const char *host, int port, const char *api_key, td_bench_scrape_t *out);
/* after - before, per bucket and total. */
void td_bench_scrape_diff(const td_bench_scrape_t *before, const td_bench_scrape_t *after,
                          td_bench_scrape_t *out);
/* Prometheus histogram_quantile (linear within the bucket); NAN when empty. */
double td_bench_hist_quantile(const td_bench_prom_hist_t *h, double q);

/* ---- reports (report_json.c, report_html.c) ---- */

/* What a run was, for the result file. */
typedef struct td_bench_run_info {
    const char *backend;       /* "openai" or "openai-chat" */
    const char *endpoint_type; /* same as backend, as vLLM writes it */
    const char *model_id, *tokenizer_id, *label;
    size_t num_prompts;
    double request_rate; /* INFINITY for "inf" */
    double burstiness;
    long max_concurrency;            /* 0 = none (written as null) */
    const td_bench_slo_t *slo;       /* NULL when --goodput was not given */
    const td_bench_scrape_t *server; /* /metrics difference, or NULL */
    const char *timestamps;          /* "kernel-rx" or "app": where chunk times come from */
} td_bench_run_info_t;

/* One run of a sweep, kept for the HTML report. */
typedef struct td_bench_run {
    td_bench_run_info_t info;
    td_bench_metrics_t m;
    td_bench_result_t *results; /* [n], owned by the caller */
    size_t n;
    td_bench_scrape_t server;
    bool have_server;
} td_bench_run_t;

/* Append the result JSON (vLLM's keys; per-request arrays when `detailed`). 0 or TD_ENOMEM. */
int td_bench_report_json(const td_bench_run_t *run, bool detailed, td_buf_t *out);
/* Append a self-contained HTML report (inline SVG, no scripts fetched) of runs[n]. 0 or TD_ENOMEM.
 */
int td_bench_report_html(const td_bench_run_t *runs, size_t n, td_buf_t *out);
/* The human summary vLLM prints, to `f`. */
void td_bench_report_text(const td_bench_run_t *run, FILE *f);

#endif
