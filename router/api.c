/* api.c: parsing and validating OpenAI and Anthropic request bodies (json-c, strict mode). */
#include "api_impl.h"
#include "td_error.h"
#include "td_util.h"

#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef td_api_ctx_t ctx_t;
#define fail td__api_fail
#define field td__api_field
#define type_name td__api_type_name

int td__api_fail(ctx_t *c, const char *param, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    td_err_vset(code, fmt, ap);
    va_end(ap);
    c->param = param;
    return code;
}

const char *td__api_param(const char *fmt, ...)
{
    static _Thread_local char buf[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return buf;
}

json_object *td__api_field(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v))
        return NULL;
    return v; /* NULL also for an explicit null: absent and null mean the same here */
}

const char *td__api_type_name(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double: return "a number";
    case json_type_int: return "an integer";
    case json_type_object: return "an object";
    case json_type_array: return "an array";
    case json_type_string: return "a string";
    }
    return "?";
}

/* The number literal of `key` as written in the body (json-c saturates integers beyond 64 bits,
 * so an error would otherwise echo INT64_MAX), into out; false when not found. The first
 * `"key"` (not inside a string: not after a backslash) followed by ':' and a number wins. */
static bool raw_number(const ctx_t *c, const char *key, char *out, size_t n)
{
    size_t kl = strlen(key);
    if (!c->body)
        return false;
    for (const char *p = c->body, *end = c->body + c->len; p + kl + 2 <= end; p++) {
        if (*p != '"' || (p > c->body && p[-1] == '\\') || memcmp(p + 1, key, kl) != 0 ||
            p[kl + 1] != '"')
            continue;
        const char *q = p + kl + 2;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
            q++;
        if (q >= end || *q++ != ':')
            continue;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
            q++;
        size_t l = 0;
        while (q + l < end && l + 1 < n && q[l] && strchr("+-0123456789.eE", q[l]))
            l++;
        if (!l || (q + l < end && q[l] && strchr("+-0123456789.eE", q[l])))
            continue; /* not a number, or longer than out */
        memcpy(out, q, l);
        out[l] = '\0';
        return true;
    }
    return false;
}

/* Integers may be written as 16 or 16.0 (as Python clients sometimes send), never 16.5. */
static int get_int(ctx_t *c, json_object *o, const char *key, int64_t lo, int64_t hi, bool *set,
                   int64_t *out)
{
    json_object *v = field(o, key);
    *set = false;
    if (!v)
        return 0;
    int64_t x;
    if (json_object_is_type(v, json_type_int)) {
        x = json_object_get_int64(v);
    } else if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (d != floor(d) || fabs(d) > 9e15)
            return fail(c, key, TD_EINVAL, "'%s' must be an integer, got %g", key, d);
        x = (int64_t)d;
    } else {
        return fail(c, key, TD_EINVAL, "'%s' must be an integer, got %s", key, type_name(v));
    }
    char raw[64];
    if ((x == INT64_MAX || x == INT64_MIN) && (x > hi || x < lo) &&
        raw_number(c, key, raw, sizeof(raw)))
        return fail(c, key, TD_EINVAL, "'%s' must be in [%lld, %lld], got %s", key,
                    (long long)lo, (long long)hi, raw);
    if ((x == INT64_MAX || x == INT64_MIN) && (x > hi || x < lo))
        return fail(c, key, TD_EINVAL, "'%s' must be in [%lld, %lld], got a number beyond 64 bits",
                    key, (long long)lo, (long long)hi);
    if (x < lo || x > hi)
        return fail(c, key, TD_EINVAL, "'%s' must be in [%lld, %lld], got %lld", key,
                    (long long)lo, (long long)hi, (long long)x);
    *set = true;
    *out = x;
    return 0;
}

