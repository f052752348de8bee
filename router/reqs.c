/* reqs.c: the request state machine. Every sequence of every job is placed, tracked and ended
 * here; worker frames for requests arrive here; worker failures are decided here. */
#include "router.h"
#include "stopstr.h"

#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

#define RETRY_MAX 1 /* re-placements of a sequence after a worker failed it */

/* ---- the id table ------------------------------------------------------------------------ */

static size_t bucket_of(const td_router_t *rt, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) % rt->n_buckets;
}

static void seq_hash_add(td_router_t *rt, td_seq_t *s)
{
    size_t b = bucket_of(rt, s->id);
    s->hnext = rt->buckets[b];
    rt->buckets[b] = s;
}

static void seq_hash_del(td_router_t *rt, td_seq_t *s)
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

static td_seq_t *seq_find(td_router_t *rt, uint64_t id)
{
    if (!id)
        return NULL;
    for (td_seq_t *s = rt->buckets[bucket_of(rt, id)]; s; s = s->hnext)
        if (s->id == id)
            return s;
    return NULL;
}

/* ---- the waiting queue ------------------------------------------------------------------- */

static void wait_push(td_router_t *rt, td_seq_t *s)
{
    s->state = TD_SEQ_WAITING;
    s->wnext = NULL;
    s->wprev = rt->wait_tail;
    if (rt->wait_tail)
        rt->wait_tail->wnext = s;
    else
        rt->wait_head = s;
    rt->wait_tail = s;
    rt->n_waiting++;
    td_metric_set(rt->m_waiting_g, (double)rt->n_waiting);
}

static void wait_del(td_router_t *rt, td_seq_t *s)
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

/* ---- sending ------------------------------------------------------------------------------- */

static int send_frame(td_worker_t *w, Tandem__Frame *f)
{
    if (!w || !w->conn)
        return TD_ECLOSED;
    return td_rpc_send(w->conn, f);
}

static void send_cancel(td_worker_t *w, uint64_t id)
{
    Tandem__Cancel c = TANDEM__CANCEL__INIT;
    c.request_id = id;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_CANCEL;
    f.cancel = &c;
    send_frame(w, &f);
}

static void fill_sampling(const td_seq_t *s, Tandem__Sampling *sp)
{
    const td_sampling_t *p = &s->job->sp;
    sp->temperature = p->temperature;
    sp->top_k = p->top_k;
    sp->top_p = p->top_p;
    sp->min_p = p->min_p;
    sp->seed = s->seed;
    sp->max_tokens = p->max_tokens;
    sp->n_stop_ids = p->n_stop_ids;
    sp->stop_ids = p->stop_ids;
    sp->ignore_eos = p->ignore_eos;
    sp->logprobs = p->logprobs;
}

/* ---- sequence bookkeeping ------------------------------------------------------------------ */

/* The sequence leaves its workers: Cancel where they still hold it, forget its id. */
static void seq_detach(td_router_t *rt, td_seq_t *s, bool cancel)
{
    wait_del(rt, s);
    if (s->state == TD_SEQ_ACCEPTING || s->state == TD_SEQ_RUNNING) {
        if (cancel) {
            send_cancel(s->dw, s->id);
            if (s->pw && !s->got_prefill_done)
                send_cancel(s->pw, s->id);
        }
        TD_ASSERT(rt->n_running > 0);
        rt->n_running--;
        td_metric_set(rt->m_running_g, (double)rt->n_running);
    }
    seq_hash_del(rt, s);
    s->dw = s->pw = NULL;
    s->state = TD_SEQ_NEW;
}

static void job_unlink(td_router_t *rt, td_job_t *j)
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

/* End the job with a failure: cancel every sequence, count it, tell the front end. */
static void job_fail(td_job_t *j, int http_status, int code, const char *msg)
{
    td_router_t *rt = j->rt;
    if (j->ended)
        return;
    j->ended = true;
    for (size_t i = 0; i < j->n_seqs; i++)
        if (j->seqs[i].state != TD_SEQ_DONE)
            seq_detach(rt, &j->seqs[i], true);
    job_unlink(rt, j);
    td_metric_add(rt->m_ok_abort, 1);
    td_logf(http_status == 499 ? TD_LOG_DEBUG : TD_LOG_INFO, j->log_id, "request failed: %s", msg);
    j->ops->fail(j, http_status, code, msg);
}

