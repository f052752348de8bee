/* compute.c: the compute thread and the handoff of each step between it and the loop.
 *
 * The loop builds a step (sched.c) and posts it under cp.mu; the compute thread runs
 * td_engine_step over it (the engine samples where asked), stores the result under cp.mu and
 * wakes the loop through cp.done_async; the loop then applies the results (td_wk_step_finish).
 * Only one step is ever in flight. */
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdio.h>
#include <stdlib.h>

int td_wk_compute_run(td_worker_t *w, double *seconds)
{
    td_wk_compute_t *cp = &w->cp;
    int n = w->n_items, V = w->mc->vocab_size;
    double t0 = td_now_s();
    if (n > cp->cap) {
        td_batch_seq_t *bs = td_reallocarray(cp->bs, (size_t)w->cap_items, sizeof(*bs));
        if (!bs)
            return td_err_set(TD_ENOMEM, "out of memory");
        cp->bs = bs;
        cp->cap = w->cap_items;
    }
    for (int i = 0; i < n; i++) {
        td_wk_item_t *it = &w->items[i];
        td_wk_seq_t *s = it->s;
        cp->bs[i] = (td_batch_seq_t){
            .kv = &s->kv,
            .tokens = s->toks + s->kv.n_tokens,
            .n_tokens = it->n,
            .logits = it->sample ? w->logits + (size_t)i * V : NULL,
            .smp = it->sample ? &s->smp : NULL,
            .out = it->sample ? &it->out : NULL,
            .decode = it->decode,
        };
    }
    int rc = td_engine_step(w->engine, &w->pool, cp->bs, n);
    *seconds = td_now_s() - t0;
    return rc;
}

static void *compute_main(void *arg)
{
    td_worker_t *w = arg;
    td_wk_compute_t *cp = &w->cp;
    pthread_mutex_lock(&cp->mu);
    for (;;) {
        while (!cp->posted && !cp->quit)
            pthread_cond_wait(&cp->cv, &cp->mu);
        if (cp->quit)
            break;
        cp->posted = false;
        pthread_mutex_unlock(&cp->mu);
        double dt = 0;
        int rc = td_wk_compute_run(w, &dt);
        pthread_mutex_lock(&cp->mu);
        cp->rc = rc;
        if (rc)
            snprintf(cp->err, sizeof(cp->err), "%s", td_err_msg());
        cp->seconds = dt;
        cp->done = true;
        uv_async_send(&cp->done_async);
    }
    pthread_mutex_unlock(&cp->mu);
    return NULL;
}

static void on_step_done(uv_async_t *a)
{
    td_worker_t *w = a->data;
    td_wk_compute_t *cp = &w->cp;
    pthread_mutex_lock(&cp->mu);
    bool done = cp->done;
    int rc = cp->rc;
    double dt = cp->seconds;
    char err[sizeof(cp->err)];
    snprintf(err, sizeof(err), "%s", cp->err);
    cp->done = false;
    pthread_mutex_unlock(&cp->mu);
    if (done && w->n_items > 0)
        td_wk_step_finish(w, rc, err, dt);
}

int td_wk_compute_start(td_worker_t *w)
{
    td_wk_compute_t *cp = &w->cp;
    pthread_mutex_init(&cp->mu, NULL);
    pthread_cond_init(&cp->cv, NULL);
    uv_async_init(w->loop, &cp->done_async, on_step_done);
    cp->done_async.data = w;
    if (pthread_create(&cp->thread, NULL, compute_main, w) != 0)
        return td_err_set(TD_EINTERNAL, "cannot start the compute thread");
    cp->started = true;
    return 0;
}

void td_wk_compute_post(td_worker_t *w)
{
    td_wk_compute_t *cp = &w->cp;
    for (int i = 0; i < w->n_items; i++)
        w->items[i].s->in_step = true;
    pthread_mutex_lock(&cp->mu);
    cp->posted = true;
    cp->done = false;
    pthread_cond_signal(&cp->cv);
    pthread_mutex_unlock(&cp->mu);
}

bool td_wk_compute_busy(const td_worker_t *w)
{
    return w->n_items > 0;
}

void td_wk_compute_join(td_worker_t *w)
{
    td_wk_compute_t *cp = &w->cp;
    if (!cp->started)
        return;
    pthread_mutex_lock(&cp->mu);
    cp->quit = true;
    pthread_cond_signal(&cp->cv);
    pthread_mutex_unlock(&cp->mu);
    pthread_join(cp->thread, NULL);
    cp->started = false;
    free(cp->bs);
    cp->bs = NULL;
    cp->cap = 0;
}

void td_wk_compute_close(td_worker_t *w)
{
    if (w->cp.done_async.data) {
        uv_close((uv_handle_t *)&w->cp.done_async, NULL);
        w->cp.done_async.data = NULL;
    }
}

void td_wk_step_finish(td_worker_t *w, int rc, const char *err, double seconds)
{
    int n = w->n_items;
    td_metric_observe(w->m.step, seconds);
    if (!rc && w->step_decodes == 0)
        td_wk_cache_measure_prefill(w, w->step_prefill_tokens, seconds);
    if (!rc)
        td_metric_add(w->m.computed, w->step_prefill_tokens);
    /* one line per step at debug level: what bench/calibrate_sim.py fits the sim.* model to */
    td_logf(TD_LOG_DEBUG, NULL, "step prefill_tokens=%d decodes=%d ctx_tokens=%lld seconds=%.6f",
            w->step_prefill_tokens, w->step_decodes, (long long)w->step_ctx, seconds);
    for (int i = 0; i < n; i++) {
        td_wk_item_t *it = &w->items[i];
        td_wk_seq_t *s = it->s;
        s->in_step = false;
        s->stored = s->kv.n_tokens;
        if (rc) {
            td_wk_seq_fail(w, s, rc, err);
            continue;
        }
        if (!s->dead)
            td_wk_cache_publish(w, s);
        if (s->dead) {
            if (w->role->abandon)
                w->role->abandon(w, s);
            td_wk_seq_maybe_free(w, s);
            continue;
        }
        if (s->state == TD_WK_PREFILL && !it->sample) {
            if (s->recompute && s->stored == td_wk_prefill_target(s)) {
                s->recompute = false; /* its KV is back: the pending token is the next input */
                s->state = TD_WK_RUN;
            } else if (w->role->chunk_done) {
                w->role->chunk_done(w, s);
            }
            continue;
        }
        if (it->out.finish == TD_FINISH_NONE && s->n_toks + 1 >= w->mc->max_ctx)
            it->out.finish = TD_FINISH_LENGTH;
        if (s->state == TD_WK_PREFILL)
            w->role->prefilled(w, s, &it->out);
        else
            w->role->decoded(w, s, &it->out);
    }
    w->n_items = 0;
    td_wk_schedule(w);
}
