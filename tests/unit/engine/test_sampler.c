/* test_sampler.c: sampling against hand-computable distributions. The logits ln(1..4) give
 * probabilities 1/10, 2/10, 3/10, 4/10 for ids 0..3; each filter's surviving set and the
 * renormalised frequencies follow from that by hand. */
#include "td_error.h"
#include "td_sampler.h"
#include "td_check.h"

#include <check.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>

static float L[4];

static void setup(void)
{
    for (int i = 0; i < 4; i++)
        L[i] = logf((float)(i + 1)); /* p = (i + 1) / 10 */
}

/* Empirical frequencies over n draws. */
static void freqs(const td_sampling_t *p, int n, double f[4])
{
    td_sampler_t s;
    ck_assert_int_eq(td_sampler_init(&s, p, 4), 0);
    memset(f, 0, 4 * sizeof(double));
    for (int i = 0; i < n; i++) {
        td_sample_t o;
        td_sampler_sample(&s, L, &o);
        ck_assert(o.token >= 0 && o.token < 4);
        f[o.token] += 1.0 / n;
    }
    td_sampler_free(&s);
}

static void expect_freqs(const td_sampling_t *p, const double want[4])
{
    double f[4];
    freqs(p, 40000, f);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(f[i] - want[i]) < 0.012, "id %d: frequency %.4f, expected %.4f", i, f[i],
                      want[i]);
}

START_TEST(test_greedy_and_logprobs)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.logprobs = 3;
    td_sampler_t s;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sample_t o;
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.token, 3);
    ck_assert(fabsf(o.logprob - logf(0.4f)) < 1e-6);
    ck_assert_int_eq(o.n_top, 3);
    ck_assert_int_eq(o.top[0].id, 3);
    ck_assert_int_eq(o.top[1].id, 2);
    ck_assert_int_eq(o.top[2].id, 1);
    ck_assert(fabsf(o.top[1].logprob - logf(0.3f)) < 1e-6);
    ck_assert(fabsf(o.top[2].logprob - logf(0.2f)) < 1e-6);
    ck_assert_int_eq(o.finish, TD_FINISH_NONE);
    /* ties: the lowest id wins */
    float tie[4] = {0, 2, 2, 1};
    td_sampler_sample(&s, tie, &o);
    ck_assert_int_eq(o.token, 1);
    ck_assert_int_eq(o.top[0].id, 1);
    ck_assert_int_eq(o.top[1].id, 2);
    td_sampler_free(&s);
}
END_TEST

START_TEST(test_temperature)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.seed = 1;
    expect_freqs(&p, (double[]){0.1, 0.2, 0.3, 0.4});
    p.temperature = 0.5f; /* p^2 / sum: 1, 4, 9, 16 over 30 */
    expect_freqs(&p, (double[]){1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0});
}
END_TEST

