/* td_worker.h: what both worker daemons (tandem-prefill in prefill/, tandem-decode in decode/)
 * share: configuration, the sequence table, the compute thread, the scheduler, the router
 * connections with their heartbeats, and the admin HTTP endpoints. What differs between the two
 * is a role table (td_worker_role_t) of the functions the core calls at each event, so the core
 * has no role branches.
 *
 * One process = one engine, one KV pool (the data plane's UCX-registered memory, so blocks move
 * without a copy), one libuv loop thread and one compute thread:
 *
 *   loop thread     control plane to every router (td_rpc), data plane (td_kvx), /metrics and
 *                   /health (td_http), every sequence's state, and the scheduler that builds each
 *                   step's batch and reserves its blocks
 *   compute thread  runs one step at a time (td_engine_step, which also samples), handed over by
 *                   the loop under w->mu and handed back through a uv_async; it never touches the
 *                   network or the pool's bookkeeping
 *
 * Who owns what at that boundary: from td_wk_sched_post until the loop's done callback, the
 * compute thread owns w->items[0, n_items), and for every sequence in them (`in_step`) its `kv`
 * (n_tokens advances, the KV bytes of its reserved blocks) and its sampler `smp`; it reads the
 * sequence's `toks` (which the loop does not change while in_step). The loop must not read those
 * fields of an in_step sequence: its own view of the stored tokens is `stored`, updated when the
 * step comes back. Every other field of a sequence and of the worker belongs to the loop thread.
 *
 * Sequence states (loop thread):
 *   PREFILL  the prompt is computed here chunk by chunk (a prefill worker's task, or a decode
 *            worker's local prefill); after a preemption, the sequence's KV is recomputed here
 *   WAIT_KV  decode: blocks reserved, the prefill worker's pushes arriving
 *   RUN      decode: one token per step until a stop condition
 *   PUSHING  prefill: compute done, the last pushes in flight; PrefillDone when they complete
 * A sequence canceled or failed while the compute thread or the data plane holds its blocks is
 * marked dead and freed once they let go.
 */
#ifndef TD_WORKER_H
#define TD_WORKER_H

#include "control.pb-c.h"
#include "td_daemon.h"
#include "td_engine.h"
#include "td_http.h"
#include "td_kv.h"
#include "td_kvdisk.h"
#include "td_kvx.h"
#include "td_metrics.h"
#include "td_model.h"
#include "td_rpc.h"
#include "td_sampler.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#define TD_WK_MAX_ROUTERS 16

/* ---- configuration (config.c) ------------------------------------------------------------- */

typedef struct td_wk_cfg {
    char *model;
    char *id;
    char *routers; /* comma-separated router cluster addresses */
    char *secret;
    char *secret_file;
    char *http_listen;
    uint64_t kv_memory;  /* bytes for the KV pool when kv_blocks is 0 */
    uint64_t kv_blocks;  /* blocks in the pool; 0: from kv_memory */
    int64_t block_size;  /* tokens per block */
    bool kv_checksum;    /* per-block checksums on pushes */
    bool prefix_cache;   /* keep and reuse full blocks by hash (tier 0) */
    char *disk_dir;      /* the disk tier's directory (tier 2); NULL: no disk tier */
    uint64_t disk_max;   /* its size cap, bytes */
    char *disk_load;     /* "auto": load a block from disk when measured cheaper than computing it;
                            "always" */
    double kv_wait_s;    /* decode: how long reserved blocks wait for a prefill worker's push */
    char *kv_redis;      /* "host:port" of the cluster KV index's Redis; empty: not published */
    double kv_redis_lease_s; /* the worker's index entries expire this long after its last beat */
    double fetch_timeout_s;  /* a fetch from another worker not answered by then is computed */
    int64_t threads;     /* compute threads; 0: every core */
    bool hugepage_weights; /* cpu engine: weights copied to anonymous huge pages at start */
    bool grouped_weights;  /* cpu engine: F16 matrices multiplied from a grouped copy */
    int64_t max_batch_tokens;
    int64_t prefill_chunk;
    int64_t max_running;
    char *engine_kind;     /* "cpu" or "sim" */
    td_sim_opts_t sim;     /* the simulated engine's latency model */
    double heartbeat_s;
    double drain_timeout_s;
    bool vllm_names;     /* /metrics: vLLM's names where they mean the same (admin.c) */
    char *model_name;    /* /metrics: model_name label under vllm_names; NULL: model's basename */
    char *log_level;
    char *log_format;
} td_wk_cfg_t;

