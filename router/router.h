/* router.h: what the tandem-router daemon's parts share: the configuration, the worker registry
 * (registry.c), the request state machine (reqs*.c) and the two front ends that feed it
 * (http_api.c for the OpenAI/Anthropic HTTP API, rpc_api.c for the internal protobuf RPC).
 *
 * One request from a front end is a job; each choice of it (n > 1, several completions prompts)
 * is a sequence with its own router-unique id, placed on a decode worker and, unless prefilled
 * locally, a prefill worker. The request state machine (its parts are listed in reqs_impl.h) owns
 * every sequence's state and is the one place that decides what happens when a worker fails or
 * refuses: retry elsewhere, queue, or fail the job. It turns the workers' token ids into text
 * (incremental detokenization, stop strings) and hands the front end per-token events through
 * td_job_ops_t.
 *
 * Threading: everything runs on the router's loop thread.
 */
#ifndef TD_ROUTER_ROUTER_H
#define TD_ROUTER_ROUTER_H

#include "api.h"
#include "control.pb-c.h"
#include "placement.h"
#include "response.h"
#include "td_chat.h"
#include "td_daemon.h"
#include "td_http.h"
#include "td_kvhash.h"
#include "td_metrics.h"
#include "td_rpc.h"
#include "td_sampler.h"
#include "td_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Every option of the daemon (main.c's table maps them). Strings are owned (td_config_free). */
typedef struct td_router_cfg {
    char *model;             /* model directory (config.json, tokenizer.json, ...) */
    char *served_model_name; /* name clients use; default: the directory's basename */
    char *chat_template;     /* Jinja template file overriding the model's, or NULL */
    char *tool_parser;       /* "auto" or a td_tool_fmt name (toolparse.h) */
    char *router_id;         /* StatusResponse.router_id; default host:pid */
    char *http_listen;       /* "host:port" of the HTTP API */
    char *rpc_listen;        /* internal client RPC */
    char *cluster_listen;    /* where workers connect */
    char *secret_file;       /* cluster secret (one of secret_file / secret / credential) */
    char *secret;
    char *secret_prev_file;  /* the previous cluster secret, accepted during a rotation */
    char *secret_prev;
    double heartbeat_timeout_s; /* a worker silent this long is out of rotation */
    char *api_key;              /* HTTP: required bearer / x-api-key when set */
    char *tenant_header;        /* HTTP: header naming the request's tenant, or NULL */
    char *api_keys_file;        /* HTTP: API keys with tenants and limits (auth.h), or NULL */
    double limit_window_s;      /* the window the keys' rpm and tpm count over */
    char *admin_listen;         /* HTTP: /metrics on its own listener, or NULL */
    uint64_t max_body;          /* largest HTTP request body, bytes */
    char *policy;               /* placement policy name */
    uint64_t max_queued_tokens; /* placement high-water marks (0 disables) */
    uint64_t max_running;
    double max_kv_usage;
    uint64_t local_prefill_tokens; /* prompts up to this many tokens are prefilled on decode */
    double local_cached_share;     /* a prompt a decode worker holds this share of is prefilled
                                      there, however long (kv index) */
    double prefill_us_per_token;   /* kv_aware: prefill cost before a worker's is measured */
    double seq_cost_us;            /* kv_aware: what one running sequence adds to a local prefill */
    double imbalance;              /* kv_aware: the guard's threshold (x the mean load) */
    char *kv_redis;                /* "host:port" of the cluster KV index; empty: none */
    uint64_t fetch_min_blocks;     /* a prefill worker fetches another worker's cached blocks
                                      when it gains at least this many (0: never) */
    uint64_t max_waiting;          /* sequences that may wait for a worker; beyond: 503 */
    double request_timeout_s;      /* per-request deadline (0: none) */
    double shutdown_timeout_s;     /* in-flight requests get this long after SIGTERM */
    double no_worker_wait_s;       /* a sequence waits this long while no decode worker is
                                      available, then 503 with Retry-After */
    double max_queue_wait_s;       /* a sequence that has delivered nothing waits at most this
                                      long for a worker to take it, then 503 (0: no limit) */
    /* migration (reqs_worker.c): a sequence whose worker dies, stalls or misses a deadline is
     * re-placed with its prompt plus the tokens generated so far */
    bool migrate;               /* migration.enabled; off: re-placed only before any token */
    uint64_t migrate_attempts;  /* re-placements of one sequence, then the request fails */
    /* deadlines per stage of one attempt, seconds (0: none); reqs_sweep.c */
    double dl_reservation_s;    /* DecodeTask sent -> DecodeAccept */
    double dl_prefill_s;        /* PrefillTask sent -> PrefillDone */
    double dl_kv_handoff_s;     /* PrefillDone -> the decode worker's first token */
    double dl_first_token_s;    /* DecodeAccept -> the attempt's first token */
    double dl_token_stall_s;    /* one token -> the next */
    bool vllm_names;               /* metrics: vLLM's names where they mean the same */
    char *log_level;
    char *log_format;
} td_router_cfg_t;

