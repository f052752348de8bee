/* reqs_place.c: placing sequences: choosing a decode worker (and, once it accepts, a prefill
 * worker of the same KV layout) through the placement policy, with what each candidate holds of
 * the prompt by the cluster KV index (kvmirror.c), and the FIFO of sequences waiting for a decode
 * worker with room. */
#include "reqs_impl.h"

#include "td_error.h"
#include "td_log.h"
#include "td_msg.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the waiting queue ------------------------------------------------------------------- */

void td__reqs_wait_insert(td_router_t *rt, td_seq_t *s, bool at_head)
{
    s->n_tried = 0;
    if (!at_head)
        s->t_wait = td_now_s(); /* at the head it goes back to an older wait */
    s->state = TD_SEQ_WAITING;
    if (at_head) {
        s->wprev = NULL;
        s->wnext = rt->wait_head;
        if (rt->wait_head)
            rt->wait_head->wprev = s;
        else
            rt->wait_tail = s;
        rt->wait_head = s;
    } else {
        s->wnext = NULL;
        s->wprev = rt->wait_tail;
        if (rt->wait_tail)
            rt->wait_tail->wnext = s;
        else
            rt->wait_head = s;
        rt->wait_tail = s;
    }
    rt->n_waiting++;
    td_metric_set(rt->m_waiting_g, (double)rt->n_waiting);
}

void td__reqs_wait_del(td_router_t *rt, td_seq_t *s)
{
    if (s->state != TD_SEQ_WAITING)
        return;
    if (s->wprev)
        s->wprev->wnext = s->wnext;
    else
        rt->wait_head = s->wnext;
    if (s->wnext)
        s->wnext->wprev = s->wprev;
    else
        rt->wait_tail = s->wprev;
    s->wnext = s->wprev = NULL;
    rt->n_waiting--;
    s->state = TD_SEQ_NEW;
    td_metric_set(rt->m_waiting_g, (double)rt->n_waiting);
}

/* ---- choosing workers ---------------------------------------------------------------------- */

/* Whether decode worker w already refused s in this placement round. */
static bool tried(const td_seq_t *s, const td_worker_t *w)
{
    for (size_t i = 0; i < s->n_tried; i++)
        if (s->tried[i] == w->serial)
            return true;
    return false;
}

int td__reqs_add_tried(td_seq_t *s, const td_worker_t *w)
{
    if (s->n_tried == s->cap_tried) {
        size_t cap = s->cap_tried ? s->cap_tried * 2 : 4;
        uint64_t *t = td_reallocarray(s->tried, cap, sizeof(*t));
        if (!t)
            return TD_ENOMEM;
        s->tried = t;
        s->cap_tried = cap;
    }
    s->tried[s->n_tried++] = w->serial;
    return 0;
}

/* Whether a and b registered the same KV layout fingerprint (KV blocks can move between them). */
static bool fp_equal(const td_worker_t *a, const td_worker_t *b)
{
    return a->fp_len == b->fp_len && memcmp(a->fp, b->fp, a->fp_len) == 0;
}

/* Whether w is connected, heartbeating and not draining. */
static bool live(const td_worker_t *w)
{
    return w->conn && w->load.alive && !w->load.draining;
}

/* Whether a live prefill worker shares decode worker `pair`'s layout (else prefill locally). */
static bool any_prefill(const td_router_t *rt, const td_worker_t *pair)
{
    for (size_t i = 0; i < rt->n_workers; i++) {
        const td_worker_t *w = rt->workers[i];
        if (w->role == TANDEM__ROLE__ROLE_PREFILL && live(w) && fp_equal(w, pair))
            return true;
    }
    return false;
}

/* Whether decode worker d prefills s itself: a short prompt, no prefill worker of its layout, or
 * a prompt it mostly holds (`cached` tokens of it) in its prefix cache. */
static bool local_on(const td_router_t *rt, const td_seq_t *s, const td_worker_t *d,
                     uint64_t cached)
{
    return s->n_prompt <= rt->cfg.local_prefill_tokens || !any_prefill(rt, d) ||
           (cached > 0 && (double)cached >= rt->cfg.local_cached_share * (double)s->n_prompt);
}

/* kv_aware: what w holds of s by the cluster index, and what its slower tiers cost it (its last
 * heartbeat's measured disk load cost); also what it would fetch from another worker, and at what
 * measured cost. `memo`: td_fetchhint_pick's, for this request. */
