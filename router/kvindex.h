/* kvindex.h: the router's in-memory mirror of the cluster KV index: which workers hold which
 * prompt blocks (td_kvhash_t: hash version 1 block hashes, which already bind model, layout and
 * tenant, see td_kvhash.h), and in which tier. Placement asks it how many leading blocks of a
 * prompt each worker already holds, so a request goes where its prefix is cached. The mirror is
 * fed by workers' add/remove events; it is never authoritative (a hit that turns out stale costs
 * a recompute, not a wrong answer). Loop thread only.
 */
#ifndef TD_ROUTER_KVINDEX_H
#define TD_ROUTER_KVINDEX_H

#include "td_kvhash.h"

#include <stddef.h>
#include <stdint.h>

typedef struct td_kvindex td_kvindex_t;

/* Tiers, fastest first. */
enum { TD_TIER_POOL = 0, TD_TIER_HOST = 1, TD_TIER_DISK = 2 };

td_kvindex_t *td_kvindex_new(void);
void td_kvindex_free(td_kvindex_t *ix);

/* Record that `worker` holds block `h` in `tier` (an existing record's tier is updated).
 * 0 or TD_ENOMEM. */
int td_kvindex_add(td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker, uint8_t tier);
/* Forget one holder of one block (no-op when unknown). */
void td_kvindex_remove(td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker);
/* Forget every block of a worker (it died or restarted). Sweeps the whole index. */
void td_kvindex_remove_worker(td_kvindex_t *ix, uint32_t worker);

/* How many of hashes[0..n) a worker holds as an unbroken prefix (in any tier, or only in tiers
 * <= max_tier). */
size_t td_kvindex_prefix(const td_kvindex_t *ix, const td_kvhash_t *hashes, size_t n,
                         uint32_t worker, uint8_t max_tier);
/* td_kvindex_prefix, also counting in *slow (when non-NULL) how many of the prefix's blocks the
 * worker holds below the pool (host or disk: they cost a load, not a recompute). */
size_t td_kvindex_prefix_tiers(const td_kvindex_t *ix, const td_kvhash_t *hashes, size_t n,
                               uint32_t worker, uint8_t max_tier, size_t *slow);
/* The tier a worker holds a block in, or -1. */
int td_kvindex_tier(const td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker);

/* Start loading the slot of `h` into the cache (a batch of adds calls it a few blocks ahead:
 * the table is larger than the cache, and every insert would otherwise wait on memory). */
void td_kvindex_prefetch(const td_kvindex_t *ix, const td_kvhash_t *h);
/* Blocks with at least one holder. */
size_t td_kvindex_blocks(const td_kvindex_t *ix);
/* Make room for `blocks` blocks without rehashing (a rebuild knows its size). 0 or TD_ENOMEM. */
int td_kvindex_reserve(td_kvindex_t *ix, size_t blocks);
/* Memory the index uses, in bytes (its table and holder arrays). */
size_t td_kvindex_bytes(const td_kvindex_t *ix);

#endif
