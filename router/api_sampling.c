/* api_sampling.c: the request fields that adjust logits (logit_bias, min_tokens) into the
 * request model, and the request model's sampling settings into the engine's td_sampling_t. The
 * penalties (presence, frequency, repetition) are plain numbers parsed with the rest in api.c. */
#include "api.h"
#include "td_error.h"
#include "td_util.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int bad(const char **param, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(const char **param, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    td_err_vset(TD_EINVAL, fmt, ap);
    va_end(ap);
    *param = name;
    return TD_EINVAL;
}

/* OpenAI's logit_bias: an object mapping token ids (decimal strings) to biases in [-100, 100]. */
static int parse_logit_bias(json_object *v, td_api_request_t *r, const char **param)
{
    if (!json_object_is_type(v, json_type_object))
        return bad(param, "logit_bias", "'logit_bias' must be an object of token id to bias");
    size_t n = (size_t)json_object_object_length(v);
    if (n > TD_SAMPLER_MAX_BIAS)
        return bad(param, "logit_bias", "'logit_bias' holds %zu entries; at most %d are allowed",
                   n, TD_SAMPLER_MAX_BIAS);
    r->logit_bias_ids = td_calloc(n + 1, sizeof(int32_t));
    r->logit_bias_values = td_calloc(n + 1, sizeof(float));
    if (!r->logit_bias_ids || !r->logit_bias_values)
        return td_err_set(TD_ENOMEM, "out of memory");
    json_object_object_foreach(v, key, val)
    {
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id > INT32_MAX || key[0] == '+' ||
            key[0] == ' ' || (key[0] == '0' && key[1]))
            return bad(param, "logit_bias", "'logit_bias' key \"%s\" is not a token id", key);
        if (!json_object_is_type(val, json_type_int) && !json_object_is_type(val, json_type_double))
            return bad(param, "logit_bias", "'logit_bias' value for %s must be a number", key);
        double b = json_object_get_double(val);
        if (!(b >= -100 && b <= 100))
            return bad(param, "logit_bias",
                       "'logit_bias' value for %s must be in [-100, 100], got %g", key, b);
        r->logit_bias_ids[r->n_logit_bias] = (int32_t)id;
        r->logit_bias_values[r->n_logit_bias++] = (float)b;
    }
    return 0;
}

int td_api_parse_adjust(json_object *o, td_api_request_t *r, const char **param)
{
    json_object *v;
    if (json_object_object_get_ex(o, "logit_bias", &v) && v) {
        int rc = parse_logit_bias(v, r, param);
        if (rc)
            return rc;
    }
    if (json_object_object_get_ex(o, "min_tokens", &v) && v) {
        double d = json_object_get_double(v);
        if ((!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double)) ||
            d != floor(d))
            return bad(param, "min_tokens", "'min_tokens' must be an integer");
        if (d < 0 || d > INT32_MAX)
            return bad(param, "min_tokens", "'min_tokens' must be in [0, %d], got %g", INT32_MAX,
                       d);
        r->min_tokens = (int64_t)d;
    }
    return 0;
}

int td_api_check_adjust(const td_api_request_t *r, const char **param)
{
    if (r->max_tokens > 0 && r->min_tokens > r->max_tokens)
        return bad(param, "min_tokens", "'min_tokens' (%lld) must not exceed 'max_tokens' (%lld)",
                   (long long)r->min_tokens, (long long)r->max_tokens);
    return 0;
}

void td_api_sampling(const td_api_request_t *r, td_sampling_t *out)
{
    td_sampling_defaults(out);
    out->temperature = (float)r->temperature;
    out->top_k = r->top_k > 0 ? (int)r->top_k : 0;
    out->top_p = (float)r->top_p;
    out->min_p = (float)r->min_p;
    out->ignore_eos = r->ignore_eos;
    out->logprobs = r->logprobs ? (int)r->top_logprobs : -1;
    TD_ASSERT(r->n_stop_token_ids <= TD_SAMPLER_MAX_STOP); /* td_api_parse refuses more */
    for (size_t i = 0; i < r->n_stop_token_ids; i++)
        out->stop_ids[i] = r->stop_token_ids[i];
    out->n_stop = (int)r->n_stop_token_ids;
    out->presence_penalty = (float)r->presence_penalty;
    out->frequency_penalty = (float)r->frequency_penalty;
    out->repetition_penalty = (float)r->repetition_penalty;
    out->min_tokens = (int)r->min_tokens;
    out->logit_bias_ids = r->logit_bias_ids;
    out->logit_bias_values = r->logit_bias_values;
    out->n_logit_bias = (int)r->n_logit_bias;
}
