/* kvmirror.c: the router's mirror of the cluster KV index. A td_kvredis subscriber feeds a
 * td_kvindex (hash -> holders); a holder is a worker id as it appears in Redis, numbered here, so
 * the mirror outlives a worker's registration (a restarted router rebuilds it before the workers
 * come back) and a registered worker (td_worker_t.holder) is looked up by number. The prompt's
 * block hashes are computed in one place, prompt_hashes(), with the rule of the workers'
 * common/worker/cache.c. */
#include "router.h"

#include "kvindex.h"
#include "td_error.h"
#include "td_kvredis.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

/* The namespace every daemon uses (common/worker/index.c): the layout fingerprint is in every
 * block hash, so workers of different layouts share it without collisions. */
#define INDEX_NS "tandem:kv"

typedef struct holder {
    char *id;       /* the worker id in Redis */
    uint64_t epoch; /* the publisher's epoch whose set the mirror holds (0: not known yet) */
    bool any;       /* the mirror may hold entries of it */
} holder_t;

struct td_kvmirror {
    td_router_t *rt;
    td_kvredis_t *r;
    td_kvindex_t *ix;
    holder_t *holders; /* [n_holders], numbered by position */
    uint32_t n_holders, cap_holders;
    td_metric_t *m_blocks, *m_bytes, *m_rebuild; /* NULL without a registry */
};

static void update_metrics(struct td_kvmirror *m)
{
    if (m->m_blocks)
        td_metric_set(m->m_blocks, (double)td_kvindex_blocks(m->ix));
    if (m->m_bytes)
        td_metric_set(m->m_bytes, (double)td_kvindex_bytes(m->ix));
}

/* The holder number of worker `id`, a new one when unknown. UINT32_MAX when out of memory. */
static uint32_t holder_of(struct td_kvmirror *m, const char *id)
{
    for (uint32_t i = 0; i < m->n_holders; i++)
        if (strcmp(m->holders[i].id, id) == 0)
            return i;
    if (m->n_holders == m->cap_holders) {
        uint32_t cap = m->cap_holders ? m->cap_holders * 2 : 16;
        holder_t *h = td_reallocarray(m->holders, cap, sizeof(*h));
        if (!h)
            return UINT32_MAX;
        m->holders = h;
        m->cap_holders = cap;
    }
    char *dup = td_strdup(id);
    if (!dup)
        return UINT32_MAX;
    m->holders[m->n_holders] = (holder_t){dup, 0, false};
    return m->n_holders++;
}

static void forget(struct td_kvmirror *m, uint32_t k)
{
    if (m->holders[k].any)
        td_kvindex_remove_worker(m->ix, k);
    m->holders[k].any = false;
    update_metrics(m);
}

static void on_events(const td_kvredis_event_t *ev, size_t n, void *ud)
{
    struct td_kvmirror *m = ud;
    uint32_t k = UINT32_MAX;
    enum { AHEAD = 8 };
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            td_kvindex_prefetch(m->ix, &ev[i + AHEAD].hash);
        if (k == UINT32_MAX || strcmp(m->holders[k].id, ev[i].worker) != 0)
            k = holder_of(m, ev[i].worker);
        if (k == UINT32_MAX)
            continue;
        holder_t *h = &m->holders[k];
        if (ev[i].op == TD_KVREDIS_RESET) {
            forget(m, k);
            if (ev[i].size_hint)
                td_kvindex_reserve(m->ix, td_kvindex_blocks(m->ix) + ev[i].size_hint);
            h->epoch = ev[i].epoch; /* a new set: that of this epoch */
            continue;
        }
        if (!h->epoch)
            h->epoch = ev[i].epoch;
        else if (ev[i].epoch && ev[i].epoch != h->epoch)
            continue; /* late news of a process that restarted: its set was replaced */
        if (ev[i].op == TD_KVREDIS_ADD) {
            if (td_kvindex_add(m->ix, &ev[i].hash, k, ev[i].tier) == 0)
                h->any = true;
        } else {
            td_kvindex_remove(m->ix, &ev[i].hash, k);
        }
    }
    update_metrics(m);
}

static void on_resynced(double seconds, void *ud)
{
    struct td_kvmirror *m = ud;
    if (m->m_rebuild)
        td_metric_set(m->m_rebuild, seconds);
    TD_LOG_I("KV index: read from Redis: %zu blocks in %.1f ms", td_kvindex_blocks(m->ix),
             seconds * 1e3);
}

/* Redis connected (a read of every set follows), or lost: the mirror could no longer hear of
 * evictions, restarts or new blocks, so it is emptied and placement goes by load alone until
 * the read after the reconnect (which the workers' republished inventories feed) fills it. */
static void on_state(bool up, bool need_inventory, void *ud)
{
    struct td_kvmirror *m = ud;
    (void)need_inventory;
    if (up) {
        TD_LOG_I("KV index: connected; reading the index from Redis");
        return;
    }
    td_kvindex_t *fresh = td_kvindex_new();
    if (!fresh)
        return; /* out of memory: keep the old view, stale entries cost recomputes only */
    td_kvindex_free(m->ix);
    m->ix = fresh;
    for (uint32_t i = 0; i < m->n_holders; i++) {
        m->holders[i].any = false;
        m->holders[i].epoch = 0;
    }
    update_metrics(m);
    TD_LOG_W("KV index: Redis unreachable; placing by load alone until it is back");
}