static int get_num(ctx_t *c, json_object *o, const char *key, double lo, double hi, bool lo_open,
                   double *out)
{
    json_object *v = field(o, key);
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return fail(c, key, TD_EINVAL, "'%s' must be a number, got %s", key, type_name(v));
    double x = json_object_get_double(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return fail(c, key, TD_EINVAL, "'%s' must be in %s%g, %g], got %g", key,
                    lo_open ? "(" : "[", lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(ctx_t *c, json_object *o, const char *key, bool *out)
{
    json_object *v = field(o, key);
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_boolean))
        return fail(c, key, TD_EINVAL, "'%s' must be a boolean, got %s", key, type_name(v));
    *out = json_object_get_boolean(v);
    return 0;
}

static int get_str(ctx_t *c, json_object *o, const char *key, char **out)
{
    json_object *v = field(o, key);
    if (!v)
        return 0;
    if (!json_object_is_type(v, json_type_string))
        return fail(c, key, TD_EINVAL, "'%s' must be a string, got %s", key, type_name(v));
    *out = td_strndup(json_object_get_string(v), (size_t)json_object_get_string_len(v));
    return *out ? 0 : TD_ENOMEM;
}

static int add_stop(ctx_t *c, td_api_request_t *r, const char *param, json_object *s)
{
    if (!json_object_is_type(s, json_type_string))
        return fail(c, param, TD_EINVAL, "'%s' entries must be strings, got %s", param,
                    type_name(s));
    if (json_object_get_string_len(s) == 0)
        return fail(c, param, TD_EINVAL, "'%s' entries must not be empty", param);
    if (r->n_stop >= TD_API_MAX_STOP)
        return fail(c, param, TD_EINVAL, "at most %d stop strings", TD_API_MAX_STOP);
    char *dup = td_strndup(json_object_get_string(s), (size_t)json_object_get_string_len(s));
    if (!dup)
        return TD_ENOMEM;
    r->stop[r->n_stop++] = dup;
    return 0;
}

static int get_stop(ctx_t *c, json_object *o, const char *key, td_api_request_t *r)
{
    json_object *v = field(o, key);
    if (!v)
        return 0;
    r->stop = calloc(TD_API_MAX_STOP, sizeof(char *));
    if (!r->stop)
        return TD_ENOMEM;
    if (!json_object_is_type(v, json_type_array))
        return add_stop(c, r, key, v);
    int rc = 0;
    for (size_t i = 0; i < json_object_array_length(v) && !rc; i++)
        rc = add_stop(c, r, key, json_object_array_get_idx(v, i));
    return rc;
}

/* An array of token ids; `what` names it in errors. */
static int get_ids(ctx_t *c, json_object *v, const char *param, int32_t **ids, size_t *n)
{
    size_t len = json_object_array_length(v);
    *ids = malloc((len ? len : 1) * sizeof(int32_t));
    if (!*ids)
        return TD_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!json_object_is_type(e, json_type_int))
            return fail(c, param, TD_EINVAL, "'%s' must hold token ids (integers), element %zu is %s",
                        param, i, type_name(e));
        int64_t id = json_object_get_int64(e);
        if (id < 0 || id > INT32_MAX)
            return fail(c, param, TD_EINVAL, "'%s': token id %lld out of range", param,
                        (long long)id);
        (*ids)[i] = (int32_t)id;
    }
    *n = len;
    return 0;
}

static int parse_prompts(ctx_t *c, json_object *o, td_api_request_t *r)
{
    json_object *p = field(o, "prompt");
    if (!p)
        return fail(c, "prompt", TD_EINVAL, "'prompt' is required");
    if (json_object_is_type(p, json_type_string)) {
        r->prompts = calloc(1, sizeof(*r->prompts));
        if (!r->prompts)
            return TD_ENOMEM;
        r->n_prompts = 1;
        r->prompts[0].text = td_strndup(json_object_get_string(p),
                                        (size_t)json_object_get_string_len(p));
        if (!r->prompts[0].text)
            return TD_ENOMEM;
        if (!*r->prompts[0].text)
            return fail(c, "prompt", TD_EINVAL, "'prompt' must not be empty");
        return 0;
    }
    if (!json_object_is_type(p, json_type_array))
        return fail(c, "prompt", TD_EINVAL,
                    "'prompt' must be a string, an array of strings, an array of token ids or "
                    "an array of arrays of token ids; got %s", type_name(p));
    size_t len = json_object_array_length(p);
    if (len == 0)
        return fail(c, "prompt", TD_EINVAL, "'prompt' must not be empty");
    json_object *first = json_object_array_get_idx(p, 0);
    if (json_object_is_type(first, json_type_int)) { /* one prompt as token ids */
        r->prompts = calloc(1, sizeof(*r->prompts));
        if (!r->prompts)
            return TD_ENOMEM;
        r->n_prompts = 1;
        return get_ids(c, p, "prompt", &r->prompts[0].ids, &r->prompts[0].n_ids);
    }
    r->prompts = calloc(len, sizeof(*r->prompts));
    if (!r->prompts)
        return TD_ENOMEM;
    r->n_prompts = len;
    for (size_t i = 0; i < len; i++) {
        json_object *e = json_object_array_get_idx(p, i);
        if (json_object_is_type(e, json_type_string)) {
            if (json_object_get_string_len(e) == 0)
                return fail(c, "prompt", TD_EINVAL, "'prompt[%zu]' must not be empty", i);
            r->prompts[i].text = td_strndup(json_object_get_string(e),
                                            (size_t)json_object_get_string_len(e));
            if (!r->prompts[i].text)
                return TD_ENOMEM;
        } else if (json_object_is_type(e, json_type_array)) {
            if (json_object_array_length(e) == 0)
                return fail(c, "prompt", TD_EINVAL, "'prompt[%zu]' must not be empty", i);
            int rc = get_ids(c, e, "prompt", &r->prompts[i].ids, &r->prompts[i].n_ids);
            if (rc)
                return rc;
        } else {
            return fail(c, "prompt", TD_EINVAL,
                        "'prompt[%zu]' must be a string or an array of token ids, got %s", i,
                        type_name(e));
        }
    }
    return 0;
}

