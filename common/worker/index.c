/* index.c: the worker's share of the cluster KV index (td_kvredis.h): every block its prefix
 * cache holds is announced with the fastest tier that holds it: an ADD of tier 0 when the pool
 * publishes it; when the pool evicts it, an ADD of tier 2 if the disk tier still has it (the
 * write-through put it there), else a REMOVE; the disk tier's own stores and evictions likewise
 * for blocks the pool does not hold. On every (re)connect, and whenever the library asks, the
 * whole inventory (the pool's blocks, then the disk's others) replaces what Redis held for this
 * worker. The entries carry this process's epoch and expire kv.redis_lease_s after the last
 * heartbeat, so those of a dead or restarted worker go by themselves. Publishing only queues:
 * Redis is never on a request's path, and while it is down the worker loses nothing but the
 * routers' hits. */
#include "td_error.h"
#include "td_kvdisk.h"
#include "td_kvredis.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>

/* The namespace every daemon uses: the layout fingerprint is in every block hash already, so
 * workers of different models or layouts share it without collisions. */
#define INDEX_NS "tandem:kv"
#define TIER_POOL 0
#define TIER_DISK 2

static bool on_disk(const td_worker_t *w, const td_kvhash_t *h)
{
    return w->disk && td_kvdisk_contains(w->disk, h);
}

static void on_cache(void *ud, int32_t id, const td_kvhash_t *h, bool added)
{
    td_worker_t *w = ud;
    (void)id;
    if (added)
        td_kvredis_publish(w->index, TD_KVREDIS_ADD, TIER_POOL, h);
    else if (on_disk(w, h)) /* evicted from the pool, still on disk: a slower hit */
        td_kvredis_publish(w->index, TD_KVREDIS_ADD, TIER_DISK, h);
    else
        td_kvredis_publish(w->index, TD_KVREDIS_REMOVE, 0, h);
}

static void publish_inventory(td_worker_t *w);

static void on_disk_change(void *ud, const td_kvhash_t *h, bool added)
{
    td_worker_t *w = ud;
    if (!h) { /* the tier turned off: what is left is the pool's */
        publish_inventory(w);
        return;
    }
    if (td_kv_cache_find(&w->pool, h) >= 0)
        return; /* announced as the pool's */
    td_kvredis_publish(w->index, added ? TD_KVREDIS_ADD : TD_KVREDIS_REMOVE, TIER_DISK, h);
}

/* Replace what Redis holds for us with every block of the pool (tier 0) and of the disk tier
 * that the pool does not hold (tier 2). */
static void publish_inventory(td_worker_t *w)
{
    td_kv_pool_t *p = &w->pool;
    size_t n_disk = w->disk ? td_kvdisk_list(w->disk, NULL, 0) : 0;
    size_t n = 0, cap = (size_t)(p->n_cached > 0 ? p->n_cached : 0) + n_disk + 1;
    td_kvhash_t *hs = td_calloc(cap, sizeof(*hs));
    uint8_t *tiers = td_calloc(cap, 1);
    if (!hs || !tiers) {
        TD_LOG_W("KV index: out of memory for the inventory of %zu blocks", cap);
        goto out;
    }
    for (int32_t id = 0; id < p->n_blocks && n < cap; id++)
        if (p->cached[id])
            tiers[n] = TIER_POOL, hs[n++] = p->hash[id];
    size_t pool = n;
    if (n_disk) {
        size_t got = td_kvdisk_list(w->disk, hs + n, cap - n);
        for (size_t i = 0; i < TD_MIN(got, cap - pool); i++)
            if (td_kv_cache_find(p, &hs[pool + i]) < 0)
                tiers[n] = TIER_DISK, hs[n++] = hs[pool + i];
    }
    int rc = td_kvredis_publish_inventory(w->index, tiers, hs, n);
    if (rc)
        TD_LOG_W("KV index: inventory not published: %s", td_strerror(rc));
    else
        TD_LOG_I("KV index: published the inventory of %zu cached blocks (%zu in the pool, %zu "
                 "on disk)",
                 n, pool, n - pool);
out:
    free(hs);
    free(tiers);
}

/* (Re)connected, or the library needs the set rewritten. */
static void on_state(bool up, bool need_inventory, void *ud)
{
    if (up && need_inventory)
        publish_inventory(ud);
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
    if (w->disk)
        td_kvdisk_set_listener(w->disk, on_disk_change, w);
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
    if (w->disk)
        td_kvdisk_set_listener(w->disk, NULL, NULL);
    td_kvredis_leave(w->index); /* routers forget our blocks now, not at the lease's end */
    w->index = NULL;
}