static void kv_fill(td_router_t *rt, td_seq_t *s, const td_worker_t *w, td_place_load_t *l,
                    uint64_t *memo)
{
    l->cached_tokens = td_kvmirror_cached_tiers(rt, s, w, &l->cached_slow_tokens);
    l->s_per_token = w->s_per_token;
    l->slow_s_per_token = 0;
    for (size_t i = 0; i < w->n_hb_cache; i++)
        if (strcmp(w->hb_cache[i].name, "disk") == 0)
            l->slow_s_per_token = w->hb_cache[i].load_s_per_token;
    l->fetch_tokens = 0;
    l->fetch_s_per_token = 0;
    uint64_t gain; /* a decode worker fetches too, when it prefills locally */
    if (memo && td_fetchhint_pick(rt, s, w, l->cached_tokens, memo, &gain)) {
        l->fetch_tokens = gain * w->block_tokens;
        if (w->fetch_bps > 0 && w->block_bytes > 0)
            l->fetch_s_per_token = (double)w->block_bytes / w->fetch_bps / (double)w->block_tokens;
    }
}

/* td_fetchhint_pick's memo for one request: UINT64_MAX (not asked) per worker; NULL when out of
 * memory or without an index (then no fetch is predicted). */
static uint64_t *fetch_memo(td_router_t *rt)
{
    if (!rt->kvm || rt->cfg.fetch_min_blocks == 0 || !rt->n_workers)
        return NULL;
    uint64_t *m = malloc(rt->n_workers * sizeof(*m));
    if (m)
        memset(m, 0xff, rt->n_workers * sizeof(*m));
    return m;
}

/* kv_aware: the predicted time to first token of s on the best live prefill worker (what a decode
 * worker that does not prefill s itself waits for). */
static double remote_prefill_s(td_router_t *rt, td_seq_t *s, uint64_t *memo)
{
    double best = -1;
    for (size_t i = 0; i < rt->n_workers; i++) {
        td_worker_t *w = rt->workers[i];
        if (w->role != TANDEM__ROLE__ROLE_PREFILL || !live(w))
            continue;
        td_place_load_t l = w->load;
        kv_fill(rt, s, w, &l, memo);
        double t = td_place_prefill_ttft(&rt->placer, &l, s->n_prompt);
        if (best < 0 || t < best)
            best = t;
    }
    return best < 0 ? 0 : best;
}

td_worker_t *td__reqs_choose(td_router_t *rt, int role, td_seq_t *s, const td_worker_t *pair,
                             uint64_t amount)
{
    bool kv = rt->placer.policy == TD_PLACE_KV_AWARE;
    size_t n = 0;
    /* a cluster of up to CHOOSE_STACK workers chooses without allocating (once or twice per
     * request) */
    enum { CHOOSE_STACK = 16 };
    td_worker_t *cand_s[CHOOSE_STACK];
    td_place_load_t loads_s[CHOOSE_STACK];
    bool heap = rt->n_workers > CHOOSE_STACK;
    td_worker_t **cand = heap ? td_calloc(rt->n_workers, sizeof(*cand)) : cand_s;
    td_place_load_t *loads = heap ? td_calloc(rt->n_workers, sizeof(*loads)) : loads_s;
    td_worker_t *out = NULL;
    uint64_t *memo = kv ? fetch_memo(rt) : NULL;
    if (!cand || !loads)
        goto out;
    for (size_t i = 0; i < rt->n_workers; i++) {
        td_worker_t *w = rt->workers[i];
        if (w->role != role || !w->conn)
            continue;
        if (role == TANDEM__ROLE__ROLE_DECODE && tried(s, w))
            continue;
        if (pair && !fp_equal(w, pair))
            continue;
        cand[n] = w;
        loads[n] = w->load;
        if (kv) {
            kv_fill(rt, s, w, &loads[n], memo);
            if (role == TANDEM__ROLE__ROLE_DECODE)
                loads[n].local = local_on(rt, s, w, loads[n].cached_tokens);
        }
        n++;
    }
    if (!n)
        goto out;
    int k = role == TANDEM__ROLE__ROLE_DECODE
                ? td_place_decode_prompt(&rt->placer, loads, n, (uint32_t)amount, s->n_prompt,
                                         kv ? remote_prefill_s(rt, s, memo) : 0)
                : td_place_prefill(&rt->placer, loads, n, amount);
    if (k >= 0) {
        out = cand[k];
        out->load = loads[k];
        if (role == TANDEM__ROLE__ROLE_PREFILL) {
            s->prefill_cached = loads[k].cached_tokens;
            s->pw_hb = out->n_hb;
        } else {
            s->dw_hb = out->n_hb;
        }
    }
out:
    free(memo);
    if (heap) {
        free(cand);
        free(loads);
    }
    return out;
}

/* KV blocks of w that s needs at most: prompt plus max_tokens. */
static uint32_t blocks_for(const td_seq_t *s, const td_worker_t *w)
{
    uint64_t bt = w->block_tokens ? w->block_tokens : 16;
    uint64_t need = s->n_prompt + (uint64_t)s->job->sp.max_tokens;
    return (uint32_t)((need + bt - 1) / bt);
}