extern const td_opt_t td_wk_opts[];
extern const size_t td_wk_n_opts;

/* ---- the role table ----------------------------------------------------------------------- */

typedef struct td_worker td_worker_t;
typedef struct td_wk_router td_wk_router_t;
typedef struct td_wk_seq td_wk_seq_t;

typedef struct td_worker_role {
    Tandem__Role role;
    const char *name;       /* "prefill" / "decode": program tandem-<name>, log component */
    const char *env_prefix; /* TANDEM_PREFILL / TANDEM_DECODE: one environment, several daemons */
    const char *takes;      /* --help: what the worker takes and does */
    /* The task frame this role takes (PrefillTask or DecodeTask); any other task is refused. */
    Tandem__Frame__BodyCase task_case;
    void (*on_task)(td_worker_t *w, td_wk_router_t *rt, const Tandem__Frame *f);
    /* Tell the router that s failed (the sequence is freed by the caller). */
    void (*report_failure)(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg);
    /* s is canceled (or its router is gone) and not in a step: tell peers that nothing more
     * comes (prefill: the aborted last push). May be NULL. */
    void (*abandon)(td_worker_t *w, td_wk_seq_t *s);
    /* A step stored a chunk of s's prompt without sampling (more chunks follow). May be NULL. */
    void (*chunk_done)(td_worker_t *w, td_wk_seq_t *s);
    /* The last chunk of s's prompt was computed and its first token sampled (`out`, with the
     * finish state already adjusted for the context limit). */
    void (*prefilled)(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *out);
    /* A decode step sampled s's next token (decode only; NULL for prefill). */
    void (*decoded)(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *out);
    /* Whether a peer may still write into s's blocks, so they cannot be freed yet. May be NULL. */
    bool (*blocks_busy)(const td_worker_t *w, const td_wk_seq_t *s);
    /* KV pushed into this worker's pool (decode). May be NULL. */
    td_kvx_recv_cb on_kv_recv;
    /* Every heartbeat: the role's own deadlines. May be NULL. */
    void (*sweep)(td_worker_t *w, double now);
} td_worker_role_t;

/* ---- state -------------------------------------------------------------------------------- */

struct td_wk_router {
    td_worker_t *w;
    char addr[256];
    td_rpc_client_t *cl;
    td_rpc_conn_t *conn; /* ready connection or NULL */
    uint64_t gen;        /* bumped on every new connection: a sequence belongs to one */
};

typedef enum td_wk_state {
    TD_WK_PREFILL,
    TD_WK_WAIT_KV,
    TD_WK_RUN,
    TD_WK_PUSHING,
    TD_WK_LOADING, /* prompt blocks are being read from the disk tier into the pool, or fetched
                      from another worker (fetch.c) */
} td_wk_state_t;

