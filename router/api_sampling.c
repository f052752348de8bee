/* api_sampling.c: the request fields that adjust logits (logit_bias, min_tokens, bad_words) into the
 * request model, and the request model's sampling settings into the engine's td_sampling_t. The
 * penalties (presence, frequency, repetition) are plain numbers parsed with the rest in api.c. */
#include "api.h"
#include "td_error.h"
#include "td_jsonfsm.h"
#include "td_tokenizer.h"
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

#define MAX_BAD_WORDS 128

static int parse_bad_words(json_object *v, td_api_request_t *r, const char **param)
{
    if (!json_object_is_type(v, json_type_array))
        return bad(param, "bad_words", "'bad_words' must be an array of strings");
    size_t n = json_object_array_length(v);
    if (n > MAX_BAD_WORDS)
        return bad(param, "bad_words", "'bad_words' holds %zu strings; at most %d are allowed", n,
                   MAX_BAD_WORDS);
    if (!(r->bad_words = td_calloc(n + 1, sizeof(char *))))
        return td_err_set(TD_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *w = json_object_array_get_idx(v, i);
        if (!json_object_is_type(w, json_type_string) || !json_object_get_string_len(w))
            return bad(param, "bad_words", "'bad_words[%zu]' must be a non-empty string", i);
        if (!(r->bad_words[i] = td_strdup(json_object_get_string(w))))
            return td_err_set(TD_ENOMEM, "out of memory");
        r->n_bad_words = i + 1;
    }
    return 0;
}

/* Whether ids[0..n) is already one of r's banned sequences. */
static bool have_seq(const td_api_request_t *r, const int32_t *ids, size_t n)
{
    const int32_t *p = r->bad_word_ids;
    for (size_t i = 0; i < r->n_bad_seqs; p += r->bad_word_lens[i++])
        if (r->bad_word_lens[i] == n && !memcmp(p, ids, n * sizeof(int32_t)))
            return true;
    return false;
}

int td_api_tokenize_bad_words(td_api_request_t *r, const td_tokenizer_t *tok, const char **param)
{
    if (!r->n_bad_words)
        return 0;
    size_t total = 0;
    r->bad_word_ids = td_calloc(TD_SAMPLER_MAX_BAD, sizeof(int32_t));
    r->bad_word_lens = td_calloc(r->n_bad_words * 2, sizeof(uint32_t));
    if (!r->bad_word_ids || !r->bad_word_lens)
        return td_err_set(TD_ENOMEM, "out of memory");
    td_buf_t b;
    td_buf_init(&b);
    int rc = 0;
    for (size_t i = 0; !rc && i < r->n_bad_words; i++) {
        const char *w = r->bad_words[i];
        while (*w == ' ')
            w++; /* as vLLM: the word stripped of leading spaces, then with one */
        for (int space = 0; !rc && space < 2; space++) {
            b.len = 0;
            if (space)
                td_buf_append_char(&b, ' ');
            td_buf_append_str(&b, w);
            td_tokens_t t;
            td_tokens_init(&t);
            rc = td_tokenizer_encode(tok, b.data ? b.data : "", b.len, false, &t);
            if (!rc && t.len && !have_seq(r, t.ids, t.len)) {
                if (total + t.len > TD_SAMPLER_MAX_BAD)
                    rc = bad(param, "bad_words", "'bad_words' tokenize to more than %d tokens",
                             TD_SAMPLER_MAX_BAD);
                else {
                    memcpy(r->bad_word_ids + total, t.ids, t.len * sizeof(int32_t));
                    total += t.len;
                    r->bad_word_lens[r->n_bad_seqs++] = (uint32_t)t.len;
                }
            }
            td_tokens_free(&t);
        }
    }
    td_buf_free(&b);
    return rc;
}