START_TEST(test_filters)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.seed = 7;
    p.top_k = 2; /* {2, 3}: 3/7, 4/7 */
    expect_freqs(&p, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
    p.top_k = 1;
    expect_freqs(&p, (double[]){0, 0, 0, 1});
    p.top_k = 0;
    p.top_p = 0.5f; /* 0.4 < 0.5, 0.4 + 0.3 >= 0.5: {2, 3} */
    expect_freqs(&p, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
    p.top_p = 0.35f; /* 0.4 alone covers it */
    expect_freqs(&p, (double[]){0, 0, 0, 1});
    p.top_p = 0.75f; /* 0.4 + 0.3 < 0.75: add 0.2 */
    expect_freqs(&p, (double[]){0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
    p.top_p = 1.0f;
    p.min_p = 0.55f; /* keep p >= 0.22: {2, 3} */
    expect_freqs(&p, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
    p.min_p = 0.3f; /* keep p >= 0.12: {1, 2, 3} */
    expect_freqs(&p, (double[]){0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
    p.min_p = 0.3f; /* with top_k = 2 on top: {2, 3} */
    p.top_k = 2;
    expect_freqs(&p, (double[]){0, 0, 3 / 7.0, 4 / 7.0});
}
END_TEST

START_TEST(test_seed_reproducible)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.seed = 42;
    td_sampler_t a, b, c, other;
    ck_assert_int_eq(td_sampler_init(&a, &p, 4), 0);
    ck_assert_int_eq(td_sampler_init(&b, &p, 4), 0);
    p.seed = 43;
    ck_assert_int_eq(td_sampler_init(&c, &p, 4), 0);
    ck_assert_int_eq(td_sampler_init(&other, &p, 4), 0);
    int same_c = 0;
    float other_logits[4] = {3, 0, 1, 2};
    for (int i = 0; i < 200; i++) {
        td_sample_t x, y, z, w;
        td_sampler_sample(&a, L, &x);
        /* b shares the batch with another request whose sampling happens in between */
        td_sampler_sample(&other, other_logits, &w);
        td_sampler_sample(&other, other_logits, &w);
        td_sampler_sample(&b, L, &y);
        td_sampler_sample(&c, L, &z);
        ck_assert_int_eq(x.token, y.token);
        same_c += x.token == z.token;
    }
    ck_assert_int_lt(same_c, 150); /* another seed gives another sequence */
    td_sampler_free(&a);
    td_sampler_free(&b);
    td_sampler_free(&c);
    td_sampler_free(&other);
}
END_TEST

/* A scratch lent to several samplers in turn (td_sampler_sample_in, as the engine lends its own
 * to every sampler of a step) gives each the tokens its own scratch gives, with filters that
 * read the candidate list in order: draws write every entry they read, so neither garbage left
 * by a larger vocabulary's draw nor the scratch's first contents reach a token. A sampler
 * allocates no scratch until it draws. */
START_TEST(test_lent_scratch)
{
    enum { V = 3000, N = 300 };
    static float big[V];
    for (int i = 0; i < V; i++)
        big[i] = 0.003f * (float)((i * 7919) % 1000);
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.temperature = 0.8f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.seed = 7;
    td_sampler_t own_big, lent_big, own_small, lent_small;
    ck_assert_int_eq(td_sampler_init(&own_big, &p, V), 0);
    ck_assert_int_eq(td_sampler_init(&lent_big, &p, V), 0);
    ck_assert_ptr_null(own_big.own.prob); /* nothing until the first draw */
    p.top_k = 0;
    p.min_p = 0.2f;
    ck_assert_int_eq(td_sampler_init(&own_small, &p, 4), 0);
    ck_assert_int_eq(td_sampler_init(&lent_small, &p, 4), 0);
    td_sampler_scratch_t sc = {0};
    ck_assert_int_eq(td_sampler_scratch_reserve(&sc, V), 0);
    for (int i = 0; i < V; i++) {
        sc.prob[i] = NAN;
        sc.idx[i] = -1;
    }
    int differ = 0, prev = -1;
    for (int n = 0; n < N; n++) {
        td_sample_t a, b, c, d;
        td_sampler_sample(&own_big, big, &a);
        td_sampler_sample_in(&lent_big, big, &b, &sc);
        td_sampler_sample(&own_small, L, &c);
        td_sampler_sample_in(&lent_small, L, &d, &sc);
        ck_assert_int_eq(a.token, b.token);
        ck_assert_int_eq(c.token, d.token);
        ck_assert_int_eq(a.finish, b.finish);
        differ += a.token != prev;
        prev = a.token;
    }
    ck_assert_int_gt(differ, N / 2); /* the draws are not all one token */
    ck_assert_ptr_nonnull(own_big.own.prob);
    ck_assert_ptr_null(lent_big.own.prob);
    td_sampler_scratch_free(&sc);
    td_sampler_free(&own_big);
    td_sampler_free(&lent_big);
    td_sampler_free(&own_small);
    td_sampler_free(&lent_small);
}
END_TEST

START_TEST(test_stop_conditions)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.max_tokens = 3;
    td_sampler_t s;
    td_sample_t o;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_NONE);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_NONE);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_LENGTH);
    td_sampler_free(&s);
    /* EOS (greedy picks 3) */
    td_sampling_defaults(&p);
    p.eos_id = 3;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_STOP);
    td_sampler_free(&s);
    p.ignore_eos = true;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_NONE);
    td_sampler_free(&s);
    /* stop ids: a stop that is not produced does nothing, one that is produced stops */
    td_sampling_defaults(&p);
    p.stop_ids[0] = 1;
    p.n_stop = 1;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_NONE);
    td_sampler_free(&s);
    p.stop_ids[1] = 3;
    p.n_stop = 2;
    p.max_tokens = 1; /* stop wins over length on the same token */
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.finish, TD_FINISH_STOP);
    td_sampler_free(&s);
}
END_TEST