struct td_wk_seq {
    td_wk_seq_t *prev, *next; /* the worker's list, oldest first */
    uint64_t id;              /* this worker's id for it */
    uint64_t req;             /* the router's request id */
    td_wk_router_t *rt;       /* NULL: no router (tests) */
    uint64_t rt_gen;
    td_wk_state_t state;
    bool in_step;   /* the compute thread owns kv and smp (see the header comment) */
    bool recompute; /* preempted: its KV was dropped; PREFILL recomputes toks[0, n_toks - 1)
                       without sampling, then it runs again */
    bool dead;      /* canceled or failed: free once nothing holds its blocks */
    int32_t *toks;  /* [n_toks] prompt, then generated tokens */
    int n_toks, cap_toks;
    int n_prompt;
    int n_resumed; /* migration: of toks[0, n_prompt), the last n_resumed were generated by the
                      request's earlier attempts (usage counts them as completion tokens) */
    int stored; /* tokens whose KV is stored, as the loop knows it (kv.n_tokens outside steps) */
    uint8_t *tenant; /* [tenant_len] the request's tenant: the salt of its block hashes */
    size_t tenant_len;
    td_kvhash_t *hashes; /* [cap_hashes] chain hashes of toks' first n_hashed full blocks */
    int n_hashed, cap_hashes;
    int n_published;   /* kv.blocks[0, n_published) are published in the pool's prefix cache */
    int cached_tokens; /* prompt tokens taken from a cache instead of computed (usage) */
    int loads_out;     /* disk loads into kv.blocks not completed (they own those blocks' bytes) */
    int load_from, load_to; /* LOADING: kv.blocks[load_from, load_to) are being loaded */
    int load_bad;      /* the first block whose load or fetch failed (the end when none) */
    int fetch_from, fetch_to; /* LOADING: kv.blocks[fetch_from, fetch_to) are being fetched
                                 from another worker, right after the disk's (0, 0: none) */
    double t_load0;
    int logprobs; /* -1: none; else top alternatives per token */
    td_sampler_t smp;
    td_kv_seq_t kv; /* kv.n_tokens tokens stored */
    double t_start;
    /* prefill worker: where the blocks go */
    td_kvx_peer_t *peer;
    uint32_t *dst; /* [n_dst] the decode worker's block ids */
    int n_dst;
    uint64_t dst_req; /* the decode worker's id of the request */
    int pushed;       /* blocks [0, pushed) pushed so far */
    int sent;         /* blocks delivered over every push (re-sent ones included) */
    int pushes_out;   /* pushes not completed */
    int push_status;  /* first failure */
    double t_push0;   /* first push posted */
    double t_final;   /* last push posted (compute done) */
    uint64_t push_bytes;
    /* decode worker: KV arriving from a prefill worker */
    int kv_recv;  /* blocks arrived */
    int kv_total; /* blocks announced by the last push, -1 until then */
    bool kv_aborted;
    double kv_deadline;
    Tandem__KvNote *note; /* the last push's note (first token) */
};

/* One sequence's share of a step, and what the compute thread returns for it. */
typedef struct td_wk_item {
    td_wk_seq_t *s;
    int n;       /* tokens fed: toks[stored, stored + n) */
    bool sample; /* sample the next token into out */
    bool decode; /* a running sequence's next token */
    td_sample_t out;
} td_wk_item_t;

/* The compute thread and the step it runs (compute.c). Fields under `mu`. */
typedef struct td_wk_compute {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uv_async_t done_async;
    bool posted, done, quit;
    int rc;
    char err[256];
    double seconds;
    td_batch_seq_t *bs; /* [cap] the engine's view of the step (compute thread) */
    int cap;
} td_wk_compute_t;

/* What the worker's /metrics shows (admin.c). */
typedef struct td_wk_metrics {
    td_metrics_t *reg;
    td_metric_t *running, *waiting, *kv_usage, *prompt, *gen, *step, *xfer_bytes, *xfer_s,
        *tail_s, *recv_bytes, *req_ok, *req_fail, *preempt, *cache_queries, *cache_hits,
        *cached_blocks, *evictions, *disk_queries, *disk_hits, *disk_files, *disk_bytes,
        *disk_enabled, *disk_corrupt, *disk_errors, *disk_evictions, *computed;
    /* cross-worker fetch (fetch.c) */
    td_metric_t *fetch_blocks, *fetch_bytes, *fetch_served, *fetch_bw;
    td_metric_t *fetch_fail[6]; /* by reason: td_wk_fetch_reasons */
} td_wk_metrics_t;

/* The reasons a fetch from another worker fails (fetch_fail's `reason` label). */
extern const char *const td_wk_fetch_reasons[6];

