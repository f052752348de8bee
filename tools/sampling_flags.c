/* sampling_flags.c: the sampling flags of `tandem generate` and `tandem ctl generate`
 * (sampling_flags.h), parsed with td_util.h's strict number parsers. */
#include "sampling_flags.h"

#include "td_error.h"
#include "td_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int td_sampling_flags_parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (td_parse_i64(s, &v) != 0 || v < lo || v > hi)
        return td_err_set(TD_EINVAL, "%s: \"%s\" is not an integer in [%d, %d]", flag, s, lo, hi);
    *out = (int)v;
    return 0;
}

/* Finite number flag value in [lo, hi], or (lo, hi] when `open_lo`. 0 or TD_EINVAL naming the
 * flag. */
static int parse_float(const char *flag, const char *s, double lo, bool open_lo, double hi,
                       float *out)
{
    double v;
    if (td_parse_double(s, &v) != 0 || !isfinite(v) || v < lo || (open_lo && v == lo) || v > hi) {
        if (isinf(hi))
            return td_err_set(TD_EINVAL, "%s: \"%s\" is not a finite number >= %g", flag, s, lo);
        return td_err_set(TD_EINVAL, "%s: \"%s\" is not a number in %c%g, %g]", flag, s,
                          open_lo ? '(' : '[', lo, hi);
    }
    *out = (float)v;
    return 0;
}

bool td_sampling_flags_has(int opt)
{
    return opt >= TD_SAMPLING_FLAG_MAX_TOKENS && opt < TD_SAMPLING_FLAG_END;
}

/* --logit-bias ID:BIAS,...: the lists a td_sampling_t borrows, kept for the process. */
static int32_t bias_ids[TD_SAMPLER_MAX_BIAS];
static float bias_values[TD_SAMPLER_MAX_BIAS];

static int parse_logit_bias(const char *arg, td_sampling_t *sp)
{
    int n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        if (n == TD_SAMPLER_MAX_BIAS)
            return td_err_set(TD_EINVAL, "--logit-bias: more than %d pairs", TD_SAMPLER_MAX_BIAS);
        if (*p < '0' || *p > '9')
            return td_err_set(TD_EINVAL, "--logit-bias: \"%s\": expected ID:BIAS pairs", arg);
        long id = strtol(p, &end, 10);
        if (*end != ':' || id > INT32_MAX)
            return td_err_set(TD_EINVAL, "--logit-bias: \"%s\": expected ID:BIAS pairs", arg);
        double b = strtod(end + 1, &end);
        if ((*end && *end != ',') || end == p || !(b >= -100 && b <= 100))
            return td_err_set(TD_EINVAL, "--logit-bias: \"%s\": a bias in [-100, 100] after "
                              "each ID:", arg);
        bias_ids[n] = (int32_t)id;
        bias_values[n++] = (float)b;
        p = *end ? end + 1 : end;
    }
    if (!n)
        return td_err_set(TD_EINVAL, "--logit-bias: no pairs");
    sp->logit_bias_ids = bias_ids;
    sp->logit_bias_values = bias_values;
    sp->n_logit_bias = n;
    return 0;
}

