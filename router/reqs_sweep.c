/* reqs_sweep.c: the periodic part of the request state machine (the sweep timer calls it every
 * 100 ms): request deadlines, the deadline of each stage of an attempt (a worker that misses one
 * loses the sequence to another pair: reqs_worker.c re-places it), sequences that wait while no
 * decode worker is available, and the waiting queue; and failing every job at shutdown. */
#include "reqs_impl.h"

#include "td_error.h"
#include "td_log.h"

#include <stdio.h>

const char *td__reqs_stage_late(const td_router_cfg_t *c, const td_seq_t *s, double now,
                                char *why, size_t cap)
{
    double age = now - s->t_stage;
    const char *dw = s->dw ? s->dw->id : "?";
    if (s->state == TD_SEQ_ACCEPTING) {
        if (c->dl_reservation_s > 0 && age > c->dl_reservation_s) {
            snprintf(why, cap,
                     "decode worker %s did not answer the DecodeTask within %.3g s "
                     "(deadline.reservation_s)",
                     dw, c->dl_reservation_s);
            return why;
        }
        return NULL;
    }
    if (s->state != TD_SEQ_RUNNING)
        return NULL;
    bool first = s->n_tokens == s->base_tokens; /* no token in this attempt yet */
    if (!first) {
        if (c->dl_token_stall_s > 0 && now - s->t_last > c->dl_token_stall_s) {
            snprintf(why, cap,
                     "decode worker %s stalled: no token for %.3g s (deadline.token_stall_s)", dw,
                     c->dl_token_stall_s);
            return why;
        }
        return NULL;
    }
    if (s->pw && !s->got_prefill_done) {
        if (c->dl_prefill_s > 0 && age > c->dl_prefill_s) {
            snprintf(why, cap,
                     "prefill worker %s did not finish the prompt and hand its KV to decode "
                     "worker %s within %.3g s (deadline.prefill_s)",
                     s->pw->id, dw, c->dl_prefill_s);
            return why;
        }
    } else if (!s->local && s->got_prefill_done) {
        if (c->dl_kv_handoff_s > 0 && age > c->dl_kv_handoff_s) {
            snprintf(why, cap,
                     "the prompt was prefilled and its KV handed over, but decode worker %s sent "
                     "no token within %.3g s (deadline.kv_handoff_s)",
                     dw, c->dl_kv_handoff_s);
            return why;
        }
    }
    /* the whole attempt, from the decode worker's accept */
    double since_accept = s->local || !s->got_prefill_done ? age : now - s->t_placed;
    if (c->dl_first_token_s > 0 && since_accept > c->dl_first_token_s) {
        snprintf(why, cap, "decode worker %s sent no token within %.3g s (deadline.first_token_s)",
                 dw, c->dl_first_token_s);
        return why;
    }
    return NULL;
}

/* The first sequence that missed a stage deadline (its message in why), or NULL. */
static td_seq_t *find_late(td_router_t *rt, double now, char *why, size_t cap)
{
    for (td_job_t *j = rt->jobs; j; j = j->next) {
        if (j->abort_queued || j->ended)
            continue;
        for (size_t i = 0; i < j->n_seqs; i++)
            if (j->seqs[i].id && td__reqs_stage_late(&rt->cfg, &j->seqs[i], now, why, cap))
                return &j->seqs[i];
    }
    return NULL;
}

void td_reqs_sweep(td_router_t *rt, double now)
{
    /* request deadlines: collect first, failing ends jobs */
    for (;;) {
        td_job_t *late = NULL;
        for (td_job_t *j = rt->jobs; j; j = j->next)
            if (j->deadline > 0 && now > j->deadline && !j->abort_queued) {
                late = j;
                break;
            }
        if (!late)
            break;
        char msg[200];
        snprintf(msg, sizeof(msg), "the request did not finish within %.3g s (request_timeout_s)",
                 rt->cfg.request_timeout_s);
        td__reqs_job_fail(late, 504, TD_ETIMEDOUT, msg);
    }
    /* stage deadlines: the sequence moves (each one handled changes the lists: search again) */
    char why[512];
    for (int guard = 0; guard < 100000; guard++) {
        td_seq_t *s = find_late(rt, now, why, sizeof(why));
        if (!s)
            break;
        td_logf(TD_LOG_WARN, s->job->log_id, "%s", why);
        td__reqs_retry(rt, s, why);
    }
    /* waiting while no decode worker is available at all: 503 after admission.no_worker_wait_s */
    if (rt->wait_head && !td_registry_has_decode(rt)) {
        for (;;) {
            td_seq_t *s = rt->wait_head;
            while (s && now - s->t_wait <= rt->cfg.no_worker_wait_s)
                s = s->wnext;
            if (!s)
                break;
            snprintf(why, sizeof(why),
                     "no decode worker is available (none registered or all draining) after "
                     "waiting %.3g s (admission.no_worker_wait_s)",
                     now - s->t_wait);
            td__reqs_job_fail(s->job, 503, TD_EUNREACH, why);
        }
    }
    /* over capacity: a queue that outgrows what the workers serve would make every request wait
     * out its deadline (none served in time); past admission.max_queue_wait_s a request that has
     * delivered nothing gets 503 with Retry-After, so the ones taken finish and a client or
     * balancer can go elsewhere. A migrating sequence (tokens delivered) waits on. */
    if (rt->cfg.max_queue_wait_s > 0) {
        for (;;) {
            td_seq_t *s = rt->wait_head;
            while (s && (s->n_tokens > 0 || now - s->t_wait <= rt->cfg.max_queue_wait_s))
                s = s->wnext;
            if (!s)
                break;
            snprintf(why, sizeof(why),
                     "the cluster is over capacity: no worker took the request in %.3g s "
                     "(admission.max_queue_wait_s)",
                     now - s->t_wait);
            td_metric_add(rt->m_shed, 1);
            td__reqs_job_fail(s->job, 503, TD_EBUSY, why);
        }
    }
    td_reqs_kick(rt);
}

void td_reqs_abort_all(td_router_t *rt, const char *msg)
{
    while (rt->jobs)
        td__reqs_job_fail(rt->jobs, 503, TD_ECANCELED, msg);
}
