/* test_bench_metrics.c: the load generator's metric definitions against hand-computed values
 * (vLLM's calculate_metrics), the result-JSON keys, the SSE chunk scanner, the /metrics parser
 * and the HTML report (tools/loadgen/). */
#include "bench.h"
#include "td_check.h"
#include "td_error.h"

#include <check.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_percentiles)
{
    double x[] = {4, 1, 3, 2};
    const double p[] = {90, 95, 99, 25};
    td_bench_stats_t s;
    td_bench_stats(x, 4, p, 4, &s);
    /* numpy: mean 2.5, median 2.5, std (ddof 0) sqrt(1.25), percentile rank (n-1)p/100 */
    ck_assert_double_eq_tol(s.mean, 2.5, 1e-12);
    ck_assert_double_eq_tol(s.median, 2.5, 1e-12);
    ck_assert_double_eq_tol(s.std, sqrt(1.25), 1e-12);
    ck_assert_double_eq_tol(s.pct[0], 3.7, 1e-12);
    ck_assert_double_eq_tol(s.pct[1], 3.85, 1e-12);
    ck_assert_double_eq_tol(s.pct[2], 3.97, 1e-12);
    ck_assert_double_eq_tol(s.pct[3], 1.75, 1e-12);
    /* empty: numpy over `x or 0` gives zeros */
    td_bench_stats(x, 0, p, 4, &s);
    ck_assert(s.mean == 0 && s.median == 0 && s.std == 0 && s.pct[2] == 0 && s.n == 0);
    double one[] = {7};
    td_bench_stats(one, 1, p, 4, &s);
    ck_assert(s.mean == 7 && s.median == 7 && s.std == 0 && s.pct[2] == 7);
}
END_TEST

/* Three requests: a stream of 11 tokens, a one-token answer, and a failure. */
static void make_results(td_bench_result_t r[3])
{
    for (int i = 0; i < 3; i++)
        td_bench_result_init(&r[i]);
    r[0].send_s = 0.0;
    r[0].ttft = 0.1;
    r[0].latency = 1.1;
    r[0].output_len = 11;
    r[0].n_chunks = 11;
    r[0].prompt_len = 10;
    r[0].itl = malloc(10 * sizeof(double));
    r[0].n_itl = r[0].cap_itl = 10;
    for (int k = 0; k < 10; k++)
        r[0].itl[k] = k < 5 ? 0.05 : 0.15; /* mean 0.1 */
    td_buf_append_str(&r[0].text, "hello \"world\"");
    r[1].send_s = 0.5;
    r[1].ttft = 0.2;
    r[1].latency = 0.2;
    r[1].output_len = 1;
    r[1].n_chunks = 1;
    r[1].prompt_len = 20;
    r[2].send_s = 0.7;
    r[2].prompt_len = 30;
    td_bench_result_fail(&r[2], TD_BENCH_ERR_HTTP, "HTTP %d: %s", 500, "boom");
}