int td_sampling_flags_apply(int opt, const char *arg, td_sampling_t *sp)
{
    int32_t *ids;
    size_t n;
    int rc;
    switch (opt) {
    case TD_SAMPLING_FLAG_MAX_TOKENS:
        return td_sampling_flags_parse_int("--max-tokens", arg, 1, 1 << 20, &sp->max_tokens);
    case TD_SAMPLING_FLAG_TEMPERATURE:
        return parse_float("--temperature", arg, 0, false, INFINITY, &sp->temperature);
    case TD_SAMPLING_FLAG_TOP_K:
        return td_sampling_flags_parse_int("--top-k", arg, 0, 1 << 24, &sp->top_k);
    case TD_SAMPLING_FLAG_TOP_P:
        return parse_float("--top-p", arg, 0, true, 1, &sp->top_p);
    case TD_SAMPLING_FLAG_MIN_P:
        return parse_float("--min-p", arg, 0, false, 1, &sp->min_p);
    case TD_SAMPLING_FLAG_SEED:
        if (td_parse_u64(arg, &sp->seed) != 0)
            return td_err_set(TD_EINVAL, "--seed: \"%s\" is not an unsigned integer", arg);
        return 0;
    case TD_SAMPLING_FLAG_STOP_IDS:
        if ((rc = td_sampling_flags_parse_ids("--stop-ids", arg, false, &ids, &n)))
            return rc;
        if (n > TD_SAMPLER_MAX_STOP) {
            free(ids);
            return td_err_set(TD_EINVAL, "--stop-ids: %zu ids (at most %d)", n,
                              TD_SAMPLER_MAX_STOP);
        }
        memcpy(sp->stop_ids, ids, n * sizeof(int32_t));
        sp->n_stop = (int)n;
        free(ids);
        return 0;
    case TD_SAMPLING_FLAG_IGNORE_EOS:
        sp->ignore_eos = true;
        return 0;
    case TD_SAMPLING_FLAG_LOGPROBS:
        return td_sampling_flags_parse_int("--logprobs", arg, -1, TD_SAMPLER_MAX_LOGPROBS,
                                           &sp->logprobs);
    case TD_SAMPLING_FLAG_PRESENCE:
        return parse_float("--presence-penalty", arg, -2, false, 2, &sp->presence_penalty);
    case TD_SAMPLING_FLAG_FREQUENCY:
        return parse_float("--frequency-penalty", arg, -2, false, 2, &sp->frequency_penalty);
    case TD_SAMPLING_FLAG_REPETITION:
        return parse_float("--repetition-penalty", arg, 0, true, 100, &sp->repetition_penalty);
    case TD_SAMPLING_FLAG_MIN_TOKENS:
        return td_sampling_flags_parse_int("--min-tokens", arg, 0, 1 << 20, &sp->min_tokens);
    case TD_SAMPLING_FLAG_LOGIT_BIAS:
        return parse_logit_bias(arg, sp);
    default:
        return td_err_set(TD_EINVAL, "option %d is not a sampling flag", opt);
    }
}

int td_sampling_flags_parse_ids(const char *flag, const char *s, bool signed_ids, int32_t **out,
                                size_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *ids = td_calloc(cap, sizeof(int32_t));
    *n = 0;
    if (!ids)
        return td_err_set(TD_ENOMEM, "out of memory");
    if (!*s) {
        free(ids);
        return td_err_set(TD_EINVAL, "%s: no token ids", flag);
    }
    /* each element: 1 to 10 decimal digits (after a '-' when signed), nothing else (no '+',
     * space, 0x or octal) */
    const char *p = s;
    for (size_t i = 0; i < cap; i++) {
        size_t len = strcspn(p, ",");
        bool neg = signed_ids && len > 1 && p[0] == '-';
        size_t nd = len - neg, digits = strspn(p + neg, "0123456789");
        int64_t v = 0;
        if (len == 0) {
            free(ids);
            return td_err_set(TD_EINVAL, "%s: element %zu is empty (in \"%s\")", flag, i + 1, s);
        }
        if (digits == nd && nd <= 10)
            for (size_t k = 0; k < nd; k++)
                v = v * 10 + (p[neg + k] - '0');
        v = neg ? -v : v;
        if (digits != nd || nd > 10 || v > INT32_MAX || v < INT32_MIN) {
            free(ids);
            if (signed_ids)
                return td_err_set(TD_EINVAL, "%s: element %zu \"%.*s\" is not an int32", flag,
                                  i + 1, (int)len, p);
            return td_err_set(TD_EINVAL, "%s: element %zu \"%.*s\" is not a token id (0..%d)",
                              flag, i + 1, (int)len, p, INT32_MAX);
        }
        ids[i] = (int32_t)v;
        p += len + (p[len] == ',');
    }
    *out = ids;
    *n = cap;
    return 0;
}
