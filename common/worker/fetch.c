/* fetch.c: cross-worker fetch of cached KV blocks (docs/dataplane.md, Fetch). A prefill worker
 * whose PrefillTask carries a FetchHint (the router found, in the cluster KV index, a worker
 * holding more of the prompt's leading blocks than this one) asks that holder for the blocks it
 * lacks by their block hashes (td_kvx_fetch), into blocks of the sequence's own table, and waits
 * in LOADING beside any disk loads; the holder serves them from its pool's prefix cache or its
 * disk tier and pushes them back with checksums (td_kvx_fetch_answer). Whatever does not arrive
 * verified (the holder died, evicted them, a checksum failed, no answer in kv.fetch_timeout_s)
 * is computed: the cached prefix ends at the first block that failed.
 *
 * Ownership: a fetch (fetch_op_t) holds its own reference on each destination block until the
 * data plane's callback runs, so a fetch given up on at its deadline leaves those blocks to UCX
 * (the sequence goes on with new ones) and they are freed only once UCX lets go of them. A
 * served fetch (serve_t) holds a reference on each source block until its push completes.
 */
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const td_wk_fetch_reasons[6] = {"peer",    "missing", "checksum",
                                            "timeout", "refused", "nospace"};
enum { R_PEER, R_MISSING, R_CHECKSUM, R_TIMEOUT, R_REFUSED, R_NOSPACE };

/* The failure reason of a fetch that ended with `status`. */
static int reason_of(int status)
{
    switch (status) {
    case TD_ENOENT:
        return R_MISSING;
    case TD_ECHECKSUM:
        return R_CHECKSUM;
    case TD_EPROTO:
    case TD_ENOTSUP:
    case TD_EMISMATCH:
    case TD_EPARSE:
    case TD_EINVAL:
    case TD_ERANGE:
        return R_REFUSED;
    default: /* the holder or the path to it failed: reset, unreachable, handshake timeout... */
        return R_PEER;
    }
}

static void count_failure(td_worker_t *w, int reason)
{
    td_metric_add(w->m.fetch_fail[reason], 1);
}

/* ---- the requester ---------------------------------------------------------------------------*/

typedef struct fetch_op {
    td_worker_t *w;
    uint64_t seq_id;
    int from, n;     /* the sequence's kv.blocks[from, from + n) */
    int32_t *blocks; /* [n] those block ids, a reference each held by the op */
    double t0;
    uv_timer_t timer; /* kv.fetch_timeout_s */
    bool abandoned;   /* the deadline passed: the sequence went on without the answer */
    char holder[64];
} fetch_op_t;

static void op_closed(uv_handle_t *h)
{
    fetch_op_t *op = h->data;
    free(op->blocks);
    free(op);
}

/* The sequence of op, which waits for it (a sequence with loads out is never freed). */
static td_wk_seq_t *op_seq(fetch_op_t *op)
{
    td_wk_seq_t *s = td_wk_seq_find(op->w, op->seq_id);
    TD_ASSERT(s && s->loads_out > 0);
    return s;
}

/* The fetch of op ended for its sequence: blocks from `good` on are computed. */
static void op_finish(fetch_op_t *op, int good)
{
    td_wk_seq_t *s = op_seq(op);
    s->load_bad = TD_MIN(s->load_bad, good);
    if (--s->loads_out == 0)
        td_wk_cache_loaded(op->w, s);
}

static void on_deadline(uv_timer_t *t)
{
    fetch_op_t *op = t->data;
    op->abandoned = true;
    count_failure(op->w, R_TIMEOUT);
    TD_LOG_W("fetch of %d KV blocks from %s: no answer in %.1f s; computing them", op->n,
             op->holder, op->w->cfg.fetch_timeout_s);
    op_finish(op, op->from);
}

static void on_fetched(int status, uint32_t got, void *arg)
{
    fetch_op_t *op = arg;
    td_worker_t *w = op->w;
    uv_timer_stop(&op->timer);
    for (int i = 0; i < op->n; i++)
        td_kv_block_unref(&w->pool, op->blocks[i]);
    if (!op->abandoned) {
        double dt = td_now_s() - op->t0;
        uint64_t bytes = (uint64_t)got * w->layout.block_bytes;
        if (status == 0) {
            td_metric_add(w->m.fetch_blocks, got);
            td_metric_add(w->m.fetch_bytes, (double)bytes);
            if (dt > 0) {
                double bps = (double)bytes / dt;
                w->fetch_bytes_per_s =
                    w->fetch_bytes_per_s > 0 ? 0.8 * w->fetch_bytes_per_s + 0.2 * bps : bps;
                td_metric_set(w->m.fetch_bw, w->fetch_bytes_per_s);
            }
            TD_LOG_D("fetched %u of %d KV blocks from %s in %.3f s", got, op->n, op->holder, dt);
        } else {
            count_failure(w, reason_of(status));
            TD_LOG_W("fetch of %d KV blocks from %s failed: %s; computing them", op->n, op->holder,
                     td_strerror(status));
        }
        op_finish(op, op->from + (status == 0 ? (int)got : 0));
    }
    uv_close((uv_handle_t *)&op->timer, op_closed);
}

