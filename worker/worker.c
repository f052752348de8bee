/* worker.c: tandem-prefill and tandem-decode (see worker.h for the threads and roles, and
 * docs/architecture.md for the request flow).
 *
 * Sequence states (loop thread only):
 *
 *   PREFILL  the prompt is being computed here, chunk by chunk (a prefill worker's task, or a
 *            decode worker's local prefill). After the last chunk the first token is sampled:
 *            a prefill worker pushes the rest of the blocks with a KvNote and goes to PUSHING;
 *            a decode worker emits the token and goes to RUN.
 *   WAIT_KV  decode worker: blocks reserved, waiting for the prefill worker's pushes.
 *   RUN      decode worker: one token per step until a stop condition.
 *   PUSHING  prefill worker: compute done, pushes in flight; PrefillDone when they complete.
 *
 * A sequence that is canceled or fails while the compute thread or the data plane still holds
 * its blocks is marked dead and freed once they let go: the step returns, its pushes complete, or
 * (decode side) the prefill worker's last push arrives or kv.wait_s passes.
 */
#include "worker.h"
#include "td_config.h"
#include "td_daemon.h"
#include "td_engine.h"
#include "td_error.h"
#include "td_frame.h"
#include "td_http.h"
#include "td_kv.h"
#include "td_kvx.h"
#include "td_log.h"
#include "td_metrics.h"
#include "td_model.h"
#include "td_rpc.h"
#include "td_sampler.h"
#include "td_util.h"

#include <math.h>
#include <pthread.h>
#include <time.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WK_VERSION "0.1.0"
#define WK_MAX_ROUTERS 16

/* ---- configuration --------------------------------------------------------------------------- */

typedef struct wk_cfg {
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
    double kv_wait_s;    /* decode: how long reserved blocks wait for a prefill worker's push */
    int64_t threads;     /* compute threads; 0: every core */
    int64_t max_batch_tokens;
    int64_t prefill_chunk;
    int64_t max_running;
    char *engine_kind;   /* "cpu" or "sim" */
    double sim_step_us;  /* sim: fixed cost of a step */
    double sim_prefill_us; /* sim: per prompt token */
    double sim_decode_us;  /* sim: per decoding sequence */
    double sim_ctx_us;     /* sim: per cached token attended to by a decoding sequence */
    double heartbeat_s;
    double drain_timeout_s;
    char *log_level;
    char *log_format;
} wk_cfg_t;

#define O(f) offsetof(wk_cfg_t, f)
static const td_opt_t wk_opts[] = {
    {"model", TD_OPT_STR, O(model), NULL, "model directory (config.json, safetensors, tokenizer)"},
    {"id", TD_OPT_STR, O(id), NULL, "worker id, unique in the cluster (default: role-host-pid)"},
    {"routers", TD_OPT_STR, O(routers), "127.0.0.1:8200",
     "comma-separated cluster addresses of every router (host:port or unix:/path)"},
    {"cluster.secret", TD_OPT_STR, O(secret), NULL,
     "shared cluster secret (prefer cluster.secret_file)"},
    {"cluster.secret_file", TD_OPT_STR, O(secret_file), NULL,
     "file holding the shared cluster secret (default: $CREDENTIALS_DIRECTORY/cluster-secret)"},
    {"http.listen", TD_OPT_STR, O(http_listen), "127.0.0.1:0",
     "address of /metrics and /health (port 0: any free port)"},
    {"kv.memory", TD_OPT_SIZE, O(kv_memory), "256M", "KV pool size when kv.blocks is 0", 0, 0},
    {"kv.blocks", TD_OPT_UINT, O(kv_blocks), "0", "KV pool size in blocks (0: from kv.memory)", 0,
     1 << 30},
    {"kv.block_size", TD_OPT_INT, O(block_size), "16",
     "tokens per KV block; the same on every worker of a cluster", 1, 4096},
    {"kv.checksum", TD_OPT_BOOL, O(kv_checksum), "false",
     "verify a per-block XXH3 checksum on every KV transfer"},
    {"kv.wait_s", TD_OPT_DOUBLE, O(kv_wait_s), "60",
     "decode: seconds reserved blocks wait for the prefill worker's KV", 0.1, 3600},
    {"engine.threads", TD_OPT_INT, O(threads), "0", "compute threads (0: every core)", 0, 1024},
    {"engine.max_batch_tokens", TD_OPT_INT, O(max_batch_tokens), "2048",
     "tokens per step, decodes and prefill chunks together", 1, 1 << 20},
    {"engine.prefill_chunk", TD_OPT_INT, O(prefill_chunk), "512",
     "largest prefill chunk of one prompt per step", 1, 1 << 20},
    {"engine.max_running", TD_OPT_INT, O(max_running), "256",
     "sequences held at once (running, prefilling and waiting for KV)", 1, 1 << 20},
    {"engine.kind", TD_OPT_STR, O(engine_kind), "cpu",
     "cpu: run the model; sim: SIMULATED engine: no model math, each step takes the time of "
     "the sim.* latency model (batching, KV reservation and transfer stay real)"},
    {"sim.step_us", TD_OPT_DOUBLE, O(sim_step_us), "2000",
     "simulated engine: fixed microseconds per step", 0, 1e9},
    {"sim.prefill_us_per_token", TD_OPT_DOUBLE, O(sim_prefill_us), "50",
     "simulated engine: microseconds per prompt token in a step", 0, 1e9},
    {"sim.decode_us_per_seq", TD_OPT_DOUBLE, O(sim_decode_us), "100",
     "simulated engine: microseconds per decoding sequence in a step", 0, 1e9},
    {"sim.decode_us_per_ctx_token", TD_OPT_DOUBLE, O(sim_ctx_us), "0.05",
     "simulated engine: microseconds per cached token a decoding sequence attends to", 0, 1e9},
    {"heartbeat_s", TD_OPT_DOUBLE, O(heartbeat_s), "0.5", "seconds between heartbeats", 0.01, 60},
    {"drain_timeout_s", TD_OPT_DOUBLE, O(drain_timeout_s), "10",
     "on SIGTERM: seconds to finish running requests before canceling them", 0, 3600},
    {"log.level", TD_OPT_STR, O(log_level), "info", "error|warn|info|debug|trace"},
    {"log.format", TD_OPT_STR, O(log_format), "logfmt", "logfmt|json"},
};
#undef O

/* ---- state ----------------------------------------------------------------------------------- */

typedef struct worker worker_t;

typedef struct wk_router {
    worker_t *w;
    char addr[256];
    td_rpc_client_t *cl;
    td_rpc_conn_t *conn; /* ready connection or NULL */
    uint64_t gen;        /* bumped on every new connection: a sequence belongs to one */
} wk_router_t;

typedef enum wk_state { S_PREFILL, S_WAIT_KV, S_RUN, S_PUSHING } wk_state_t;

typedef struct wk_seq {
    struct wk_seq *prev, *next; /* worker's list, oldest first */
    uint64_t id;                /* this worker's id for it */
    uint64_t req;               /* the router's request id */
    wk_router_t *rt;
    uint64_t rt_gen;
    wk_state_t state;
    bool in_step; /* the compute thread is using it */
    bool recompute; /* preempted: its KV was dropped; PREFILL recomputes toks[0, n_toks - 1)
                       without sampling, then it runs again */
    bool dead;    /* canceled or failed: free once nothing holds its blocks */
    int32_t *toks; /* [n_toks] prompt, then generated tokens */
    int n_toks, cap_toks;
    int n_prompt;
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
} wk_seq_t;

/* One sequence's share of a step, and what the compute thread returns for it. */
typedef struct wk_item {
    wk_seq_t *s;
    int n;        /* tokens fed: toks[kv.n_tokens, kv.n_tokens + n) */
    bool sample;  /* logits wanted: sample the next token */
    td_sample_t out;
} wk_item_t;

