/* seq.c: the worker's sequence table: admission of a new sequence, lookup, and freeing once
 * nothing holds its blocks (td_worker.h says who owns which field). */
#include "td_error.h"
#include "td_log.h"
#include "td_msg.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdlib.h>
#include <string.h>

int td_wk_prefill_target(const td_wk_seq_t *s)
{
    return s->recompute ? s->n_toks - 1 : s->n_prompt;
}

void td_wk_send(td_wk_seq_t *s, const Tandem__Frame *f)
{
    if (!s->rt || !s->rt->conn || s->rt->gen != s->rt_gen)
        return;
    int rc = td_rpc_send(s->rt->conn, f);
    if (rc)
        TD_LOG_W("send to router %s failed: %s", s->rt->addr, td_strerror(rc));
}

int td_wk_seq_resume(td_worker_t *w, td_wk_seq_t *s, uint32_t generated,
                     const Tandem__Sampling *sp)
{
    if (!generated)
        return 0;
    int n = (int)generated;
    if (generated >= (uint32_t)s->n_prompt)
        return td_err_set(TD_EINVAL, "generated %u of %d tokens leaves no prompt", generated,
                          s->n_prompt);
    /* max_tokens as the first attempt had it: the room after the request's own prompt */
    int want = sp ? sp->max_tokens : 0, room = w->mc->max_ctx - (s->n_prompt - n);
    s->smp.p.max_tokens = want <= 0 || want > room ? room : want;
    if (n >= s->smp.p.max_tokens)
        return td_err_set(TD_EINVAL, "generated %u tokens of max_tokens %d: nothing to resume",
                          generated, s->smp.p.max_tokens);
    td_sampler_seek(&s->smp, n);
    /* the penalties and bad_words count the last n of the tokens as generated */
    int rc = td_sampler_context(&s->smp, s->toks, s->n_prompt, n);
    if (rc)
        return rc;
    s->n_resumed = n;
    return 0;
}

void td_wk_seq_usage(const td_wk_seq_t *s, uint32_t *prompt, uint32_t *completion,
                     uint32_t *cached)
{
    int p = s->n_prompt - s->n_resumed;
    *prompt = (uint32_t)p;
    *completion = (uint32_t)(s->n_toks - p);
    *cached = (uint32_t)TD_MIN(s->cached_tokens, p);
}