int td_kvmirror_start(td_router_t *rt)
{
    if (!rt->cfg.kv_redis || !*rt->cfg.kv_redis)
        return 0;
    struct td_kvmirror *m = td_calloc(1, sizeof(*m));
    if (!m || !(m->ix = td_kvindex_new())) {
        free(m);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    m->rt = rt;
    td_kvredis_opts_t o = {.addr = rt->cfg.kv_redis,
                           .ns = INDEX_NS,
                           .subscribe = true,
                           .on_events = on_events,
                           .on_state = on_state,
                           .on_resynced = on_resynced,
                           .ud = m};
    if (rt->metrics) {
        m->m_blocks = td_metrics_gauge(rt->metrics, "kv_index_blocks",
                                       "Blocks in this router's mirror of the cluster KV index.",
                                       NULL);
        m->m_bytes = td_metrics_gauge(rt->metrics, "kv_index_bytes",
                                      "Memory of this router's KV index mirror, bytes.", NULL);
        m->m_rebuild = td_metrics_gauge(rt->metrics, "kv_index_rebuild_seconds",
                                        "How long the last full read of the KV index from Redis "
                                        "took.",
                                        NULL);
    }
    if (!(m->r = td_kvredis_new(rt->loop, &o))) {
        int rc = td_err_set(TD_EINVAL, "kv.redis: %s", td_err_msg());
        td_kvindex_free(m->ix);
        free(m);
        return rc;
    }
    rt->kvm = m;
    TD_LOG_I("KV index: mirroring redis %s", rt->cfg.kv_redis);
    return 0;
}

void td_kvmirror_stop(td_router_t *rt)
{
    struct td_kvmirror *m = rt->kvm;
    if (!m)
        return;
    td_kvredis_close(m->r); /* freed by the loop once closed; it calls nothing more */
    td_kvindex_free(m->ix);
    for (uint32_t i = 0; i < m->n_holders; i++)
        free(m->holders[i].id);
    free(m->holders);
    free(m);
    rt->kvm = NULL;
}

void td_kvmirror_worker_up(td_router_t *rt, td_worker_t *w)
{
    struct td_kvmirror *m = rt->kvm;
    w->holder = UINT32_MAX;
    if (!m)
        return;
    w->holder = holder_of(m, w->id);
    /* it may have left rotation before (its entries dropped) while its set stayed in Redis */
    if (w->holder != UINT32_MAX && !m->holders[w->holder].any)
        td_kvredis_resync_worker(m->r, w->id);
}

void td_kvmirror_worker_gone(td_router_t *rt, td_worker_t *w)
{
    struct td_kvmirror *m = rt->kvm;
    if (m && w->holder < m->n_holders)
        forget(m, w->holder);
}

/* The block hashes of s's prompt for a worker of layout fingerprint `fp` and `bt` tokens per
 * block, into s->kvh: the rule of common/worker/cache.c, which takes cached blocks for at most
 * n_prompt - 1 tokens (the last prompt token is always computed) and salts with the tenant. The
 * one place the router hashes prompts. 0 or TD_ENOMEM. */
static int prompt_hashes(td_seq_t *s, const uint8_t fp[16], uint32_t bt)
{
    if (s->kvh_bt == bt && memcmp(s->kvh_fp, fp, 16) == 0)
        return 0;
    size_t n = s->n_prompt > 0 ? (s->n_prompt - 1) / bt : 0;
    td_kvhash_t *h = td_reallocarray(s->kvh, n ? n : 1, sizeof(*h));
    if (!h)
        return TD_ENOMEM;
    s->kvh = h;
    td_kvhash_t root;
    if (td_kvhash_root(fp, s->job->tenant, s->job->tenant_len, &root))
        return TD_ENOMEM; /* a tenant of 4 GiB or more cannot reach here */
    s->n_kvh = td_kvhash_blocks(s->prompt, n * bt, bt, &root, h, n);
    memcpy(s->kvh_fp, fp, 16);
    s->kvh_bt = bt;
    return 0;
}

uint64_t td_kvmirror_cached_tiers(td_router_t *rt, td_seq_t *s, const td_worker_t *w,
                                  uint64_t *slow_tokens)
{
    struct td_kvmirror *m = rt->kvm;
    size_t slow = 0;
    if (slow_tokens)
        *slow_tokens = 0;
    if (!m || w->holder >= m->n_holders || !m->holders[w->holder].any || w->fp_len != 16 ||
        !w->block_tokens || td_kvindex_blocks(m->ix) == 0)
        return 0;
    if (prompt_hashes(s, w->fp, w->block_tokens))
        return 0;
    size_t n = td_kvindex_prefix_tiers(m->ix, s->kvh, s->n_kvh, w->holder, UINT8_MAX, &slow);
    if (slow_tokens)
        *slow_tokens = (uint64_t)slow * w->block_tokens;
    return (uint64_t)n * w->block_tokens;
}

uint64_t td_kvmirror_cached(td_router_t *rt, td_seq_t *s, const td_worker_t *w)
{
    return td_kvmirror_cached_tiers(rt, s, w, NULL);
}

size_t td_kvmirror_blocks(const td_router_t *rt)
{
    return rt->kvm ? td_kvindex_blocks(rt->kvm->ix) : 0;
}