struct worker {
    Tandem__Role role;
    const char *role_name;
    const char *env_prefix; /* TANDEM_PREFILL or TANDEM_DECODE: one environment, several daemons */
    wk_cfg_t cfg;
    uv_loop_t *loop;
    td_daemon_t *daemon;
    uint8_t *secret;
    size_t secret_len;
    char model_name[256];
    td_model_t *model;
    td_engine_t *engine; /* NULL with the simulated engine */
    bool sim;
    td_kv_layout_t layout;
    td_kv_pool_t pool;
    td_kvx_t *kvx;
    td_http_server_t *http;
    td_metrics_t *metrics;
    wk_router_t routers[WK_MAX_ROUTERS];
    int n_routers;
    uv_timer_t hb_timer;
    uint64_t hb_seq;
    wk_seq_t *head, *tail; /* every live sequence */
    int n_seqs;
    uint64_t next_id;
    bool draining, stopping;
    double stop_deadline;
    /* the compute thread */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uv_async_t done_async;
    bool job_posted, job_done, quit;
    wk_item_t *items; /* [cap_items] the step in flight */
    int n_items, cap_items;
    float *logits; /* [cap_items][vocab] */
    int job_rc;
    char job_err[256];
    int job_prefill_tokens; /* the step in flight: prompt tokens, decodes, their context tokens */
    int job_decodes;
    int64_t job_ctx;
    double job_s;
    /* metrics */
    td_metric_t *m_running, *m_waiting, *m_kv_usage, *m_prompt, *m_gen, *m_step, *m_xfer_bytes,
        *m_xfer_s, *m_tail_s, *m_recv_bytes, *m_req_ok, *m_req_fail, *m_preempt;
};

static void schedule(worker_t *w);
static void seq_fail(worker_t *w, wk_seq_t *s, int code, const char *msg);

/* ---- sending --------------------------------------------------------------------------------- */

/* Tokens the PREFILL state must have stored before the sequence runs: the prompt, or, after a
 * preemption, everything but the last generated token (the next step's input). */
static int prefill_target(const wk_seq_t *s)
{
    return s->recompute ? s->n_toks - 1 : s->n_prompt;
}

static bool rt_live(const wk_seq_t *s)
{
    return s->rt && s->rt->conn && s->rt->gen == s->rt_gen;
}

static void send_frame(wk_seq_t *s, const Tandem__Frame *f)
{
    if (!rt_live(s))
        return;
    int rc = td_rpc_send(s->rt->conn, f);
    if (rc)
        TD_LOG_W("send to router %s failed: %s", s->rt->addr, td_strerror(rc));
}

static void send_error(wk_router_t *rt, uint64_t req, int code, const char *msg)
{
    if (!rt->conn)
        return;
    Tandem__Error e = TANDEM__ERROR__INIT;
    e.code = code;
    e.message = (char *)msg;
    e.request_id = req;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_ERROR;
    f.error = &e;
    td_rpc_send(rt->conn, &f);
}

static void fill_load(worker_t *w, Tandem__Load *l)
{
    uint64_t queued = 0;
    uint32_t running = 0, waiting = 0;
    for (wk_seq_t *s = w->head; s; s = s->next) {
        if (s->dead)
            continue;
        if (s->state == S_PREFILL)
            queued += (uint64_t)(prefill_target(s) - s->kv.n_tokens);
        if (s->state == S_RUN)
            running++;
        else
            waiting++;
    }
    l->queued_prefill_tokens = queued;
    l->running_sequences = running;
    l->waiting_sequences = waiting;
    l->free_blocks = (uint32_t)w->pool.n_free;
    l->total_blocks = (uint32_t)w->pool.n_blocks;
    l->draining = w->draining;
    td_metric_set(w->m_running, running);
    td_metric_set(w->m_waiting, waiting);
    td_metric_set(w->m_kv_usage, 1.0 - (double)w->pool.n_free / w->pool.n_blocks);
}

static void send_heartbeats(worker_t *w)
{
    Tandem__Load l = TANDEM__LOAD__INIT;
    fill_load(w, &l);
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.seq = ++w->hb_seq;
    hb.load = &l;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    for (int i = 0; i < w->n_routers; i++)
        if (w->routers[i].conn)
            td_rpc_send(w->routers[i].conn, &f);
}

/* TokenChunk for `n` new tokens of s (the last n of s->toks), with their samples when asked. */
static void send_tokens(worker_t *w, wk_seq_t *s, int n, const td_sample_t *const *samples,
                        td_finish_t fin, const char *err)
{
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    Tandem__TokenLogprob lp[4], *lpp[4];
    int32_t top_ids[4][TD_SAMPLER_MAX_LOGPROBS];
    float top_lp[4][TD_SAMPLER_MAX_LOGPROBS];
    TD_ASSERT(n <= 4);
    c.request_id = s->req;
    c.n_tokens = (size_t)n;
    c.tokens = s->toks + s->n_toks - n;
    if (s->logprobs >= 0 && samples) {
        for (int i = 0; i < n; i++) {
            tandem__token_logprob__init(&lp[i]);
            lp[i].logprob = samples[i]->logprob;
            for (int k = 0; k < samples[i]->n_top; k++) {
                top_ids[i][k] = samples[i]->top[k].id;
                top_lp[i][k] = samples[i]->top[k].logprob;
            }
            lp[i].n_top_ids = lp[i].n_top_logprobs = (size_t)samples[i]->n_top;
            lp[i].top_ids = top_ids[i];
            lp[i].top_logprobs = top_lp[i];
            lpp[i] = &lp[i];
        }
        c.n_logprobs = (size_t)n;
        c.logprobs = lpp;
    }
    if (fin != TD_FINISH_NONE || err) {
        c.finish = err ? TANDEM__FINISH__FINISH_ABORT
                       : fin == TD_FINISH_STOP ? TANDEM__FINISH__FINISH_STOP
                                               : TANDEM__FINISH__FINISH_LENGTH;
        c.prompt_tokens = (uint32_t)s->n_prompt;
        c.completion_tokens = (uint32_t)(s->n_toks - s->n_prompt);
        c.error = (char *)(err ? err : "");
    }
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_TOKEN_CHUNK;
    f.token_chunk = &c;
    send_frame(s, &f);
    td_metric_add(w->m_gen, n);
}

/* ---- sequences ------------------------------------------------------------------------------- */