static void job_maybe_done(td_job_t *j)
{
    td_router_t *rt = j->rt;
    if (j->ended || j->n_done < j->n_seqs)
        return;
    j->ended = true;
    job_unlink(rt, j);
    double now = td_now_s();
    td_metric_observe(rt->m_e2e, now - j->t_arrival);
    j->ops->done(j);
}

/* ---- placement ----------------------------------------------------------------------------- */

static bool tried(const td_seq_t *s, const td_worker_t *w)
{
    for (size_t i = 0; i < s->n_tried; i++)
        if (s->tried[i] == w->serial)
            return true;
    return false;
}

static int add_tried(td_seq_t *s, const td_worker_t *w)
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

static bool fp_equal(const td_worker_t *a, const td_worker_t *b)
{
    return a->fp_len == b->fp_len && memcmp(a->fp, b->fp, a->fp_len) == 0;
}

static bool live(const td_worker_t *w)
{
    return w->conn && w->load.alive && !w->load.draining;
}

/* Choose among the workers of `role` that pass `ok`; the placement policy decides. */
static td_worker_t *choose(td_router_t *rt, int role, const td_seq_t *s, const td_worker_t *pair,
                           uint64_t amount)
{
    size_t n = 0;
    td_worker_t **cand = td_calloc(rt->n_workers ? rt->n_workers : 1, sizeof(*cand));
    td_place_load_t *loads = td_calloc(rt->n_workers ? rt->n_workers : 1, sizeof(*loads));
    td_worker_t *out = NULL;
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
        n++;
    }
    if (!n)
        goto out;
    int k = role == TANDEM__ROLE__ROLE_DECODE
                ? td_place_decode(&rt->placer, loads, n, (uint32_t)amount)
                : td_place_prefill(&rt->placer, loads, n, amount);
    if (k >= 0) {
        out = cand[k];
        out->load = loads[k];
    }
out:
    free(cand);
    free(loads);
    return out;
}

static bool any_prefill(const td_router_t *rt, const td_worker_t *pair)
{
    for (size_t i = 0; i < rt->n_workers; i++) {
        const td_worker_t *w = rt->workers[i];
        if (w->role == TANDEM__ROLE__ROLE_PREFILL && live(w) && fp_equal(w, pair))
            return true;
    }
    return false;
}

static uint32_t blocks_for(const td_seq_t *s, const td_worker_t *w)
{
    uint64_t bt = w->block_tokens ? w->block_tokens : 16;
    uint64_t need = s->n_prompt + (uint64_t)s->job->sp.max_tokens;
    return (uint32_t)((need + bt - 1) / bt);
}

/* Try to place a sequence on a decode worker: 0 (DecodeTask sent), TD_ENOSPC when no decode
 * worker can take it now, or another code when sending failed. */
static int place(td_router_t *rt, td_seq_t *s)
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
        d = choose(rt, TANDEM__ROLE__ROLE_DECODE, s, NULL, blocks);
        if (!d)
            return TD_ENOSPC;
        s->id = rt->next_id++;
        seq_hash_add(rt, s);
        s->dw = d;
        s->pw = NULL;
        s->got_prefill_done = false;
        s->local = s->n_prompt <= rt->cfg.local_prefill_tokens || !any_prefill(rt, d);
        Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
        fill_sampling(s, &sp);
        Tandem__DecodeTask t = TANDEM__DECODE_TASK__INIT;
        t.request_id = s->id;
        t.n_tokens = s->n_prompt;
        t.tokens = s->prompt;
        t.sampling = &sp;
        t.local_prefill = s->local;
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_DECODE_TASK;
        f.decode_task = &t;
        int rc = send_frame(d, &f);
        if (rc) {
            /* the connection is going away: on_close will remove it; try another */
            seq_hash_del(rt, s);
            s->dw = NULL;
            if (add_tried(s, d))
                return TD_ENOMEM;
            continue;
        }
        d->assigned++;
        s->state = TD_SEQ_ACCEPTING;
        s->t_placed = td_now_s();
        rt->n_running++;
        td_metric_set(rt->m_running_g, (double)rt->n_running);
        td_logf(TD_LOG_DEBUG, s->job->log_id, "seq %llu -> decode %s (%s prefill)",
                (unsigned long long)s->id, d->id, s->local ? "local" : "remote");
        return 0;
    }
}

/* Place or queue a sequence that needs a (new) decode worker. `admit` applies the waiting limit
 * (new requests); re-queued sequences were admitted already. 0 or TD_EBUSY (queue full). */
