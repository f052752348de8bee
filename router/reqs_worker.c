/* reqs_worker.c: frames about requests from workers (DecodeAccept, Error, PrefillDone,
 * TokenChunk) and worker failures: a decode worker that is full or draining makes the sequence try
 * the next one or wait; a worker that fails or leaves before the client saw a token gets the
 * sequence retried once on a new pair; otherwise the job fails with a message naming the worker. */
#include "reqs_impl.h"

#include "td_error.h"
#include "td_log.h"
#include "td_msg.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>

bool td__reqs_retry(td_router_t *rt, td_seq_t *s, const char *why)
{
    td_job_t *j = s->job;
    char msg[700];
    if (rt->stopping) {
        td__reqs_job_fail(j, 503, TD_EUNREACH, why);
        return false;
    }
    if (s->n_tokens > 0 && !rt->cfg.migrate) {
        snprintf(msg, sizeof(msg), "%s (after %llu tokens; migration.enabled is off)", why,
                 (unsigned long long)s->n_tokens);
        td__reqs_job_fail(j, 503, TD_EUNREACH, msg);
        return false;
    }
    if ((uint64_t)s->retries >= rt->cfg.migrate_attempts) {
        snprintf(msg, sizeof(msg), "%s (gave up after %d re-placements: migration.max_attempts)",
                 why, s->retries);
        td__reqs_job_fail(j, 503, TD_EUNREACH, msg);
        return false;
    }
    if (s->n_tokens > 0 && s->n_tokens >= (uint64_t)j->sp.max_tokens) {
        /* every token is here; only the finish was lost with the worker */
        s->completion_tokens = (uint32_t)s->n_tokens;
        td__reqs_finish(rt, s, TD_RESP_LENGTH, NULL);
        td__reqs_job_maybe_done(j);
        return !j->ended;
    }
    s->retries++;
    if (s->n_tokens)
        td_logf(TD_LOG_INFO, j->log_id,
                "migrating sequence %d with %llu generated tokens (attempt %d) after: %s",
                s->index, (unsigned long long)s->n_tokens, s->retries + 1, why);
    else
        td_logf(TD_LOG_INFO, j->log_id, "retrying sequence %d (attempt %d) after: %s", s->index,
                s->retries + 1, why);
    td_metric_add(rt->m_migrations, 1);
    td_worker_t *stalled = s->dw;
    td__reqs_detach(rt, s, true);
    s->n_tried = 0;
    if (stalled && td__reqs_add_tried(s, stalled)) {
        td__reqs_job_fail(j, 500, TD_ENOMEM, "out of memory");
        return false;
    }
    int rc = td__reqs_place_or_wait(rt, s, false);
    if (rc) {
        td__reqs_job_fail(j, 503, rc, why);
        return false;
    }
    return true;
}

/* ---- worker frames ------------------------------------------------------------------------- */

/* Decode worker w holds the sequence's KV blocks: send the prompt to a prefill worker of the same
 * layout, unless it prefills locally. */
static void on_accept(td_router_t *rt, td_worker_t *w, const Tandem__DecodeAccept *a)
{
    td_seq_t *s = td__reqs_find(rt, a->request_id);
    if (!s || s->dw != w || s->state != TD_SEQ_ACCEPTING)
        return;
    s->state = TD_SEQ_RUNNING;
    s->t_stage = td_now_s();
    if (!s->retries)
        td_metric_observe(rt->m_queue, s->t_stage - s->job->t_arrival);
    if (s->local)
        return;
    size_t n_toks;
    int32_t *owned;
    const int32_t *toks = td__reqs_task_tokens(s, &n_toks, &owned);
    if (!toks) {
        td__reqs_job_fail(s->job, 500, TD_ENOMEM, "out of memory");
        return;
    }
    td_worker_t *p = td__reqs_choose(rt, TANDEM__ROLE__ROLE_PREFILL, s, w, s->n_prompt);
    if (!p) {
        /* every prefill worker left (or is full) since we decided: prefill on decode instead */
        td_logf(TD_LOG_INFO, s->job->log_id, "no prefill worker for seq %llu: replacing",
                (unsigned long long)s->id);
        free(owned);
        td__reqs_detach(rt, s, true);
        int rc = td__reqs_place_or_wait(rt, s, false);
        if (rc)
            td__reqs_job_fail(s->job, 503, rc, "no worker could take the request");
        return;
    }
    Tandem__Sampling sp;
    td_msg_sampling_to_proto(&s->job->sp, s->seed, &sp);
    Tandem__PrefillTask t = TANDEM__PREFILL_TASK__INIT;
    t.tenant.data = s->job->tenant;
    t.tenant.len = s->job->tenant_len;
    t.request_id = s->id;
    t.n_tokens = n_toks;
    t.tokens = (int32_t *)toks;
    t.generated = (uint32_t)s->n_tokens;
    t.sampling = &sp;
    t.decode_worker = w->id;
    t.decode_blob.data = w->blob;
    t.decode_blob.len = w->blob_len;
    t.n_dst_blocks = a->n_blocks;
    t.dst_blocks = a->blocks;
    t.decode_request_id = a->worker_request_id;
    Tandem__FetchHint fh;
    t.fetch = td_fetchhint_fill(rt, s, p, &fh) ? &fh : NULL;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_PREFILL_TASK;
    f.prefill_task = &t;
    s->pw = p;
    snprintf(s->log_pw, sizeof(s->log_pw), "%s", p->id);
    p->assigned++;
    int rc = td__reqs_send(p, &f);
    free(owned);
    if (rc != 0) {
        s->pw = NULL;
        td__reqs_retry(rt, s, "the prefill worker's connection closed");
    }
}