START_TEST(test_bad_params)
{
    td_sampling_t p;
    td_sampler_t s;
    td_sampling_defaults(&p);
    p.temperature = -1;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "temperature"));
    td_sampling_defaults(&p);
    p.top_p = 0;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "top_p"));
    td_sampling_defaults(&p);
    p.min_p = 1.5f;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    td_sampling_defaults(&p);
    p.top_k = -2;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    td_sampling_defaults(&p);
    p.logprobs = 21;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    td_sampling_defaults(&p);
    p.temperature = NAN;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    td_sampling_defaults(&p);
    ck_assert_int_eq(td_sampler_init(&s, &p, 0), TD_EINVAL);
}
END_TEST

/* A large, nearly flat vocabulary: top-p's nucleus holds thousands of candidates, far more than
 * the first selection window, so the window must widen; every draw must stay inside the nucleus
 * computed here by sorting everything, and some must come from deep inside it. */
/* A sampler that is handed its first token (td_sampler_accept, as a decode worker is after a
 * remote prefill) continues exactly like the one that drew it, for sampled and greedy requests,
 * and reaches max_tokens at the same point. */
START_TEST(test_accept_continues_stream)
{
    for (int greedy = 0; greedy < 2; greedy++) {
        td_sampling_t p;
        td_sampling_defaults(&p);
        p.temperature = greedy ? 0.0f : 0.9f;
        p.top_p = 0.95f;
        p.seed = 1234;
        p.max_tokens = 40;
        td_sampler_t a, b;
        ck_assert_int_eq(td_sampler_init(&a, &p, 4), 0);
        ck_assert_int_eq(td_sampler_init(&b, &p, 4), 0);
        td_sample_t first;
        td_sampler_sample(&a, L, &first);
        ck_assert_int_eq(td_sampler_accept(&b, first.token), first.finish);
        int differ_from_fresh = 0;
        td_sampler_t c;
        ck_assert_int_eq(td_sampler_init(&c, &p, 4), 0);
        for (int i = 1; i < 40; i++) {
            td_sample_t x, y, z;
            td_sampler_sample(&a, L, &x);
            td_sampler_sample(&b, L, &y);
            td_sampler_sample(&c, L, &z); /* never skipped: one draw behind */
            ck_assert_int_eq(x.token, y.token);
            ck_assert_int_eq(x.finish, y.finish);
            differ_from_fresh += x.token != z.token;
            if (i == 39)
                ck_assert_int_eq(y.finish, TD_FINISH_LENGTH);
        }
        /* the check can fail: without the skipped draw the streams diverge */
        if (!greedy)
            ck_assert_int_gt(differ_from_fresh, 5);
        td_sampler_free(&a);
        td_sampler_free(&b);
        td_sampler_free(&c);
    }
}
END_TEST