/* Fields every kind shares. */
static int parse_sampling(ctx_t *c, json_object *o, td_api_request_t *r, double max_temp)
{
    bool set;
    int64_t v;
    int rc;
    if ((rc = get_str(c, o, "model", &r->model)))
        return rc;
    if ((rc = get_num(c, o, "temperature", 0, max_temp, false, &r->temperature)) ||
        (rc = get_num(c, o, "top_p", 0, 1, true, &r->top_p)) ||
        (rc = get_num(c, o, "min_p", 0, 1, false, &r->min_p)) ||
        (rc = get_num(c, o, "presence_penalty", -2, 2, false, &r->presence_penalty)) ||
        (rc = get_num(c, o, "frequency_penalty", -2, 2, false, &r->frequency_penalty)) ||
        (rc = get_num(c, o, "repetition_penalty", 0, 100, true, &r->repetition_penalty)))
        return rc;
    if ((rc = get_int(c, o, "top_k", -1, INT32_MAX, &set, &v)))
        return rc;
    r->top_k = set && v > 0 ? v : 0;
    if ((rc = get_int(c, o, "seed", INT64_MIN, INT64_MAX, &r->has_seed, &r->seed)))
        return rc;
    if ((rc = get_bool(c, o, "stream", &r->stream)) || (rc = get_bool(c, o, "ignore_eos", &r->ignore_eos)))
        return rc;
    if ((rc = td_api_parse_adjust(o, r, &c->param)))
        return rc;
    json_object *ids = field(o, "stop_token_ids");
    if (ids) {
        if (!json_object_is_type(ids, json_type_array))
            return fail(c, "stop_token_ids", TD_EINVAL, "'stop_token_ids' must be an array");
        /* the sampler holds a fixed number: refuse more rather than drop some */
        if (json_object_array_length(ids) > TD_API_MAX_STOP_IDS)
            return fail(c, "stop_token_ids", TD_EINVAL,
                        "'stop_token_ids' holds %zu ids; at most %d are allowed",
                        json_object_array_length(ids), TD_API_MAX_STOP_IDS);
        if ((rc = get_ids(c, ids, "stop_token_ids", &r->stop_token_ids, &r->n_stop_token_ids)))
            return rc;
    }
    json_object *so = field(o, "stream_options");
    if (so) {
        if (!json_object_is_type(so, json_type_object))
            return fail(c, "stream_options", TD_EINVAL, "'stream_options' must be an object");
        if (!r->stream)
            return fail(c, "stream_options", TD_EINVAL,
                        "'stream_options' is only allowed when 'stream' is true");
        if ((rc = get_bool(c, so, "include_usage", &r->include_usage))) {
            c->param = "stream_options.include_usage";
            return rc;
        }
    }
    return 0;
}

static int parse_max_tokens(ctx_t *c, json_object *o, const char *key, td_api_request_t *r)
{
    bool set;
    int64_t v;
    int rc = get_int(c, o, key, 1, INT32_MAX, &set, &v);
    if (!rc && set)
        r->max_tokens = v;
    return rc;
}

static int parse_completions(ctx_t *c, json_object *o, td_api_request_t *r)
{
    int rc;
    bool set;
    int64_t v;
    if ((rc = parse_prompts(c, o, r)) || (rc = parse_sampling(c, o, r, 2)) ||
        (rc = get_stop(c, o, "stop", r)) || (rc = parse_max_tokens(c, o, "max_tokens", r)) ||
        (rc = get_bool(c, o, "echo", &r->echo)) || (rc = get_str(c, o, "user", &r->user)))
        return rc;
    if ((rc = get_int(c, o, "n", 1, TD_API_MAX_N, &set, &v)))
        return rc;
    if (set)
        r->n = v;
    if ((rc = get_int(c, o, "logprobs", 0, TD_API_MAX_LOGPROBS, &set, &v)))
        return rc;
    if (set) {
        r->logprobs = true;
        r->top_logprobs = v;
    }
    json_object *suffix = field(o, "suffix");
    if (suffix && (!json_object_is_type(suffix, json_type_string) ||
                   json_object_get_string_len(suffix) > 0))
        return fail(c, "suffix", TD_ENOTSUP, "'suffix' is not supported");
    if ((rc = get_int(c, o, "best_of", 1, TD_API_MAX_N, &set, &v)))
        return rc;
    if (set && v != r->n)
        return fail(c, "best_of", TD_ENOTSUP, "'best_of' other than 'n' is not supported");
    if ((rc = td_api_parse_response_format(o, r, &c->param)))
        return rc;
    return 0;
}