static int place_or_wait(td_router_t *rt, td_seq_t *s, bool admit)
{
    int rc = place(rt, s);
    if (rc == 0)
        return 0;
    if (rc != TD_ENOSPC)
        return rc;
    if (admit && rt->n_waiting >= rt->cfg.max_waiting)
        return TD_EBUSY;
    s->n_tried = 0;
    wait_push(rt, s);
    return 0;
}

void td_reqs_kick(td_router_t *rt)
{
    if (rt->stopping && !rt->jobs)
        return;
    while (rt->wait_head) {
        td_seq_t *s = rt->wait_head;
        wait_del(rt, s);
        int rc = place(rt, s);
        if (rc == 0)
            continue;
        /* still nothing: back to the head of the queue, keep the order */
        s->n_tried = 0;
        s->state = TD_SEQ_WAITING;
        s->wprev = NULL;
        s->wnext = rt->wait_head;
        if (rt->wait_head)
            rt->wait_head->wprev = s;
        else
            rt->wait_tail = s;
        rt->wait_head = s;
        rt->n_waiting++;
        td_metric_set(rt->m_waiting_g, (double)rt->n_waiting);
        if (rc != TD_ENOSPC)
            job_fail(s->job, rc == TD_ERANGE ? 400 : 500, rc, td_err_msg());
        break;
    }
}

/* A worker failed this sequence (died, refused a prefill, could not be reached). Retry on
 * another pair when nothing reached the client yet, else fail the job. Returns whether the job
 * still exists. */
static bool seq_retry(td_router_t *rt, td_seq_t *s, const char *why)
{
    td_job_t *j = s->job;
    if (s->n_tokens > 0 || s->retries >= RETRY_MAX || rt->stopping) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", why);
        job_fail(j, 503, TD_EUNREACH, msg);
        return false;
    }
    s->retries++;
    td_logf(TD_LOG_INFO, j->log_id, "retrying sequence %d after: %s", s->index, why);
    seq_detach(rt, s, true);
    s->n_tried = 0;
    int rc = place_or_wait(rt, s, false);
    if (rc) {
        job_fail(j, 503, rc, why);
        return false;
    }
    return true;
}

/* ---- text ---------------------------------------------------------------------------------- */

/* Search the text added since the last search for the earliest stop string (its index or -1,
 * its start in *pos). */
static int stop_find(td_seq_t *s, size_t *pos)
{
    td_job_t *j = s->job;
    if (!j->n_stop)
        return -1;
    int k = td_stop_find((const char *const *)j->stop, j->n_stop, j->stop_max, s->text.data,
                         s->text.len, s->scanned, pos);
    s->scanned = s->text.len;
    return k;
}

/* Bytes at the end of the text that could start a stop string (held back while streaming). */
static size_t holdback(const td_seq_t *s)
{
    const td_job_t *j = s->job;
    return td_stop_holdback((const char *const *)j->stop, j->n_stop, s->text.data, s->text.len);
}

/* The sequence ended (worker finish or stop string): release the rest, report, count. */
static void seq_finish(td_router_t *rt, td_seq_t *s, td_resp_finish_t why, const char *stop)
{
    td_job_t *j = s->job;
    bool worker_done = stop == NULL; /* the worker ended it: nothing to cancel */
    if (!stop) {
        td_detok_finish(rt->tok, &s->detok, &s->text);
        size_t pos;
        int k = stop_find(s, &pos);
        if (k >= 0) {
            s->text.len = pos;
            stop = j->stop[k];
            why = TD_RESP_STOP;
        }
    }
    if (s->text.len > s->sent) {
        j->ops->token(j, s->index, -1, NULL, s->text.data + s->sent, s->text.len - s->sent);
        s->sent = s->text.len;
    }
    s->finish = why;
    double now = td_now_s();
    if (s->n_tokens > 1 && s->t_first > 0)
        td_metric_observe(rt->m_tpot, (now - s->t_first) / (double)(s->n_tokens - 1));
    td_metric_add(rt->m_gen, (double)s->n_tokens);
    td_metric_add(why == TD_RESP_LENGTH ? rt->m_ok_length : rt->m_ok_stop, 1);
    seq_detach(rt, s, !worker_done);
    s->state = TD_SEQ_DONE;
    j->n_done++;
    j->ops->finish(j, s->index, why, stop);
}