typedef struct td_router td_router_t;
typedef struct td_worker td_worker_t;
typedef struct td_job td_job_t;
typedef struct td_seq td_seq_t;

/* ---- registry ---------------------------------------------------------------------------- */

/* One tier of a worker's prefix cache, as its last heartbeat said (Load.cache). */
typedef struct td_worker_tier {
    char name[16];          /* "pool", "disk" */
    uint64_t cached_blocks; /* blocks held */
    uint64_t queries, hits; /* prompt tokens looked up / found since the worker started */
    double load_s_per_token; /* the worker's measured cost of loading a token (0: unmeasured) */
} td_worker_tier_t;

#define TD_WORKER_MAX_TIERS 4 /* tiers kept per worker; a heartbeat's further ones are ignored */

/* One registered worker (it has sent Hello). Freed when it leaves; requests never keep a pointer
 * past td_reqs_worker_gone. */
struct td_worker {
    uint64_t serial;     /* unique per registration (ids may come back) */
    char *id;            /* worker id (the authenticated peer id) */
    td_rpc_conn_t *conn; /* its control connection */
    int role;            /* TANDEM__ROLE__ROLE_PREFILL or TANDEM__ROLE__ROLE_DECODE */
    char *model;         /* Hello.model */
    uint8_t fp[32];      /* layout fingerprint, fp_len bytes */
    size_t fp_len;
    uint32_t block_tokens; /* tokens per KV block */
    uint8_t *blob;         /* Hello.ucx_address (the td_kvx blob), blob_len bytes, opaque */
    size_t blob_len;
    uint32_t total_blocks; /* KV pool size, blocks */
    uint32_t max_running;
    td_place_load_t load;      /* placement's view (last heartbeat + pending estimate) */
    bool drain_req;            /* this router sent Drain{on}; heartbeats may lag behind it */
    uint64_t hb_queued_tokens; /* last heartbeat's figures, for status */
    uint32_t hb_running, hb_waiting, hb_free, hb_total;
    td_worker_tier_t hb_cache[TD_WORKER_MAX_TIERS]; /* [n_hb_cache] */
    size_t n_hb_cache;
    double last_hb;    /* td_now_s() of the last Hello or heartbeat */
    uint64_t assigned; /* sequences this router placed on it */
    uint32_t holder;   /* its number in the KV index mirror (kvmirror.c) */
    double s_per_token; /* prefill seconds per computed token, EWMA of PrefillDone (0: none yet) */
    uint64_t n_hb;      /* heartbeats received (which of them a placement came after) */
    uint64_t block_bytes; /* Hello.layout.block_bytes: bytes of one KV block */
    double fetch_bps;     /* Load.fetch_bytes_per_s: its measured fetch bandwidth (0: none yet) */
    td_metric_t *m_up, *m_kv, *m_running, *m_waiting;
};

/* One connection on the cluster listener (registered or not). */
typedef struct td_cluster_conn {
    td_rpc_conn_t *conn;
    td_worker_t *worker; /* NULL until Hello */
} td_cluster_conn_t;

/* ---- the daemon ---------------------------------------------------------------------------- */