/* Worker w refused or failed a sequence. A full or draining decode worker (ENOSPC or EBUSY before
 * it accepted): the next one, else the waiting queue. A failed prefill: retry. Anything else fails
 * the job. */
static void on_error(td_router_t *rt, td_worker_t *w, const Tandem__Error *e)
{
    td_seq_t *s = td__reqs_find(rt, e->request_id);
    if (!s || (s->dw != w && s->pw != w)) {
        if (!s)
            td_logf(TD_LOG_DEBUG, NULL, "worker %s: error for unknown request %llu: %s", w->id,
                    (unsigned long long)e->request_id, e->message ? e->message : "");
        return;
    }
    const char *msg = e->message && *e->message ? e->message : td_strerror(e->code);
    if (s->dw == w && s->state == TD_SEQ_ACCEPTING &&
        (e->code == TD_ENOSPC || e->code == TD_EBUSY)) {
        /* the decode worker is full, or draining (drained through another router, or stopping
         * on SIGTERM) and took no part of the request: another one, else wait. A draining one
         * stays out of rotation until a heartbeat says it is back. */
        if (e->code == TD_EBUSY)
            w->load.draining = true;
        td__reqs_hash_del(rt, s);
        rt->n_running--;
        td_metric_set(rt->m_running_g, (double)rt->n_running);
        s->state = TD_SEQ_NEW;
        s->dw = NULL;
        if (td__reqs_add_tried(s, w)) {
            td__reqs_job_fail(s->job, 500, TD_ENOMEM, "out of memory");
            return;
        }
        int rc = td__reqs_place_or_wait(rt, s, false);
        if (rc)
            td__reqs_job_fail(s->job, 503, rc, msg);
        return;
    }
    char full[600];
    snprintf(full, sizeof(full), "%s worker %s: %s", s->dw == w ? "decode" : "prefill", w->id, msg);
    int status = e->code == TD_EINVAL || e->code == TD_ERANGE ? 400 : 500;
    if (s->pw == w && s->dw != w) {
        if (e->code == TD_EBUSY)
            w->load.draining = true; /* the retry goes elsewhere */
        s->pw = NULL;
        s->got_prefill_done = true; /* it sends nothing more */
        td__reqs_retry(rt, s, full);
        return;
    }
    if (status == 500 && e->code != TD_ENOMEM) {
        /* the decode worker failed the sequence (its KV handoff broke or timed out, it is
         * stopping...): another pair resumes it */
        td__reqs_retry(rt, s, full);
        return;
    }
    td__reqs_job_fail(s->job, status, e->code, full);
}

/* The prefill worker finished (or failed) the prompt; the decode worker now generates. */
static void on_prefill_done(td_router_t *rt, td_worker_t *w, const Tandem__PrefillDone *d)
{
    td_seq_t *s = td__reqs_find(rt, d->request_id);
    if (!s || s->pw != w)
        return;
    if (d->computed) {
        s->prefill_computed = true; /* progress: only the KV handoff remains */
        return;
    }
    s->got_prefill_done = true;
    s->pw = NULL;
    s->t_stage = td_now_s(); /* the KV handoff's deadline runs from here */
    if (d->status >= 0) {
        /* kv_aware's cost model: seconds per computed token, an EWMA per worker */
        uint64_t computed = s->n_prompt - TD_MIN(s->prefill_cached, (uint64_t)s->n_prompt);
        td_place_prefill_done(&w->load, computed, s->pw_hb == w->n_hb);
        if (d->compute_seconds > 0 && computed > 0) {
            double x = d->compute_seconds / (double)computed;
            w->s_per_token = w->s_per_token > 0 ? 0.8 * w->s_per_token + 0.2 * x : x;
        }
        return;
    }
    char msg[600];
    snprintf(msg, sizeof(msg), "prefill worker %s failed: %s", w->id,
             d->message && *d->message ? d->message : td_strerror(d->status));
    td__reqs_retry(rt, s, msg);
}