void td_wk_fetch_start(td_worker_t *w, td_wk_seq_t *s, const Tandem__FetchHint *h)
{
    int B = w->pool.layout.block_size;
    if (!h || !h->blocks || !h->holder_blob.len || !w->cfg.prefix_cache || s->dead)
        return;
    int want = TD_MIN((int)TD_MIN(h->blocks, (uint32_t)INT32_MAX), (s->n_prompt - 1) / B);
    bool loading = s->state == TD_WK_LOADING;
    if (loading && s->load_bad < s->load_to)
        return; /* a disk load failed already: the cached prefix ends before the fetch's run */
    int from = s->kv.n_blocks; /* after the pool's prefix and the disk loads */
    if (want <= from || s->n_hashed < want)
        return;
    const char *holder = h->holder && *h->holder ? h->holder : "another worker";
    td_kvx_peer_t *peer;
    int rc = td_kvx_connect(w->kvx, h->holder_blob.data, h->holder_blob.len, &peer);
    if (rc) {
        count_failure(w, reason_of(rc));
        TD_LOG_W("cannot fetch KV blocks from %s: %s", holder, td_err_msg());
        return;
    }
    if (td_kv_seq_reserve(&w->pool, &s->kv, want * B)) {
        count_failure(w, R_NOSPACE);
        return;
    }
    int n = want - from;
    fetch_op_t *op = td_calloc(1, sizeof(*op));
    int32_t *blocks = td_calloc((size_t)n, sizeof(*blocks));
    rc = op && blocks ? 0 : TD_ENOMEM;
    if (rc == 0) {
        *op = (fetch_op_t){
            .w = w, .seq_id = s->id, .from = from, .n = n, .blocks = blocks, .t0 = td_now_s()};
        snprintf(op->holder, sizeof(op->holder), "%s", holder);
        memcpy(blocks, s->kv.blocks + from, (size_t)n * sizeof(*blocks));
        for (int i = 0; i < n; i++)
            td_kv_block_ref(&w->pool, blocks[i]);
        rc = td_kvx_fetch(peer, (const uint8_t *)&s->hashes[from], (const uint32_t *)blocks,
                          (uint32_t)n, TD_KVX_F_CSUM, on_fetched, op);
        if (rc)
            for (int i = 0; i < n; i++)
                td_kv_block_unref(&w->pool, blocks[i]);
    }
    if (rc) {
        count_failure(w, rc == TD_ENOMEM ? R_NOSPACE : reason_of(rc));
        TD_LOG_W("cannot fetch KV blocks from %s: %s", holder, td_strerror(rc));
        free(blocks);
        free(op);
        td_kv_seq_truncate(&w->pool, &s->kv, from);
        return;
    }
    uv_timer_init(w->loop, &op->timer);
    op->timer.data = op;
    uv_timer_start(&op->timer, on_deadline, (uint64_t)(w->cfg.fetch_timeout_s * 1000), 0);
    if (!loading) {
        s->load_from = s->load_to = from;
        s->t_load0 = op->t0;
        s->state = TD_WK_LOADING;
    }
    s->fetch_from = from;
    s->fetch_to = s->load_bad = want;
    s->loads_out++;
    TD_LOG_D("request %llu: fetching KV blocks [%d, %d) from %s", (unsigned long long)s->req, from,
             want, holder);
}

/* ---- the holder ------------------------------------------------------------------------------*/

typedef struct serve {
    td_worker_t *w;
    td_kvx_peer_t *peer;
    uint64_t id;
    unsigned flags;
    uint32_t upto;      /* keys [0, upto) resolved: src holds a referenced block for each */
    uint32_t bad;       /* the first of them whose disk load failed (upto when none) */
    int loads_out;      /* disk loads not completed */
    uint32_t *src;      /* [n] our block ids */
    uint32_t *dst;      /* [n] the requester's */
    td_kvhash_t *keys;  /* [n] */
    uint8_t *from_disk; /* [n] 1: read from the disk tier into a new pool block */
} serve_t;

