/* fetchhint.c: the cross-worker fetch hint of a PrefillTask (docs/dataplane.md, Fetch). When the
 * cluster KV index (kvmirror.c) says another live worker of the prefill worker's layout holds more
 * of the prompt's leading blocks than the prefill worker does, the task names that holder (id,
 * data-plane blob, blocks held) and the prefill worker fetches the difference from it instead of
 * computing it. The rule: at least kv.fetch_min_blocks more blocks, and, once the prefill worker
 * has measured both, fetching them (blocks x block bytes / its measured fetch bandwidth) must be
 * quicker than computing them (tokens x its measured prefill seconds per token). Ties prefer a
 * prefill worker as holder (serving a fetch costs a decode worker's loop time between its
 * steps). The index is never authoritative: a holder that no longer has the blocks, or dies,
 * costs the prefill worker a recompute, not the request. */
#include "router.h"

#include "td_log.h"

#include <string.h>

/* Whether w can serve p's fetch: alive (draining is fine: it still holds its cache), reachable
 * on the data plane, and of p's layout. */
static bool can_serve(const td_worker_t *w, const td_worker_t *p)
{
    return w != p && w->conn && w->load.alive && w->blob_len > 0 && w->fp_len == p->fp_len &&
           memcmp(w->fp, p->fp, p->fp_len) == 0 && w->block_tokens == p->block_tokens;
}

const td_worker_t *td_fetchhint_pick(td_router_t *rt, td_seq_t *s, const td_worker_t *p,
                                     uint64_t have_tokens, uint64_t *memo, uint64_t *gain_blocks)
{
    uint64_t bt = p->block_tokens;
    *gain_blocks = 0;
    if (!rt->kvm || rt->cfg.fetch_min_blocks == 0 || bt == 0)
        return NULL;
    uint64_t have = have_tokens / bt, best_n = have;
    const td_worker_t *best = NULL;
    for (size_t i = 0; i < rt->n_workers; i++) {
        const td_worker_t *w = rt->workers[i];
        if (!can_serve(w, p))
            continue;
        if (memo && memo[i] == UINT64_MAX)
            memo[i] = td_kvmirror_cached(rt, s, w);
        uint64_t n = (memo ? memo[i] : td_kvmirror_cached(rt, s, w)) / bt;
        if (n > best_n || (best && n == best_n && best->role != TANDEM__ROLE__ROLE_PREFILL &&
                           w->role == TANDEM__ROLE__ROLE_PREFILL)) {
            best = w;
            best_n = n;
        }
    }
    if (!best || best_n - have < rt->cfg.fetch_min_blocks)
        return NULL;
    uint64_t gain = best_n - have;
    if (p->fetch_bps > 0 && p->s_per_token > 0 && p->block_bytes > 0 &&
        (double)gain * (double)p->block_bytes / p->fetch_bps >=
            (double)(gain * bt) * p->s_per_token)
        return NULL; /* measured: computing them is quicker */
    *gain_blocks = gain;
    return best;
}

bool td_fetchhint_fill(td_router_t *rt, td_seq_t *s, const td_worker_t *p, Tandem__FetchHint *h)
{
    uint64_t bt = p->block_tokens, have = td_kvmirror_cached(rt, s, p), gain;
    const td_worker_t *best = td_fetchhint_pick(rt, s, p, have, NULL, &gain);
    if (!best)
        return false;
    have /= bt;
    uint64_t best_n = have + gain;
    tandem__fetch_hint__init(h);
    h->holder = best->id;
    h->holder_blob.data = best->blob;
    h->holder_blob.len = best->blob_len;
    h->blocks = (uint32_t)(best_n > UINT32_MAX ? UINT32_MAX : best_n);
    td_logf(TD_LOG_DEBUG, s->job->log_id,
            "seq %llu: prefill %s may fetch blocks [%llu, %llu) "
            "from %s",
            (unsigned long long)s->id, p->id, (unsigned long long)have, (unsigned long long)best_n,
            best->id);
    return true;
}