START_TEST(test_top_p_wide_nucleus)
{
    enum { V = 5000 };
    static float logits[V];
    static int order[V];
    for (int i = 0; i < V; i++) {
        logits[i] = 0.001f * (float)((i * 7919) % 1000); /* 1000 distinct levels, many ties */
        order[i] = i;
    }
    /* reference nucleus: probability descending, id ascending; exp of logits is monotone */
    for (int i = 1; i < V; i++)
        for (int j = i; j > 0 && (logits[order[j]] > logits[order[j - 1]] ||
                                  (logits[order[j]] == logits[order[j - 1]] &&
                                   order[j] < order[j - 1]));
             j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double tot = 0, mx = logits[order[0]];
    for (int i = 0; i < V; i++)
        tot += exp(logits[i] - mx);
    static bool in_nucleus[V];
    static int rank[V];
    double kept = 0;
    int nucleus = 0;
    for (int i = 0; i < V && kept < 0.9 * tot; i++, nucleus++) {
        kept += exp(logits[order[i]] - mx);
        in_nucleus[order[i]] = true;
    }
    for (int i = 0; i < V; i++)
        rank[order[i]] = i;
    ck_assert_int_gt(nucleus, 2000);
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.temperature = 1;
    p.top_p = 0.9f;
    td_sampler_t s;
    ck_assert_int_eq(td_sampler_init(&s, &p, V), 0);
    int deep = 0;
    for (int n = 0; n < 2000; n++) {
        td_sample_t o;
        td_sampler_sample(&s, logits, &o);
        ck_assert_msg(in_nucleus[o.token], "draw %d: token %d (rank %d) outside the nucleus of %d",
                      n, o.token, rank[o.token], nucleus);
        deep += rank[o.token] >= 2048;
    }
    ck_assert_int_gt(deep, 100);
    td_sampler_free(&s);
}
END_TEST

/* A sampler put at position n (td_sampler_seek, as a decode worker is when a sequence migrates to
 * it after n generated tokens) continues exactly like one that sampled those n tokens itself, for
 * sampled and greedy requests, whatever it did before the seek, and reaches max_tokens at the same
 * point; a seek to a wrong position gives other tokens (the test can fail). */
START_TEST(test_seek_continues_stream)
{
    for (int greedy = 0; greedy < 2; greedy++) {
        td_sampling_t p;
        td_sampling_defaults(&p);
        p.temperature = greedy ? 0.0f : 1.1f;
        p.top_k = 3;
        p.seed = 987654321;
        p.max_tokens = 30;
        td_sample_t ref[30];
        td_sampler_t a;
        ck_assert_int_eq(td_sampler_init(&a, &p, 4), 0);
        for (int i = 0; i < 30; i++)
            td_sampler_sample(&a, L, &ref[i]);
        ck_assert_int_eq(ref[29].finish, TD_FINISH_LENGTH);
        for (int n = 0; n < 30; n += 7) {
            td_sampler_t b;
            ck_assert_int_eq(td_sampler_init(&b, &p, 4), 0);
            td_sample_t junk;
            td_sampler_sample(&b, L, &junk); /* a seek starts from the seed, not from here */
            td_sampler_seek(&b, n);
            ck_assert_int_eq(b.n_generated, n);
            for (int i = n; i < 30; i++) {
                td_sample_t y;
                td_sampler_sample(&b, L, &y);
                ck_assert_int_eq(y.token, ref[i].token);
                ck_assert_int_eq(y.finish, ref[i].finish);
            }
            td_sampler_free(&b);
        }
        if (!greedy) {
            /* one position off: the stream differs somewhere */
            td_sampler_t c;
            ck_assert_int_eq(td_sampler_init(&c, &p, 4), 0);
            td_sampler_seek(&c, 9);
            int differ = 0;
            for (int i = 10; i < 30; i++) {
                td_sample_t z;
                td_sampler_sample(&c, L, &z);
                differ += z.token != ref[i].token;
            }
            ck_assert_int_gt(differ, 3);
            td_sampler_free(&c);
        }
        td_sampler_free(&a);
    }
}
END_TEST

/* Greedy tokens of a sampler over fixed logits. */
static void greedy_run(td_sampling_t *p, const float *lg, int V, const int32_t *prompt, int np,
                       int n, int32_t *out, td_finish_t *fin)
{
    td_sampler_t s;
    ck_assert_int_eq(td_sampler_init(&s, p, V), 0);
    ck_assert_int_eq(td_sampler_context(&s, prompt, np, 0), 0);
    for (int i = 0; i < n; i++) {
        td_sample_t o;
        td_sampler_sample(&s, lg, &o);
        out[i] = o.token;
        if (fin)
            fin[i] = o.finish;
    }
    td_sampler_free(&s);
}

/* logit_bias adds to the logit: +ln 4 on id 0 makes the probabilities (4, 2, 3, 4) / 13; +2
 * makes it the greedy choice; the reported logprob stays the raw one. */
START_TEST(test_logit_bias)
{
    td_sampling_t p;
    td_sampling_defaults(&p);
    int32_t bid = 0;
    float bias = 2.0f;
    p.logit_bias_ids = &bid;
    p.logit_bias_values = &bias;
    p.n_logit_bias = 1;
    p.logprobs = 0;
    td_sampler_t s;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), 0);
    td_sample_t o;
    td_sampler_sample(&s, L, &o);
    ck_assert_int_eq(o.token, 0);
    ck_assert(fabsf(o.logprob - logf(0.1f)) < 1e-6);
    td_sampler_free(&s);
    bias = logf(4.0f);
    p.temperature = 1;
    p.seed = 7;
    expect_freqs(&p, (double[]){4 / 13.0, 2 / 13.0, 3 / 13.0, 4 / 13.0});
    bias = -100; /* as OpenAI: -100 all but bans */
    expect_freqs(&p, (double[]){0, 2 / 9.0, 3 / 9.0, 4 / 9.0});
}
END_TEST

/* Presence and frequency penalties over the generated tokens only (a prompt token is not
 * penalised), computed by hand on ln(1..4) = 0, .693, 1.099, 1.386. */