struct td_worker {
    const td_worker_role_t *role;
    td_wk_cfg_t cfg;
    uv_loop_t *loop;
    td_daemon_t *daemon;
    bool ready_sent; /* READY=1 told systemd: once, at the first registration (routers.c) */
    uint8_t *secret;
    size_t secret_len;
    char model_name[256];
    td_model_t *model;
    const td_model_cfg_t *mc; /* &model->cfg */
    td_engine_t *engine;
    /* structured outputs (structured.c): the vocabulary's byte trie, built from the model
     * directory's tokenizer at the first request that needs it */
    struct td_vocab_trie *vocab_trie;
    bool vocab_trie_failed;
    bool sim;
    td_kv_layout_t layout;
    td_kv_pool_t pool;
    td_kvx_t *kvx;
    td_kvdisk_t *disk; /* tier 2, or NULL */
    double load_s_per_block;    /* measured: seconds to load one block from disk (0: unmeasured) */
    double prefill_s_per_token; /* measured: seconds of prefill compute per token (0: unmeasured) */
    double fetch_bytes_per_s;   /* measured: payload bytes per second of fetches (0: unmeasured) */
    struct td_kvredis *index; /* the cluster KV index publisher (index.c), NULL when off */
    td_http_server_t *http;
    td_wk_metrics_t m;
    td_wk_router_t routers[TD_WK_MAX_ROUTERS];
    int n_routers;
    uv_timer_t hb_timer;
    uint64_t hb_seq;
    /* Load.cache as td_wk_fill_load last filled it: [0] pool, [1] disk (when w->disk); loop
     * thread, valid until its next call */
    Tandem__CacheTier load_tiers[2];
    Tandem__CacheTier *load_tier_p[2];
    td_wk_seq_t *head, *tail; /* every live sequence, oldest first */
    int n_seqs;
    uint64_t next_id;
    bool draining, stopping, stopped;
    double stop_deadline;
    /* the step in flight: items [0, n_items) are the compute thread's until it returns */
    td_wk_item_t *items; /* [cap_items] */
    int n_items, cap_items;
    float *logits; /* [cap_items][vocab] */
    int step_prefill_tokens, step_decodes; /* its composition, for the debug line */
    int64_t step_ctx;
    td_wk_compute_t cp;
};

/* ---- worker.c: the daemon ----------------------------------------------------------------- */

/* Run the daemon in `role`: parse argv, load the model, serve until SIGTERM/SIGINT, drain, exit.
 * Returns the process exit status. */
int td_worker_main(const td_worker_role_t *role, int argc, char **argv);

/* ---- seq.c: the sequence table ------------------------------------------------------------ */

/* A new sequence of prompt toks[0, n) from router rt (NULL in tests) with sampling `sp` (NULL:
 * greedy), added at the tail. NULL with *code and td_err_msg on refusal: TD_EINVAL (bad prompt
 * or sampling), TD_EBUSY (draining), TD_ENOSPC (engine.max_running), TD_ENOMEM. */
td_wk_seq_t *td_wk_seq_new(td_worker_t *w, td_wk_router_t *rt, uint64_t req,
                           const int32_t *toks, size_t n, const Tandem__Sampling *sp,
                           const ProtobufCBinaryData *tenant, int *code);
/* s (just made by td_wk_seq_new from a task) resumes a migrated sequence: the last `generated`
 * of its tokens came from earlier attempts. Its sampler is put at that position (the seeded
 * stream and the max_tokens count, from the task's `sp`, as one uninterrupted run), and usage
 * will count them as completion tokens. 0, or TD_EINVAL when `generated` leaves no prompt or
 * nothing to generate. */
/* structured.c: constrain s's sampler by p's response format (json_mode, json_schema): the
 * schema compiled, the mask over the model's vocabulary. 0 (also when p asks for none), or
 * TD_EINVAL / TD_ENOTSUP naming the schema keyword, TD_ENOENT when the model directory has no
 * tokenizer, TD_ENOMEM. */
