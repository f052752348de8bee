/* sampler.c: greedy, temperature, top-k, top-p and min-p sampling with a per-request random
 * stream, logit adjustments (penalties, logit_bias, min_tokens, bad_words), stop conditions and
 * top-n logprobs. */
#include "td_error.h"
#include "td_log.h"
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
    p->repetition_penalty = 1.0f;
}

bool td_sampler_adjusts(const td_sampler_t *s)
{
    return s->adj != NULL;
}

int td_sampler_set_mask(td_sampler_t *s, td_jsonmask_t *m)
{
    td_jsonmask_free(s->mask);
    s->mask = m;
    if (!s->adj) {
        s->adj = td_calloc((size_t)s->vocab, sizeof(float));
        s->count = td_calloc((size_t)s->vocab, sizeof(uint32_t));
        s->seen = td_calloc((size_t)s->vocab, 1);
        if (!s->adj || !s->count || !s->seen)
            return td_err_set(TD_ENOMEM, "sampler: out of memory");
    }
    return 0;
}

static bool needs_adjust(const td_sampling_t *p)
{
    return p->presence_penalty != 0 || p->frequency_penalty != 0 ||
           p->repetition_penalty != 1 || p->min_tokens > 0 || p->n_logit_bias > 0 ||
           p->n_bad_words > 0;
}

/* Check and copy the adjustments' parameters. */
static int init_adjust(td_sampler_t *s, const td_sampling_t *p, int vocab)
{
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return td_err_set(TD_EINVAL, "sampler: presence_penalty %g must be in [-2, 2]",
                          p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return td_err_set(TD_EINVAL, "sampler: frequency_penalty %g must be in [-2, 2]",
                          p->frequency_penalty);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 100))
        return td_err_set(TD_EINVAL, "sampler: repetition_penalty %g must be in (0, 100]",
                          p->repetition_penalty);
    if (p->min_tokens < 0)
        return td_err_set(TD_EINVAL, "sampler: min_tokens %d must be >= 0", p->min_tokens);
    if (p->n_logit_bias < 0 || p->n_logit_bias > TD_SAMPLER_MAX_BIAS)
        return td_err_set(TD_EINVAL, "sampler: %d logit_bias entries (at most %d)",
                          p->n_logit_bias, TD_SAMPLER_MAX_BIAS);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= vocab)
            return td_err_set(TD_EINVAL, "sampler: logit_bias token id %d outside [0, %d)",
                              p->logit_bias_ids[i], vocab);
        if (!(p->logit_bias_values[i] >= -100 && p->logit_bias_values[i] <= 100))
            return td_err_set(TD_EINVAL, "sampler: logit_bias %g for token %d must be in "
                              "[-100, 100]", p->logit_bias_values[i], p->logit_bias_ids[i]);
    }
    if (p->n_bad_words < 0)
        return td_err_set(TD_EINVAL, "sampler: %d bad_words", p->n_bad_words);
    size_t total = 0;
    for (int i = 0; i < p->n_bad_words; i++) {
        if (p->bad_word_len[i] < 1 || p->bad_word_len[i] > TD_SAMPLER_MAX_BAD)
            return td_err_set(TD_EINVAL, "sampler: bad_words[%d] has %u tokens", i,
                              p->bad_word_len[i]);
        total += p->bad_word_len[i];
    }
    if (total > TD_SAMPLER_MAX_BAD)
        return td_err_set(TD_EINVAL, "sampler: bad_words hold %zu tokens (at most %d)", total,
                          TD_SAMPLER_MAX_BAD);
    for (size_t i = 0; i < total; i++)
        if (p->bad_words[i] < 0 || p->bad_words[i] >= vocab)
            return td_err_set(TD_EINVAL, "sampler: bad_words token id %d outside [0, %d)",
                              p->bad_words[i], vocab);
    if (!needs_adjust(p))
        return 0;
    s->adj = td_calloc((size_t)vocab, sizeof(float));
    s->count = td_calloc((size_t)vocab, sizeof(uint32_t));
    s->seen = td_calloc((size_t)vocab, 1);
    s->bias_ids = td_calloc((size_t)p->n_logit_bias + 1, sizeof(int32_t));
    s->bias_values = td_calloc((size_t)p->n_logit_bias + 1, sizeof(float));
    s->bad = td_calloc(total + 1, sizeof(int32_t));
    s->bad_len = td_calloc((size_t)p->n_bad_words + 1, sizeof(uint32_t));
    if (!s->adj || !s->count || !s->seen || !s->bias_ids || !s->bias_values || !s->bad || !s->bad_len)
        return td_err_set(TD_ENOMEM, "sampler: out of memory");
    if (p->n_logit_bias) {
        memcpy(s->bias_ids, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof(int32_t));
        memcpy(s->bias_values, p->logit_bias_values, (size_t)p->n_logit_bias * sizeof(float));
    }
    if (total)
        memcpy(s->bad, p->bad_words, total * sizeof(int32_t));
    if (p->n_bad_words)
        memcpy(s->bad_len, p->bad_word_len, (size_t)p->n_bad_words * sizeof(uint32_t));
    s->p.logit_bias_ids = NULL;
    s->p.logit_bias_values = NULL;
    s->p.bad_words = NULL;
    s->p.bad_word_len = NULL;
    return 0;
}

