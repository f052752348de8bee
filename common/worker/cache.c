/* cache.c: the worker's use of the prefix cache in its KV pool (tier 0, td_kv.h): block hashes
 * of a sequence's tokens (td_kvhash.h; the tenant is the salt), lookups at admission and after a
 * preemption, publishing blocks once their KV is final, and the disk tier (tier 2): loads at
 * admission, write-through. Blocks fetched from another worker (fetch.c) end their LOADING here
 * too (td_wk_cache_loaded). */
#include "td_error.h"
#include "td_kvhash.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>
#include <string.h>

/* Hashes of s's first n full blocks (n * block_size <= n_toks). 0 or TD_ENOMEM. */
static int hash_blocks(td_worker_t *w, td_wk_seq_t *s, int n)
{
    int B = w->pool.layout.block_size;
    TD_ASSERT(n * B <= s->n_toks);
    if (n <= s->n_hashed)
        return 0;
    if (n > s->cap_hashes) {
        int cap = TD_MAX(n, s->cap_hashes * 2);
        td_kvhash_t *h = td_reallocarray(s->hashes, (size_t)cap, sizeof(*h));
        if (!h)
            return td_err_set(TD_ENOMEM, "out of memory");
        s->hashes = h;
        s->cap_hashes = cap;
    }
    td_kvhash_t root;
    const td_kvhash_t *prev = s->n_hashed ? &s->hashes[s->n_hashed - 1] : &root;
    if (!s->n_hashed) {
        int rc = td_kvhash_root(w->pool.layout.fingerprint, s->tenant, s->tenant_len, &root);
        if (rc)
            return rc;
    }
    td_kvhash_blocks(s->toks + (size_t)s->n_hashed * B, (size_t)(n - s->n_hashed) * B, (size_t)B,
                     prev, s->hashes + s->n_hashed, (size_t)(n - s->n_hashed));
    s->n_hashed = n;
    return 0;
}

static void disk_store(td_worker_t *w, int32_t id, const td_kvhash_t *h);

int td_wk_cache_attach(td_worker_t *w, td_wk_seq_t *s, int limit, bool count)
{
    int B = w->pool.layout.block_size;
    if (!w->cfg.prefix_cache)
        return 0;
    if (count)
        td_metric_add(w->m.cache_queries, limit);
    if (s->kv.n_blocks > 0 || limit < B || hash_blocks(w, s, limit / B))
        return 0;
    int hit = td_kv_seq_attach_cached(&w->pool, &s->kv, s->hashes, limit / B);
    s->stored = s->kv.n_tokens;
    s->n_published = hit;
    if (count)
        td_metric_add(w->m.cache_hits, (double)hit * B);
    return hit * B;
}

void td_wk_cache_publish(td_worker_t *w, td_wk_seq_t *s)
{
    int full = s->stored / w->pool.layout.block_size;
    if (!w->cfg.prefix_cache || full <= s->n_published || hash_blocks(w, s, full))
        return;
    for (int i = s->n_published; i < full; i++)
        if (td_kv_block_publish(&w->pool, s->kv.blocks[i], &s->hashes[i]))
            disk_store(w, s->kv.blocks[i], &s->hashes[i]);
    s->n_published = full;
}

/* ---- the disk tier (tier 2) ---------------------------------------------------------------- */

/* A store or load in flight: which worker, which sequence (loads) or block (stores). */
typedef struct disk_op {
    td_worker_t *w;
    uint64_t seq_id; /* loads */
    int32_t block;   /* stores: the pool block lent to the tier (a reference held) */
    int index;       /* loads: the block's index in the sequence's table */
} disk_op_t;

int td_wk_disk_open(td_worker_t *w)
{
    const td_wk_cfg_t *c = &w->cfg;
    if (!c->disk_dir || !*c->disk_dir)
        return 0;
    if (!td_str_eq(c->disk_load, "auto") && !td_str_eq(c->disk_load, "always"))
        return td_err_set(TD_EINVAL, "kv.disk_load: \"%s\" is not auto or always", c->disk_load);
    td_kvdisk_opts_t o = {.dir = c->disk_dir,
                          .max_bytes = c->disk_max,
                          .block_bytes = w->layout.block_bytes};
    memcpy(o.fingerprint, w->layout.fingerprint, 16);
    int rc = td_kvdisk_open(w->loop, &o, &w->disk);
    if (rc) { /* a disk problem costs the tier, never the worker */
        TD_LOG_E("kv.disk_dir: %s: running without the disk tier", td_err_msg());
        w->disk = NULL;
        return 0;
    }
    td_kvdisk_stats_t st;
    td_kvdisk_stats(w->disk, &st);
    TD_LOG_I("disk tier %s: %llu blocks (%llu bytes) of this layout found", c->disk_dir,
             (unsigned long long)st.files, (unsigned long long)st.bytes);
    return 0;
}

/* The tier's close has finished. */
typedef struct disk_close {
    void (*done)(void *arg);
    void *arg;
} disk_close_t;

static void on_disk_closed(void *arg)
{
    disk_close_t dc = *(disk_close_t *)arg;
    free(arg);
    if (dc.done)
        dc.done(dc.arg);
}

void td_wk_disk_close(td_worker_t *w, void (*done)(void *arg), void *arg)
{
    disk_close_t *dc = w->disk ? td_calloc(1, sizeof(*dc)) : NULL;
    if (!dc) {
        if (w->disk)
            td_kvdisk_close(w->disk, NULL, NULL); /* out of memory: close without a callback */
        w->disk = NULL;
        if (done)
            done(arg);
        return;
    }
    *dc = (disk_close_t){done, arg};
    td_kvdisk_close(w->disk, on_disk_closed, dc);
    w->disk = NULL;
}