/* Generated tokens (and maybe the finish) of a sequence from its decode worker. */
static void on_chunk(td_router_t *rt, td_worker_t *w, const Tandem__TokenChunk *c)
{
    td_seq_t *s = td__reqs_find(rt, c->request_id);
    if (!s || s->dw != w || s->state == TD_SEQ_DONE)
        return;
    td_job_t *j = s->job;
    if (c->prompt_tokens)
        s->prompt_tokens = c->prompt_tokens;
    if (c->cached_tokens)
        s->cached_tokens = c->cached_tokens;
    bool want_lp = j->sp.logprobs >= 0;
    for (size_t i = 0; i < c->n_tokens; i++) {
        const Tandem__TokenLogprob *lp = want_lp && i < c->n_logprobs ? c->logprobs[i] : NULL;
        if (!td__reqs_token(rt, s, c->tokens[i], lp))
            return; /* stop string (the job may have ended) or failure */
        if (s->id != c->request_id)
            return; /* the front end aborted the job meanwhile */
    }
    if (c->finish == TANDEM__FINISH__FINISH_ABORT) {
        char msg[600];
        snprintf(msg, sizeof(msg), "decode worker %s aborted the request: %s", w->id,
                 c->error && *c->error ? c->error : "no reason given");
        td__reqs_job_fail(j, 500, TD_EINTERNAL, msg);
        return;
    }
    if (c->finish != TANDEM__FINISH__FINISH_NONE) {
        s->completion_tokens = c->completion_tokens ? c->completion_tokens : (uint32_t)s->n_tokens;
        j->ops->flush(j, s->index);
        td__reqs_finish(rt, s,
                        c->finish == TANDEM__FINISH__FINISH_LENGTH ? TD_RESP_LENGTH : TD_RESP_STOP,
                        NULL);
        td__reqs_job_maybe_done(j);
        td_reqs_kick(rt);
        return;
    }
    j->ops->flush(j, s->index);
}

void td_reqs_on_frame(td_router_t *rt, td_worker_t *w, const Tandem__Frame *f)
{
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_DECODE_ACCEPT:
        on_accept(rt, w, f->decode_accept);
        break;
    case TANDEM__FRAME__BODY_ERROR:
        on_error(rt, w, f->error);
        break;
    case TANDEM__FRAME__BODY_PREFILL_DONE:
        on_prefill_done(rt, w, f->prefill_done);
        break;
    case TANDEM__FRAME__BODY_TOKEN_CHUNK:
        on_chunk(rt, w, f->token_chunk);
        break;
    default:
        break;
    }
}

/* ---- worker failure ------------------------------------------------------------------------ */

/* Collect the ids of the sequences worker w holds, then handle each (handling may end jobs). */
void td_reqs_worker_gone(td_router_t *rt, td_worker_t *w)
{
    size_t n = 0, cap = 16;
    uint64_t *ids = malloc(cap * sizeof(*ids));
    if (!ids)
        return;
    for (td_job_t *j = rt->jobs; j; j = j->next)
        for (size_t i = 0; i < j->n_seqs; i++) {
            td_seq_t *s = &j->seqs[i];
            if (s->id && (s->dw == w || s->pw == w)) {
                if (n == cap) {
                    uint64_t *t = td_reallocarray(ids, cap * 2, sizeof(*ids));
                    if (!t)
                        break;
                    ids = t;
                    cap *= 2;
                }
                ids[n++] = s->id;
            }
        }
    for (size_t i = 0; i < n; i++) {
        td_seq_t *s = td__reqs_find(rt, ids[i]);
        if (!s)
            continue;
        char msg[300];
        if (s->pw == w) {
            s->pw = NULL;
            s->got_prefill_done = true;
            if (s->prefill_computed)
                snprintf(msg, sizeof(msg),
                         "prefill worker %s left after computing the prompt, before its KV "
                         "reached decode worker %s: the handoff failed",
                         w->id, s->dw ? s->dw->id : "?");
            else
                snprintf(msg, sizeof(msg), "prefill worker %s left before finishing the prompt",
                         w->id);
        } else {
            snprintf(msg, sizeof(msg), "decode worker %s left while running the request", w->id);
        }
        if (s->dw == w) {
            /* nothing to cancel on it: it is gone */
            s->dw = NULL;
            if (s->state == TD_SEQ_ACCEPTING || s->state == TD_SEQ_RUNNING) {
                if (s->pw && !s->got_prefill_done)
                    td__reqs_send_cancel(s->pw, s->id);
                s->pw = NULL;
                s->got_prefill_done = true;
            }
        }
        td__reqs_retry(rt, s, msg);
    }
    free(ids);
}