/* Record one generated token for the penalties and bad_words. */
static void note_generated(td_sampler_t *s, int32_t token)
{
    if (!s->adj || token < 0 || token >= s->vocab)
        return;
    if (s->mask)
        (void)td_jsonmask_advance(s->mask, token); /* the mask allowed it (or it came from a
                                                      sampler with the same mask) */
    s->count[token]++;
    s->seen[token] = 1;
    if (!s->p.n_bad_words)
        return;
    if (s->n_hist == s->cap_hist) {
        int cap = s->cap_hist ? s->cap_hist * 2 : 64;
        int32_t *h = td_reallocarray(s->hist, (size_t)cap, sizeof(int32_t));
        if (!h)
            return; /* bad_words then look at a shorter history: td_sampler_context reports */
        s->hist = h;
        s->cap_hist = cap;
    }
    s->hist[s->n_hist++] = token;
}

int td_sampler_context(td_sampler_t *s, const int32_t *toks, int n, int generated)
{
    if (!s->adj)
        return 0;
    memset(s->count, 0, (size_t)s->vocab * sizeof(uint32_t));
    memset(s->seen, 0, (size_t)s->vocab);
    s->n_hist = 0;
    if (s->mask)
        td_jsonmask_reset(s->mask);
    if (generated > n)
        generated = n;
    for (int i = 0; i < n - generated; i++)
        if (toks[i] >= 0 && toks[i] < s->vocab)
            s->seen[toks[i]] = 1;
    for (int i = n - generated; i < n; i++) {
        int before = s->n_hist;
        note_generated(s, toks[i]);
        if (s->p.n_bad_words && s->n_hist == before)
            return td_err_set(TD_ENOMEM, "sampler: out of memory");
    }
    return 0;
}