static void on_stored(td_kvdisk_t *d, const td_kvhash_t *h, int status, void *arg)
{
    (void)d;
    (void)h;
    (void)status; /* a failure turned the tier off (it logged it) or it was closing */
    disk_op_t *op = arg;
    td_kv_block_unref(&op->w->pool, op->block);
    free(op);
}

/* Write published block `id` to the disk tier; the pool keeps it until the write is done. */
static void disk_store(td_worker_t *w, int32_t id, const td_kvhash_t *h)
{
    disk_op_t *op = w->disk ? td_calloc(1, sizeof(*op)) : NULL;
    if (!op)
        return;
    *op = (disk_op_t){.w = w, .block = id};
    td_kv_block_ref(&w->pool, id);
    if (td_kvdisk_store(w->disk, h, td_kv_block_data(&w->pool, id), on_stored, op) != 0) {
        td_kv_block_unref(&w->pool, id); /* already on disk, or the tier is off */
        free(op);
    }
}

void td_wk_cache_measure_prefill(td_worker_t *w, int tokens, double seconds)
{
    if (tokens < 1 || !(seconds > 0))
        return;
    double x = seconds / tokens;
    w->prefill_s_per_token = w->prefill_s_per_token > 0 ? 0.8 * w->prefill_s_per_token + 0.2 * x
                                                        : x;
}

/* Whether reading a block from disk is expected to be cheaper than computing it. Unmeasured
 * costs favour the disk, which measures it. */
static bool load_cheaper(const td_worker_t *w)
{
    if (td_str_eq(w->cfg.disk_load, "always") || w->load_s_per_block <= 0 ||
        w->prefill_s_per_token <= 0)
        return true;
    return w->load_s_per_block < w->prefill_s_per_token * w->pool.layout.block_size;
}

void td_wk_cache_loaded(td_worker_t *w, td_wk_seq_t *s)
{
    int B = w->pool.layout.block_size, n = s->load_to - s->load_from;
    double dt = td_now_s() - s->t_load0;
    if (n > 0 && dt > 0 && s->fetch_to == 0) { /* the disk's own time only */
        double x = dt / n;
        w->load_s_per_block = w->load_s_per_block > 0 ? 0.8 * w->load_s_per_block + 0.2 * x : x;
    }
    int fetch_from = s->fetch_to > 0 ? s->fetch_from : s->load_to;
    s->fetch_from = s->fetch_to = 0;
    if (s->dead) {
        td_wk_seq_maybe_free(w, s);
        return;
    }
    int good = s->load_bad;
    td_kv_seq_truncate(&w->pool, &s->kv, good);
    for (int i = s->load_from; i < good; i++)
        if (td_kv_block_publish(&w->pool, s->kv.blocks[i], &s->hashes[i]) && i >= fetch_from)
            disk_store(w, s->kv.blocks[i], &s->hashes[i]); /* fetched: not on our disk yet */
    s->kv.n_tokens = s->stored = good * B;
    s->n_published = good;
    s->cached_tokens = s->stored;
    if (TD_MIN(good, s->load_to) > s->load_from)
        td_metric_add(w->m.disk_hits, (double)(TD_MIN(good, s->load_to) - s->load_from) * B);
    s->state = TD_WK_PREFILL;
    td_wk_schedule(w);
}

static void on_loaded(td_kvdisk_t *d, const td_kvhash_t *h, int status, void *arg)
{
    (void)d;
    (void)h;
    disk_op_t *op = arg;
    td_worker_t *w = op->w;
    td_wk_seq_t *s = td_wk_seq_find(w, op->seq_id);
    TD_ASSERT(s && s->loads_out > 0); /* a sequence with loads out is never freed */
    if (status && op->index < s->load_bad)
        s->load_bad = op->index; /* corrupt, or the tier failed: compute from here */
    free(op);
    if (--s->loads_out == 0)
        td_wk_cache_loaded(w, s);
}

void td_wk_cache_admit(td_worker_t *w, td_wk_seq_t *s, int limit)
{
    int B = w->pool.layout.block_size;
    s->cached_tokens = td_wk_cache_attach(w, s, limit, true);
    if (!w->disk || !w->cfg.prefix_cache || limit < B)
        return;
    int from = s->kv.n_blocks, want = limit / B, to = from;
    td_metric_add(w->m.disk_queries, (double)(want - from) * B);
    while (to < want && td_kvdisk_contains(w->disk, &s->hashes[to]))
        to++;
    if (to == from || !load_cheaper(w) || td_kv_seq_reserve(&w->pool, &s->kv, to * B) != 0)
        return;
    s->load_from = from;
    s->load_to = s->load_bad = to;
    s->t_load0 = td_now_s();
    for (int i = from; i < to; i++) {
        disk_op_t *op = td_calloc(1, sizeof(*op));
        int rc = op ? 0 : TD_ENOMEM;
        if (op) {
            *op = (disk_op_t){.w = w, .seq_id = s->id, .index = i};
            rc = td_kvdisk_load(w->disk, &s->hashes[i],
                                td_kv_block_data(&w->pool, s->kv.blocks[i]), on_loaded, op);
        }
        if (rc) {
            free(op);
            s->load_bad = TD_MIN(s->load_bad, i);
            break;
        }
        s->loads_out++;
    }
    if (s->loads_out > 0) {
        s->state = TD_WK_LOADING;
    } else {
        td_kv_seq_truncate(&w->pool, &s->kv, from);
        s->kv.n_tokens = s->stored;
    }
}