struct td_router {
    uv_loop_t *loop;
    td_router_cfg_t cfg;
    const char *model_name; /* served name (points into cfg or name_buf) */
    char name_buf[256];
    char id_buf[128]; /* router id when not configured */
    const char *id;
    td_tokenizer_t *tok;
    td_chat_template_t chat;
    bool have_chat;
    int tool_fmt; /* td_tool_fmt_t: the syntax of the model's tool calls */
    int max_ctx; /* tokens: the model's context length */
    int32_t bos_id, eos_id;
    /* listeners */
    td_http_server_t *http;
    td_http_server_t *admin; /* /metrics and /health when http.admin_listen is set */
    struct td_access *access; /* API keys and limits (auth.h), NULL without a key file */
    uv_signal_t hup;          /* SIGHUP: reload the key file and the cluster secrets */
    td_rpc_server_t *cluster;
    td_rpc_server_t *rpc;
    td_daemon_t *daemon;
    uint8_t *secret;
    size_t secret_len;
    uint8_t *secret_prev; /* previous cluster secret (rotation), NULL when none */
    size_t secret_prev_len;
    /* registry */
    td_worker_t **workers; /* [n_workers] registered workers */
    size_t n_workers, cap_workers;
    uint64_t next_serial;
    td_placer_t placer;
    struct td_kvmirror *kvm; /* the cluster KV index mirror (kvmirror.c), NULL when off */
    /* requests */
    uint64_t next_id;   /* next router-unique sequence id */
    td_seq_t **buckets; /* [n_buckets] hash chains by sequence id */
    size_t n_buckets;
    td_seq_t *wait_head, *wait_tail; /* FIFO of sequences waiting for a decode worker */
    size_t n_waiting;
    size_t n_running; /* sequences placed and not finished */
    td_job_t *jobs;   /* every live job */
    size_t n_jobs;
    td_job_t *aborts;       /* jobs with an abort requested, processed from defer_timer */
    uv_timer_t sweep_timer; /* heartbeats, deadlines, the waiting queue */
    uv_timer_t defer_timer; /* deferred aborts */
    uv_timer_t stop_timer;  /* shutdown progress */
    bool stopping;
    double stop_deadline;
    int exit_code;
    /* metrics */
    td_metrics_t *metrics;
    td_metric_t *m_ttft, *m_itl, *m_tpot, *m_e2e, *m_queue;
    td_metric_t *m_running_g, *m_waiting_g, *m_prompt, *m_gen;
    td_metric_t *m_ok_stop, *m_ok_length, *m_ok_abort;
    td_metric_t *m_migrations; /* tandem_request_migrations_total */
    td_metric_t *m_shed;       /* tandem_requests_shed_total: admission.max_queue_wait_s */
};

/* ---- jobs: the front ends' view of a request ------------------------------------------------ */

/* Events a job reports to its front end. Called on the loop thread; after `done` or `fail` the
 * core never touches the job again, and the front end must release it with td_job_free (it may
 * do so inside the callback). */
typedef struct td_job_ops {
    /* One generated token of sequence `idx` (id -1: text only, at the end) with its logprob
     * record (NULL unless asked), and the text this token releases to the client (may be empty:
     * a partial character or text held back as a possible stop-string start). */
    void (*token)(td_job_t *j, int idx, int32_t id, const Tandem__TokenLogprob *lp,
                  const char *text, size_t len);
    /* The tokens of one worker chunk have all been reported (a good moment to write). */
    void (*flush)(td_job_t *j, int idx);
    /* Sequence `idx` finished normally; `stop` is the stop string that ended it or NULL. */
    void (*finish)(td_job_t *j, int idx, td_resp_finish_t why, const char *stop);
    /* Every sequence finished. */
    void (*done)(td_job_t *j);
    /* The job failed (every sequence was canceled on its workers): `http_status` (400, 500,
     * 503, 504, or 499 when the front end aborted it) and a message. */
    void (*fail)(td_job_t *j, int http_status, int code, const char *msg);
} td_job_ops_t;

