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
