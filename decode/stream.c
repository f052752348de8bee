/* stream.c: a decode worker's tokens to the router: one TokenChunk per token (with its logprob
 * record when asked), the last one carrying the finish reason and usage, or an Error frame. */
#include "decode.h"
#include "td_error.h"
#include "td_util.h"

/* TokenChunk for the last `n` tokens of s, with their samples when asked. */
static void send_tokens(td_worker_t *w, td_wk_seq_t *s, int n, const td_sample_t *const *samples,
                        td_finish_t fin)
{
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    Tandem__TokenLogprob lp[4], *lpp[4];
    int32_t top_ids[4][TD_SAMPLER_MAX_LOGPROBS];
    float top_lp[4][TD_SAMPLER_MAX_LOGPROBS];
    TD_ASSERT(n <= 4);
    c.request_id = s->req;
    c.n_tokens = (size_t)n;
    c.tokens = s->toks + s->n_toks - n;
    if (s->logprobs >= 0 && samples) {
        for (int i = 0; i < n; i++) {
            tandem__token_logprob__init(&lp[i]);
            lp[i].logprob = samples[i]->logprob;
            for (int k = 0; k < samples[i]->n_top; k++) {
                top_ids[i][k] = samples[i]->top[k].id;
                top_lp[i][k] = samples[i]->top[k].logprob;
            }
            lp[i].n_top_ids = lp[i].n_top_logprobs = (size_t)samples[i]->n_top;
            lp[i].top_ids = top_ids[i];
            lp[i].top_logprobs = top_lp[i];
            lpp[i] = &lp[i];
        }
        c.n_logprobs = (size_t)n;
        c.logprobs = lpp;
    }
    if (fin != TD_FINISH_NONE) {
        c.finish = fin == TD_FINISH_STOP ? TANDEM__FINISH__FINISH_STOP
                                         : TANDEM__FINISH__FINISH_LENGTH;
        td_wk_seq_usage(s, &c.prompt_tokens, &c.completion_tokens, &c.cached_tokens);
        c.error = "";
    }
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_TOKEN_CHUNK;
    f.token_chunk = &c;
    td_wk_send(s, &f);
    td_metric_add(w->m.gen, n);
}

void td_decode_report_failure(td_worker_t *w, td_wk_seq_t *s, int code, const char *msg)
{
    (void)w;
    td_wk_send_error(s->rt, s->req, code, msg);
}

/* Append the token, stream it, and finish the sequence when its sampler says so. */
static void emit(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *smp)
{
    const td_sample_t *one[1] = {smp};
    if (td_wk_seq_push_token(s, smp->token)) {
        td_wk_seq_fail(w, s, TD_ENOMEM, "out of memory");
        return;
    }
    send_tokens(w, s, 1, one, smp->finish);
    if (smp->finish != TD_FINISH_NONE) {
        td_metric_add(w->m.req_ok, 1);
        td_wk_seq_kill(w, s);
    }
}

void td_decode_first_token(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *smp)
{
    if (smp->finish == TD_FINISH_NONE)
        s->state = TD_WK_RUN;
    emit(w, s, smp);
}

void td_decode_decoded(td_worker_t *w, td_wk_seq_t *s, const td_sample_t *out)
{
    emit(w, s, out);
}