START_TEST(test_metrics_hand_computed)
{
    td_bench_result_t r[3];
    make_results(r);
    const double p[] = {50, 99};
    td_bench_metrics_t m;
    ck_assert_int_eq(td_bench_metrics_compute(r, 3, 2.0, p, 2, NULL, &m), 0);
    ck_assert_uint_eq(m.completed, 2);
    ck_assert_uint_eq(m.failed, 1);
    ck_assert_uint_eq(m.failed_by_kind[TD_BENCH_ERR_HTTP], 1);
    ck_assert_int_eq(m.total_input, 30); /* the failed request's input is not counted */
    ck_assert_int_eq(m.total_output, 12);
    ck_assert_double_eq_tol(m.request_throughput, 1.0, 1e-12);
    ck_assert_double_eq_tol(m.output_throughput, 6.0, 1e-12);
    ck_assert_double_eq_tol(m.total_token_throughput, 21.0, 1e-12);
    ck_assert(isnan(m.request_goodput));
    ck_assert_double_eq_tol(m.ttft.mean, 0.15, 1e-12);
    ck_assert_double_eq_tol(m.ttft.std, 0.05, 1e-12);
    ck_assert_double_eq_tol(m.ttft.pct[1], 0.1 + 0.1 * 0.99, 1e-12);
    /* TPOT excludes the first token: (1.1 - 0.1) / (11 - 1); one-token answers have none */
    ck_assert_uint_eq(m.tpot.n, 1);
    ck_assert_double_eq_tol(m.tpot.mean, 0.1, 1e-12);
    /* ITL pools every gap of every request */
    ck_assert_uint_eq(m.itl.n, 10);
    ck_assert_double_eq_tol(m.itl.mean, 0.1, 1e-12);
    ck_assert_double_eq_tol(m.itl.median, 0.1, 1e-12);
    ck_assert_double_eq_tol(m.itl.std, 0.05, 1e-12);
    ck_assert_double_eq_tol(m.e2el.mean, 0.65, 1e-12);
    ck_assert_uint_eq(m.added_ttft.n, 0);
    /* concurrency: both successful requests overlap the bin [0, 1) (vLLM's binned figure), and
     * [0, 1.1] contains [0.5, 0.7] (the exact peak) */
    ck_assert_uint_eq(m.max_concurrent_requests, 2);
    ck_assert_uint_eq(m.peak_inflight, 2);
    /* one token per chunk: 11 chunks of r0 land in [0, 1.1): bin 0 holds the first 10 (ttft 0.1,
     * five gaps of 0.05 then 0.15s: 0.1 .. 0.35, 0.5 .. 0.95) plus r1's one */
    ck_assert_double_eq_tol(m.max_output_tokens_per_s, 11, 1e-9);
    /* every request was scheduled at 0: the lag is the send time; 3 sends over 0.7 s */
    ck_assert_double_eq_tol(m.send_lag.mean, 0.4, 1e-12);
    ck_assert_double_eq_tol(m.send_rate, 2 / 0.7, 1e-9);

    /* goodput: a request counts when every given SLO holds (SLO >= value) */
    td_bench_slo_t slo = {150, -1, -1};
    ck_assert_int_eq(td_bench_metrics_compute(r, 3, 2.0, p, 2, &slo, &m), 0);
    ck_assert_uint_eq(m.good_completed, 1);
    ck_assert_double_eq_tol(m.request_goodput, 0.5, 1e-12);
    slo = (td_bench_slo_t){-1, 50, -1}; /* TPOT 0 for the one-token answer: it passes */
    td_bench_metrics_compute(r, 3, 2.0, p, 2, &slo, &m);
    ck_assert_uint_eq(m.good_completed, 1);
    slo = (td_bench_slo_t){150, 50, -1};
    td_bench_metrics_compute(r, 3, 2.0, p, 2, &slo, &m);
    ck_assert_uint_eq(m.good_completed, 0);
    slo = (td_bench_slo_t){-1, -1, 1100}; /* boundary: 1.1 s <= 1100 ms */
    td_bench_metrics_compute(r, 3, 2.0, p, 2, &slo, &m);
    ck_assert_uint_eq(m.good_completed, 2);
    for (int i = 0; i < 3; i++)
        td_bench_result_free(&r[i]);
}
END_TEST