START_TEST(test_presence_frequency)
{
    int32_t prompt[] = {3, 3, 3}, got[6];
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.presence_penalty = 0.5f;
    /* 3; 3 at .886 < 1.099: 2; 2 at .599: 3 (.886 stays: presence counts once) */
    greedy_run(&p, L, 4, prompt, 3, 5, got, NULL);
    int32_t want_p[] = {3, 2, 3, 3, 3};
    ck_assert_mem_eq(got, want_p, sizeof(want_p));
    td_sampling_defaults(&p);
    p.frequency_penalty = 0.5f;
    /* 3 (1.386); 3 -> .886: 2 (1.099); 2 -> .599: 3 (.886); 3 -> .386: 1 (.693);
       1 -> .193: 2 (.599); 2 -> .099: 3 (.386) */
    greedy_run(&p, L, 4, prompt, 3, 6, got, NULL);
    int32_t want_f[] = {3, 2, 3, 1, 2, 3};
    ck_assert_mem_eq(got, want_f, sizeof(want_f));
    td_sampling_defaults(&p);
    p.frequency_penalty = -2.0f; /* negative: encourages repeats */
    greedy_run(&p, (float[]){0, 0, 0, 1.5f}, 4, prompt, 0, 1, got, NULL);
    ck_assert_int_eq(got[0], 3);
}
END_TEST

/* The repetition penalty over prompt and generated tokens: a positive logit divided by it, a
 * negative one multiplied. */
START_TEST(test_repetition)
{
    int32_t prompt[] = {3}, got[3];
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.repetition_penalty = 3.0f;
    /* 3 is in the prompt: 1.386 / 3 = .462: 2; then 2 -> .366, 3 .462, 1 .693: 1 */
    greedy_run(&p, L, 4, prompt, 1, 3, got, NULL);
    ck_assert_int_eq(got[0], 2);
    ck_assert_int_eq(got[1], 1);
    ck_assert_int_eq(got[2], 3); /* 1 -> .231, 0 is 0, 3 .462 */
    float neg[] = {-0.5f, -1.0f, -2.0f, -3.0f};
    int32_t zero[] = {0};
    greedy_run(&p, neg, 4, zero, 1, 1, got, NULL);
    ck_assert_int_eq(got[0], 1); /* -0.5 * 3 = -1.5 < -1 */
    p.repetition_penalty = 1.0f;
    greedy_run(&p, neg, 4, zero, 1, 1, got, NULL);
    ck_assert_int_eq(got[0], 0);
}
END_TEST

/* min_tokens: EOS and the stop ids are masked until that many tokens were generated. */
START_TEST(test_min_tokens)
{
    int32_t got[4];
    td_finish_t fin[4];
    td_sampling_t p;
    td_sampling_defaults(&p);
    p.eos_id = 3;
    p.stop_ids[0] = 2;
    p.n_stop = 1;
    p.min_tokens = 2;
    greedy_run(&p, L, 4, NULL, 0, 3, got, fin);
    ck_assert_int_eq(got[0], 1);
    ck_assert_int_eq(fin[0], TD_FINISH_NONE);
    ck_assert_int_eq(got[1], 1);
    ck_assert_int_eq(got[2], 3);
    ck_assert_int_eq(fin[2], TD_FINISH_STOP);
    p.min_tokens = 0;
    greedy_run(&p, L, 4, NULL, 0, 1, got, fin);
    ck_assert_int_eq(got[0], 3);
    ck_assert_int_eq(fin[0], TD_FINISH_STOP);
}
END_TEST

/* bad_words: the last token of a sequence is banned when the rest ends the generated tokens. */
START_TEST(test_bad_words)
{
    int32_t got[5];
    td_sampling_t p;
    td_sampling_defaults(&p);
    int32_t words[] = {3, 3, 1, 2, 0};
    uint32_t lens[] = {2, 3};
    p.bad_words = words;
    p.bad_word_len = lens;
    p.n_bad_words = 1; /* [3, 3] */
    greedy_run(&p, L, 4, NULL, 0, 5, got, NULL);
    int32_t want[] = {3, 2, 3, 2, 3};
    ck_assert_mem_eq(got, want, sizeof(want));
    words[0] = 1; /* [1]: id 1 is never chosen, even by sampling */
    lens[0] = 1;
    p.temperature = 1;
    expect_freqs(&p, (double[]){1 / 8.0, 0, 3 / 8.0, 4 / 8.0});
    /* [1, 2, 0]: only after 1, 2 */
    p.temperature = 0;
    words[0] = 5; /* unused first word, replaced by: */
    int32_t w2[] = {3, 3, 3};
    uint32_t l2[] = {3};
    p.bad_words = w2;
    p.bad_word_len = l2;
    greedy_run(&p, L, 4, NULL, 0, 4, got, NULL);
    int32_t want2[] = {3, 3, 2, 3};
    ck_assert_mem_eq(got, want2, sizeof(want2));
}
END_TEST

