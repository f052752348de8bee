/* reqs_job.c: the front ends' side of the request state machine (td_job_* in router.h): a job's
 * sequences, prompts and stop strings, admission when it starts, an abort requested by the front
 * end (processed from the loop shortly after, so the front end never re-enters itself), and
 * release. */
#include "reqs_impl.h"

#include "td_error.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    j->n_choices = 1;
    td_sampling_defaults(&j->sp);
    j->sp.temperature = 1;
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
    s->kvh_bt = 0; /* its block hashes, if any, were of another prompt */
    s->seed = seed;
    s->prompt_tokens = (uint32_t)n;
    return 0;
}

int td_job_set_tenant(td_job_t *j, const void *tenant, size_t len)
{
    free(j->tenant);
    j->tenant = NULL;
    j->tenant_len = 0;
    if (!len)
        return 0;
    if (!(j->tenant = td_calloc(len, 1)))
        return TD_ENOMEM;
    memcpy(j->tenant, tenant, len);
    j->tenant_len = len;
    return 0;
}

void td_job_set_client(td_job_t *j, const char *front, const char *client_id, size_t n_choices)
{
    j->front = front;
    snprintf(j->client_id, sizeof(j->client_id), "%s", client_id ? client_id : "");
    j->n_choices = n_choices ? n_choices : 1;
}

int td_job_set_sampling(td_job_t *j, const td_sampling_t *p)
{
    size_t nb = (size_t)p->n_logit_bias, nw = (size_t)p->n_bad_words, nt = 0;
    for (size_t i = 0; i < nw; i++)
        nt += p->bad_word_len[i];
    free(j->sp_arrays);
    j->sp_arrays = NULL;
    j->sp = *p;
    size_t ns = p->json_schema ? p->json_schema_len + 1 : 0;
    if (!nb && !nw && !ns)
        return 0;
    /* one block: bias ids, bias values, bad-word tokens, bad-word lengths (4-byte items), then
       the schema's text */
    size_t words = nb * 2 + nt + nw;
    uint8_t *m = td_calloc(words * 4 + ns + 1, 1);
    if (!m)
        return TD_ENOMEM;
    j->sp_arrays = m;
    if (ns) {
        memcpy(m + words * 4, p->json_schema, ns - 1);
        j->sp.json_schema = (const char *)(m + words * 4);
    }
    memcpy(m, p->logit_bias_ids, nb * 4);
    j->sp.logit_bias_ids = (const int32_t *)m;
    memcpy(m + nb * 4, p->logit_bias_values, nb * 4);
    j->sp.logit_bias_values = (const float *)(m + nb * 4);
    memcpy(m + nb * 8, p->bad_words, nt * 4);
    j->sp.bad_words = (const int32_t *)(m + nb * 8);
    memcpy(m + (nb * 2 + nt) * 4, p->bad_word_len, nw * 4);
    j->sp.bad_word_len = (const uint32_t *)(m + (nb * 2 + nt) * 4);
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
        int rc = td__reqs_place_or_wait(rt, s, true);
        if (rc) {
            for (size_t k = 0; k <= i; k++)
                td__reqs_detach(rt, &j->seqs[k], true);
            td__reqs_job_unlink(rt, j);
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

void td_job_abort(td_job_t *j, int http_status, const char *msg)
{
    td_router_t *rt = j->rt;
    if (j->ended || j->abort_queued)
        return;
    /* cancel on the workers at once: they send nothing more for these ids */
    for (size_t i = 0; i < j->n_seqs; i++)
        if (j->seqs[i].state != TD_SEQ_DONE)
            td__reqs_detach(rt, &j->seqs[i], true);
    j->abort_status = http_status;
    free(j->abort_msg);
    j->abort_msg = td_strdup(msg ? msg : "canceled");
    j->abort_queued = true;
    j->anext = rt->aborts;
    rt->aborts = j;
    uv_timer_start(&rt->defer_timer, td__reqs_on_defer, 0, 0);
}

void td__reqs_on_defer(uv_timer_t *t)
{
    td_router_t *rt = t->data;
    while (rt->aborts) {
        td_job_t *j = rt->aborts;
        rt->aborts = j->anext;
        j->abort_queued = false;
        td__reqs_job_fail(j, j->abort_status, TD_ECANCELED,
                          j->abort_msg ? j->abort_msg : "canceled");
    }
}

void td_job_free(td_job_t *j)
{
    if (!j)
        return;
    td_router_t *rt = j->rt;
    if (!j->ended && j->started) { /* its front end went before it ended: it ends here */
        for (size_t i = 0; i < j->n_seqs; i++)
            if (j->seqs[i].state != TD_SEQ_DONE)
                td__reqs_detach(rt, &j->seqs[i], true);
        td__reqs_job_unlink(rt, j);
        td_metric_add(rt->m_ok_abort, 1);
        td__reqs_log_end(j, j->abort_status ? j->abort_status : 499,
                         j->abort_msg ? j->abort_msg : "the client went away");
    }
    for (size_t i = 0; i < j->n_seqs; i++) {
        free(j->seqs[i].prompt);
        free(j->seqs[i].tried);
        free(j->seqs[i].gen);
        free(j->seqs[i].kvh);
        td_buf_free(&j->seqs[i].text);
    }
    free(j->seqs);
    free(j->tenant);
    free(j->sp_arrays);
    for (size_t i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->stop);
    free(j->abort_msg);
    free(j);
}