START_TEST(test_json_keys)
{
    td_bench_result_t r[3];
    make_results(r);
    const double p[] = {90, 99, 99.9};
    td_bench_slo_t slo = {150, -1, -1};
    td_bench_run_t run = {0};
    run.info =
        (td_bench_run_info_t){"openai", "openai", "m", NULL, NULL, 3, INFINITY, 1.0, 0, &slo, NULL};
    run.results = r;
    run.n = 3;
    ck_assert_int_eq(td_bench_metrics_compute(r, 3, 2.0, p, 3, &slo, &run.m), 0);
    td_buf_t b;
    td_buf_init(&b);
    ck_assert_int_eq(td_bench_report_json(&run, true, &b), 0);
    json_object *o = json_tokener_parse(b.data);
    ck_assert_msg(o != NULL, "not JSON: %s", b.data);
    /* vllm/benchmarks/serve.py's result keys */
    const char *keys[] = {"date",
                          "endpoint_type",
                          "backend",
                          "label",
                          "model_id",
                          "tokenizer_id",
                          "num_prompts",
                          "request_rate",
                          "burstiness",
                          "max_concurrency",
                          "duration",
                          "completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "request_goodput",
                          "output_throughput",
                          "total_token_throughput",
                          "max_output_tokens_per_s",
                          "max_concurrent_requests",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p90_ttft_ms",
                          "p99_ttft_ms",
                          "p99.9_ttft_ms",
                          "mean_tpot_ms",
                          "median_tpot_ms",
                          "std_tpot_ms",
                          "p99_tpot_ms",
                          "mean_itl_ms",
                          "median_itl_ms",
                          "std_itl_ms",
                          "p99_itl_ms",
                          "mean_e2el_ms",
                          "median_e2el_ms",
                          "std_e2el_ms",
                          "p99_e2el_ms",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "generated_texts",
                          "errors"};
    for (size_t i = 0; i < TD_ARRAY_LEN(keys); i++) {
        json_object *v;
        ck_assert_msg(json_object_object_get_ex(o, keys[i], &v), "missing key %s", keys[i]);
    }
    json_object *v;
    json_object_object_get_ex(o, "request_rate", &v);
    ck_assert_str_eq(json_object_get_string(v), "inf"); /* as vLLM writes an infinite rate */
    json_object_object_get_ex(o, "max_concurrency", &v);
    ck_assert(v == NULL); /* null */
    json_object_object_get_ex(o, "mean_ttft_ms", &v);
    ck_assert_double_eq_tol(json_object_get_double(v), 150, 1e-9);
    json_object_object_get_ex(o, "mean_tpot_ms", &v);
    ck_assert_double_eq_tol(json_object_get_double(v), 100, 1e-9);
    json_object_object_get_ex(o, "request_goodput", &v);
    ck_assert_double_eq_tol(json_object_get_double(v), 0.5, 1e-12);
    json_object_object_get_ex(o, "completed", &v);
    ck_assert_int_eq(json_object_get_int(v), 2);
    json_object_object_get_ex(o, "output_lens", &v);
    ck_assert_int_eq(json_object_array_length(v), 3);
    ck_assert_int_eq(json_object_get_int(json_object_array_get_idx(v, 2)), 0);
    json_object_object_get_ex(o, "itls", &v);
    ck_assert_int_eq(json_object_array_length(json_object_array_get_idx(v, 0)), 10);
    json_object_object_get_ex(o, "generated_texts", &v);
    ck_assert_str_eq(json_object_get_string(json_object_array_get_idx(v, 0)), "hello \"world\"");
    json_object_object_get_ex(o, "errors", &v);
    ck_assert_str_eq(json_object_get_string(json_object_array_get_idx(v, 2)), "HTTP 500: boom");
    json_object_object_get_ex(o, "failed_by_kind", &v);
    json_object *k;
    ck_assert(json_object_object_get_ex(v, "http", &k) && json_object_get_int(k) == 1);
    json_object_put(o);

    /* without --save-detailed the per-request arrays are left out, as vLLM does */
    td_buf_reset(&b);
    run.info.slo = NULL;
    run.info.request_rate = 4;
    run.info.max_concurrency = 8;
    ck_assert_int_eq(td_bench_report_json(&run, false, &b), 0);
    o = json_tokener_parse(b.data);
    ck_assert_ptr_nonnull(o);
    ck_assert(!json_object_object_get_ex(o, "ttfts", &v));
    ck_assert(json_object_object_get_ex(o, "request_goodput", &v) && v == NULL);
    json_object_object_get_ex(o, "request_rate", &v);
    ck_assert_double_eq_tol(json_object_get_double(v), 4, 1e-12);
    json_object_object_get_ex(o, "max_concurrency", &v);
    ck_assert_int_eq(json_object_get_int(v), 8);
    json_object_put(o);

    /* the HTML report is self-contained: inline SVG, nothing fetched */
    td_buf_reset(&b);
    td_bench_run_t runs[2] = {run, run};
    runs[1].info.request_rate = 8;
    ck_assert_int_eq(td_bench_report_html(runs, 2, &b), 0);
    ck_assert_ptr_nonnull(strstr(b.data, "<svg"));
    ck_assert_ptr_nonnull(strstr(b.data, "TTFT CDF"));
    ck_assert_ptr_nonnull(strstr(b.data, "against request rate"));
    ck_assert_ptr_null(strstr(b.data, "src="));
    ck_assert_ptr_null(strstr(b.data, "href="));
    ck_assert_ptr_null(strstr(b.data, "http://"));
    ck_assert_ptr_null(strstr(b.data, "https://"));
    /* text from the command line is escaped */
    td_buf_reset(&b);
    runs[0].info.model_id = "<script>x</script>";
    ck_assert_int_eq(td_bench_report_html(runs, 1, &b), 0);
    ck_assert_ptr_null(strstr(b.data, "<script"));
    ck_assert_ptr_nonnull(strstr(b.data, "&lt;script&gt;"));
    td_buf_free(&b);
    for (int i = 0; i < 3; i++)
        td_bench_result_free(&r[i]);
}
END_TEST

