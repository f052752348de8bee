/* sampler.c: greedy, temperature, top-k, top-p and min-p sampling with a per-request random
 * stream, stop conditions and top-n logprobs. */
#include "td_error.h"
#include "td_rng.h"
#include "td_sampler.h"
#include "td_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void td_sampling_defaults(td_sampling_t *p)
{
    memset(p, 0, sizeof(*p));
    p->top_p = 1.0f;
    p->eos_id = -1;
    p->logprobs = -1;
}

int td_sampler_init(td_sampler_t *s, const td_sampling_t *p, int vocab)
{
    memset(s, 0, sizeof(*s));
    if (vocab < 1)
        return td_err_set(TD_EINVAL, "sampler: vocabulary of %d tokens", vocab);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return td_err_set(TD_EINVAL, "sampler: temperature %g must be >= 0", p->temperature);
    if (p->top_k < 0)
        return td_err_set(TD_EINVAL, "sampler: top_k %d must be >= 0", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return td_err_set(TD_EINVAL, "sampler: top_p %g must be in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return td_err_set(TD_EINVAL, "sampler: min_p %g must be in [0, 1]", p->min_p);
    if (p->max_tokens < 0)
        return td_err_set(TD_EINVAL, "sampler: max_tokens %d must be >= 0", p->max_tokens);
    if (p->n_stop < 0 || p->n_stop > TD_SAMPLER_MAX_STOP)
        return td_err_set(TD_EINVAL, "sampler: %d stop ids (at most %d)", p->n_stop,
                          TD_SAMPLER_MAX_STOP);
    if (p->logprobs < -1 || p->logprobs > TD_SAMPLER_MAX_LOGPROBS)
        return td_err_set(TD_EINVAL, "sampler: logprobs %d must be in [-1, %d]", p->logprobs,
                          TD_SAMPLER_MAX_LOGPROBS);
    s->p = *p;
    s->vocab = vocab;
    td_rng_seed(&s->rng, p->seed);
    s->prob = td_calloc((size_t)vocab, sizeof(float));
    s->idx = td_calloc((size_t)vocab, sizeof(int32_t));
    if (!s->prob || !s->idx) {
        td_sampler_free(s);
        return td_err_set(TD_ENOMEM, "sampler: out of memory");
    }
    return 0;
}

void td_sampler_free(td_sampler_t *s)
{
    free(s->prob);
    free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

/* qsort has no context argument: the key is per thread. */
static _Thread_local const float *tl_key;

static int by_prob_desc(const void *a, const void *b)
{
    float pa = tl_key[*(const int32_t *)a], pb = tl_key[*(const int32_t *)b];
    if (pa != pb)
        return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The candidate order: probability descending, then id ascending (a total order). */
static bool before(const float *p, int32_t a, int32_t b)
{
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* Rearrange ix[0..n) so that its first m entries are the m candidates that come first in the
 * order, then sort just those: O(n + m log m) instead of sorting the whole vocabulary. */
static void first_sorted(const float *p, int32_t *ix, int n, int m)
{
    int lo = 0, hi = n - 1;
    while (m < n && lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int32_t a = ix[lo], b = ix[mid], c = ix[hi], piv;
        if (before(p, a, b))
            piv = before(p, b, c) ? b : (before(p, a, c) ? c : a);
        else
            piv = before(p, a, c) ? a : (before(p, b, c) ? c : b);
        int i = lo, j = hi;
        while (i <= j) {
            while (before(p, ix[i], piv))
                i++;
            while (before(p, piv, ix[j]))
                j--;
            if (i <= j) {
                int32_t t = ix[i];
                ix[i++] = ix[j];
                ix[j--] = t;
            }
        }
        if (m - 1 <= j)
            hi = j;
        else if (m - 1 >= i)
            lo = i;
        else
            break;
    }
    tl_key = p;
    qsort(ix, (size_t)m, sizeof(int32_t), by_prob_desc);
}

/* Draw from the tempered, filtered distribution. */
static int32_t draw(td_sampler_t *s, const float *logits)
{
    int V = s->vocab;
    float *p = s->prob;
    int32_t *ix = s->idx;
    double inv_t = 1.0 / s->p.temperature, mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, logits[i] * inv_t);
    for (int i = 0; i < V; i++) {
        p[i] = (float)exp(logits[i] * inv_t - mx);
        sum += p[i];
    }
    for (int i = 0; i < V; i++)
        p[i] = (float)(p[i] / sum);
    /* candidates, most likely first when a rank-based filter needs them in order */
    int n = V;
    for (int i = 0; i < V; i++)
        ix[i] = i;
    if (s->p.top_k > 0 && s->p.top_k < V) {
        n = s->p.top_k;
        first_sorted(p, ix, V, n);
    }
    if (s->p.top_p < 1) {
        /* the smallest prefix holding top_p of the mass of what top-k left: sort a window of
         * the most likely candidates, widening it until the prefix is inside it */
        double tot = 0;
        for (int i = 0; i < n; i++)
            tot += p[ix[i]];
        int w = n == V ? TD_MIN(V, 256) : n, k = 0;
        for (;;) {
            if (n == V)
                first_sorted(p, ix, V, w);
            double kept = 0;
            for (k = 0; k < w && kept < s->p.top_p * tot; k++)
                kept += p[ix[k]];
            if (kept >= s->p.top_p * tot || w == n)
                break;
            w = (int)TD_MIN((int64_t)w * 8, (int64_t)n);
        }
        n = TD_MAX(k, 1);
    }
    if (s->p.min_p > 0) {
        float top = 0;
        for (int i = 0; i < n; i++)
            top = fmaxf(top, p[ix[i]]);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (p[ix[i]] >= s->p.min_p * top)
                ix[k++] = ix[i];
        n = k;
    }
    double tot = 0;
    for (int i = 0; i < n; i++)
        tot += p[ix[i]];
    double u = td_rng_uniform(&s->rng) * tot, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += p[ix[i]];
        if (u < acc)
            return ix[i];
    }
    return ix[n - 1];
}

/* Count one more generated token and say whether it ends the request. */
static td_finish_t finish_after(td_sampler_t *s, int32_t token)
{
    s->n_generated++;
    for (int i = 0; i < s->p.n_stop; i++)
        if (token == s->p.stop_ids[i])
            return TD_FINISH_STOP;
    if (token == s->p.eos_id && !s->p.ignore_eos)
        return TD_FINISH_STOP;
    if (s->p.max_tokens > 0 && s->n_generated >= s->p.max_tokens)
        return TD_FINISH_LENGTH;
    return TD_FINISH_NONE;
}

void td_sampler_sample(td_sampler_t *s, const float *logits, td_sample_t *out)
{
    int V = s->vocab;
    memset(out, 0, sizeof(*out));
    /* raw log-softmax for the reported logprobs */
    double mx = -INFINITY, sum = 0;
    int best = 0;
    for (int i = 0; i < V; i++) {
        mx = fmax(mx, logits[i]);
        if (logits[i] > logits[best])
            best = i;
    }
    for (int i = 0; i < V; i++)
        sum += exp(logits[i] - mx);
    double lse = mx + log(sum);

    out->token = s->p.temperature == 0 ? best : draw(s, logits);
    out->logprob = (float)(logits[out->token] - lse);
    /* top-n: insertion into a short sorted list (ties: lower id first) */
    int n = 0;
    for (int i = 0; i < V && s->p.logprobs > 0; i++) {
        if (n == s->p.logprobs && logits[i] <= out->top[n - 1].logprob)
            continue;
        int j = n < s->p.logprobs ? n++ : n - 1;
        while (j > 0 && out->top[j - 1].logprob < logits[i]) {
            out->top[j] = out->top[j - 1];
            j--;
        }
        out->top[j].id = i;
        out->top[j].logprob = logits[i]; /* raw logit until the end */
    }
    for (int k = 0; k < n; k++)
        out->top[k].logprob = (float)(out->top[k].logprob - lse);
    out->n_top = n;
    out->finish = finish_after(s, out->token);
}

td_finish_t td_sampler_accept(td_sampler_t *s, int32_t token)
{
    if (s->p.temperature != 0)
        (void)td_rng_next(&s->rng); /* draw() takes exactly one value per token */
    return finish_after(s, token);
}

void td_sampler_seek(td_sampler_t *s, int n)
{
    td_rng_seed(&s->rng, s->p.seed);
    s->n_generated = 0;
    for (int i = 0; i < n; i++) {
        if (s->p.temperature != 0)
            (void)td_rng_next(&s->rng); /* one value per token, as draw() takes */
        s->n_generated++;
    }
}