int td_wk_structured(td_worker_t *w, td_wk_seq_t *s, const td_sampling_t *p);
void td_wk_structured_free(td_worker_t *w);

int td_wk_seq_resume(td_worker_t *w, td_wk_seq_t *s, uint32_t generated,
                     const Tandem__Sampling *sp);
/* Usage for the finish: the request's prompt tokens (without resumed ones), the completion
 * tokens over every attempt, and the cached prompt tokens. */
void td_wk_seq_usage(const td_wk_seq_t *s, uint32_t *prompt, uint32_t *completion,
                     uint32_t *cached);
td_wk_seq_t *td_wk_seq_find(td_worker_t *w, uint64_t id);
/* The live sequence the router knows as `req` on its current connection, or NULL. */
td_wk_seq_t *td_wk_seq_find_req(td_worker_t *w, td_wk_router_t *rt, uint64_t req);
/* Append a generated token. 0 or TD_ENOMEM. */
int td_wk_seq_push_token(td_wk_seq_t *s, int32_t t);
/* Free s unless the compute thread, the data plane or a peer still holds its blocks. */
void td_wk_seq_maybe_free(td_worker_t *w, td_wk_seq_t *s);
/* Mark s dead and free it when nothing holds it. */
void td_wk_seq_kill(td_worker_t *w, td_wk_seq_t *s);
/* Fail s: the role tells the router, then s is killed. No-op on a dead sequence. */
void td_wk_seq_fail(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg);
/* s is canceled or its router is gone: abandon it (role), then kill it. */
void td_wk_seq_cancel(td_worker_t *w, td_wk_seq_t *s);
/* Tokens the PREFILL state must have stored before the sequence runs: the prompt, or, after a
 * preemption, everything but the last generated token (the next step's input). */
int td_wk_prefill_target(const td_wk_seq_t *s);
/* Send a frame to s's router, if its connection is still the one s came on. */
void td_wk_send(td_wk_seq_t *s, const Tandem__Frame *f);

/* ---- cache.c: the prefix cache in the pool (tier 0) ---------------------------------------- */

/* Take the longest cached prefix of s's tokens (at most `limit` tokens) into its empty block
 * table; s->stored becomes what was taken. Returns the tokens taken. With `count` the lookup is
 * counted in the prefix-cache metrics (an admission, as vLLM counts them). */
int td_wk_cache_attach(td_worker_t *w, td_wk_seq_t *s, int limit, bool count);
/* Publish s's blocks that are full and stored (their KV is final) in the prefix cache, and
 * write them to the disk tier. */
void td_wk_cache_publish(td_worker_t *w, td_wk_seq_t *s);
/* Admission of a sequence in PREFILL whose prompt's first `limit` tokens may come from a cache:
 * the pool's blocks are taken at once; the next blocks the disk tier holds are loaded into the
 * pool when that is cheaper than computing them (kv.disk_load), and s waits in LOADING until they
 * are in (then it is PREFILL again and the scheduler runs). Returns the tokens taken so far;
 * s->cached_tokens counts every cached token once loads complete. */
void td_wk_cache_admit(td_worker_t *w, td_wk_seq_t *s, int limit);
/* Every disk load and fetch of s (in LOADING) is in: keep the verified prefix (up to the first
 * block that failed), publish it, and let s prefill the rest (PREFILL again). */
void td_wk_cache_loaded(td_worker_t *w, td_wk_seq_t *s);
/* Open the disk tier when configured. 0 or TD_E*. */
int td_wk_disk_open(td_worker_t *w);
/* Close it (callbacks of work in flight run first); `done` runs on the loop once it is closed. */
void td_wk_disk_close(td_worker_t *w, void (*done)(void *arg), void *arg);
/* A prefill-only step of `tokens` prompt tokens took `seconds` (the compute cost model). */
void td_wk_cache_measure_prefill(td_worker_t *w, int tokens, double seconds);

/* ---- fetch.c: cross-worker fetch of cached blocks (docs/dataplane.md, Fetch) -------------- */