START_TEST(test_chunk_scan)
{
    td_bench_chunk_t c;
    const char *s = "{\"id\":\"x\",\"choices\":[{\"index\":0,\"text\":\" w\\u00f6rd\","
                    "\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}";
    ck_assert_int_eq(td_bench_chunk_scan(s, strlen(s), &c), 0);
    ck_assert(c.has_choices);
    ck_assert_uint_eq(c.text_len, 10);
    ck_assert_int_eq(c.completion_tokens, -1);
    td_buf_t t;
    td_buf_init(&t);
    ck_assert_int_eq(td_bench_json_unescape(c.text, c.text_len, &t), 0);
    ck_assert_str_eq(t.data, " w\xc3\xb6rd");
    /* chat delta; usage chunk with empty choices; content null */
    s = "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"}},{\"delta\":{"
        "\"content\":\"second choice\"}}], \"srv_ttft_us\": 1234}";
    ck_assert_int_eq(td_bench_chunk_scan(s, strlen(s), &c), 0);
    ck_assert(c.has_choices && c.text_len == 2 && memcmp(c.text, "hi", 2) == 0);
    ck_assert_int_eq(c.srv_ttft_us, 1234);
    s = "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":17}}";
    ck_assert_int_eq(td_bench_chunk_scan(s, strlen(s), &c), 0);
    ck_assert(!c.has_choices);
    ck_assert_int_eq(c.completion_tokens, 17);
    s = "{\"choices\":[{\"delta\":{\"content\":null}}]}";
    ck_assert_int_eq(td_bench_chunk_scan(s, strlen(s), &c), 0);
    ck_assert(c.has_choices && c.text == NULL);
    /* a "text" key outside choices[0] is not the text */
    s = "{\"text\":\"no\",\"choices\":[{\"x\":{\"text\":\"deep\"}}]}";
    ck_assert_int_eq(td_bench_chunk_scan(s, strlen(s), &c), 0);
    ck_assert(c.text == NULL);
    /* surrogate pair and escapes */
    td_buf_reset(&t);
    ck_assert_int_eq(td_bench_json_unescape("\\ud83d\\ude00\\n\\\"\\/", 18, &t), 0);
    ck_assert_str_eq(t.data, "\xf0\x9f\x98\x80\n\"/");
    td_buf_free(&t);
    /* malformed: every one an error, none a crash */
    const char *bad[] = {"",
                         "[]",
                         "{",
                         "{\"choices\":[{\"text\":\"x\"}]",
                         "{\"choices\": [1,]}",
                         "{\"a\":tru}",
                         "{\"a\":\"\x01\"}",
                         "{\"a\":\"\\x\"}",
                         "{\"a\":\"\\u12\"}",
                         "{\"a\":01}",
                         "{\"a\":1.}",
                         "{\"a\":-}",
                         "{\"a\":1e}",
                         "{\"a\":1} x",
                         "{a:1}",
                         "{\"a\" 1}",
                         "{\"a\":1,}",
                         "{\"a\":\"unterminated}"};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++)
        ck_assert_msg(td_bench_chunk_scan(bad[i], strlen(bad[i]), &c) == TD_EPARSE, "accepted %s",
                      bad[i]);
    /* nesting beyond the limit */
    char deep[400];
    size_t n = 0;
    deep[n++] = '{';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    deep[n++] = ':';
    for (int i = 0; i < 100; i++)
        deep[n++] = '[';
    for (int i = 0; i < 100; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    ck_assert_int_eq(td_bench_chunk_scan(deep, n, &c), TD_EPARSE);
    /* random bytes never crash */
    td_rng_t rng;
    td_rng_seed(&rng, 5);
    char buf[64];
    const char alpha[] = "{}[]\":,0123456789.eE+-tfnul\\ \"abc";
    for (int it = 0; it < 200000; it++) {
        size_t len = td_rng_next(&rng) % sizeof(buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = alpha[td_rng_next(&rng) % (sizeof(alpha) - 1)];
        if (len)
            buf[0] = '{';
        int rc = td_bench_chunk_scan(buf, len, &c);
        ck_assert(rc == 0 || rc == TD_EPARSE);
    }
}
END_TEST

START_TEST(test_scrape_parse)
{
    const char *before = "# HELP tandem_time_to_first_token_seconds x\n"
                         "# TYPE tandem_time_to_first_token_seconds histogram\n"
                         "tandem_time_to_first_token_seconds_bucket{role=\"d\",le=\"0.01\"} 1\n"
                         "tandem_time_to_first_token_seconds_bucket{role=\"d\",le=\"0.1\"} 2\n"
                         "tandem_time_to_first_token_seconds_bucket{role=\"d\",le=\"+Inf\"} 2\n"
                         "tandem_time_to_first_token_seconds_sum{role=\"d\"} 0.06\n"
                         "tandem_time_to_first_token_seconds_count{role=\"d\"} 2\n"
                         "tandem_generation_tokens_total{role=\"d\"} 10\n";
    const char *after = "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.01\"} 1\n"
                        "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 12\n"
                        "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 12\n"
                        "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.56\n"
                        "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 12\n"
                        "vllm:generation_tokens_total{model_name=\"m\"} 110\n"
                        "vllm:prompt_tokens_total{model_name=\"m\"} 7\n"
                        "vllm:inter_token_latency_seconds_sum{model_name=\"m\"} 2\n"
                        "vllm:inter_token_latency_seconds_count{model_name=\"m\"} 100\n"
                        "vllm:time_per_output_token_seconds_sum{model_name=\"m\"} 9\n"
                        "vllm:time_per_output_token_seconds_count{model_name=\"m\"} 10\n";
    td_bench_scrape_t a, b, d;
    ck_assert_int_eq(td_bench_scrape_parse(before, strlen(before), &a), 0);
    ck_assert_int_eq(td_bench_scrape_parse(after, strlen(after), &b), 0);
    ck_assert(a.ttft.found && a.ttft.n == 3);
    td_bench_scrape_diff(&a, &b, &d);
    ck_assert_double_eq_tol(d.ttft.total, 10, 1e-12);
    ck_assert_double_eq_tol(d.ttft.sum, 0.5, 1e-12);
    ck_assert_double_eq_tol(d.generation_tokens, 100, 1e-12);
    /* ITL and TPOT histograms are kept apart (a server may export both) */
    ck_assert_double_eq_tol(d.itl.sum / d.itl.total, 0.02, 1e-12);
    ck_assert_double_eq_tol(d.tpot.sum / d.tpot.total, 0.9, 1e-12);
    /* 10 new observations, all in (0.01, 0.1]: the median interpolates to 0.055 */
    ck_assert_double_eq_tol(td_bench_hist_quantile(&d.ttft, 0.5), 0.055, 1e-12);
    ck_assert_int_eq(td_bench_scrape_parse("x{le=\"1\" 3\n", 11, &a), TD_EPARSE);
    ck_assert_int_eq(td_bench_scrape_parse("x 3z\n", 5, &a), TD_EPARSE);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("bench_metrics");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_percentiles);
    tcase_add_test(tc, test_metrics_hand_computed);
    tcase_add_test(tc, test_json_keys);
    tcase_add_test(tc, test_chunk_scan);
    tcase_add_test(tc, test_scrape_parse);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}
