/* reqs_text.c: a sequence's generated tokens become text here: incremental detokenization, stop
 * strings (text that could start one is held back while streaming), and the end of a sequence,
 * reported to the front end through td_job_ops_t. */
#include "reqs_impl.h"
#include "stopstr.h"

#include "td_error.h"
#include "td_util.h"

#include <stdio.h>

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

void td__reqs_finish(td_router_t *rt, td_seq_t *s, td_resp_finish_t why, const char *stop)
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
    td__reqs_detach(rt, s, !worker_done);
    s->state = TD_SEQ_DONE;
    j->n_done++;
    j->ops->finish(j, s->index, why, stop);
}

bool td__reqs_token(td_router_t *rt, td_seq_t *s, int32_t id, const Tandem__TokenLogprob *lp)
{
    td_job_t *j = s->job;
    double now = td_now_s();
    if (s->n_tokens == 0) {
        s->t_first = now;
        if (s->local && s->dw)
            td_place_prefill_done(&s->dw->load,
                                  s->n_prompt - TD_MIN(s->local_cached, (uint64_t)s->n_prompt),
                                  s->dw_hb == s->dw->n_hb);
        td_metric_observe(rt->m_ttft, now - j->t_arrival);
    } else {
        td_metric_observe(rt->m_itl, now - s->t_last);
    }
    s->t_last = now;
    if (s->n_tokens == s->cap_gen) {
        size_t cap = s->cap_gen ? s->cap_gen * 2 : 64;
        int32_t *g = td_reallocarray(s->gen, cap, sizeof(*g));
        if (!g) {
            td__reqs_job_fail(j, 500, TD_ENOMEM, "out of memory");
            return false;
        }
        s->gen = g;
        s->cap_gen = cap;
    }
    s->gen[s->n_tokens++] = id;
    int rc = td_detok_step(rt->tok, &s->detok, id, &s->text);
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof(msg), "decode worker %s sent token id %d outside the vocabulary",
                 s->dw ? s->dw->id : "?", id);
        td__reqs_job_fail(j, 500, TD_EPROTO, msg);
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
        td__reqs_finish(rt, s, TD_RESP_STOP, j->stop[k]);
        td__reqs_job_maybe_done(j);
        return false;
    }
    size_t safe = s->text.len - holdback(s);
    size_t rel = safe > s->sent ? safe - s->sent : 0;
    j->ops->token(j, s->index, id, lp, s->text.data + s->sent, rel);
    s->sent += rel;
    return true;
}
