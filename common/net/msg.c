/* msg.c: shared message builders (td_msg.h). */
#include "td_msg.h"
#include "td_error.h"

#include <string.h>

void td_msg_sampling_to_proto(const td_sampling_t *p, uint64_t seed, Tandem__Sampling *out)
{
    tandem__sampling__init(out);
    out->temperature = p->temperature;
    out->top_k = p->top_k;
    out->top_p = p->top_p;
    out->min_p = p->min_p;
    out->seed = seed;
    out->max_tokens = p->max_tokens;
    out->n_stop_ids = (size_t)p->n_stop;
    out->stop_ids = (int32_t *)p->stop_ids;
    out->ignore_eos = p->ignore_eos;
    out->logprobs = p->logprobs;
    out->presence_penalty = p->presence_penalty;
    out->frequency_penalty = p->frequency_penalty;
    out->repetition_penalty = p->repetition_penalty;
    out->min_tokens = p->min_tokens;
    out->n_bad_words = 0;
    for (int i = 0; i < p->n_bad_words; i++)
        out->n_bad_words += p->bad_word_len[i];
    out->bad_words = (int32_t *)p->bad_words;
    out->n_bad_word_lens = (size_t)p->n_bad_words;
    out->bad_word_lens = (uint32_t *)p->bad_word_len;
    out->n_logit_bias_ids = out->n_logit_bias_values = (size_t)p->n_logit_bias;
    out->logit_bias_ids = (int32_t *)p->logit_bias_ids;
    out->logit_bias_values = (float *)p->logit_bias_values;
    out->json_mode = (uint32_t)p->json_mode;
    if (p->json_mode == 2 && p->json_schema)
        out->json_schema = (char *)p->json_schema; /* NUL-terminated (td_sampling_t says) */
}

int td_msg_sampling_from_proto(const Tandem__Sampling *sp, td_sampling_t *p)
{
    td_sampling_defaults(p);
    if (!sp)
        return 0;
    if (sp->n_stop_ids > TD_SAMPLER_MAX_STOP)
        return td_err_set(TD_EINVAL, "sampling.stop_ids: %zu ids (at most %d)", sp->n_stop_ids,
                          TD_SAMPLER_MAX_STOP);
    if (!(sp->top_p >= 0 && sp->top_p <= 1))
        return td_err_set(TD_EINVAL, "sampling.top_p: %g (0 for unset, else (0, 1])",
                          (double)sp->top_p);
    if (sp->logprobs < -1 || sp->logprobs > TD_SAMPLER_MAX_LOGPROBS)
        return td_err_set(TD_EINVAL, "sampling.logprobs: %d (-1..%d)", sp->logprobs,
                          TD_SAMPLER_MAX_LOGPROBS);
    p->temperature = sp->temperature;
    p->top_k = sp->top_k > 0 ? sp->top_k : 0;
    p->top_p = sp->top_p == 0 ? 1.0f : sp->top_p;
    p->min_p = sp->min_p;
    p->seed = sp->seed;
    p->max_tokens = sp->max_tokens > 0 ? sp->max_tokens : 0;
    p->ignore_eos = sp->ignore_eos;
    p->logprobs = sp->logprobs;
    for (size_t i = 0; i < sp->n_stop_ids; i++)
        p->stop_ids[i] = sp->stop_ids[i];
    p->n_stop = (int)sp->n_stop_ids;
    /* adjustments: shapes here, ranges in td_sampler_init (both name the field) */
    if (sp->n_logit_bias_ids != sp->n_logit_bias_values)
        return td_err_set(TD_EINVAL, "sampling.logit_bias: %zu ids but %zu values",
                          sp->n_logit_bias_ids, sp->n_logit_bias_values);
    if (sp->n_logit_bias_ids > TD_SAMPLER_MAX_BIAS)
        return td_err_set(TD_EINVAL, "sampling.logit_bias: %zu entries (at most %d)",
                          sp->n_logit_bias_ids, TD_SAMPLER_MAX_BIAS);
    size_t total = 0;
    for (size_t i = 0; i < sp->n_bad_word_lens; i++)
        total += sp->bad_word_lens[i];
    if (sp->n_bad_word_lens > TD_SAMPLER_MAX_BAD || total != sp->n_bad_words)
        return td_err_set(TD_EINVAL, "sampling.bad_words: %zu tokens, %zu by the lengths",
                          sp->n_bad_words, total);
    p->presence_penalty = sp->presence_penalty;
    p->frequency_penalty = sp->frequency_penalty;
    p->repetition_penalty = sp->repetition_penalty == 0 ? 1.0f : sp->repetition_penalty;
    p->min_tokens = sp->min_tokens;
    p->logit_bias_ids = sp->logit_bias_ids;
    p->logit_bias_values = sp->logit_bias_values;
    p->n_logit_bias = (int)sp->n_logit_bias_ids;
    p->bad_words = sp->bad_words;
    p->bad_word_len = sp->bad_word_lens;
    p->n_bad_words = (int)sp->n_bad_word_lens;
    if (sp->json_mode > 2)
        return td_err_set(TD_EINVAL, "sampling.json_mode: %u (0..2)", sp->json_mode);
    if (sp->json_mode == 2 && (!sp->json_schema || !*sp->json_schema))
        return td_err_set(TD_EINVAL, "sampling.json_schema: empty with json_mode 2");
    p->json_mode = (int)sp->json_mode;
    p->json_schema = sp->json_mode == 2 ? sp->json_schema : NULL;
    p->json_schema_len = p->json_schema ? strlen(p->json_schema) : 0;
    return 0;
}

int td_msg_send_error(td_rpc_conn_t *c, uint64_t request_id, int code, const char *message)
{
    if (!c)
        return 0;
    Tandem__Error e = TANDEM__ERROR__INIT;
    e.code = code;
    e.message = (char *)(message ? message : "");
    e.request_id = request_id;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_ERROR;
    f.error = &e;
    return td_rpc_send(c, &f);
}
