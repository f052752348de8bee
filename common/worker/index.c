/* index.c: the worker's share of the cluster KV index (td_kvredis.h): every block the pool's
 * prefix cache publishes is announced as an ADD (tier 0), every eviction as a REMOVE, and on
 * every (re)connect the whole inventory replaces what Redis held for this worker. The entries
 * carry this process's epoch and expire kv.redis_lease_s after the last heartbeat, so those of a
 * dead or restarted worker go by themselves. Publishing only queues: Redis is never on a
 * request's path, and while it is down the worker loses nothing but the routers' hits. */
#include "td_error.h"
#include "td_kvredis.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>

/* The namespace every daemon uses: the layout fingerprint is in every block hash already, so
 * workers of different models or layouts share it without collisions. */
#define INDEX_NS "tandem:kv"

static void on_cache(void *ud, int32_t id, const td_kvhash_t *h, bool added)
{
    td_worker_t *w = ud;
    (void)id;
    td_kvredis_publish(w->index, added ? TD_KVREDIS_ADD : TD_KVREDIS_REMOVE, 0, h);
}

/* (Re)connected: replace what Redis holds for us with every published block of the pool. */
static void on_state(bool up, bool need_inventory, void *ud)
{
    td_worker_t *w = ud;
    if (!up || !need_inventory)
        return;
    td_kv_pool_t *p = &w->pool;
    size_t n = 0, cap = (size_t)(p->n_cached > 0 ? p->n_cached : 1);
    td_kvhash_t *hs = td_calloc(cap, sizeof(*hs));
    uint8_t *tiers = td_calloc(cap, 1);
    if (!hs || !tiers) {
        TD_LOG_W("KV index: out of memory for the inventory of %d blocks", p->n_cached);
        goto out;
    }
    for (int32_t id = 0; id < p->n_blocks && n < cap; id++)
        if (p->cached[id])
            hs[n++] = p->hash[id];
    int rc = td_kvredis_publish_inventory(w->index, tiers, hs, n);
    if (rc)
        TD_LOG_W("KV index: inventory not published: %s", td_strerror(rc));
    else
        TD_LOG_I("KV index: published the inventory of %zu cached blocks", n);
out:
    free(hs);
    free(tiers);
}

int td_wk_index_start(td_worker_t *w)
{
    const td_wk_cfg_t *c = &w->cfg;
    if (!c->kv_redis || !*c->kv_redis)
        return 0;
    td_kvredis_opts_t o = {.addr = c->kv_redis,
                           .ns = INDEX_NS,
                           .worker_id = c->id,
                           .lease_ms = (uint64_t)(c->kv_redis_lease_s * 1000),
                           .on_state = on_state,
                           .ud = w};
    if (!(w->index = td_kvredis_new(w->loop, &o)))
        return td_err_set(TD_EINVAL, "kv.redis: %s", td_err_msg());
    w->pool.on_cache = on_cache;
    w->pool.on_cache_ud = w;
    TD_LOG_I("KV index: publishing to redis %s (lease %.1f s, epoch %016llx)", c->kv_redis,
             c->kv_redis_lease_s, (unsigned long long)td_kvredis_epoch(w->index));
    return 0;
}

void td_wk_index_renew(td_worker_t *w)
{
    if (w->index)
        td_kvredis_renew(w->index);
}

void td_wk_index_stop(td_worker_t *w)
{
    if (!w->index)
        return;
    w->pool.on_cache = NULL;
    td_kvredis_close(w->index);
    w->index = NULL;
}