static wk_seq_t *seq_find(worker_t *w, uint64_t id)
{
    for (wk_seq_t *s = w->head; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static wk_seq_t *seq_find_req(worker_t *w, wk_router_t *rt, uint64_t req)
{
    for (wk_seq_t *s = w->head; s; s = s->next)
        if (s->rt == rt && s->rt_gen == rt->gen && s->req == req && !s->dead)
            return s;
    return NULL;
}

static int seq_push_token(wk_seq_t *s, int32_t t)
{
    if (s->n_toks == s->cap_toks) {
        int cap = s->cap_toks * 2;
        int32_t *p = td_reallocarray(s->toks, (size_t)cap, sizeof(int32_t));
        if (!p)
            return td_err_set(TD_ENOMEM, "out of memory");
        s->toks = p;
        s->cap_toks = cap;
    }
    s->toks[s->n_toks++] = t;
    return 0;
}

/* Free s unless the compute thread or the data plane still holds its blocks. */
static void seq_maybe_free(worker_t *w, wk_seq_t *s)
{
    if (s->in_step || s->pushes_out > 0)
        return;
    if (s->state == S_WAIT_KV && !(s->kv_total >= 0 && s->kv_recv >= s->kv_total) &&
        td_now_s() < s->kv_deadline)
        return; /* a prefill worker may still write into these blocks */
    if (s->prev)
        s->prev->next = s->next;
    else
        w->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        w->tail = s->prev;
    w->n_seqs--;
    td_kv_seq_release(&w->pool, &s->kv);
    td_sampler_free(&s->smp);
    if (s->note)
        tandem__kv_note__free_unpacked(s->note, NULL);
    free(s->dst);
    free(s->toks);
    free(s);
}

static void seq_kill(worker_t *w, wk_seq_t *s)
{
    s->dead = true;
    seq_maybe_free(w, s);
}

/* Fail s: tell the router (decode: a last TokenChunk; prefill: PrefillDone) and free it. */
static void seq_fail(worker_t *w, wk_seq_t *s, int code, const char *msg)
{
    if (s->dead)
        return;
    TD_LOG_W("request %llu failed: %s", (unsigned long long)s->req, msg);
    td_metric_add(w->m_req_fail, 1);
    if (w->role == TANDEM__ROLE__ROLE_DECODE) {
        send_error(s->rt, s->req, code, msg);
    } else {
        Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
        d.request_id = s->req;
        d.status = code;
        d.message = (char *)msg;
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
        f.prefill_done = &d;
        send_frame(s, &f);
    }
    seq_kill(w, s);
}

static wk_seq_t *seq_new(worker_t *w, wk_router_t *rt, uint64_t req, const int32_t *toks,
                         size_t n, const Tandem__Sampling *sp, int *code)
{
    const td_model_cfg_t *c = &w->model->cfg;
    *code = TD_EINVAL;
    if (n == 0) {
        td_err_set(TD_EINVAL, "empty prompt");
        return NULL;
    }
    if ((int64_t)n + 1 > c->max_ctx) {
        td_err_set(TD_EINVAL, "prompt of %zu tokens leaves no room in the context of %d", n,
                   c->max_ctx);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= c->vocab_size) {
            td_err_set(TD_EINVAL, "token %zu: id %d outside the vocabulary [0, %d)", i, toks[i],
                       c->vocab_size);
            return NULL;
        }
    if (w->draining || w->stopping) {
        *code = TD_EBUSY;
        td_err_set(TD_EBUSY, "worker %s is draining", w->cfg.id);
        return NULL;
    }
    if (w->n_seqs >= w->cfg.max_running) {
        *code = TD_ENOSPC;
        td_err_set(TD_ENOSPC, "worker %s holds %d sequences (engine.max_running)", w->cfg.id,
                   w->n_seqs);
        return NULL;
    }
    td_sampling_t p;
    td_sampling_defaults(&p);
    if (sp) {
        p.temperature = sp->temperature;
        p.top_k = sp->top_k;
        p.top_p = sp->top_p == 0 ? 1.0f : sp->top_p;
        p.min_p = sp->min_p;
        p.seed = sp->seed;
        p.max_tokens = sp->max_tokens;
        p.ignore_eos = sp->ignore_eos;
        p.logprobs = sp->logprobs > 0 ? sp->logprobs : 0;
        if (sp->n_stop_ids > TD_SAMPLER_MAX_STOP) {
            td_err_set(TD_EINVAL, "at most %d stop token ids", TD_SAMPLER_MAX_STOP);
            return NULL;
        }
        for (size_t i = 0; i < sp->n_stop_ids; i++)
            p.stop_ids[i] = sp->stop_ids[i];
        p.n_stop = (int)sp->n_stop_ids;
    }
    int room = c->max_ctx - (int)n;
    if (p.max_tokens <= 0 || p.max_tokens > room)
        p.max_tokens = room;
    p.eos_id = c->eos_id;
    wk_seq_t *s = td_calloc(1, sizeof(*s));
    if (!s) {
        *code = td_err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    s->cap_toks = (int)n + 16;
    s->toks = td_calloc((size_t)s->cap_toks, sizeof(int32_t));
    int rc = s->toks ? td_sampler_init(&s->smp, &p, c->vocab_size)
                     : td_err_set(TD_ENOMEM, "out of memory");
    if (rc) {
        *code = rc;
        free(s->toks);
        free(s);
        return NULL;
    }
    memcpy(s->toks, toks, n * sizeof(int32_t));
    s->n_toks = s->n_prompt = (int)n;
    s->logprobs = sp && sp->logprobs >= 0 ? sp->logprobs : -1;
    s->id = ++w->next_id;
    s->req = req;
    s->rt = rt;
    s->rt_gen = rt->gen;
    s->kv_total = -1;
    s->t_start = td_now_s();
    td_kv_seq_init(&s->kv);
    s->prev = w->tail;
    if (w->tail)
        w->tail->next = s;
    else
        w->head = s;
    w->tail = s;
    w->n_seqs++;
    td_metric_add(w->m_prompt, (double)n);
    return s;
}

/* ---- the compute thread ---------------------------------------------------------------------- */

/* The simulated engine: no model math. The step takes the latency model's time, the sequences
 * advance as a real step would advance them, and each sampled token is a hash of the request's
 * seed and position (never EOS, so requests run to max_tokens): deterministic, and cheap enough
 * that one machine can host dozens of simulated workers. */
static void sim_step(worker_t *w, td_batch_seq_t *bs, int n)
{
    const wk_cfg_t *c = &w->cfg;
    double us = c->sim_step_us;
    for (int i = 0; i < n; i++) {
        if (bs[i].n_tokens > 1 || w->items[i].s->state == S_PREFILL)
            us += c->sim_prefill_us * bs[i].n_tokens;
        else
            us += c->sim_decode_us + c->sim_ctx_us * bs[i].kv->n_tokens;
    }
    struct timespec ts = {(time_t)(us / 1e6), (long)(fmod(us, 1e6) * 1e3)};
    nanosleep(&ts, NULL);
    int V = w->model->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        wk_item_t *it = &w->items[i];
        bs[i].kv->n_tokens += bs[i].n_tokens;
        if (!it->sample)
            continue;
        uint64_t x = it->s->smp.p.seed ^ ((uint64_t)it->s->n_toks * 0x9e3779b97f4a7c15ull);
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        int32_t tok = (int32_t)(x % (uint64_t)V);
        if (tok == w->model->cfg.eos_id)
            tok = (tok + 1) % V;
        memset(&it->out, 0, sizeof(it->out));
        it->out.token = tok;
        it->out.logprob = -1.0f;
        it->out.finish = td_sampler_accept(&it->s->smp, tok);
    }
}

static void *compute_main(void *arg)
{
    worker_t *w = arg;
    int V = w->model->cfg.vocab_size;
    td_batch_seq_t *bs = NULL;
    int cap = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job_posted && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit)
            break;
        w->job_posted = false;
        int n = w->n_items;
        pthread_mutex_unlock(&w->mu);

        double t0 = td_now_s();
        int rc = 0;
        if (n > cap) {
            free(bs);
            cap = w->cap_items;
            bs = td_calloc((size_t)cap, sizeof(*bs));
            if (!bs) {
                cap = 0;
                rc = td_err_set(TD_ENOMEM, "out of memory");
            }
        }
        for (int i = 0; i < n && !rc; i++) {
            wk_item_t *it = &w->items[i];
            bs[i].kv = &it->s->kv;
            bs[i].tokens = it->s->toks + it->s->kv.n_tokens;
            bs[i].n_tokens = it->n;
            bs[i].logits = it->sample ? w->logits + (size_t)i * V : NULL;
        }
        if (!rc && w->sim) {
            sim_step(w, bs, n);
        } else if (!rc) {
            rc = td_engine_step(w->engine, &w->pool, bs, n);
            for (int i = 0; i < n && !rc; i++)
                if (w->items[i].sample)
                    td_sampler_sample(&w->items[i].s->smp, bs[i].logits, &w->items[i].out);
        }

        pthread_mutex_lock(&w->mu);
        w->job_rc = rc;
        if (rc)
            snprintf(w->job_err, sizeof(w->job_err), "%s", td_err_msg());
        w->job_s = td_now_s() - t0;
        w->job_done = true;
        uv_async_send(&w->done_async);
    }
    pthread_mutex_unlock(&w->mu);
    free(bs);
    return NULL;
}

