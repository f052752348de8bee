/* test_metrics.c: Prometheus registry: exact text rendering, histogram bucket semantics,
 * label handling, concurrent updates. */
#include "td_metrics.h"
#include "td_check.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_render_exact)
{
    td_metrics_t *r = td_metrics_new("tandem_", "role=\"decode\"");
    td_metric_t *c = td_metrics_counter(r, "prompt_tokens_total", "Prompt tokens.", NULL);
    td_metric_t *stop = td_metrics_counter(r, "request_success_total", "Finished requests.",
                                           "finished_reason=\"stop\"");
    td_metric_t *len = td_metrics_counter(r, "request_success_total", "Finished requests.",
                                          "finished_reason=\"length\"");
    td_metric_t *g = td_metrics_gauge(r, "num_requests_running", "Running.", NULL);
    static const double b[] = {0.1, 1.0, 2.5};
    td_metric_t *h = td_metrics_histogram(r, "time_to_first_token_seconds", "TTFT.", NULL, b, 3);
    td_metric_add(c, 10);
    td_metric_add(c, 5);
    td_metric_add(c, -3); /* counters never go down */
    td_metric_add(stop, 2);
    td_metric_add(len, 1);
    td_metric_set(g, 3);
    td_metric_set(g, 7);
    td_metric_observe(h, 0.05);
    td_metric_observe(h, 0.1); /* le is inclusive */
    td_metric_observe(h, 0.5);
    td_metric_observe(h, 3.0); /* only +Inf */
    ck_assert(td_metrics_counter(r, "prompt_tokens_total", "Prompt tokens.", NULL) == c);
    td_buf_t out;
    td_buf_init(&out);
    ck_assert_int_eq(td_metrics_render(r, &out), 0);
    const char *want =
        "# HELP tandem_prompt_tokens_total Prompt tokens.\n"
        "# TYPE tandem_prompt_tokens_total counter\n"
        "tandem_prompt_tokens_total{role=\"decode\"} 15.0\n"
        "# HELP tandem_request_success_total Finished requests.\n"
        "# TYPE tandem_request_success_total counter\n"
        "tandem_request_success_total{role=\"decode\",finished_reason=\"stop\"} 2.0\n"
        "tandem_request_success_total{role=\"decode\",finished_reason=\"length\"} 1.0\n"
        "# HELP tandem_num_requests_running Running.\n"
        "# TYPE tandem_num_requests_running gauge\n"
        "tandem_num_requests_running{role=\"decode\"} 7.0\n"
        "# HELP tandem_time_to_first_token_seconds TTFT.\n"
        "# TYPE tandem_time_to_first_token_seconds histogram\n"
        "tandem_time_to_first_token_seconds_bucket{role=\"decode\",le=\"0.1\"} 2.0\n"
        "tandem_time_to_first_token_seconds_bucket{role=\"decode\",le=\"1.0\"} 3.0\n"
        "tandem_time_to_first_token_seconds_bucket{role=\"decode\",le=\"2.5\"} 3.0\n"
        "tandem_time_to_first_token_seconds_bucket{role=\"decode\",le=\"+Inf\"} 4.0\n"
        "tandem_time_to_first_token_seconds_sum{role=\"decode\"} 3.65\n"
        "tandem_time_to_first_token_seconds_count{role=\"decode\"} 4.0\n";
    ck_assert_str_eq(out.data, want);
    ck_assert(td_metric_value(h) == 4);
    ck_assert(fabs(td_metric_sum(h) - 3.65) < 1e-12);
    td_buf_free(&out);
    td_metrics_free(r);
}
END_TEST

/* metrics.vllm_names: listed series under vLLM's names and labels, the rest unchanged; an entry
 * with labels picks one series of a family and drops those labels. */