typedef enum td_seq_state {
    TD_SEQ_NEW,       /* not placed yet */
    TD_SEQ_WAITING,   /* in the waiting queue */
    TD_SEQ_ACCEPTING, /* DecodeTask sent, DecodeAccept awaited */
    TD_SEQ_RUNNING,   /* accepted (and PrefillTask sent unless local) */
    TD_SEQ_DONE,
} td_seq_state_t;

struct td_seq {
    uint64_t id;             /* router-unique id of the current attempt (0 while unplaced) */
    td_seq_t *hnext;         /* hash chain */
    td_seq_t *wnext, *wprev; /* waiting queue links */
    td_job_t *job;
    int index;       /* choice index in the job */
    int32_t *prompt; /* [n_prompt] token ids, owned by the seq */
    size_t n_prompt;
    uint64_t seed;
    td_seq_state_t state;
    td_worker_t *dw; /* decode worker, NULL when unplaced */
    td_worker_t *pw; /* prefill worker until its PrefillDone, else NULL */
    bool local;      /* prefilled on the decode worker */
    bool got_prefill_done;
    bool prefill_computed; /* the prefill worker said the prompt is computed (handoff under way) */
    uint64_t *tried; /* [n_tried] serials of decode workers that answered ENOSPC */
    size_t n_tried, cap_tried;
    int retries;       /* re-placements after a worker failure (migrations included) */
    uint64_t n_tokens; /* generated tokens received, over every attempt */
    int32_t *gen;      /* [n_tokens] their ids (cap_gen allocated): a migrated sequence resumes
                          with prompt + gen */
    size_t cap_gen;
    uint64_t base_tokens; /* n_tokens when the current attempt was placed */
    double t_stage;       /* td_now_s() when the attempt's current stage began (deadlines) */
    double t_wait;        /* td_now_s() when it last entered the waiting queue as a new wait */
    td_detok_t detok;
    td_buf_t text;  /* generated text so far (bytes), the tail possibly held back */
    size_t sent;    /* bytes of text already handed to the front end */
    size_t scanned; /* bytes of text already searched for stop strings */
    uint32_t prompt_tokens, cached_tokens, completion_tokens; /* usage (worker's last chunk) */
    td_kvhash_t *kvh;  /* [n_kvh] the prompt's block hashes (kvmirror.c), for layout kvh_fp */
    size_t n_kvh;
    uint8_t kvh_fp[16];
    uint32_t kvh_bt;          /* tokens per block they were computed for; 0: none yet */
    uint64_t prefill_cached;  /* what the index said the prefill worker holds (its cost EWMA) */
    uint64_t local_cached;    /* local prefill: what the index said the decode worker holds */
    uint64_t dw_hb, pw_hb;    /* the workers' n_hb when s was placed on them */
    td_resp_finish_t finish;
    double t_placed, t_first, t_last; /* td_now_s() stamps */
    char log_dw[64], log_pw[64]; /* for the end-of-request log: the workers of the last attempt
                                    (log_pw "local": prefilled on the decode worker), "" none */
};

struct td_job {
    td_router_t *rt;
    const td_job_ops_t *ops;
    void *ud;        /* the front end's state */
    char log_id[32]; /* "r-<first seq id>" for logs */
    const char *front;  /* static: "completions", "chat", "messages", "rpc"; NULL until set */
    char client_id[64]; /* the id the client sees (response id, RPC request id); "" until set */
    size_t n_choices;   /* sequences per prompt, >= 1: the log counts each prompt once */
    td_seq_t *seqs;  /* [n_seqs] */
    size_t n_seqs;
    size_t n_done;
    td_sampling_t sp; /* the engine's settings, shared by every sequence: sp.seed is unused (each
                         sequence has its own seed), sp.eos_id is left to the workers, and
                         sp.max_tokens is > 0 (the front end derives it from the context) */
    void *sp_arrays;  /* owned copies of sp's lists and schema (td_job_set_sampling) */
    uint8_t *tenant;  /* [tenant_len] the tenant (the KV hash salt), owned; NULL: default */
    size_t tenant_len;
    char **stop;      /* [n_stop] stop strings, owned */
    size_t n_stop;
    size_t stop_max;  /* longest stop string, bytes */
    double t_arrival; /* td_now_s() */
    double deadline;  /* td_now_s() value, 0: none */
    bool started, ended;
    int abort_status; /* set by td_job_abort: http status to report */
    char *abort_msg;
    td_job_t *next, *prev; /* rt->jobs */
    td_job_t *anext;       /* rt->aborts */
    bool abort_queued;
};