/* One token from the decode worker. Returns false when the sequence or job ended. */
static bool seq_token(td_router_t *rt, td_seq_t *s, int32_t id, const Tandem__TokenLogprob *lp)
{
    td_job_t *j = s->job;
    double now = td_now_s();
    if (s->n_tokens == 0) {
        s->t_first = now;
        td_metric_observe(rt->m_ttft, now - j->t_arrival);
    } else {
        td_metric_observe(rt->m_itl, now - s->t_last);
    }
    s->t_last = now;
    s->n_tokens++;
    int rc = td_detok_step(rt->tok, &s->detok, id, &s->text);
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof(msg), "decode worker %s sent token id %d outside the vocabulary",
                 s->dw ? s->dw->id : "?", id);
        job_fail(j, 500, TD_EPROTO, msg);
        return false;
    }
    size_t pos;
    int k = stop_find(s, &pos);
    if (k >= 0) {
        s->text.len = pos;
        size_t rel = s->text.len > s->sent ? s->text.len - s->sent : 0;
        j->ops->token(j, s->index, id, lp, s->text.data + s->sent, rel);
        s->sent += rel;
        s->completion_tokens = (uint32_t)s->n_tokens;
        j->ops->flush(j, s->index);
        seq_finish(rt, s, TD_RESP_STOP, j->stop[k]);
        job_maybe_done(j);
        return false;
    }
    size_t safe = s->text.len - holdback(s);
    size_t rel = safe > s->sent ? safe - s->sent : 0;
    j->ops->token(j, s->index, id, lp, s->text.data + s->sent, rel);
    s->sent += rel;
    return true;
}

/* ---- worker frames ------------------------------------------------------------------------- */

static void on_accept(td_router_t *rt, td_worker_t *w, const Tandem__DecodeAccept *a)
{
    td_seq_t *s = seq_find(rt, a->request_id);
    if (!s || s->dw != w || s->state != TD_SEQ_ACCEPTING)
        return;
    s->state = TD_SEQ_RUNNING;
    td_metric_observe(rt->m_queue, td_now_s() - s->job->t_arrival);
    if (s->local)
        return;
    td_worker_t *p = choose(rt, TANDEM__ROLE__ROLE_PREFILL, s, w, s->n_prompt);
    if (!p) {
        /* every prefill worker left (or is full) since we decided: prefill on decode instead */
        td_logf(TD_LOG_INFO, s->job->log_id, "no prefill worker for seq %llu: replacing",
                (unsigned long long)s->id);
        seq_detach(rt, s, true);
        int rc = place_or_wait(rt, s, false);
        if (rc)
            job_fail(s->job, 503, rc, "no worker could take the request");
        return;
    }
    Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
    fill_sampling(s, &sp);
    Tandem__PrefillTask t = TANDEM__PREFILL_TASK__INIT;
    t.request_id = s->id;
    t.n_tokens = s->n_prompt;
    t.tokens = s->prompt;
    t.sampling = &sp;
    t.decode_worker = w->id;
    t.decode_blob.data = w->blob;
    t.decode_blob.len = w->blob_len;
    t.n_dst_blocks = a->n_blocks;
    t.dst_blocks = a->blocks;
    t.decode_request_id = a->worker_request_id;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_PREFILL_TASK;
    f.prefill_task = &t;
    s->pw = p;
    p->assigned++;
    if (send_frame(p, &f) != 0) {
        s->pw = NULL;
        seq_retry(rt, s, "the prefill worker's connection closed");
    }
}

static void on_error(td_router_t *rt, td_worker_t *w, const Tandem__Error *e)
{
    td_seq_t *s = seq_find(rt, e->request_id);
    if (!s || (s->dw != w && s->pw != w)) {
        if (!s)
            td_logf(TD_LOG_DEBUG, NULL, "worker %s: error for unknown request %llu: %s", w->id,
                    (unsigned long long)e->request_id, e->message ? e->message : "");
        return;
    }
    const char *msg = e->message && *e->message ? e->message : td_strerror(e->code);
    if (s->dw == w && s->state == TD_SEQ_ACCEPTING && e->code == TD_ENOSPC) {
        /* the decode worker is full: another one, else wait */
        seq_hash_del(rt, s);
        rt->n_running--;
        td_metric_set(rt->m_running_g, (double)rt->n_running);
        s->state = TD_SEQ_NEW;
        s->dw = NULL;
        if (add_tried(s, w)) {
            job_fail(s->job, 500, TD_ENOMEM, "out of memory");
            return;
        }
        int rc = place(rt, s);
        if (rc == TD_ENOSPC) {
            s->n_tried = 0;
            wait_push(rt, s);
        } else if (rc) {
            job_fail(s->job, 503, rc, msg);
        }
        return;
    }
    char full[600];
    snprintf(full, sizeof(full), "%s worker %s: %s", s->dw == w ? "decode" : "prefill", w->id, msg);
    int status = e->code == TD_EINVAL || e->code == TD_ERANGE ? 400 : 500;
    if (s->pw == w && s->dw != w) {
        s->pw = NULL;
        s->got_prefill_done = true; /* it sends nothing more */
        seq_retry(rt, s, full);
        return;
    }
    job_fail(s->job, status, e->code, full);
}