static int parse_chat(ctx_t *c, json_object *o, td_api_request_t *r)
{
    int rc;
    bool set;
    int64_t v;
    json_object *m = field(o, "messages");
    if (!m || !json_object_is_type(m, json_type_array))
        return fail(c, "messages", TD_EINVAL, "'messages' must be an array of messages");
    if (json_object_array_length(m) == 0)
        return fail(c, "messages", TD_EINVAL, "'messages' must not be empty");
    if ((rc = td_chat_msgs_from_json(&r->msgs, m))) {
        c->param = "messages";
        return rc;
    }
    if ((rc = parse_sampling(c, o, r, 2)) || (rc = get_stop(c, o, "stop", r)) ||
        (rc = parse_max_tokens(c, o, "max_tokens", r)) ||
        (rc = parse_max_tokens(c, o, "max_completion_tokens", r)) ||
        (rc = get_bool(c, o, "logprobs", &r->logprobs)) || (rc = get_str(c, o, "user", &r->user)) ||
        (rc = get_bool(c, o, "add_generation_prompt", &r->add_generation_prompt)))
        return rc;
    if ((rc = get_int(c, o, "n", 1, TD_API_MAX_N, &set, &v)))
        return rc;
    if (set)
        r->n = v;
    if ((rc = get_int(c, o, "top_logprobs", 0, TD_API_MAX_LOGPROBS, &set, &v)))
        return rc;
    if (set) {
        if (!r->logprobs && v > 0)
            return fail(c, "top_logprobs", TD_EINVAL,
                        "'top_logprobs' requires 'logprobs' to be true");
        r->top_logprobs = v;
    }
    json_object *kw = field(o, "chat_template_kwargs");
    if (kw) {
        if (!json_object_is_type(kw, json_type_object))
            return fail(c, "chat_template_kwargs", TD_EINVAL,
                        "'chat_template_kwargs' must be an object");
        static const char *const reserved[] = {"messages", "tools", "documents",
                                               "add_generation_prompt"};
        for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
            if (json_object_object_get_ex(kw, reserved[i], NULL))
                return fail(c, "chat_template_kwargs", TD_EINVAL,
                            "'chat_template_kwargs' cannot set '%s'", reserved[i]);
        bool thinking = true;
        if ((rc = get_bool(c, kw, "enable_thinking", &thinking))) {
            c->param = "chat_template_kwargs.enable_thinking";
            return rc;
        }
        r->disable_thinking = !thinking;
        r->template_kwargs = json_object_get(kw);
    }
    if ((rc = td__api_tools_openai(c, o, r)))
        return rc;
    if ((rc = td_api_parse_response_format(o, r, &c->param)))
        return rc;
    return 0;
}

/* Anthropic: system (string or text blocks) and user/assistant messages (string or blocks). */
static int parse_messages(ctx_t *c, json_object *o, td_api_request_t *r)
{
    int rc;
    bool set;
    int64_t v;
    if ((rc = get_int(c, o, "max_tokens", 1, INT32_MAX, &set, &v)))
        return rc;
    if (!set)
        return fail(c, "max_tokens", TD_EINVAL, "'max_tokens' is required");
    r->max_tokens = v;
    json_object *m = field(o, "messages");
    if (!m || !json_object_is_type(m, json_type_array) || json_object_array_length(m) == 0)
        return fail(c, "messages", TD_EINVAL, "'messages' must be a non-empty array");
    json_object *all = NULL;
    if ((rc = td__api_anthropic_messages(c, field(o, "system"), m, &all)))
        return rc;
    rc = td_chat_msgs_from_json(&r->msgs, all);
    json_object_put(all);
    if (rc) {
        c->param = "messages";
        return rc;
    }
    if ((rc = parse_sampling(c, o, r, 1)) || (rc = get_stop(c, o, "stop_sequences", r)) ||
        (rc = td__api_tools_anthropic(c, o, r)) ||
        (rc = td_api_parse_response_format(o, r, &c->param)))
        return rc;
    json_object *md = field(o, "metadata");
    if (md && json_object_is_type(md, json_type_object) && (rc = get_str(c, md, "user_id", &r->user)))
        return rc;
    return 0;
}