static int ensure_items(worker_t *w, int n)
{
    if (n <= w->cap_items)
        return 0;
    int cap = TD_MAX(n, w->cap_items * 2);
    wk_item_t *it = td_reallocarray(w->items, (size_t)cap, sizeof(*it));
    if (!it)
        return TD_ENOMEM;
    w->items = it;
    float *lg = td_reallocarray(w->logits, (size_t)cap * w->model->cfg.vocab_size, sizeof(float));
    if (!lg)
        return TD_ENOMEM;
    w->logits = lg;
    w->cap_items = cap;
    return 0;
}

static bool job_busy(worker_t *w)
{
    return w->n_items > 0;
}

/* Build the next step from every running decode (one token each) and prefill chunks in arrival
 * order up to the token budget, reserve their blocks, hand it to the compute thread. */
static void schedule(worker_t *w)
{
    if (job_busy(w))
        return;
    int budget = (int)w->cfg.max_batch_tokens, n = 0;
    if (ensure_items(w, w->n_seqs) != 0 || w->n_seqs == 0)
        return;
    wk_seq_t *next;
    for (wk_seq_t *s = w->head; s; s = next) {
        next = s->next;
        if (s->dead || s->state != S_RUN || budget < 1)
            continue;
        if (td_kv_seq_reserve(&w->pool, &s->kv, s->kv.n_tokens + 1) != 0) {
            /* no block for its next token: preempt it (vLLM's recompute mode). Its blocks go back
             * to the pool now; it keeps its place in line and recomputes its KV, bit for bit the
             * same (the engine does not depend on how a prompt is chunked or batched), when
             * there is room again. */
            td_kv_seq_release(&w->pool, &s->kv);
            td_kv_seq_init(&s->kv);
            s->recompute = true;
            s->state = S_PREFILL;
            td_metric_add(w->m_preempt, 1);
            TD_LOG_D("request %llu preempted: the KV cache is full", (unsigned long long)s->req);
            continue;
        }
        w->items[n++] = (wk_item_t){.s = s, .n = 1, .sample = true};
        budget--;
    }
    bool blocked = false;
    for (wk_seq_t *s = w->head; s && !blocked; s = next) {
        next = s->next;
        if (s->dead || s->state != S_PREFILL || budget < 1)
            continue;
        int left = prefill_target(s) - s->kv.n_tokens;
        int k = (int)TD_MIN((int64_t)TD_MIN(left, budget), w->cfg.prefill_chunk);
        if (td_kv_seq_reserve(&w->pool, &s->kv, s->kv.n_tokens + k) != 0) {
            /* no room: wait for decodes to finish, unless nothing can free any */
            if (n == 0 && s == w->head)
                seq_fail(w, s, TD_ENOSPC, "the prompt does not fit in the KV cache");
            blocked = true;
            continue;
        }
        w->items[n++] = (wk_item_t){.s = s, .n = k, .sample = k == left && !s->recompute};
        budget -= k;
    }
    if (n == 0)
        return;
    w->job_prefill_tokens = w->job_decodes = 0;
    w->job_ctx = 0;
    for (int i = 0; i < n; i++) {
        wk_item_t *it = &w->items[i];
        it->s->in_step = true;
        if (it->s->state == S_RUN) {
            w->job_decodes++;
            w->job_ctx += it->s->kv.n_tokens;
        } else {
            w->job_prefill_tokens += it->n;
        }
    }
    pthread_mutex_lock(&w->mu);
    w->n_items = n;
    w->job_posted = true;
    w->job_done = false;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- prefill worker: pushing KV ------------------------------------------------------------- */

typedef struct push_ctx {
    worker_t *w;
    uint64_t seq_id;
    uint32_t n;
} push_ctx_t;

static void prefill_done(worker_t *w, wk_seq_t *s)
{
    Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
    d.request_id = s->req;
    d.status = s->push_status;
    d.message = (char *)(s->push_status ? td_strerror(s->push_status) : "");
    d.kv_bytes = s->push_bytes;
    d.kv_seconds = td_now_s() - s->t_push0;
    d.compute_seconds = s->t_push0 - s->t_start;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
    f.prefill_done = &d;
    send_frame(s, &f);
    if (s->push_status)
        td_metric_add(w->m_req_fail, 1);
    else
        td_metric_add(w->m_req_ok, 1);
    td_metric_observe(w->m_xfer_s, d.kv_seconds);
    if (!s->push_status)
        td_metric_observe(w->m_tail_s, td_now_s() - s->t_final);
    seq_kill(w, s);
}

static void on_push_done(int status, void *arg)
{
    push_ctx_t *pc = arg;
    worker_t *w = pc->w;
    wk_seq_t *s = seq_find(w, pc->seq_id);
    if (s) {
        s->pushes_out--;
        if (status && !s->push_status)
            s->push_status = status;
        if (!status) {
            s->push_bytes += (uint64_t)pc->n * w->layout.block_bytes;
            td_metric_add(w->m_xfer_bytes, (double)pc->n * w->layout.block_bytes);
        }
        if (s->dead)
            seq_maybe_free(w, s);
        else if (s->state == S_PUSHING && s->pushes_out == 0)
            prefill_done(w, s);
    }
    free(pc);
}

/* Push our blocks [s->pushed, upto) to the decode worker, with a note. */
static int push_blocks(worker_t *w, wk_seq_t *s, int upto, const Tandem__KvNote *note)
{
    int n = upto - s->pushed;
    if (n <= 0)
        return 0;
    uint8_t nb[TD_KVX_NOTE_MAX];
    size_t nl = tandem__kv_note__get_packed_size(note);
    if (nl > sizeof(nb))
        return td_err_set(TD_EOVERFLOW, "KV note of %zu bytes", nl);
    tandem__kv_note__pack(note, nb);
    uint32_t *src = td_calloc((size_t)n, sizeof(uint32_t));
    push_ctx_t *pc = td_calloc(1, sizeof(*pc));
    if (!pc || !src) {
        free(pc);
        free(src);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++)
        src[i] = (uint32_t)s->kv.blocks[s->pushed + i];
    *pc = (push_ctx_t){w, s->id, (uint32_t)n};
    if (s->pushes_out == 0 && s->pushed == 0)
        s->t_push0 = td_now_s();
    int rc = td_kvx_push(s->peer, src, s->dst + s->pushed, (uint32_t)n, nb, (uint32_t)nl,
                         w->cfg.kv_checksum ? TD_KVX_F_CSUM : 0, on_push_done, pc);
    free(src);
    if (rc) {
        free(pc);
        return rc;
    }
    s->pushed = upto;
    s->sent += n;
    s->pushes_out++;
    return 0;
}

/* After a chunk: push the blocks that are full now (they will not change again). */
static void prefill_progress(worker_t *w, wk_seq_t *s)
{
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    note.request_id = s->dst_req;
    int full = s->kv.n_tokens / w->layout.block_size;
    int rc = push_blocks(w, s, full, &note);
    if (rc)
        seq_fail(w, s, rc, td_err_msg());
}

/* After the last chunk: push the rest with the first token. The last push always exists (it
 * re-sends the final block when every block already went), so the note always arrives, and it
 * announces how many blocks the decode worker must have received before it may use them. */
static void prefill_finish(worker_t *w, wk_seq_t *s, const td_sample_t *first)
{
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    int32_t ids[TD_SAMPLER_MAX_LOGPROBS];
    float lps[TD_SAMPLER_MAX_LOGPROBS];
    note.request_id = s->dst_req;
    note.last = true;
    note.first_token = first->token;
    note.first_logprob = first->logprob;
    for (int k = 0; k < first->n_top; k++) {
        ids[k] = first->top[k].id;
        lps[k] = first->top[k].logprob;
    }
    note.n_top_ids = note.n_top_logprobs = (size_t)first->n_top;
    note.top_ids = ids;
    note.top_logprobs = lps;
    if (s->pushed == s->n_dst)
        s->pushed--;
    note.total_blocks = (uint32_t)(s->sent + (s->n_dst - s->pushed));
    s->state = S_PUSHING;
    s->t_final = td_now_s();
    int rc = push_blocks(w, s, s->n_dst, &note);
    if (rc)
        seq_fail(w, s, rc, td_err_msg());
}

/* A canceled prefill tells the decode worker that nothing more comes: one last push (of any
 * block: the decode worker discards it) whose note is marked aborted. */
static void prefill_abort(worker_t *w, wk_seq_t *s)
{
    if (!s->peer || s->n_dst == 0 || s->state == S_PUSHING)
        return;
    Tandem__KvNote note = TANDEM__KV_NOTE__INIT;
    note.request_id = s->dst_req;
    note.last = note.aborted = true;
    note.total_blocks = (uint32_t)s->sent + 1;
    uint8_t nb[64];
    size_t nl = tandem__kv_note__pack(&note, nb);
    uint32_t src = s->kv.n_blocks > 0 ? (uint32_t)s->kv.blocks[0] : 0, dst = s->dst[0];
    push_ctx_t *pc = td_calloc(1, sizeof(*pc));
    if (!pc)
        return;
    *pc = (push_ctx_t){w, s->id, 0};
    if (td_kvx_push(s->peer, &src, &dst, 1, nb, (uint32_t)nl, 0, on_push_done, pc) == 0)
        s->pushes_out++;
    else
        free(pc);
}

/* ---- decode worker: KV arriving ------------------------------------------------------------- */

static void emit_first(worker_t *w, wk_seq_t *s, const td_sample_t *smp, td_finish_t fin)
{
    const td_sample_t *one[1] = {smp};
    if (seq_push_token(s, smp->token)) {
        seq_fail(w, s, TD_ENOMEM, "out of memory");
        return;
    }
    send_tokens(w, s, 1, one, fin, NULL);
    if (fin != TD_FINISH_NONE) {
        td_metric_add(w->m_req_ok, 1);
        seq_kill(w, s);
    } else {
        s->state = S_RUN;
    }
}

/* Every block is in: join the running batch with the prefill worker's first token. */
static void kv_complete(worker_t *w, wk_seq_t *s)
{
    if (s->dead || s->kv_aborted) {
        s->dead = true;
        seq_maybe_free(w, s);
        return;
    }
    Tandem__KvNote *nt = s->note;
    if (nt->first_token < 0 || nt->first_token >= w->model->cfg.vocab_size) {
        seq_fail(w, s, TD_EPROTO, "the prefill worker sent an invalid first token");
        return;
    }
    s->kv.n_tokens = s->n_prompt;
    td_sample_t smp = {.token = nt->first_token, .logprob = nt->first_logprob};
    smp.n_top = (int)TD_MIN(nt->n_top_ids, (size_t)TD_SAMPLER_MAX_LOGPROBS);
    smp.n_top = (int)TD_MIN((size_t)smp.n_top, nt->n_top_logprobs);
    for (int k = 0; k < smp.n_top; k++)
        smp.top[k] = (td_logprob_t){nt->top_ids[k], nt->top_logprobs[k]};
    td_finish_t fin = td_sampler_accept(&s->smp, smp.token);
    if (fin == TD_FINISH_NONE && s->n_toks + 1 >= w->model->cfg.max_ctx)
        fin = TD_FINISH_LENGTH;
    emit_first(w, s, &smp, fin);
    schedule(w);
}

static void on_kv_recv(td_kvx_t *kvx, td_kvx_peer_t *peer, const td_kvx_recv_t *r, void *arg)
{
    (void)kvx;
    (void)peer;
    worker_t *w = arg;
    if (r->note_len == 0) {
        if (r->status)
            TD_LOG_W("a KV transfer failed before naming its request: %s",
                     td_strerror(r->status));
        return;
    }
    Tandem__KvNote *nt = tandem__kv_note__unpack(NULL, r->note_len, r->note);
    if (!nt) {
        TD_LOG_W("a KV push carried a malformed note (%u bytes)", r->note_len);
        return;
    }
    wk_seq_t *s = seq_find(w, nt->request_id);
    if (!s || s->state != S_WAIT_KV) {
        tandem__kv_note__free_unpacked(nt, NULL);
        return; /* canceled and freed already (its deadline passed) */
    }
    td_metric_add(w->m_recv_bytes, (double)r->n_blocks * w->layout.block_bytes);
    s->kv_recv += (int)r->n_blocks;
    if (r->status) {
        char msg[160];
        snprintf(msg, sizeof(msg), "KV transfer from the prefill worker failed: %s",
                 td_strerror(r->status));
        seq_fail(w, s, r->status, msg);
    }
    if (nt->last) {
        s->kv_total = (int)nt->total_blocks;
        s->kv_aborted = nt->aborted;
        if (s->note)
            tandem__kv_note__free_unpacked(s->note, NULL);
        s->note = nt;
        nt = NULL;
    }
    if (nt)
        tandem__kv_note__free_unpacked(nt, NULL);
    if (s->kv_total >= 0 && s->kv_recv >= s->kv_total)
        kv_complete(w, s);
    else if (s->dead)
        seq_maybe_free(w, s);
}

/* ---- step results ---------------------------------------------------------------------------- */

static void on_step_done(uv_async_t *a)
{
    worker_t *w = a->data;
    pthread_mutex_lock(&w->mu);
    bool done = w->job_done;
    int rc = w->job_rc;
    double dt = w->job_s;
    pthread_mutex_unlock(&w->mu);
    if (!done || !job_busy(w))
        return;
    int n = w->n_items;
    td_metric_observe(w->m_step, dt);
    /* one line per step at debug level: what bench/calibrate_sim.py fits the sim.* model to */
    td_logf(TD_LOG_DEBUG, NULL, "step prefill_tokens=%d decodes=%d ctx_tokens=%lld seconds=%.6f",
            w->job_prefill_tokens, w->job_decodes, (long long)w->job_ctx, dt);
    for (int i = 0; i < n; i++) {
        wk_item_t *it = &w->items[i];
        wk_seq_t *s = it->s;
        s->in_step = false;
        if (rc) {
            seq_fail(w, s, rc, w->job_err);
            continue;
        }
        if (s->dead) {
            if (w->role == TANDEM__ROLE__ROLE_PREFILL)
                prefill_abort(w, s);
            seq_maybe_free(w, s);
            continue;
        }
        if (s->state == S_PREFILL && !it->sample) {
            if (s->recompute && s->kv.n_tokens == prefill_target(s)) {
                s->recompute = false; /* its KV is back: the pending token is the next input */
                s->state = S_RUN;
            } else if (w->role == TANDEM__ROLE__ROLE_PREFILL) {
                prefill_progress(w, s);
            }
            continue;
        }
        if (s->state == S_PREFILL && w->role == TANDEM__ROLE__ROLE_PREFILL) {
            prefill_finish(w, s, &it->out);
            continue;
        }
        td_finish_t fin = it->out.finish;
        if (fin == TD_FINISH_NONE && s->n_toks + 1 >= w->model->cfg.max_ctx)
            fin = TD_FINISH_LENGTH;
        if (s->state == S_PREFILL) { /* local prefill: the first token */
            emit_first(w, s, &it->out, fin);
            continue;
        }
        const td_sample_t *one[1] = {&it->out};
        if (seq_push_token(s, it->out.token)) {
            seq_fail(w, s, TD_ENOMEM, "out of memory");
            continue;
        }
        send_tokens(w, s, 1, one, fin, NULL);
        if (fin != TD_FINISH_NONE) {
            td_metric_add(w->m_req_ok, 1);
            seq_kill(w, s);
        }
    }
    w->n_items = 0;
    schedule(w);
}

/* ---- control plane --------------------------------------------------------------------------- */

static void on_decode_task(worker_t *w, wk_router_t *rt, const Tandem__DecodeTask *t)
{
    int code;
    if (w->role != TANDEM__ROLE__ROLE_DECODE) {
        send_error(rt, t->request_id, TD_EINVAL, "a prefill worker takes no DecodeTask");
        return;
    }
    wk_seq_t *s = seq_new(w, rt, t->request_id, t->tokens, t->n_tokens, t->sampling, &code);
    if (!s) {
        send_error(rt, t->request_id, code, td_err_msg());
        return;
    }
    Tandem__DecodeAccept acc = TANDEM__DECODE_ACCEPT__INIT;
    acc.request_id = t->request_id;
    acc.worker_request_id = s->id;
    uint32_t *ids = NULL;
    if (t->local_prefill) {
        s->state = S_PREFILL;
    } else {
        int rc = td_kv_seq_reserve(&w->pool, &s->kv, s->n_prompt);
        ids = td_calloc((size_t)TD_MAX(s->kv.n_blocks, 1), sizeof(uint32_t));
        if (rc || !ids) {
            free(ids);
            send_error(rt, t->request_id, rc ? rc : TD_ENOMEM,
                       rc ? "no free KV blocks for the prompt" : "out of memory");
            s->dead = true;
            s->state = S_PREFILL; /* nothing will arrive: free at once */
            seq_maybe_free(w, s);
            return;
        }
        for (int i = 0; i < s->kv.n_blocks; i++)
            ids[i] = (uint32_t)s->kv.blocks[i];
        acc.n_blocks = (size_t)s->kv.n_blocks;
        acc.blocks = ids;
        s->state = S_WAIT_KV;
        s->kv_deadline = td_now_s() + w->cfg.kv_wait_s;
    }
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_DECODE_ACCEPT;
    f.decode_accept = &acc;
    send_frame(s, &f);
    free(ids);
    schedule(w);
}

static void on_prefill_task(worker_t *w, wk_router_t *rt, const Tandem__PrefillTask *t)
{
    int code;
    if (w->role != TANDEM__ROLE__ROLE_PREFILL) {
        send_error(rt, t->request_id, TD_EINVAL, "a decode worker takes no PrefillTask");
        return;
    }
    wk_seq_t *s = seq_new(w, rt, t->request_id, t->tokens, t->n_tokens, t->sampling, &code);
    if (!s) {
        Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
        d.request_id = t->request_id;
        d.status = code;
        d.message = (char *)td_err_msg();
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
        f.prefill_done = &d;
        if (rt->conn)
            td_rpc_send(rt->conn, &f);
        return;
    }
    s->state = S_PREFILL;
    int need = (s->n_prompt + w->layout.block_size - 1) / w->layout.block_size;
    if ((int)t->n_dst_blocks != need) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%zu destination blocks for a prompt of %d blocks",
                 t->n_dst_blocks, need);
        seq_fail(w, s, TD_EINVAL, msg);
        return;
    }
    s->dst = td_calloc((size_t)need, sizeof(uint32_t));
    if (!s->dst) {
        seq_fail(w, s, TD_ENOMEM, "out of memory");
        return;
    }
    memcpy(s->dst, t->dst_blocks, (size_t)need * sizeof(uint32_t));
    s->n_dst = need;
    s->dst_req = t->decode_request_id;
    int rc = td_kvx_connect(w->kvx, t->decode_blob.data, t->decode_blob.len, &s->peer);
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof(msg), "cannot reach decode worker %s: %s", t->decode_worker,
                 td_err_msg());
        seq_fail(w, s, rc, msg);
        return;
    }
    schedule(w);
}

