/* bench_cmd_impl.h: what the files of the `tandem bench` subcommand share: its options and the
 * state of the phase being run. The subcommand is compiled into the tandem tool, not into
 * td_loadgen. */
#ifndef TD_BENCH_CMD_IMPL_H
#define TD_BENCH_CMD_IMPL_H

#include "bench.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

/* The flags of `tandem bench`, after parsing (defaults in td_cmd_bench). */
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

/* ---- bench_flags.c */

/* The help text, to f. */
void td__bench_usage(FILE *f);
/* Parse argv into o (which holds the defaults); host[hn] receives the host of --base-url, which
 * o->host then points to. *help is set for --help. 0, or TD_EINVAL with a message naming the
 * flag. */
int td__bench_parse_opts(int argc, char **argv, opts_t *o, char *host, size_t hn, bool *help);

/* ---- bench_driver.c */

/* Run one phase to completion: send d->n requests at d->arrivals (within --max-concurrency) and
 * wait for every answer; d->results gets them in send order. 0, or TD_EIO when the timerfd cannot
 * be made. */
int td__bench_run_phase(driver_t *d);
/* The backend's completion callback (arg: the driver_t): record the result, count output tokens,
 * queue the session's next turn, and dispatch what is ready. */
void td__bench_on_done(td_bench_result_t *r, void *arg);

#endif