/* OpenAI Responses: input items and instructions become messages, then as chat. */
static int parse_responses(ctx_t *c, json_object *o, td_api_request_t *r)
{
    int rc;
    if ((rc = td__api_responses(c, o, r)) || (rc = parse_sampling(c, o, r, 2)) ||
        (rc = parse_max_tokens(c, o, "max_output_tokens", r)) || (rc = get_str(c, o, "user", &r->user)))
        return rc;
    if (field(o, "previous_response_id"))
        return fail(c, "previous_response_id", TD_ENOTSUP,
                    "'previous_response_id' is not supported: responses are not stored, send the "
                    "whole conversation as input items");
    return td_api_parse_response_format(o, r, &c->param);
}

/* One tokener per thread, reset after each body (so it is clean for the next): a fresh one costs
 * a handful of allocations and its string buffer regrows through every long prompt. */
static _Thread_local json_tokener *tls_tok;
#define TOK_KEEP_MAX (64u << 10) /* bodies up to this size leave the tokener for the next */

int td_api_parse_object(const char *body, size_t len, json_object **out)
{
    *out = NULL;
    json_tokener *tok = tls_tok;
    if (!tok) {
        if (!(tok = json_tokener_new()))
            return td_err_set(TD_ENOMEM, "out of memory");
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
        tls_tok = tok;
    }
    json_object *o = json_tokener_parse_ex(tok, body ? body : "",
                                           (int)TD_MIN(len, (size_t)INT32_MAX));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_reset(tok); /* drops what a failed parse left on its stack */
    if (len > TOK_KEEP_MAX) { /* its string buffer grew to the body: not kept */
        json_tokener_free(tok);
        tls_tok = NULL;
    }
    if (!o || jerr != json_tokener_success) {
        json_object_put(o);
        return td_err_set(TD_EPARSE, "request body is not valid JSON: %s",
                          json_tokener_error_desc(jerr == json_tokener_continue
                                                      ? json_tokener_error_parse_eof
                                                      : jerr));
    }
    for (; used < len; used++) {
        if (body[used] != ' ' && body[used] != '\n' && body[used] != '\r' && body[used] != '\t') {
            json_object_put(o);
            return td_err_set(TD_EPARSE, "request body has trailing data after the JSON value");
        }
    }
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return td_err_set(TD_EINVAL, "request body must be a JSON object");
    }
    *out = o;
    return 0;
}

int td_api_parse(td_api_kind_t kind, const char *body, size_t len, td_api_request_t *out,
                 const char **param)
{
    ctx_t c = {NULL, body, len};
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    out->max_tokens = -1;
    out->temperature = 1.0;
    out->top_p = 1.0;
    out->repetition_penalty = 1.0;
    out->n = 1;
    out->add_generation_prompt = true;
    *param = NULL;

    json_object *o;
    int rc = td_api_parse_object(body, len, &o);
    if (rc)
        return rc;
    switch (kind) {
    case TD_API_COMPLETIONS: rc = parse_completions(&c, o, out); break;
    case TD_API_CHAT: rc = parse_chat(&c, o, out); break;
    case TD_API_RESPONSES: rc = parse_responses(&c, o, out); break;
    default: rc = parse_messages(&c, o, out); break;
    }
    json_object_put(o);
    if (!rc)
        rc = td_api_check_adjust(out, &c.param);
    if (rc) {
        *param = c.param;
        td_api_request_free(out);
    }
    return rc;
}

bool td_api_tool_forced(const td_api_request_t *r)
{
    return r->tools && (r->tool_choice == TD_API_TOOLS_REQUIRED || r->tool_choice == TD_API_TOOLS_NAMED);
}

void td_api_request_free(td_api_request_t *r)
{
    for (size_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    td_chat_msgs_free(&r->msgs);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->logit_bias_ids);
    free(r->logit_bias_values);
    free(r->json_schema);
    for (size_t i = 0; i < r->n_bad_words; i++)
        free(r->bad_words[i]);
    free(r->bad_words);
    free(r->bad_word_ids);
    free(r->bad_word_lens);
    free(r->model);
    free(r->user);
    free(r->tool_name);
    json_object_put(r->tools);
    json_object_put(r->template_kwargs);
    memset(r, 0, sizeof(*r));
}
