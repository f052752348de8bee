/* sched.c: the scheduler: which sequences run in the next step, with how many tokens, and what
 * happens when the KV pool is full (preemption by recompute, as vLLM's scheduler does). */
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>

/* Room for n items and their logits rows. 0 or TD_ENOMEM. */
static int ensure_items(td_worker_t *w, int n)
{
    if (n <= w->cap_items)
        return 0;
    int cap = TD_MAX(n, w->cap_items * 2);
    td_wk_item_t *it = td_reallocarray(w->items, (size_t)cap, sizeof(*it));
    if (!it)
        return TD_ENOMEM;
    w->items = it;
    float *lg = td_reallocarray(w->logits, (size_t)cap * (size_t)w->mc->vocab_size, sizeof(float));
    if (!lg)
        return TD_ENOMEM;
    w->logits = lg;
    w->cap_items = cap;
    return 0;
}

/* Drop v's KV (vLLM's recompute mode): its blocks go back to the pool now; it keeps its place in
 * line and, when there is room again, recomputes its KV bit for bit the same (the engine does not
 * depend on how a prompt is chunked or batched), then runs on. A prompt still prefilling starts
 * over. */
static void preempt(td_worker_t *w, td_wk_seq_t *v)
{
    td_kv_seq_release(&w->pool, &v->kv);
    td_kv_seq_init(&v->kv);
    v->stored = 0;
    v->n_published = 0;
    if (v->state == TD_WK_RUN) {
        v->recompute = true;
        v->state = TD_WK_PREFILL;
    }
    td_metric_add(w->m.preempt, 1);
    TD_LOG_D("request %llu preempted: the KV cache is full", (unsigned long long)v->req);
}

/* The newest sequence after `s` in arrival order whose blocks may be taken: running or
 * prefilling, holding blocks, no push reading them. NULL when there is none. */
static td_wk_seq_t *victim_after(td_worker_t *w, td_wk_seq_t *s)
{
    for (td_wk_seq_t *v = w->tail; v && v != s; v = v->prev)
        if (!v->dead && (v->state == TD_WK_RUN || v->state == TD_WK_PREFILL) &&
            v->kv.n_blocks > 0 && v->pushes_out == 0)
            return v;
    return NULL;
}

/* Reserve room for `tokens` tokens of s, preempting newer sequences while that is what it takes.
 * Returns whether s has the room; *preempted is set when anything was preempted. */
static bool reserve(td_worker_t *w, td_wk_seq_t *s, int tokens, bool *preempted)
{
    while (td_kv_seq_reserve(&w->pool, &s->kv, tokens) != 0) {
        td_wk_seq_t *v = victim_after(w, s);
        if (!v)
            return false;
        preempt(w, v);
        *preempted = true;
    }
    return true;
}

int td_wk_sched_build(td_worker_t *w)
{
    TD_ASSERT(w->n_items == 0);
    int budget = (int)w->cfg.max_batch_tokens, n = 0;
    if (w->n_seqs == 0 || ensure_items(w, w->n_seqs) != 0)
        return 0;
    bool preempted = false;
    td_wk_seq_t *next;
    /* every running sequence's next token, oldest first; one that finds no block takes blocks
     * from the newest sequence that holds some, or is preempted itself when it is the newest,
     * so the oldest requests keep running */
    for (td_wk_seq_t *s = w->head; s; s = next) {
        next = s->next;
        if (s->dead || s->state != TD_WK_RUN || budget < 1)
            continue;
        if (!reserve(w, s, s->stored + 1, &preempted)) {
            preempt(w, s);
            preempted = true;
            continue;
        }
        w->items[n++] = (td_wk_item_t){.s = s, .n = 1, .sample = true, .decode = true};
        budget--;
    }
    /* prefill chunks in arrival order. When decodes run in this step and it preempted, none: the
     * blocks just freed go to the running sequences, or a recomputing sequence would take them
     * straight back and be preempted again in the next step. When nothing else runs, the oldest
     * prompt takes blocks from newer sequences, so two half-computed prompts cannot hold the
     * pool between them forever. */
    int pool_tokens = w->pool.n_blocks * w->pool.layout.block_size;
    for (td_wk_seq_t *s = w->head; s && !(preempted && n > 0); s = next) {
        next = s->next;
        if (s->dead || s->state != TD_WK_PREFILL || budget < 1)
            continue;
        int target = td_wk_prefill_target(s);
        if (target > pool_tokens) {
            td_wk_seq_fail(w, s, TD_ENOSPC, "the prompt does not fit in the KV cache");
            continue;
        }
        if (s->recompute && s->kv.n_blocks == 0 &&
            td_wk_cache_attach(w, s, target, false) == target) {
            s->recompute = false; /* every block it needs was still cached */
            s->state = TD_WK_RUN;
            continue;
        }
        int left = target - s->stored;
        int k = (int)TD_MIN((int64_t)TD_MIN(left, budget), w->cfg.prefill_chunk);
        bool ok = n > 0 ? td_kv_seq_reserve(&w->pool, &s->kv, s->stored + k) == 0
                        : reserve(w, s, s->stored + k, &preempted);
        if (!ok)
            break; /* wait for running sequences to finish or for pushes to let go */
        w->items[n++] = (td_wk_item_t){.s = s, .n = k, .sample = k == left && !s->recompute};
        budget -= k;
    }
    w->n_items = n;
    w->step_prefill_tokens = w->step_decodes = 0;
    w->step_ctx = 0;
    for (int i = 0; i < n; i++) {
        td_wk_item_t *it = &w->items[i];
        if (it->decode) {
            w->step_decodes++;
            w->step_ctx += it->s->stored;
        } else {
            w->step_prefill_tokens += it->n;
        }
    }
    return n;
}

void td_wk_schedule(td_worker_t *w)
{
    if (td_wk_compute_busy(w) || w->stopped)
        return;
    if (td_wk_sched_build(w) > 0)
        td_wk_compute_post(w);
}
