/* reqs.c: the core of the request state machine: the table that maps the router ids in worker
 * frames back to sequences, the one path by which frames for requests reach workers, a sequence
 * leaving its workers, and the end of a job. The other parts are listed in reqs_impl.h. */
#include "reqs_impl.h"

#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

const int32_t *td__reqs_task_tokens(const td_seq_t *s, size_t *n, int32_t **owned)
{
    *owned = NULL;
    *n = s->n_prompt + (size_t)s->n_tokens;
    if (!s->n_tokens)
        return s->prompt;
    int32_t *t = td_calloc(*n, sizeof(*t));
    if (!t)
        return NULL;
    memcpy(t, s->prompt, s->n_prompt * sizeof(*t));
    memcpy(t + s->n_prompt, s->gen, (size_t)s->n_tokens * sizeof(*t));
    *owned = t;
    return t;
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

/* Append `id` to the comma-separated list `out` (size `cap`) unless it is empty or already there. */
static void add_worker(char *out, size_t cap, const char *id)
{
    size_t n = strlen(id), len = strlen(out);
    if (!n)
        return;
    for (const char *p = out; (p = strstr(p, id)) != NULL; p += n)
        if ((p == out || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return;
    snprintf(out + len, cap - len, "%s%s", len ? "," : "", id);
}

void td__reqs_log_end(const td_job_t *j, int http_status, const char *err)
{
    if (!td_log_enabled(TD_LOG_INFO))
        return;
    uint64_t prompt = 0, cached = 0, completion = 0;
    char dws[256] = "", pws[256] = "", status[16], ttft[32] = "", e2e[32];
    char ps[24], cs[24], gs[24], ns[24];
    double t_first = 0;
    for (size_t i = 0; i < j->n_seqs; i++) {
        const td_seq_t *s = &j->seqs[i];
        if (i % j->n_choices == 0) {
            prompt += s->prompt_tokens;
            cached += s->cached_tokens;
        }
        completion += s->completion_tokens ? s->completion_tokens : s->n_tokens;
        add_worker(dws, sizeof(dws), s->log_dw);
        add_worker(pws, sizeof(pws), s->log_pw);
        if (s->t_first > 0 && (t_first == 0 || s->t_first < t_first))
            t_first = s->t_first;
    }
    if (http_status)
        snprintf(status, sizeof(status), "%d", http_status);
    else
        snprintf(status, sizeof(status), "ok");
    if (t_first > 0)
        snprintf(ttft, sizeof(ttft), "%.4f", t_first - j->t_arrival);
    snprintf(e2e, sizeof(e2e), "%.4f", td_now_s() - j->t_arrival);
    snprintf(ps, sizeof(ps), "%llu", (unsigned long long)prompt);
    snprintf(cs, sizeof(cs), "%llu", (unsigned long long)cached);
    snprintf(gs, sizeof(gs), "%llu", (unsigned long long)completion);
    snprintf(ns, sizeof(ns), "%zu", j->n_seqs);
    const char *finish = j->seqs[0].finish == TD_RESP_LENGTH ? "length" : "stop";
    const char *kv[40];
    size_t k = 0;
#define KV(key, val)                                                                               \
    do {                                                                                           \
        kv[k++] = (key);                                                                           \
        kv[k++] = (val);                                                                           \
    } while (0)
    KV("id", j->client_id);
    KV("api", j->front ? j->front : "");
    KV("status", status);
    if (http_status)
        KV("error", err ? err : "");
    else
        KV("finish", finish);
    KV("prompt_tokens", ps);
    KV("cached_tokens", cs);
    KV("completion_tokens", gs);
    KV("n", ns);
    KV("decode", dws);
    KV("prefill", pws);
    if (ttft[0])
        KV("ttft_s", ttft);
    KV("e2e_s", e2e);
#undef KV
    kv[k] = NULL;
    td_log_kv(TD_LOG_INFO, j->log_id, kv, http_status ? "request failed" : "request done");
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
    td__reqs_log_end(j, http_status, msg);
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
    td__reqs_log_end(j, 0, NULL);
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
