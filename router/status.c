/* status.c: the router's view of the cluster for StatusRequest (rpc_api.c): every registered
 * worker with its last heartbeat (load, prefix cache tiers) and the sequences this router has on
 * it, and the sequences in flight. */
#include "router.h"

#include "td_error.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

static const char *state_name(td_seq_state_t s)
{
    switch (s) {
    case TD_SEQ_NEW:
        return "new";
    case TD_SEQ_WAITING:
        return "waiting";
    case TD_SEQ_ACCEPTING:
        return "accepting";
    case TD_SEQ_RUNNING:
        return "running";
    case TD_SEQ_DONE:
        return "done";
    }
    return "?";
}

static int worker_index(const td_router_t *rt, const td_worker_t *w)
{
    for (size_t i = 0; w && i < rt->n_workers; i++)
        if (rt->workers[i] == w)
            return (int)i;
    return -1;
}

/* Whether s still needs work from a worker (placed or waiting, not finished). */
static bool in_flight(const td_seq_t *s)
{
    return s->state != TD_SEQ_DONE;
}

int td_status_build(td_router_t *rt, bool with_requests, td_status_t *st)
{
    memset(st, 0, sizeof(*st));
    tandem__status_response__init(&st->resp);
    size_t n = rt->n_workers, nt = n * TD_WORKER_MAX_TIERS, m = 0;
    td_job_t *oldest = NULL;
    for (td_job_t *j = rt->jobs; j; j = j->next) {
        oldest = j;
        for (size_t i = 0; i < j->n_seqs; i++)
            m += in_flight(&j->seqs[i]);
    }
    Tandem__WorkerStatus *ws = st->mem[0] = td_calloc(n ? n : 1, sizeof(*ws));
    Tandem__WorkerStatus **wp = st->mem[1] = td_calloc(n ? n : 1, sizeof(*wp));
    Tandem__Load *loads = st->mem[2] = td_calloc(n ? n : 1, sizeof(*loads));
    Tandem__CacheTier *tiers = st->mem[3] = td_calloc(nt ? nt : 1, sizeof(*tiers));
    Tandem__CacheTier **tp = st->mem[4] = td_calloc(nt ? nt : 1, sizeof(*tp));
    Tandem__RequestStatus *rs = st->mem[5] = td_calloc(m ? m : 1, sizeof(*rs));
    Tandem__RequestStatus **rp = st->mem[6] = td_calloc(m ? m : 1, sizeof(*rp));
    if (!ws || !wp || !loads || !tiers || !tp || !rs || !rp)
        return td_err_set(TD_ENOMEM, "out of memory");
    double now = td_now_s();
    for (size_t i = 0; i < n; i++) {
        const td_worker_t *w = rt->workers[i];
        Tandem__Load *l = &loads[i];
        tandem__worker_status__init(&ws[i]);
        tandem__load__init(l);
        l->queued_prefill_tokens = w->hb_queued_tokens;
        l->running_sequences = w->hb_running;
        l->waiting_sequences = w->hb_waiting;
        l->free_blocks = w->hb_free;
        l->total_blocks = w->hb_total;
        l->draining = w->load.draining;
        l->cache = &tp[i * TD_WORKER_MAX_TIERS];
        l->n_cache = w->n_hb_cache;
        for (size_t k = 0; k < w->n_hb_cache; k++) {
            Tandem__CacheTier *t = &tiers[i * TD_WORKER_MAX_TIERS + k];
            tandem__cache_tier__init(t);
            t->tier = (char *)w->hb_cache[k].name;
            t->cached_blocks = w->hb_cache[k].cached_blocks;
            t->queries = w->hb_cache[k].queries;
            t->hits = w->hb_cache[k].hits;
            l->cache[k] = t;
        }
        ws[i].worker_id = w->id;
        ws[i].role = w->role;
        ws[i].load = l;
        ws[i].alive = w->load.alive && w->conn;
        ws[i].assigned = w->assigned;
        ws[i].last_heartbeat_age = now - w->last_hb;
        wp[i] = &ws[i];
    }
    size_t k = 0;
    for (td_job_t *j = oldest; j; j = j->prev)
        for (size_t i = 0; i < j->n_seqs; i++) {
            const td_seq_t *s = &j->seqs[i];
            if (!in_flight(s))
                continue;
            int di = worker_index(rt, s->dw), pi = worker_index(rt, s->pw);
            if (di >= 0)
                ws[di].in_flight++;
            if (pi >= 0 && pi != di)
                ws[pi].in_flight++;
            if (!with_requests)
                continue;
            Tandem__RequestStatus *r = &rs[k];
            tandem__request_status__init(r);
            r->id = (char *)j->log_id;
            r->index = (uint32_t)s->index;
            r->state = (char *)state_name(s->state);
            r->decode_worker = s->dw ? s->dw->id : "";
            r->prefill_worker = s->pw ? s->pw->id : "";
            r->age_s = now - j->t_arrival;
            r->prompt_tokens = (uint32_t)s->n_prompt;
            r->generated_tokens = s->n_tokens;
            r->retries = (uint32_t)s->retries;
            rp[k++] = r;
        }
    st->resp.router_id = (char *)rt->id;
    st->resp.model = (char *)rt->model_name;
    st->resp.n_workers = n;
    st->resp.workers = wp;
    st->resp.running = (uint32_t)rt->n_running;
    st->resp.waiting = (uint32_t)rt->n_waiting;
    st->resp.n_requests = k;
    st->resp.requests = rp;
    return 0;
}

void td_status_free(td_status_t *st)
{
    for (size_t i = 0; i < sizeof(st->mem) / sizeof(st->mem[0]); i++)
        free(st->mem[i]);
    memset(st, 0, sizeof(*st));
}