START_TEST(test_vllm_names)
{
    static const char *const vllm[] = {"num_requests_running", "prefix_cache_hits_total{tier=\"pool\"}",
                                       NULL};
    td_metrics_opts_t o = {.prefix = "tandem_",
                           .const_labels = "role=\"decode\"",
                           .vllm_series = vllm,
                           .vllm_labels = "role=\"decode\",model_name=\"m\""};
    td_metrics_t *r = td_metrics_new_opts(&o);
    td_metric_t *run = td_metrics_gauge(r, "num_requests_running", "Running.", NULL);
    td_metric_t *pool = td_metrics_counter(r, "prefix_cache_hits_total", "Hits.", "tier=\"pool\"");
    td_metric_t *disk = td_metrics_counter(r, "prefix_cache_hits_total", "Hits.", "tier=\"disk\"");
    td_metric_t *other = td_metrics_counter(r, "kv_disk_errors_total", "Errors.", NULL);
    ck_assert(td_metrics_counter(r, "prefix_cache_hits_total", "Hits.", "tier=\"pool\"") == pool);
    ck_assert(pool != disk);
    td_metric_set(run, 2);
    td_metric_add(pool, 5);
    td_metric_add(disk, 3);
    td_metric_add(other, 1);
    td_buf_t out;
    td_buf_init(&out);
    ck_assert_int_eq(td_metrics_render(r, &out), 0);
    ck_assert_str_eq(out.data, "# HELP vllm:num_requests_running Running.\n"
                               "# TYPE vllm:num_requests_running gauge\n"
                               "vllm:num_requests_running{role=\"decode\",model_name=\"m\"} 2.0\n"
                               "# HELP vllm:prefix_cache_hits_total Hits.\n"
                               "# TYPE vllm:prefix_cache_hits_total counter\n"
                               "vllm:prefix_cache_hits_total{role=\"decode\",model_name=\"m\"} 5.0\n"
                               "# HELP tandem_prefix_cache_hits_total Hits.\n"
                               "# TYPE tandem_prefix_cache_hits_total counter\n"
                               "tandem_prefix_cache_hits_total{role=\"decode\",tier=\"disk\"} 3.0\n"
                               "# HELP tandem_kv_disk_errors_total Errors.\n"
                               "# TYPE tandem_kv_disk_errors_total counter\n"
                               "tandem_kv_disk_errors_total{role=\"decode\"} 1.0\n");
    td_buf_free(&out);
    td_metrics_free(r);
}
END_TEST

START_TEST(test_no_labels_and_escape)
{
    td_metrics_t *r = td_metrics_new("", NULL);
    td_metric_t *g = td_metrics_gauge(r, "kv_usage", "KV.", NULL);
    td_metric_set(g, 0.25);
    td_buf_t out, esc;
    td_buf_init(&out);
    td_buf_init(&esc);
    ck_assert_int_eq(td_metrics_render(r, &out), 0);
    ck_assert_ptr_nonnull(strstr(out.data, "\nkv_usage 0.25\n"));
    ck_assert_int_eq(td_metrics_escape("a\"b\\c\nd", &esc), 0);
    ck_assert_str_eq(esc.data, "a\\\"b\\\\c\\nd");
    td_buf_free(&out);
    td_buf_free(&esc);
    td_metrics_free(r);
}
END_TEST

START_TEST(test_vllm_buckets)
{
    ck_assert_uint_eq(td_buckets_ttft_n, 22);
    ck_assert(td_buckets_ttft[0] == 0.001 && td_buckets_ttft[21] == 2560.0);
    ck_assert_uint_eq(td_buckets_tpot_n, 19);
    ck_assert(td_buckets_tpot[18] == 80.0);
    ck_assert_uint_eq(td_buckets_request_n, 21);
    ck_assert(td_buckets_request[20] == 7680.0);
}
END_TEST

static void *hammer(void *arg)
{
    td_metric_t **m = arg;
    for (int i = 0; i < 100000; i++) {
        td_metric_add(m[0], 1);
        td_metric_observe(m[1], (i % 4) * 0.5);
    }
    return NULL;
}

START_TEST(test_concurrent)
{
    td_metrics_t *r = td_metrics_new("t_", NULL);
    td_metric_t *m[2] = {
        td_metrics_counter(r, "n_total", "n", NULL),
        td_metrics_histogram(r, "h", "h", NULL, td_buckets_tpot, td_buckets_tpot_n),
    };
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hammer, m);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_assert(td_metric_value(m[0]) == 400000);
    ck_assert(td_metric_value(m[1]) == 400000);
    ck_assert(td_metric_sum(m[1]) == 4 * 25000 * (0 + 0.5 + 1.0 + 1.5));
    td_metrics_free(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_render_exact);
    tcase_add_test(tc, test_vllm_names);
    tcase_add_test(tc, test_no_labels_and_escape);
    tcase_add_test(tc, test_vllm_buckets);
    tcase_add_test(tc, test_concurrent);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