/* A sequence resumed at position n (td_sampler_seek, then td_sampler_context with its last n
 * tokens as generated) continues as the uninterrupted one, penalties and bad_words included. */
START_TEST(test_context_resume)
{
    for (int greedy = 0; greedy < 2; greedy++) {
        td_sampling_t p;
        td_sampling_defaults(&p);
        p.temperature = greedy ? 0.0f : 1.0f;
        p.seed = 99;
        p.frequency_penalty = 0.7f;
        p.presence_penalty = 0.2f;
        p.repetition_penalty = 1.3f;
        int32_t words[] = {2, 2};
        uint32_t lens[] = {2};
        p.bad_words = words;
        p.bad_word_len = lens;
        p.n_bad_words = 1;
        int32_t toks[40] = {0, 1};
        td_sampler_t a;
        ck_assert_int_eq(td_sampler_init(&a, &p, 4), 0);
        ck_assert_int_eq(td_sampler_context(&a, toks, 2, 0), 0);
        for (int i = 0; i < 30; i++) {
            td_sample_t o;
            td_sampler_sample(&a, L, &o);
            toks[2 + i] = o.token;
            if (i && toks[1 + i] == 2)
                ck_assert_int_ne(o.token, 2);
        }
        td_sampler_free(&a);
        for (int n = 1; n < 30; n += 7) {
            td_sampler_t b;
            ck_assert_int_eq(td_sampler_init(&b, &p, 4), 0);
            td_sampler_seek(&b, n);
            ck_assert_int_eq(td_sampler_context(&b, toks, 2 + n, n), 0);
            for (int i = n; i < 30; i++) {
                td_sample_t o;
                td_sampler_sample(&b, L, &o);
                ck_assert_int_eq(o.token, toks[2 + i]);
            }
            td_sampler_free(&b);
        }
    }
}
END_TEST

START_TEST(test_bad_adjust_params)
{
    td_sampling_t p;
    td_sampler_t s;
    int32_t bid = 4;
    float bias = 1;
    int32_t w[] = {9};
    uint32_t l[] = {1}, l0[] = {0};
    td_sampling_defaults(&p);
    p.presence_penalty = 2.5f;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "presence_penalty"));
    td_sampling_defaults(&p);
    p.frequency_penalty = -3;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "frequency_penalty"));
    td_sampling_defaults(&p);
    p.repetition_penalty = 0;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "repetition_penalty"));
    td_sampling_defaults(&p);
    p.logit_bias_ids = &bid;
    p.logit_bias_values = &bias;
    p.n_logit_bias = 1;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "logit_bias"));
    bid = 1;
    bias = 101;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    td_sampling_defaults(&p);
    p.min_tokens = -1;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    td_sampling_defaults(&p);
    p.bad_words = w;
    p.bad_word_len = l;
    p.n_bad_words = 1;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "bad_words"));
    p.bad_word_len = l0;
    ck_assert_int_eq(td_sampler_init(&s, &p, 4), TD_EINVAL);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("sampler");
    TCase *tc = tcase_create("sampler");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_greedy_and_logprobs);
    tcase_add_test(tc, test_temperature);
    tcase_add_test(tc, test_filters);
    tcase_add_test(tc, test_seed_reproducible);
    tcase_add_test(tc, test_lent_scratch);
    tcase_add_test(tc, test_stop_conditions);
    tcase_add_test(tc, test_bad_params);
    tcase_add_test(tc, test_top_p_wide_nucleus);
    tcase_add_test(tc, test_accept_continues_stream);
    tcase_add_test(tc, test_seek_continues_stream);
    tcase_add_test(tc, test_logit_bias);
    tcase_add_test(tc, test_presence_frequency);
    tcase_add_test(tc, test_repetition);
    tcase_add_test(tc, test_min_tokens);
    tcase_add_test(tc, test_bad_words);
    tcase_add_test(tc, test_context_resume);
    tcase_add_test(tc, test_bad_adjust_params);
    suite_add_tcase(su, tc);
    return td_check_run(su);
}