static void on_cancel(worker_t *w, wk_router_t *rt, uint64_t req)
{
    wk_seq_t *s = seq_find_req(w, rt, req);
    if (!s)
        return;
    TD_LOG_D("request %llu canceled", (unsigned long long)req);
    if (w->role == TANDEM__ROLE__ROLE_PREFILL && !s->in_step)
        prefill_abort(w, s);
    seq_kill(w, s);
}

static void on_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    wk_router_t *rt = ud;
    worker_t *w = rt->w;
    (void)c;
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_DECODE_TASK:
        on_decode_task(w, rt, f->decode_task);
        break;
    case TANDEM__FRAME__BODY_PREFILL_TASK:
        on_prefill_task(w, rt, f->prefill_task);
        break;
    case TANDEM__FRAME__BODY_CANCEL:
        on_cancel(w, rt, f->cancel->request_id);
        break;
    case TANDEM__FRAME__BODY_DRAIN:
        w->draining = f->drain->on || w->stopping;
        TD_LOG_I("draining %s by router %s", w->draining ? "on" : "off", rt->addr);
        send_heartbeats(w);
        break;
    case TANDEM__FRAME__BODY_ERROR:
        TD_LOG_W("router %s: %s", rt->addr, f->error->message);
        break;
    default:
        TD_LOG_W("router %s sent an unexpected frame (type %d)", rt->addr, (int)f->body_case);
    }
}