/* The logits the token is chosen from: raw ones adjusted as the header's order says. */
static const float *adjust(td_sampler_t *s, const float *logits)
{
    if (!s->adj)
        return logits;
    int V = s->vocab;
    float *a = s->adj;
    memcpy(a, logits, (size_t)V * sizeof(float));
    const td_sampling_t *p = &s->p;
    if (s->n_generated < p->min_tokens) {
        if (p->eos_id >= 0 && p->eos_id < V)
            a[p->eos_id] = -INFINITY;
        for (int i = 0; i < p->n_stop; i++)
            if (p->stop_ids[i] >= 0 && p->stop_ids[i] < V)
                a[p->stop_ids[i]] = -INFINITY;
    }
    for (int i = 0; i < p->n_logit_bias; i++)
        a[s->bias_ids[i]] += s->bias_values[i];
    /* bad_words: a sequence whose first len-1 tokens end the generated tokens bans its last */
    const int32_t *w = s->bad;
    for (int i = 0; i < p->n_bad_words; w += s->bad_len[i], i++) {
        int pre = (int)s->bad_len[i] - 1;
        if (pre > s->n_hist)
            continue;
        if (pre == 0 || !memcmp(w, s->hist + s->n_hist - pre, (size_t)pre * sizeof(int32_t)))
            a[w[pre]] = -INFINITY;
    }
    if (s->mask) {
        const uint64_t *ok = td_jsonmask_allowed(s->mask);
        bool any = false;
        for (int i = 0; ok && i < V; i++) {
            if (!(ok[i >> 6] >> (i & 63) & 1))
                a[i] = -INFINITY;
            else
                any |= a[i] > -INFINITY;
        }
        if (!any && p->eos_id >= 0 && p->eos_id < V) /* nothing fits: end it */
            a[p->eos_id] = 0;
    }
    if (p->repetition_penalty != 1 || p->frequency_penalty != 0 || p->presence_penalty != 0)
        for (int i = 0; i < V; i++) {
            if (s->seen[i] && p->repetition_penalty != 1)
                a[i] = a[i] > 0 ? a[i] / p->repetition_penalty : a[i] * p->repetition_penalty;
            if (s->count[i])
                a[i] -= p->frequency_penalty * (float)s->count[i] + p->presence_penalty;
        }
    return a;
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
    s->p.json_schema = NULL; /* borrowed: the worker compiles it into the mask */
    s->p.json_schema_len = 0;
    s->vocab = vocab;
    td_rng_seed(&s->rng, p->seed);
    int rc = init_adjust(s, p, vocab);
    if (rc) {
        td_sampler_free(s);
        return rc;
    }
    return 0;
}

int td_sampler_scratch_reserve(td_sampler_scratch_t *sc, int vocab)
{
    if (vocab <= sc->cap)
        return 0;
    /* not zeroed: a draw writes every entry it reads */
    float *p = td_reallocarray(sc->prob, (size_t)vocab, sizeof(float));
    if (p)
        sc->prob = p;
    int32_t *ix = p ? td_reallocarray(sc->idx, (size_t)vocab, sizeof(int32_t)) : NULL;
    if (!ix)
        return td_err_set(TD_ENOMEM, "sampler: out of memory for %d-token scratch", vocab);
    sc->idx = ix;
    sc->cap = vocab;
    return 0;
}

void td_sampler_scratch_free(td_sampler_scratch_t *sc)
{
    free(sc->prob);
    free(sc->idx);
    *sc = (td_sampler_scratch_t){0};
}

void td_sampler_free(td_sampler_t *s)
{
    td_sampler_scratch_free(&s->own);
    free(s->adj);
    free(s->bias_ids);
    free(s->bias_values);
    free(s->bad);
    free(s->bad_len);
    free(s->count);
    free(s->seen);
    free(s->hist);
    td_jsonmask_free(s->mask);
    s->mask = NULL;
    s->adj = NULL;
    s->bias_ids = NULL;
    s->bias_values = NULL;
    s->bad = NULL;
    s->bad_len = NULL;
    s->count = NULL;
    s->seen = NULL;
    s->hist = NULL;
    s->n_hist = s->cap_hist = 0;
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
static int32_t draw(td_sampler_t *s, const float *logits, td_sampler_scratch_t *sc)
{
    int V = s->vocab;
    float *p = sc->prob;
    int32_t *ix = sc->idx;
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
    note_generated(s, token);
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
    td_sampler_sample_in(s, logits, out, &s->own);
}

void td_sampler_sample_in(td_sampler_t *s, const float *logits, td_sample_t *out,
                          td_sampler_scratch_t *sc)
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

    const float *a = adjust(s, logits);
    if (a != logits) {
        best = 0;
        for (int i = 1; i < V; i++)
            if (a[i] > a[best])
                best = i;
    }
    bool greedy = s->p.temperature == 0;
    if (!greedy && td_sampler_scratch_reserve(sc, V)) {
        TD_LOG_E("%s: taking the greedy token", td_err_msg());
        (void)td_rng_next(&s->rng); /* the value draw() would have taken */
        greedy = true;
    }
    out->token = greedy ? best : draw(s, a, sc);
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