/* ---- placing ------------------------------------------------------------------------------- */

int td__reqs_place(td_router_t *rt, td_seq_t *s)
{
    for (;;) {
        td_worker_t *d = NULL;
        /* blocks depend on the worker's block size: use the first candidate's (a cluster shares
         * one layout, so they agree) */
        uint32_t blocks = 0, largest = 0;
        bool any = false;
        for (size_t i = 0; i < rt->n_workers; i++) {
            const td_worker_t *w = rt->workers[i];
            if (w->role != TANDEM__ROLE__ROLE_DECODE || !w->conn)
                continue;
            if (!any)
                blocks = blocks_for(s, w);
            any = true;
            largest = TD_MAX(largest, TD_MAX(w->total_blocks, w->load.total_blocks));
        }
        /* a sequence no decode pool can ever hold would wait for nothing */
        if (any && largest && blocks > largest)
            return td_err_set(TD_ERANGE,
                              "the request needs %u KV blocks (prompt plus max_tokens) and the "
                              "largest decode worker holds %u: lower max_tokens",
                              blocks, largest);
        d = td__reqs_choose(rt, TANDEM__ROLE__ROLE_DECODE, s, NULL, blocks);
        if (!d)
            return TD_ENOSPC;
        s->id = rt->next_id++;
        td__reqs_hash_add(rt, s);
        s->dw = d;
        s->pw = NULL;
        snprintf(s->log_dw, sizeof(s->log_dw), "%s", d->id);
        s->log_pw[0] = '\0';
        s->got_prefill_done = s->prefill_computed = false;
        s->local_cached = td_kvmirror_cached(rt, s, d);
        s->local = local_on(rt, s, d, s->local_cached);
        if (s->local)
            snprintf(s->log_pw, sizeof(s->log_pw), "local");
        Tandem__Sampling sp;
        td_msg_sampling_to_proto(&s->job->sp, s->seed, &sp);
        size_t n_toks;
        int32_t *owned;
        const int32_t *toks = td__reqs_task_tokens(s, &n_toks, &owned);
        if (!toks) {
            td__reqs_hash_del(rt, s);
            s->dw = NULL;
            return TD_ENOMEM;
        }
        Tandem__DecodeTask t = TANDEM__DECODE_TASK__INIT;
        t.request_id = s->id;
        t.n_tokens = n_toks;
        t.tokens = (int32_t *)toks;
        t.generated = (uint32_t)s->n_tokens; /* migration: resume after these */
        t.sampling = &sp;
        t.local_prefill = s->local;
        Tandem__FetchHint fh; /* points into a registry entry: sent before the loop runs again */
        t.fetch = s->local && td_fetchhint_fill(rt, s, d, &fh) ? &fh : NULL;
        t.tenant.data = s->job->tenant;
        t.tenant.len = s->job->tenant_len;
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_DECODE_TASK;
        f.decode_task = &t;
        int rc = td__reqs_send(d, &f);
        free(owned);
        if (rc) {
            /* the connection is going away: on_close will remove it; try another */
            td__reqs_hash_del(rt, s);
            s->dw = NULL;
            if (td__reqs_add_tried(s, d))
                return TD_ENOMEM;
            continue;
        }
        d->assigned++;
        s->state = TD_SEQ_ACCEPTING;
        s->t_placed = s->t_stage = td_now_s();
        s->base_tokens = s->n_tokens;
        rt->n_running++;
        td_metric_set(rt->m_running_g, (double)rt->n_running);
        td_logf(TD_LOG_DEBUG, s->job->log_id, "seq %llu -> decode %s (%s prefill)",
                (unsigned long long)s->id, d->id, s->local ? "local" : "remote");
        return 0;
    }
}

int td__reqs_place_or_wait(td_router_t *rt, td_seq_t *s, bool admit)
{
    int rc = td__reqs_place(rt, s);
    if (rc == 0)
        return 0;
    if (rc != TD_ENOSPC)
        return rc;
    if (admit && rt->n_waiting >= rt->cfg.max_waiting)
        return TD_EBUSY;
    td__reqs_wait_insert(rt, s, false);
    return 0;
}

/* Place waiting sequences in arrival order until one finds no worker (it stays at the head). */
void td_reqs_kick(td_router_t *rt)
{
    if (rt->stopping && !rt->jobs)
        return;
    while (rt->wait_head) {
        td_seq_t *s = rt->wait_head;
        td__reqs_wait_del(rt, s);
        int rc = td__reqs_place(rt, s);
        if (rc == 0)
            continue;
        /* still nothing: back to the head of the queue, keep the order */
        td__reqs_wait_insert(rt, s, true);
        if (rc != TD_ENOSPC)
            td__reqs_job_fail(s->job, rc == TD_ERANGE ? 400 : 500, rc, td_err_msg());
        break;
    }
}