static void on_ready(td_rpc_conn_t *c, void *ud)
{
    wk_router_t *rt = ud;
    worker_t *w = rt->w;
    rt->conn = c;
    rt->gen++;
    size_t blob_len;
    const void *blob = td_kvx_blob(w->kvx, &blob_len);
    Tandem__KvLayout lay = TANDEM__KV_LAYOUT__INIT;
    lay.fingerprint.data = w->layout.fingerprint;
    lay.fingerprint.len = 16;
    lay.block_tokens = (uint32_t)w->layout.block_size;
    lay.block_bytes = w->layout.block_bytes;
    lay.num_layers = (uint32_t)w->layout.n_layers;
    lay.bytes_per_layer = w->layout.layer_bytes;
    lay.dtype = "f32";
    Tandem__Hello h = TANDEM__HELLO__INIT;
    h.role = w->role;
    h.worker_id = w->cfg.id;
    h.model = w->model_name;
    h.layout = &lay;
    h.ucx_address.data = (uint8_t *)blob;
    h.ucx_address.len = blob_len;
    h.total_blocks = (uint32_t)w->pool.n_blocks;
    h.max_running = (uint32_t)w->cfg.max_running;
    h.version = WK_VERSION;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HELLO;
    f.hello = &h;
    td_rpc_send(c, &f);
    send_heartbeats(w);
    TD_LOG_I("registered with router %s", rt->addr);
}

static void on_close(td_rpc_conn_t *c, int status, void *ud)
{
    wk_router_t *rt = ud;
    worker_t *w = rt->w;
    if (rt->conn != c)
        return; /* a connection attempt that never became ready */
    rt->conn = NULL;
    TD_LOG_W("lost router %s (%s): canceling its requests", rt->addr,
             status ? td_rpc_conn_reason(c) : "closed");
    wk_seq_t *next;
    for (wk_seq_t *s = w->head; s; s = next) {
        next = s->next;
        if (s->rt == rt && s->rt_gen == rt->gen && !s->dead) {
            if (w->role == TANDEM__ROLE__ROLE_PREFILL && !s->in_step)
                prefill_abort(w, s);
            seq_kill(w, s);
        }
    }
}

/* ---- timers, HTTP, shutdown ------------------------------------------------------------------ */

static void finish_stop(worker_t *w);

static void on_hb_timer(uv_timer_t *t)
{
    worker_t *w = t->data;
    send_heartbeats(w);
    /* zombies whose prefill worker never finished */
    double now = td_now_s();
    wk_seq_t *next;
    for (wk_seq_t *s = w->head; s; s = next) {
        next = s->next;
        if (s->state == S_WAIT_KV && now >= s->kv_deadline) {
            if (!s->dead)
                seq_fail(w, s, TD_ETIMEDOUT, "the prompt's KV did not arrive in time");
            else
                seq_maybe_free(w, s);
        }
    }
    if (w->stopping) {
        if (now >= w->stop_deadline) {
            for (wk_seq_t *s = w->head; s; s = next) {
                next = s->next;
                if (!s->dead)
                    seq_fail(w, s, TD_ECANCELED, "the worker is shutting down");
            }
        }
        bool busy = job_busy(w);
        for (wk_seq_t *s = w->head; s && !busy; s = s->next)
            busy = !s->dead || s->in_step || s->pushes_out > 0;
        if (!busy)
            finish_stop(w);
    }
}