int td_api_parse_adjust(json_object *o, td_api_request_t *r, const char **param)
{
    json_object *v;
    if (json_object_object_get_ex(o, "bad_words", &v) && v) {
        int rc = parse_bad_words(v, r, param);
        if (rc)
            return rc;
    }
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

/* A JSON schema given as `schema` (an object): kept as compact text once it compiles. */
static int take_schema(json_object *schema, td_api_request_t *r, const char **param,
                       const char *name)
{
    if (!schema || !json_object_is_type(schema, json_type_object))
        return bad(param, name, "'%s' must be a JSON schema object", name);
    const char *t = json_object_to_json_string_ext(schema, JSON_C_TO_STRING_PLAIN);
    td_jsonfsm_t *f;
    int rc = td_jsonfsm_compile(t, strlen(t), &f);
    if (rc) {
        *param = name;
        return rc == TD_ENOMEM ? rc : rc == TD_ENOTSUP ? TD_ENOTSUP : TD_EINVAL;
    }
    td_jsonfsm_free(f);
    if (!(r->json_schema = td_strdup(t)))
        return td_err_set(TD_ENOMEM, "out of memory");
    r->json_mode = 2;
    return 0;
}

int td_api_parse_response_format(json_object *o, td_api_request_t *r, const char **param)
{
    json_object *rf, *t, *js, *v;
    if (r->kind == TD_API_MESSAGES) {
        /* Anthropic's structured outputs: output_format {"type": "json_schema", "schema": {..}} */
        if (!json_object_object_get_ex(o, "output_format", &rf) || !rf)
            return 0;
        if (!json_object_is_type(rf, json_type_object) ||
            !json_object_object_get_ex(rf, "type", &t) || !json_object_is_type(t, json_type_string) ||
            strcmp(json_object_get_string(t), "json_schema") != 0)
            return bad(param, "output_format.type",
                       "'output_format' must be {\"type\": \"json_schema\", \"schema\": {...}}");
        json_object_object_get_ex(rf, "schema", &v);
        return take_schema(v, r, param, "output_format.schema");
    }
    if (r->kind == TD_API_RESPONSES) {
        /* Responses: text.format {"type": "json_schema", "name", "schema", "strict"} (flat) */
        if (!json_object_object_get_ex(o, "text", &v) || !v || !json_object_is_type(v, json_type_object) ||
            !json_object_object_get_ex(v, "format", &rf) || !rf)
            return 0;
        if (!json_object_is_type(rf, json_type_object) || !json_object_object_get_ex(rf, "type", &t) ||
            !json_object_is_type(t, json_type_string))
            return bad(param, "text.format", "'text.format' must be an object with a 'type'");
        const char *ty = json_object_get_string(t);
        if (!strcmp(ty, "text"))
            return 0;
        if (!strcmp(ty, "json_object")) {
            r->json_mode = 1;
            return 0;
        }
        if (strcmp(ty, "json_schema") != 0)
            return bad(param, "text.format.type",
                       "'text.format.type' must be 'text', 'json_object' or 'json_schema'");
        if (!json_object_object_get_ex(rf, "name", &v) || !json_object_is_type(v, json_type_string) ||
            !json_object_get_string_len(v))
            return bad(param, "text.format.name", "'text.format.name' must be a non-empty string");
        json_object_object_get_ex(rf, "schema", &v);
        return take_schema(v, r, param, "text.format.schema");
    }
    if (!json_object_object_get_ex(o, "response_format", &rf) || !rf)
        return 0;
    if (!json_object_is_type(rf, json_type_object) || !json_object_object_get_ex(rf, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return bad(param, "response_format", "'response_format' must be an object with a 'type'");
    const char *type = json_object_get_string(t);
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        r->json_mode = 1;
        return 0;
    }
    if (strcmp(type, "json_schema") != 0)
        return bad(param, "response_format.type",
                   "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '%s'",
                   type);
    if (!json_object_object_get_ex(rf, "json_schema", &js) || !js ||
        !json_object_is_type(js, json_type_object))
        return bad(param, "response_format.json_schema",
                   "'response_format.json_schema' must be an object with 'name' and 'schema'");
    if (!json_object_object_get_ex(js, "name", &v) || !json_object_is_type(v, json_type_string) ||
        !json_object_get_string_len(v))
        return bad(param, "response_format.json_schema.name",
                   "'response_format.json_schema.name' must be a non-empty string");
    if (json_object_object_get_ex(js, "strict", &v) && v && !json_object_is_type(v, json_type_boolean))
        return bad(param, "response_format.json_schema.strict",
                   "'response_format.json_schema.strict' must be a boolean");
    json_object_object_get_ex(js, "schema", &v);
    return take_schema(v, r, param, "response_format.json_schema.schema");
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
    out->bad_words = r->bad_word_ids;
    out->bad_word_len = r->bad_word_lens;
    out->n_bad_words = (int)r->n_bad_seqs;
    out->json_mode = r->json_mode;
    out->json_schema = r->json_schema;
    out->json_schema_len = r->json_schema ? strlen(r->json_schema) : 0;
}