/* A new job of n_seqs sequences (each needs td_job_set_prompt). NULL on allocation failure. */
td_job_t *td_job_new(td_router_t *rt, const td_job_ops_t *ops, void *ud, size_t n_seqs);
/* Give sequence idx its prompt (copied) and seed. 0 or TD_ENOMEM. */
int td_job_set_prompt(td_job_t *j, int idx, const int32_t *ids, size_t n, uint64_t seed);
/* Copy the tenant (the salt of the request's KV block hashes). 0 or TD_ENOMEM. */
int td_job_set_tenant(td_job_t *j, const void *tenant, size_t len);
/* Name the job for the one line logged when it ends: its front end (`front`, a static string),
 * the id the client sees (copied, truncated to 63 bytes) and the choices per prompt (usage
 * counts each prompt once, as the response's does). */
void td_job_set_client(td_job_t *j, const char *front, const char *client_id, size_t n_choices);
/* Take `p` as the job's settings (j->sp), copying what it points to (logit_bias, bad_words,
 * json_schema) so the job owns it. 0 or TD_ENOMEM. */
int td_job_set_sampling(td_job_t *j, const td_sampling_t *p);
/* Copy the stop strings. 0 or TD_ENOMEM. */
int td_job_set_stop(td_job_t *j, char *const *stop, size_t n);
/* Place every sequence (or queue it). 0, or TD_EBUSY when the waiting queue is full or the router
 * is shutting down (the caller answers 503 and frees the job with td_job_free; no op was called).
 */
int td_job_start(td_job_t *j);
/* Ask for the job to end early (client gone, RPC Cancel): its workers get Cancel and, from the
 * loop shortly after, ops->fail runs with `http_status`. Safe to call more than once. */
void td_job_abort(td_job_t *j, int http_status, const char *msg);
/* Release a job that was never started, or after done/fail. */
void td_job_free(td_job_t *j);

/* ---- the request state machine (reqs*.c): called by the registry and main.c ------------------ */

int td_reqs_init(td_router_t *rt);
void td_reqs_close(td_router_t *rt);
/* A frame for requests (DecodeAccept, PrefillDone, TokenChunk, Error) from worker w. */
void td_reqs_on_frame(td_router_t *rt, td_worker_t *w, const Tandem__Frame *f);
/* Worker w is out of rotation: retry or fail everything it held. */
void td_reqs_worker_gone(td_router_t *rt, td_worker_t *w);
/* Capacity may have appeared: place waiting sequences. */
void td_reqs_kick(td_router_t *rt);
/* Periodic: deadlines. */
void td_reqs_sweep(td_router_t *rt, double now);
/* Fail every live job with `msg` (shutdown). */
void td_reqs_abort_all(td_router_t *rt, const char *msg);

/* ---- registry.c ---------------------------------------------------------------------------- */

/* Start the cluster listener. 0 or a TD_E* code. */
int td_registry_start(td_router_t *rt);
/* Heartbeat deadlines (called from the sweep timer). */
void td_registry_sweep(td_router_t *rt, double now);
/* Find a registered worker by id, or NULL. */
td_worker_t *td_registry_find(td_router_t *rt, const char *id);
/* Send Drain{on} to a worker and mark it draining at once. 0 or TD_ENOENT / TD_ECLOSED. */
int td_registry_drain(td_router_t *rt, const char *id, bool on);
/* Whether a decode worker is registered and not draining. */
bool td_registry_has_decode(const td_router_t *rt);

/* ---- status.c: the router's view for StatusRequest ------------------------------------------ */

/* A StatusResponse and the storage it points into; its strings point into the router's workers
 * and jobs, so it must be sent before the loop runs again. */
typedef struct td_status {
    Tandem__StatusResponse resp;
    void *mem[8]; /* allocations resp points into */
} td_status_t;