static void on_prefill_done(td_router_t *rt, td_worker_t *w, const Tandem__PrefillDone *d)
{
    td_seq_t *s = seq_find(rt, d->request_id);
    if (!s || s->pw != w)
        return;
    s->got_prefill_done = true;
    s->pw = NULL;
    if (d->status >= 0)
        return;
    char msg[600];
    snprintf(msg, sizeof(msg), "prefill worker %s failed: %s", w->id,
             d->message && *d->message ? d->message : td_strerror(d->status));
    seq_retry(rt, s, msg);
}

static void on_chunk(td_router_t *rt, td_worker_t *w, const Tandem__TokenChunk *c)
{
    td_seq_t *s = seq_find(rt, c->request_id);
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
        if (!seq_token(rt, s, c->tokens[i], lp))
            return; /* stop string (the job may have ended) or failure */
        if (s->id != c->request_id)
            return; /* the front end aborted the job meanwhile */
    }
    if (c->finish == TANDEM__FINISH__FINISH_ABORT) {
        char msg[600];
        snprintf(msg, sizeof(msg), "decode worker %s aborted the request: %s", w->id,
                 c->error && *c->error ? c->error : "no reason given");
        job_fail(j, 500, TD_EINTERNAL, msg);
        return;
    }
    if (c->finish != TANDEM__FINISH__FINISH_NONE) {
        s->completion_tokens = c->completion_tokens ? c->completion_tokens : (uint32_t)s->n_tokens;
        j->ops->flush(j, s->index);
        seq_finish(rt, s,
                   c->finish == TANDEM__FINISH__FINISH_LENGTH ? TD_RESP_LENGTH : TD_RESP_STOP,
                   NULL);
        job_maybe_done(j);
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
        td_seq_t *s = seq_find(rt, ids[i]);
        if (!s)
            continue;
        char msg[300];
        if (s->pw == w) {
            s->pw = NULL;
            s->got_prefill_done = true;
            snprintf(msg, sizeof(msg), "prefill worker %s left before finishing the prompt", w->id);
        } else {
            snprintf(msg, sizeof(msg), "decode worker %s left while running the request", w->id);
        }
        if (s->dw == w) {
            /* nothing to cancel on it: it is gone */
            s->dw = NULL;
            if (s->state == TD_SEQ_ACCEPTING || s->state == TD_SEQ_RUNNING) {
                if (s->pw && !s->got_prefill_done)
                    send_cancel(s->pw, s->id);
                s->pw = NULL;
                s->got_prefill_done = true;
            }
        }
        seq_retry(rt, s, msg);
    }
    free(ids);
}

/* ---- jobs ---------------------------------------------------------------------------------- */

td_job_t *td_job_new(td_router_t *rt, const td_job_ops_t *ops, void *ud, size_t n_seqs)
{
    td_job_t *j = td_calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->seqs = td_calloc(n_seqs, sizeof(*j->seqs));
    if (!j->seqs) {
        free(j);
        return NULL;
    }
    j->rt = rt;
    j->ops = ops;
    j->ud = ud;
    j->n_seqs = n_seqs;
    j->t_arrival = td_now_s();
    j->sp.top_p = 1;
    j->sp.temperature = 1;
    j->sp.logprobs = -1;
    for (size_t i = 0; i < n_seqs; i++) {
        j->seqs[i].job = j;
        j->seqs[i].index = (int)i;
        td_buf_init(&j->seqs[i].text);
        td_detok_init(&j->seqs[i].detok, true);
    }
    return j;
}

int td_job_set_prompt(td_job_t *j, int idx, const int32_t *ids, size_t n, uint64_t seed)
{
    td_seq_t *s = &j->seqs[idx];
    free(s->prompt);
    s->prompt = td_calloc(n ? n : 1, sizeof(*s->prompt));
    if (!s->prompt)
        return TD_ENOMEM;
    memcpy(s->prompt, ids, n * sizeof(*ids));
    s->n_prompt = n;
    s->seed = seed;
    s->prompt_tokens = (uint32_t)n;
    return 0;
}