static void http_metrics(td_http_req_t *r, void *ud)
{
    worker_t *w = ud;
    Tandem__Load l = TANDEM__LOAD__INIT;
    fill_load(w, &l); /* refreshes the load gauges */
    td_buf_t b;
    td_buf_init(&b);
    if (td_metrics_render(w->metrics, &b) != 0) {
        td_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
    } else {
        td_http_respond(r, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    }
    td_buf_free(&b);
}

static void http_health(td_http_req_t *r, void *ud)
{
    worker_t *w = ud;
    bool any = false;
    for (int i = 0; i < w->n_routers; i++)
        any |= w->routers[i].conn != NULL;
    char body[256];
    int n = snprintf(body, sizeof(body),
                     "{\"status\":\"%s\",\"role\":\"%s\",\"id\":\"%s\",\"routers_connected\":%s}",
                     w->draining ? "draining" : "ok", w->role_name, w->cfg.id,
                     any ? "true" : "false");
    td_http_respond(r, w->draining ? 503 : 200, "application/json", body, (size_t)n);
}

static bool closed_all;

static void on_kvx_closed(void *arg)
{
    (void)arg;
    closed_all = true;
}

static void finish_stop(worker_t *w)
{
    if (!w->stopping || w->hb_timer.data == NULL)
        return;
    TD_LOG_I("stopped: every request finished or canceled");
    uv_close((uv_handle_t *)&w->hb_timer, NULL);
    w->hb_timer.data = NULL;
    for (int i = 0; i < w->n_routers; i++)
        td_rpc_client_stop(w->routers[i].cl);
    td_http_server_close(w->http);
    uv_close((uv_handle_t *)&w->done_async, NULL);
    td_kvx_close(w->kvx, on_kvx_closed, w);
    td_daemon_close(w->daemon);
}

static void on_stop(td_daemon_t *d, int signum, void *ud)
{
    worker_t *w = ud;
    if (w->stopping) {
        TD_LOG_W("second signal %d: canceling everything now", signum);
        w->stop_deadline = 0;
        return;
    }
    TD_LOG_I("signal %d: draining (at most %.1f s)", signum, w->cfg.drain_timeout_s);
    td_daemon_stopping(d);
    w->stopping = w->draining = true;
    w->stop_deadline = td_now_s() + w->cfg.drain_timeout_s;
    send_heartbeats(w);
}

/* ---- start-up -------------------------------------------------------------------------------- */

static void usage(const worker_t *w, FILE *out)
{
    fprintf(out,
            "usage: tandem-%s --model DIR [--config FILE] [--section.key=value ...]\n\n"
            "The %s worker of a tandem cluster: registers with every router in `routers`,\n"
            "takes %s.\nIt serves /metrics and /health on http.listen.\n\n",
            w->role_name, w->role_name,
            w->role == TANDEM__ROLE__ROLE_PREFILL
                ? "prefill tasks and pushes each prompt's KV into a decode worker's pool"
                : "decode tasks, receives KV from prefill workers (or prefills locally) and\n"
                  "streams tokens back");
    td_config_print_help(out, wk_opts, TD_ARRAY_LEN(wk_opts), w->env_prefix);
}

static int setup_metrics(worker_t *w)
{
    td_buf_t lb, esc;
    td_buf_init(&lb);
    td_buf_init(&esc);
    int rc = td_metrics_escape(w->cfg.id, &esc);
    if (!rc)
        rc = td_buf_printf(&lb, "role=\"%s\",instance=\"%s\"", w->role_name, esc.data);
    if (!rc && !(w->metrics = td_metrics_new("tandem_", lb.data)))
        rc = TD_ENOMEM;
    td_buf_free(&lb);
    td_buf_free(&esc);
    if (rc)
        return td_err_set(TD_ENOMEM, "out of memory");
    td_metrics_t *m = w->metrics;
    w->m_running = td_metrics_gauge(m, "num_requests_running", "Sequences in the decode batch.",
                                    NULL);
    w->m_waiting = td_metrics_gauge(m, "num_requests_waiting",
                                    "Sequences prefilling or waiting for their KV.", NULL);
    w->m_kv_usage = td_metrics_gauge(m, "kv_cache_usage_perc",
                                     "Fraction of KV blocks in use (1 = full).", NULL);
    w->m_prompt = td_metrics_counter(m, "prompt_tokens_total", "Prompt tokens received.", NULL);
    w->m_gen = td_metrics_counter(m, "generation_tokens_total", "Tokens generated.", NULL);
    w->m_step = td_metrics_histogram(m, "engine_step_seconds", "Time of one engine step.", NULL,
                                     td_buckets_tpot, td_buckets_tpot_n);
    w->m_xfer_bytes = td_metrics_counter(m, "kv_transfer_bytes_total",
                                         "KV bytes moved over the data plane.",
                                         "direction=\"out\"");
    w->m_recv_bytes = td_metrics_counter(m, "kv_transfer_bytes_total",
                                         "KV bytes moved over the data plane.",
                                         "direction=\"in\"");
    w->m_xfer_s = td_metrics_histogram(m, "kv_transfer_seconds",
                                       "Time from a prompt's first KV push to its last "
                                       "acknowledgement.",
                                       NULL, td_buckets_tpot, td_buckets_tpot_n);
    w->m_tail_s = td_metrics_histogram(m, "kv_handoff_tail_seconds",
                                       "Time from the end of a prompt's computation to the "
                                       "acknowledgement of its last KV push (the part of the "
                                       "handoff that does not overlap compute).",
                                       NULL, td_buckets_tpot, td_buckets_tpot_n);
    w->m_req_ok = td_metrics_counter(m, "request_success_total", "Requests finished here.",
                                     NULL);
    w->m_req_fail = td_metrics_counter(m, "request_failure_total", "Requests failed here.", NULL);
    w->m_preempt = td_metrics_counter(m, "num_preemptions_total",
                                      "Sequences preempted for lack of KV blocks (recomputed).",
                                      NULL);
    if (!w->m_running || !w->m_waiting || !w->m_kv_usage || !w->m_prompt || !w->m_gen ||
        !w->m_step || !w->m_xfer_bytes || !w->m_recv_bytes || !w->m_xfer_s || !w->m_tail_s ||
        !w->m_req_ok || !w->m_req_fail || !w->m_preempt)
        return td_err_set(TD_ENOMEM, "out of memory");
    return 0;
}

static int start(worker_t *w)
{
    wk_cfg_t *c = &w->cfg;
    int rc;
    if (!c->model || !*c->model)
        return td_err_set(TD_EINVAL, "model: required (a model directory)");
    if ((rc = td_rpc_secret_load(c->secret, c->secret_file, &w->secret, &w->secret_len)))
        return rc;
    const char *base = strrchr(c->model, '/');
    snprintf(w->model_name, sizeof(w->model_name), "%s",
             base && base[1] ? base + 1 : c->model);
    if ((rc = td_model_load(c->model, &w->model)))
        return rc;
    if ((rc = td_kv_layout_init(&w->layout, w->model, (int)c->block_size)))
        return rc;
    if (w->layout.block_bytes % 64)
        return td_err_set(TD_EINVAL,
                          "kv.block_size: %lld tokens make blocks of %zu bytes; the data plane "
                          "needs a multiple of 64",
                          (long long)c->block_size, w->layout.block_bytes);
    uint64_t blocks = c->kv_blocks ? c->kv_blocks : c->kv_memory / w->layout.block_bytes;
    if (blocks < 1 || blocks > INT32_MAX)
        return td_err_set(TD_EINVAL, "kv.memory: %llu bytes hold %llu blocks of %zu bytes",
                          (unsigned long long)c->kv_memory, (unsigned long long)blocks,
                          w->layout.block_bytes);
    td_kvx_layout_t xl = {.block_bytes = w->layout.block_bytes, .n_blocks = (uint32_t)blocks};
    memcpy(xl.fingerprint, w->layout.fingerprint, 16);
    td_kvx_opts_t xo = {.on_recv = on_kv_recv, .arg = w};
    if (!(w->kvx = td_kvx_new(w->loop, &xl, &xo)))
        return td_err_set(TD_EIO, "data plane: %s", td_err_msg());
    if ((rc = td_kv_pool_init_mem(&w->pool, &w->layout, (int)blocks, td_kvx_pool(w->kvx))))
        return rc;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    td_engine_opts_t eo = {.n_threads = c->threads > 0 ? (int)c->threads : (int)TD_MAX(cores, 1)};
    if (td_str_eq(c->engine_kind, "sim")) {
        w->sim = true;
        TD_LOG_W("SIMULATED engine: no model math; step times come from the sim.* options");
    } else if (!td_str_eq(c->engine_kind, "cpu")) {
        return td_err_set(TD_EINVAL, "engine.kind: \"%s\" is not cpu or sim", c->engine_kind);
    } else if ((rc = td_engine_create(w->model, &eo, &w->engine))) {
        return rc;
    }
    if ((rc = setup_metrics(w)))
        return rc;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    uv_async_init(w->loop, &w->done_async, on_step_done);
    w->done_async.data = w;
    if (pthread_create(&w->thread, NULL, compute_main, w) != 0)
        return td_err_set(TD_EINTERNAL, "cannot start the compute thread");
    td_http_opts_t ho = {.max_body = 1 << 16};
    if (!(w->http = td_http_server_new(w->loop, &ho)) ||
        td_http_route(w->http, "/metrics", http_metrics, w) ||
        td_http_route(w->http, "/health", http_health, w))
        return td_err_set(TD_ENOMEM, "out of memory");
    if ((rc = td_http_listen(w->http, c->http_listen)))
        return rc;
    /* routers */
    char *list = td_strdup(c->routers ? c->routers : ""), *save = NULL;
    if (!list)
        return td_err_set(TD_ENOMEM, "out of memory");
    for (char *a = strtok_r(list, ", ", &save); a; a = strtok_r(NULL, ", ", &save)) {
        if (w->n_routers == WK_MAX_ROUTERS) {
            free(list);
            return td_err_set(TD_EINVAL, "routers: at most %d", WK_MAX_ROUTERS);
        }
        wk_router_t *rt = &w->routers[w->n_routers];
        rt->w = w;
        snprintf(rt->addr, sizeof(rt->addr), "%s", a);
        td_rpc_opts_t ro = {.secret = w->secret,
                            .secret_len = w->secret_len,
                            .id = c->id,
                            .cb = {.on_ready = on_ready, .on_frame = on_frame, .on_close = on_close},
                            .ud = rt};
        if ((rc = td_rpc_client_start(w->loop, a, &ro, true, &rt->cl))) {
            rc = td_err_set(rc, "routers: \"%s\": %s", a, td_err_msg());
            free(list);
            return rc;
        }
        w->n_routers++;
    }
    free(list);
    if (w->n_routers == 0)
        return td_err_set(TD_EINVAL, "routers: no router address given");
    uv_timer_init(w->loop, &w->hb_timer);
    w->hb_timer.data = w;
    uint64_t ms = (uint64_t)(c->heartbeat_s * 1000);
    uv_timer_start(&w->hb_timer, on_hb_timer, ms, ms ? ms : 1);
    return 0;
}

int td_worker_main(Tandem__Role role, int argc, char **argv)
{
    worker_t *w = td_calloc(1, sizeof(*w));
    if (!w)
        return 1;
    w->role = role;
    w->role_name = role == TANDEM__ROLE__ROLE_PREFILL ? "prefill" : "decode";
    w->env_prefix = role == TANDEM__ROLE__ROLE_PREFILL ? "TANDEM_PREFILL" : "TANDEM_DECODE";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(w, stdout);
            free(w);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("tandem-%s %s\n", w->role_name, WK_VERSION);
            free(w);
            return 0;
        }
    }
    int rc = td_config_load(wk_opts, TD_ARRAY_LEN(wk_opts), &w->cfg, NULL, w->env_prefix, argc, argv,
                            NULL, 0, NULL);
    td_log_level_t lvl = TD_LOG_INFO;
    td_log_format_t fmt = TD_LOG_LOGFMT;
    if (!rc && (td_log_level_parse(w->cfg.log_level, &lvl) ||
                td_log_format_parse(w->cfg.log_format, &fmt)))
        rc = td_err_set(TD_EINVAL, "log.level / log.format: %s", td_err_msg());
    if (rc) {
        fprintf(stderr, "tandem-%s: %s\n(see --help)\n", w->role_name, td_err_msg());
        td_config_free(wk_opts, TD_ARRAY_LEN(wk_opts), &w->cfg);
        free(w);
        return 2;
    }
    td_log_init(w->role_name, lvl, fmt, 2);
    if (!w->cfg.id || !*w->cfg.id) {
        char host[128] = "localhost", id[256];
        gethostname(host, sizeof(host) - 1);
        snprintf(id, sizeof(id), "%s-%s-%d", w->role_name, host, (int)getpid());
        free(w->cfg.id);
        w->cfg.id = td_strdup(id);
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    w->loop = &loop;
    int status = 1;
    if (!(w->daemon = td_daemon_start(&loop, on_stop, w))) {
        fprintf(stderr, "tandem-%s: out of memory\n", w->role_name);
        goto out;
    }
    if ((rc = start(w))) {
        fprintf(stderr, "tandem-%s: %s\n", w->role_name, td_err_msg());
        goto out;
    }
    /* one parseable line for scripts and tests */
    printf("tandem-%s: id=%s http=127.0.0.1:%d blocks=%d block_bytes=%zu engine=%s\n",
           w->role_name, w->cfg.id, td_http_port(w->http), w->pool.n_blocks,
           w->layout.block_bytes, w->sim ? "SIMULATED" : "cpu");
    fflush(stdout);
    td_daemon_ready(w->daemon, "serving");
    TD_LOG_I("%s worker %s ready: model %s, %d KV blocks of %d tokens", w->role_name, w->cfg.id,
             w->model_name, w->pool.n_blocks, w->layout.block_size);
    uv_run(&loop, UV_RUN_DEFAULT);
    status = closed_all ? 0 : 1;
out:
    if (w->thread) {
        pthread_mutex_lock(&w->mu);
        w->quit = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    if (!closed_all) {
        /* start-up failed: close what exists and let the loop release it */
        for (int i = 0; i < w->n_routers; i++)
            td_rpc_client_stop(w->routers[i].cl);
        if (w->http)
            td_http_server_close(w->http);
        if (w->hb_timer.data)
            uv_close((uv_handle_t *)&w->hb_timer, NULL);
        if (w->done_async.data)
            uv_close((uv_handle_t *)&w->done_async, NULL);
        if (w->kvx)
            td_kvx_close(w->kvx, NULL, NULL);
        if (w->daemon)
            td_daemon_close(w->daemon);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    uv_loop_close(&loop);
    while (w->head) {
        wk_seq_t *s = w->head;
        s->in_step = false;
        s->pushes_out = 0;
        s->state = S_RUN;
        seq_maybe_free(w, s);
    }
    td_kv_pool_free(&w->pool);
    td_engine_free(w->engine);
    td_model_free(w->model);
    td_metrics_free(w->metrics);
    free(w->items);
    free(w->logits);
    free(w->secret);
    td_config_free(wk_opts, TD_ARRAY_LEN(wk_opts), &w->cfg);
    free(w);
    return status;
}