/* Fill st from the registry (every worker, its last heartbeat and this router's sequences on it)
 * and, when with_requests, every unfinished sequence, oldest first. 0 or TD_ENOMEM; either way
 * td_status_free releases it. */
int td_status_build(td_router_t *rt, bool with_requests, td_status_t *st);
void td_status_free(td_status_t *st);

/* ---- kvmirror.c: the cluster KV index mirror ------------------------------------------------ */

/* When kv.redis is set: subscribe to the cluster KV index (td_kvredis.h) and mirror it into a
 * td_kvindex, rebuilt from Redis at start and on every reconnect. 0 or TD_EINVAL / TD_ENOMEM. */
int td_kvmirror_start(td_router_t *rt);
void td_kvmirror_stop(td_router_t *rt);
/* w registered: give it its holder number and read its set again (it may have left before). */
void td_kvmirror_worker_up(td_router_t *rt, td_worker_t *w);
/* w is out of rotation: its entries leave the mirror at once. */
void td_kvmirror_worker_gone(td_router_t *rt, td_worker_t *w);
/* Prompt tokens of s that worker w holds in its prefix cache, by the mirror (0 when off). */
uint64_t td_kvmirror_cached(td_router_t *rt, td_seq_t *s, const td_worker_t *w);
/* td_kvmirror_cached, also giving in *slow_tokens how many of those tokens w holds below its
 * pool (on disk: a load, not a recompute, but not free either). */
uint64_t td_kvmirror_cached_tiers(td_router_t *rt, td_seq_t *s, const td_worker_t *w,
                                  uint64_t *slow_tokens);
/* Blocks in the mirror, and resyncs completed (status, tests). */
size_t td_kvmirror_blocks(const td_router_t *rt);

/* ---- fetchhint.c: cross-worker fetch hints ---------------------------------------------------- */

/* Fill `h` when another live worker holds at least kv.fetch_min_blocks more of s's leading
 * blocks than prefill worker p by the mirror (and fetching them is not measured slower than
 * computing them): the holder that holds most, a prefill worker on ties. h points into that
 * worker's registry entry: send it before the loop runs again. Returns whether h was filled. */
bool td_fetchhint_fill(td_router_t *rt, td_seq_t *s, const td_worker_t *p, Tandem__FetchHint *h);
/* The rule behind it, for the hint and for kv_aware's prediction alike: the holder p would be
 * told to fetch from (NULL: none) and the blocks it would fetch (*gain_blocks), given the
 * `have_tokens` of s that p holds itself. `memo` (NULL, or one entry per rt->workers[i],
 * UINT64_MAX until asked) keeps each worker's cached tokens of s across calls for one request. */
const td_worker_t *td_fetchhint_pick(td_router_t *rt, td_seq_t *s, const td_worker_t *p,
                                     uint64_t have_tokens, uint64_t *memo, uint64_t *gain_blocks);

/* ---- front ends ---------------------------------------------------------------------------- */

/* Register the HTTP routes and listen. 0 or a TD_E* code. */
int td_http_api_start(td_router_t *rt);
/* Start the internal RPC listener. 0 or a TD_E* code. */
int td_rpc_api_start(td_router_t *rt);

/* Shared by the front ends: text of one token for logprob records (decoded alone, special tokens
 * kept) appended to out. 0 or TD_ENOMEM / TD_ERANGE. */
int td_router_token_text(const td_router_t *rt, int32_t id, td_buf_t *out);
/* Render a chat message list and tokenize it (no BOS added: the template writes it). */
int td_router_chat_tokens(td_router_t *rt, const td_chat_msgs_t *msgs, bool add_gen,
                          bool disable_thinking, td_tokens_t *out);
/* Render with full options (tools, template kwargs), append `prefill` (NULL: nothing) after the
 * rendered prompt, and tokenize. */
int td_router_chat_render(td_router_t *rt, const td_chat_msgs_t *msgs, const td_chat_opts_t *o,
                          const char *prefill, td_tokens_t *out);
/* A random 64-bit seed. */
uint64_t td_router_random_seed(void);

#endif
