/* cache.c: the worker's use of the prefix cache in its KV pool (tier 0, td_kv.h): block hashes
 * of a sequence's tokens (td_kvhash.h; the tenant is the salt), lookups at admission and after a
 * preemption, and publishing blocks once their KV is final. */
#include "td_error.h"
#include "td_kvhash.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>

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
        td_kv_block_publish(&w->pool, s->kv.blocks[i], &s->hashes[i]);
    s->n_published = full;
}