int td_job_set_stop(td_job_t *j, char *const *stop, size_t n)
{
    if (!n)
        return 0;
    j->stop = td_calloc(n, sizeof(*j->stop));
    if (!j->stop)
        return TD_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        j->stop[i] = td_strdup(stop[i]);
        if (!j->stop[i])
            return TD_ENOMEM;
        j->n_stop = i + 1;
        j->stop_max = TD_MAX(j->stop_max, strlen(stop[i]));
    }
    return 0;
}

int td_job_start(td_job_t *j)
{
    td_router_t *rt = j->rt;
    if (rt->stopping)
        return td_err_set(TD_EBUSY, "the router is shutting down");
    /* admission: every sequence that cannot be placed now must fit in the queue */
    snprintf(j->log_id, sizeof(j->log_id), "r-%llu", (unsigned long long)rt->next_id);
    j->next = rt->jobs;
    if (rt->jobs)
        rt->jobs->prev = j;
    rt->jobs = j;
    rt->n_jobs++;
    j->started = true;
    if (rt->cfg.request_timeout_s > 0)
        j->deadline = j->t_arrival + rt->cfg.request_timeout_s;
    size_t prompt_total = 0;
    for (size_t i = 0; i < j->n_seqs; i++) {
        td_seq_t *s = &j->seqs[i];
        prompt_total += s->n_prompt;
        int rc = place_or_wait(rt, s, true);
        if (rc) {
            for (size_t k = 0; k <= i; k++)
                seq_detach(rt, &j->seqs[k], true);
            job_unlink(rt, j);
            j->started = false;
            if (rc == TD_EBUSY)
                return td_err_set(TD_EBUSY,
                                  "no worker can take the request now and %llu "
                                  "requests are already waiting",
                                  (unsigned long long)rt->n_waiting);
            return rc == TD_ERANGE
                       ? rc
                       : td_err_set(rc, "could not place the request: %s", td_strerror(rc));
        }
    }
    td_metric_add(rt->m_prompt, (double)prompt_total);
    return 0;
}

static void on_defer(uv_timer_t *t);

void td_job_abort(td_job_t *j, int http_status, const char *msg)
{
    td_router_t *rt = j->rt;
    if (j->ended || j->abort_queued)
        return;
    /* cancel on the workers at once: they send nothing more for these ids */
    for (size_t i = 0; i < j->n_seqs; i++)
        if (j->seqs[i].state != TD_SEQ_DONE)
            seq_detach(rt, &j->seqs[i], true);
    j->abort_status = http_status;
    free(j->abort_msg);
    j->abort_msg = td_strdup(msg ? msg : "canceled");
    j->abort_queued = true;
    j->anext = rt->aborts;
    rt->aborts = j;
    uv_timer_start(&rt->defer_timer, on_defer, 0, 0);
}

static void on_defer(uv_timer_t *t)
{
    td_router_t *rt = t->data;
    while (rt->aborts) {
        td_job_t *j = rt->aborts;
        rt->aborts = j->anext;
        j->abort_queued = false;
        job_fail(j, j->abort_status, TD_ECANCELED, j->abort_msg ? j->abort_msg : "canceled");
    }
}

void td_job_free(td_job_t *j)
{
    if (!j)
        return;
    td_router_t *rt = j->rt;
    if (!j->ended && j->started) {
        for (size_t i = 0; i < j->n_seqs; i++)
            if (j->seqs[i].state != TD_SEQ_DONE)
                seq_detach(rt, &j->seqs[i], true);
        job_unlink(rt, j);
    }
    for (size_t i = 0; i < j->n_seqs; i++) {
        free(j->seqs[i].prompt);
        free(j->seqs[i].tried);
        td_buf_free(&j->seqs[i].text);
    }
    free(j->seqs);
    for (size_t i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->stop);
    free(j->sp.stop_ids);
    free(j->abort_msg);
    free(j);
}

void td_reqs_sweep(td_router_t *rt, double now)
{
    /* deadlines: collect first, failing ends jobs */
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
        job_fail(late, 504, TD_ETIMEDOUT, msg);
    }
    td_reqs_kick(rt);
}

void td_reqs_abort_all(td_router_t *rt, const char *msg)
{
    while (rt->jobs)
        job_fail(rt->jobs, 503, TD_ECANCELED, msg);
}

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
