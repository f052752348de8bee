/* reqs.c: the core of the request state machine: the table that maps the router ids in worker
 * frames back to sequences, the one path by which frames for requests reach workers, a sequence
 * leaving its workers, and the end of a job. The other parts are listed in reqs_impl.h. */
#include "reqs_impl.h"

#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>

/* ---- the id table ------------------------------------------------------------------------ */

/* The hash chain of router id `id`. */
static size_t bucket_of(const td_router_t *rt, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) % rt->n_buckets;
}

void td__reqs_hash_add(td_router_t *rt, td_seq_t *s)
{
    size_t b = bucket_of(rt, s->id);
    s->hnext = rt->buckets[b];
    rt->buckets[b] = s;
}

void td__reqs_hash_del(td_router_t *rt, td_seq_t *s)
{
    if (!s->id)
        return;
    td_seq_t **pp = &rt->buckets[bucket_of(rt, s->id)];
    while (*pp && *pp != s)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = s->hnext;
    s->hnext = NULL;
    s->id = 0;
}

td_seq_t *td__reqs_find(td_router_t *rt, uint64_t id)
{
    if (!id)
        return NULL;
    for (td_seq_t *s = rt->buckets[bucket_of(rt, id)]; s; s = s->hnext)
        if (s->id == id)
            return s;
    return NULL;
}

/* ---- sending ------------------------------------------------------------------------------- */

int td__reqs_send(td_worker_t *w, Tandem__Frame *f)
{
    if (!w || !w->conn)
        return TD_ECLOSED;
    return td_rpc_send(w->conn, f);
}

void td__reqs_send_cancel(td_worker_t *w, uint64_t id)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    c.request_id = id;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_CANCEL;
    f.cancel = &c;
    td__reqs_send(w, &f);
}

/* ---- sequences and jobs ending --------------------------------------------------------------- */

void td__reqs_detach(td_router_t *rt, td_seq_t *s, bool cancel)
{
    td__reqs_wait_del(rt, s);
    if (s->state == TD_SEQ_ACCEPTING || s->state == TD_SEQ_RUNNING) {
        if (cancel) {
            td__reqs_send_cancel(s->dw, s->id);
            if (s->pw && !s->got_prefill_done)
                td__reqs_send_cancel(s->pw, s->id);
        }
        if (s->state == TD_SEQ_RUNNING && s->dw)
            td_place_seq_done(&s->dw->load, s->dw_hb == s->dw->n_hb);
        TD_ASSERT(rt->n_running > 0);
        rt->n_running--;
        td_metric_set(rt->m_running_g, (double)rt->n_running);
    }
    td__reqs_hash_del(rt, s);
    s->dw = s->pw = NULL;
    s->state = TD_SEQ_NEW;
}

void td__reqs_job_unlink(td_router_t *rt, td_job_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else if (rt->jobs == j)
        rt->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    j->next = j->prev = NULL;
    rt->n_jobs--;
    if (j->abort_queued) {
        td_job_t **pp = &rt->aborts;
        while (*pp && *pp != j)
            pp = &(*pp)->anext;
        if (*pp)
            *pp = j->anext;
        j->abort_queued = false;
    }
}

void td__reqs_job_fail(td_job_t *j, int http_status, int code, const char *msg)
{
    td_router_t *rt = j->rt;
    if (j->ended)
        return;
    j->ended = true;
    for (size_t i = 0; i < j->n_seqs; i++)
        if (j->seqs[i].state != TD_SEQ_DONE)
            td__reqs_detach(rt, &j->seqs[i], true);
    td__reqs_job_unlink(rt, j);
    td_metric_add(rt->m_ok_abort, 1);
    td_logf(http_status == 499 ? TD_LOG_DEBUG : TD_LOG_INFO, j->log_id, "request failed: %s", msg);
    j->ops->fail(j, http_status, code, msg);
}

void td__reqs_job_maybe_done(td_job_t *j)
{
    td_router_t *rt = j->rt;
    if (j->ended || j->n_done < j->n_seqs)
        return;
    j->ended = true;
    td__reqs_job_unlink(rt, j);
    double now = td_now_s();
    td_metric_observe(rt->m_e2e, now - j->t_arrival);
    j->ops->done(j);
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

int td_reqs_init(td_router_t *rt)
{
    rt->n_buckets = 4096;
    rt->buckets = td_calloc(rt->n_buckets, sizeof(*rt->buckets));
    if (!rt->buckets)
        return TD_ENOMEM;
    rt->next_id = 1;
    uv_timer_init(rt->loop, &rt->defer_timer);
    rt->defer_timer.data = rt;
    /* the timer callback is set on start (uv_timer_start needs it) */
    return 0;
}

void td_reqs_close(td_router_t *rt)
{
    free(rt->buckets);
    rt->buckets = NULL;
}