td_wk_seq_t *td_wk_seq_find(td_worker_t *w, uint64_t id)
{
    for (td_wk_seq_t *s = w->head; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

td_wk_seq_t *td_wk_seq_find_req(td_worker_t *w, td_wk_router_t *rt, uint64_t req)
{
    for (td_wk_seq_t *s = w->head; s; s = s->next)
        if (s->rt == rt && s->rt_gen == rt->gen && s->req == req && !s->dead)
            return s;
    return NULL;
}

int td_wk_seq_push_token(td_wk_seq_t *s, int32_t t)
{
    if (s->n_toks == s->cap_toks) {
        int cap = s->cap_toks * 2;
        int32_t *p = td_reallocarray(s->toks, (size_t)cap, sizeof(int32_t));
        if (!p)
            return td_err_set(TD_ENOMEM, "out of memory");
        s->toks = p;
        s->cap_toks = cap;
    }
    s->toks[s->n_toks++] = t;
    return 0;
}

void td_wk_seq_maybe_free(td_worker_t *w, td_wk_seq_t *s)
{
    if (s->in_step || s->pushes_out > 0 || s->loads_out > 0)
        return;
    if (w->role->blocks_busy && w->role->blocks_busy(w, s))
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        w->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        w->tail = s->prev;
    w->n_seqs--;
    td_kv_seq_release(&w->pool, &s->kv);
    td_sampler_free(&s->smp);
    if (s->note)
        tandem__kv_note__free_unpacked(s->note, NULL);
    free(s->dst);
    free(s->toks);
    free(s->tenant);
    free(s->hashes);
    free(s);
}

void td_wk_seq_kill(td_worker_t *w, td_wk_seq_t *s)
{
    s->dead = true;
    td_wk_seq_maybe_free(w, s);
}

void td_wk_seq_fail(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg)
{
    if (s->dead)
        return;
    TD_LOG_W("request %llu failed: %s", (unsigned long long)s->req, msg);
    td_metric_add(w->m.req_fail, 1);
    w->role->report_failure(w, s, code, msg);
    td_wk_seq_kill(w, s);
}

void td_wk_seq_cancel(td_worker_t *w, td_wk_seq_t *s)
{
    if (w->role->abandon && !s->in_step)
        w->role->abandon(w, s);
    td_wk_seq_kill(w, s);
}

/* Refuse a prompt the model cannot take. 0 or TD_EINVAL. */
static int check_prompt(const td_model_cfg_t *c, const int32_t *toks, size_t n)
{
    if (n == 0)
        return td_err_set(TD_EINVAL, "empty prompt");
    if ((int64_t)n + 1 > c->max_ctx)
        return td_err_set(TD_EINVAL, "prompt of %zu tokens leaves no room in the context of %d",
                          n, c->max_ctx);
    for (size_t i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= c->vocab_size)
            return td_err_set(TD_EINVAL, "token %zu: id %d outside the vocabulary [0, %d)", i,
                              toks[i], c->vocab_size);
    return 0;
}

td_wk_seq_t *td_wk_seq_new(td_worker_t *w, td_wk_router_t *rt, uint64_t req,
                           const int32_t *toks, size_t n, const Tandem__Sampling *sp,
                           const ProtobufCBinaryData *tenant, int *code)
{
    const td_model_cfg_t *c = w->mc;
    td_sampling_t p;
    *code = TD_EINVAL;
    if (check_prompt(c, toks, n) || td_msg_sampling_from_proto(sp, &p))
        return NULL;
    if (w->draining || w->stopping) {
        *code = td_err_set(TD_EBUSY, "worker %s is draining", w->cfg.id);
        return NULL;
    }
    if (w->n_seqs >= w->cfg.max_running) {
        *code = td_err_set(TD_ENOSPC, "worker %s holds %d sequences (engine.max_running)",
                           w->cfg.id, w->n_seqs);
        return NULL;
    }
    int room = c->max_ctx - (int)n;
    if (p.max_tokens <= 0 || p.max_tokens > room)
        p.max_tokens = room;
    p.eos_id = c->eos_id;
    td_wk_seq_t *s = td_calloc(1, sizeof(*s));
    if (!s) {
        *code = td_err_set(TD_ENOMEM, "out of memory");
        return NULL;
    }
    s->cap_toks = (int)n + 16;
    s->toks = td_calloc((size_t)s->cap_toks, sizeof(int32_t));
    if (tenant && tenant->len) {
        s->tenant = td_calloc(tenant->len, 1);
        s->tenant_len = tenant->len;
    }
    int rc = s->toks && (s->tenant || !s->tenant_len) ? td_sampler_init(&s->smp, &p, c->vocab_size)
                                                      : td_err_set(TD_ENOMEM, "out of memory");
    if (!rc && ((rc = td_wk_structured(w, s, &p)) ||
                (rc = td_sampler_context(&s->smp, toks, (int)n, 0))))
        td_sampler_free(&s->smp);
    if (rc) {
        *code = rc;
        free(s->toks);
        free(s->tenant);
        free(s);
        return NULL;
    }
    if (s->tenant_len)
        memcpy(s->tenant, tenant->data, s->tenant_len);
    memcpy(s->toks, toks, n * sizeof(int32_t));
    s->n_toks = s->n_prompt = (int)n;
    s->logprobs = p.logprobs;
    s->id = ++w->next_id;
    s->req = req;
    s->rt = rt;
    s->rt_gen = rt ? rt->gen : 0;
    s->kv_total = -1;
    s->t_start = td_now_s();
    td_kv_seq_init(&s->kv);
    s->prev = w->tail;
    if (w->tail)
        w->tail->next = s;
    else
        w->head = s;
    w->tail = s;
    w->n_seqs++;
    td_metric_add(w->m.prompt, (double)n);
    return s;
}