typedef struct serve_load {
    serve_t *sv;
    uint32_t index;
} serve_load_t;

static void serve_free(serve_t *sv)
{
    free(sv->src);
    free(sv->dst);
    free(sv->keys);
    free(sv->from_disk);
    free(sv);
}

static void unref_range(td_worker_t *w, const uint32_t *ids, uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++)
        td_kv_block_unref(&w->pool, (int32_t)ids[i]);
}

static void on_served(int status, void *arg)
{
    serve_t *sv = arg;
    uint32_t n = TD_MIN(sv->upto, sv->bad);
    if (status == 0)
        td_metric_add(sv->w->m.fetch_served, n);
    unref_range(sv->w, sv->src, 0, n);
    serve_free(sv);
}

/* Every key is resolved: answer with the leading run that is in the pool. */
static void serve_answer(serve_t *sv)
{
    td_worker_t *w = sv->w;
    uint32_t n = TD_MIN(sv->upto, sv->bad);
    unref_range(w, sv->src, n, sv->upto);
    for (uint32_t i = 0; i < n; i++)
        if (sv->from_disk[i]) /* verified on load: now in the pool's cache too */
            td_kv_block_publish(&w->pool, (int32_t)sv->src[i], &sv->keys[i]);
    int rc = td_kvx_fetch_answer(sv->peer, sv->id, sv->flags, sv->src, sv->dst, n, TD_ENOENT,
                                 on_served, sv);
    if (rc == 0 && n > 0)
        return; /* on_served finishes */
    if (rc)
        TD_LOG_W("cannot answer a KV fetch: %s", td_err_msg());
    unref_range(w, sv->src, 0, n);
    serve_free(sv);
}

static void on_serve_loaded(td_kvdisk_t *d, const td_kvhash_t *h, int status, void *arg)
{
    (void)d;
    (void)h;
    serve_load_t *op = arg;
    serve_t *sv = op->sv;
    if (status && op->index < sv->bad)
        sv->bad = op->index;
    free(op);
    if (--sv->loads_out == 0)
        serve_answer(sv);
}

void td_wk_fetch_serve(td_kvx_t *kvx, const td_kvx_fetch_req_t *req, void *arg)
{
    (void)kvx;
    td_worker_t *w = arg;
    serve_t *sv = td_calloc(1, sizeof(*sv));
    if (sv) {
        sv->src = td_calloc(req->n, sizeof(*sv->src));
        sv->dst = td_calloc(req->n, sizeof(*sv->dst));
        sv->keys = td_calloc(req->n, sizeof(*sv->keys));
        sv->from_disk = td_calloc(req->n, 1);
    }
    if (!sv || !sv->src || !sv->dst || !sv->keys || !sv->from_disk) {
        if (sv)
            serve_free(sv);
        td_kvx_fetch_answer(req->peer, req->id, req->flags, NULL, NULL, 0, TD_ENOMEM, NULL, NULL);
        return;
    }
    sv->w = w;
    sv->peer = req->peer;
    sv->id = req->id;
    sv->flags = req->flags;
    memcpy(sv->dst, req->dst, (size_t)req->n * sizeof(*sv->dst));
    memcpy(sv->keys, req->keys, (size_t)req->n * TD_KVX_KEY_BYTES);
    uint32_t i = 0;
    for (; i < req->n && w->cfg.prefix_cache; i++) {
        int32_t id = td_kv_cache_find(&w->pool, &sv->keys[i]);
        if (id >= 0) {
            td_kv_block_ref(&w->pool, id); /* pinned: no eviction until the push is done */
            sv->src[i] = (uint32_t)id;
            continue;
        }
        if (!w->disk || !td_kvdisk_contains(w->disk, &sv->keys[i]) ||
            td_kv_block_alloc(&w->pool, &id) != 0)
            break;
        serve_load_t *op = td_calloc(1, sizeof(*op));
        int rc = op ? 0 : TD_ENOMEM;
        if (op) {
            *op = (serve_load_t){sv, i};
            rc = td_kvdisk_load(w->disk, &sv->keys[i], td_kv_block_data(&w->pool, id),
                                on_serve_loaded, op);
        }
        if (rc) {
            free(op);
            td_kv_block_unref(&w->pool, id);
            break;
        }
        sv->src[i] = (uint32_t)id;
        sv->from_disk[i] = 1;
        sv->loads_out++;
    }
    sv->upto = sv->bad = i;
    if (sv->loads_out == 0)
        serve_answer(sv);
}