/* After td_wk_cache_admit: when `hint` names a worker holding more of s's leading blocks than
 * this one took from its own tiers, fetch the rest of that run from it over the data plane (s
 * waits in LOADING; checksummed; a failure, a partial answer or kv.fetch_timeout_s without one
 * leaves those blocks to be computed). NULL hint: nothing. */
void td_wk_fetch_start(td_worker_t *w, td_wk_seq_t *s, const Tandem__FetchHint *hint);
/* The data plane's on_fetch: serve another worker's fetch from the pool's prefix cache and the
 * disk tier (a leading run of the keys asked; the blocks stay referenced until the push ends). */
void td_wk_fetch_serve(td_kvx_t *kvx, const td_kvx_fetch_req_t *req, void *arg);

/* ---- index.c: the cluster KV index (td_kvredis.h) ------------------------------------------- */

/* Publish the pool's cached blocks to Redis when kv.redis is set: an ADD when a block is
 * published, a REMOVE when one is evicted, the whole inventory on every (re)connect, under a
 * lease renewed by td_wk_index_renew. Redis is never on a request's path. 0 or TD_EINVAL. */
int td_wk_index_start(td_worker_t *w);
/* Every heartbeat: renew the lease on the worker's entries. */
void td_wk_index_renew(td_worker_t *w);
/* Stop publishing and close the connection (the entries expire with the lease). */
void td_wk_index_stop(td_worker_t *w);

/* ---- sched.c: the scheduler ---------------------------------------------------------------- */

/* Build the next step into w->items (n_items): every running sequence's next token, oldest
 * first, then prefill chunks in arrival order up to engine.max_batch_tokens (at most
 * engine.prefill_chunk per prompt), reserving their blocks. A running sequence that cannot get a
 * block preempts the newest running sequence (vLLM's recompute mode; itself when it is the
 * newest); no prefill is admitted in a step that preempted. Returns the number of items (0:
 * nothing to run). The loop must not be running a step. */
int td_wk_sched_build(td_worker_t *w);
/* Build and hand the next step to the compute thread, unless one is running. */
void td_wk_schedule(td_worker_t *w);

/* ---- compute.c: the compute thread --------------------------------------------------------- */

/* Start the compute thread and the async that brings steps back to the loop. 0 or TD_E*. */
int td_wk_compute_start(td_worker_t *w);
/* Hand w->items[0, n_items) to the compute thread. */
void td_wk_compute_post(td_worker_t *w);
/* Whether a step is in flight. */
bool td_wk_compute_busy(const td_worker_t *w);
/* Stop and join the thread (the async is closed by td_wk_compute_close). */
void td_wk_compute_join(td_worker_t *w);
void td_wk_compute_close(td_worker_t *w);
/* Run one step on the calling thread (what the compute thread runs; tests call it directly). */
int td_wk_compute_run(td_worker_t *w, double *seconds);
/* Apply a finished step's results (loop thread): the role's callbacks per item, then schedule. */
void td_wk_step_finish(td_worker_t *w, int rc, const char *err, double seconds);

/* ---- routers.c: control plane -------------------------------------------------------------- */

/* Start a client for every address in cfg.routers. 0 or TD_E*. */
int td_wk_routers_start(td_worker_t *w);
void td_wk_routers_stop(td_worker_t *w);
/* Fill `l` from the sequence table, the pool and the disk tier; refreshes the load gauges.
 * l->cache points into w (valid until the next call). */
void td_wk_fill_load(td_worker_t *w, Tandem__Load *l);
void td_wk_send_heartbeats(td_worker_t *w);
/* Send Error{code, msg} for request `req` to rt, if connected. */
void td_wk_send_error(td_wk_router_t *rt, uint64_t req, int code, const char *msg);

/* ---- admin.c: /metrics, /health and the metric handles -------------------------------------- */

int td_wk_metrics_init(td_worker_t *w);
void td_wk_metrics_free(td_worker_t *w);
/* Serve /metrics and /health on cfg.http_listen. 0 or TD_E*. */
int td_wk_admin_start(td_worker_t *w);

#endif
