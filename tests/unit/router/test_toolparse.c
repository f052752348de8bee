/* test_toolparse.c: tool calls parsed out of model output in the four formats, the prefills that
 * force a call, stream hold-back, and malformed or cut-off output (which stays text or yields
 * the call with what arguments it has; never a crash). */
#include "toolparse.h"
#include "td_check.h"
#include "td_error.h"

#include <check.h>
#include <string.h>

#define DSB "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DSE "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DCB "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DCE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DSEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

static td_tool_parsed_t P(td_tool_fmt_t f, const char *s)
{
    td_tool_parsed_t p;
    ck_assert_int_eq(td_tool_parse(f, s, strlen(s), &p), 0);
    return p;
}

START_TEST(test_deepseek)
{
    td_tool_parsed_t p = P(TD_TOOL_FMT_DEEPSEEK,
                           "Let me check." DSB DCB "function" DSEP "get_weather\n```json\n"
                           "{\"city\": \"Paris\"}\n```" DCE DCB "function" DSEP "now\n```json\n{}\n```"
                           DCE DSE);
    ck_assert_str_eq(p.text, "Let me check.");
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.calls[0].name, "get_weather");
    ck_assert_str_eq(p.calls[0].arguments, "{\"city\": \"Paris\"}");
    ck_assert_str_eq(p.calls[1].name, "now");
    ck_assert_str_eq(p.calls[1].arguments, "{}");
    td_tool_parsed_free(&p);
    /* V3.1 form */
    p = P(TD_TOOL_FMT_DEEPSEEK, DSB DCB "f" DSEP "{\"a\":1}" DCE DSE);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "f");
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\":1}");
    ck_assert_str_eq(p.text, "");
    td_tool_parsed_free(&p);
    /* cut off inside the arguments (max_tokens): still the call */
    p = P(TD_TOOL_FMT_DEEPSEEK, DSB DCB "function" DSEP "f\n```json\n{\"a\": ");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].arguments, "{\"a\":");
    td_tool_parsed_free(&p);
    /* no separator: no call */
    p = P(TD_TOOL_FMT_DEEPSEEK, "x" DSB DCB "garbage");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.text, "x");
    td_tool_parsed_free(&p);
}
END_TEST

START_TEST(test_qwen)
{
    td_tool_parsed_t p = P(TD_TOOL_FMT_QWEN3,
                           "<think>\nhm\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                           "\"arguments\": {\"city\": \"Paris\", \"u\": [1, 2]}}\n</tool_call>\n"
                           "<tool_call>\n{\"name\":\"b\",\"arguments\":{}}\n</tool_call>");
    ck_assert_str_eq(p.text, "<think>\nhm\n</think>\n\n\n");
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.calls[0].name, "get_weather");
    ck_assert_str_eq(p.calls[0].arguments, "{\"city\":\"Paris\",\"u\":[1,2]}");
    ck_assert_str_eq(p.calls[1].arguments, "{}");
    td_tool_parsed_free(&p);
    /* the prefilled opening continued by an unconstrained model */
    p = P(TD_TOOL_FMT_QWEN3, "<tool_call>\n{\"name\": \"f\", \"arguments\": zz qq");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "f");
    ck_assert_str_eq(p.calls[0].arguments, "zz qq");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_QWEN3, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}");
    ck_assert_str_eq(p.calls[0].arguments, "{\"x\":1}");
    td_tool_parsed_free(&p);
    /* not an object inside: text */
    p = P(TD_TOOL_FMT_QWEN3, "a<tool_call>nope</tool_call>b");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.text, "a<tool_call>nope</tool_call>b");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_QWEN3, "<tool_call>{\"name\": 3}</tool_call>");
    ck_assert_uint_eq(p.n_calls, 0);
    td_tool_parsed_free(&p);
}
END_TEST

START_TEST(test_llama)
{
    td_tool_parsed_t p =
        P(TD_TOOL_FMT_LLAMA3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "get_weather");
    ck_assert_str_eq(p.calls[0].arguments, "{\"city\":\"Paris\"}");
    ck_assert_str_eq(p.text, "");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_LLAMA3, "<|python_tag|>{\"name\":\"a\",\"parameters\":{\"s\":\";\"}}; "
                              "{\"name\":\"b\",\"parameters\":{}}");
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.calls[0].arguments, "{\"s\":\";\"}");
    ck_assert_str_eq(p.calls[1].name, "b");
    td_tool_parsed_free(&p);
    /* prose that mentions JSON is text */
    p = P(TD_TOOL_FMT_LLAMA3, "The answer is {\"name\": \"x\"}");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.text, "The answer is {\"name\": \"x\"}");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_LLAMA3, "{\"name\": \"a\", \"parameters\": {}} trailing");
    ck_assert_uint_eq(p.n_calls, 0);
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_LLAMA3, "{\"name\": \"f\", \"parameters\": abc");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].arguments, "abc");
    td_tool_parsed_free(&p);
}
END_TEST

START_TEST(test_harmony)
{
    td_tool_parsed_t p =
        P(TD_TOOL_FMT_HARMONY, "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
                               "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                               "<|message|>{\"city\":\"Paris\"}<|call|>");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "get_weather");
    ck_assert_str_eq(p.calls[0].arguments, "{\"city\":\"Paris\"}");
    ck_assert_str_eq(p.text, "");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_HARMONY, "<|channel|>final<|message|>Hello.<|return|>");
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.text, "Hello.");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_HARMONY, "plain");
    ck_assert_str_eq(p.text, "plain");
    td_tool_parsed_free(&p);
    p = P(TD_TOOL_FMT_HARMONY, "<|channel|>commentary to=functions.");
    ck_assert_uint_eq(p.n_calls, 0);
    td_tool_parsed_free(&p);
}
END_TEST

START_TEST(test_prefill_roundtrip)
{
    td_tool_fmt_t fm[] = {TD_TOOL_FMT_DEEPSEEK, TD_TOOL_FMT_QWEN3, TD_TOOL_FMT_LLAMA3,
                          TD_TOOL_FMT_HARMONY};
    const char *tail[] = {"{\"q\": 1}\n```" DCE DSE, "{\"q\": 1}}\n</tool_call>", "{\"q\": 1}}",
                          "{\"q\": 1}<|call|>"};
    for (size_t i = 0; i < 4; i++) {
        td_buf_t b;
        td_buf_init(&b);
        ck_assert_int_eq(td_tool_prefill(fm[i], "lookup", &b), 0);
        ck_assert_uint_eq(td_tool_find_start(fm[i], b.data, b.len), 0);
        td_buf_append_str(&b, tail[i]);
        td_tool_parsed_t p = P(fm[i], b.data);
        ck_assert_msg(p.n_calls == 1, "format %s", td_tool_fmt_name(fm[i]));
        ck_assert_str_eq(p.calls[0].name, "lookup");
        ck_assert_msg(strcmp(p.calls[0].arguments, "{\"q\": 1}") == 0 ||
                          strcmp(p.calls[0].arguments, "{\"q\":1}") == 0,
                      "%s: %s", td_tool_fmt_name(fm[i]), p.calls[0].arguments);
        td_tool_parsed_free(&p);
        td_buf_free(&b);
    }
    td_buf_t b;
    td_buf_init(&b);
    ck_assert_int_eq(td_tool_prefill(TD_TOOL_FMT_NONE, "x", &b), TD_ENOTSUP);
    td_buf_free(&b);
}
END_TEST

START_TEST(test_holdback_names)
{
    ck_assert_uint_eq(td_tool_holdback(TD_TOOL_FMT_QWEN3, "abc<tool", 8), 5);
    ck_assert_uint_eq(td_tool_holdback(TD_TOOL_FMT_QWEN3, "abc<", 4), 1);
    ck_assert_uint_eq(td_tool_holdback(TD_TOOL_FMT_QWEN3, "abc", 3), 0);
    ck_assert_uint_eq(td_tool_holdback(TD_TOOL_FMT_LLAMA3, "  ", 2), 2);
    ck_assert_uint_eq(td_tool_find_start(TD_TOOL_FMT_QWEN3, "ab<tool_call>", 13), 2);
    ck_assert_uint_eq(td_tool_find_start(TD_TOOL_FMT_QWEN3, "ab", 2), 2);
    ck_assert_uint_eq(td_tool_find_start(TD_TOOL_FMT_LLAMA3, "hi", 2), 2);
    td_tool_fmt_t f;
    for (int i = 0; i <= TD_TOOL_FMT_HARMONY; i++) {
        ck_assert_int_eq(td_tool_fmt_from_name(td_tool_fmt_name((td_tool_fmt_t)i), &f), 0);
        ck_assert_int_eq(f, i);
    }
    ck_assert_int_eq(td_tool_fmt_from_name("hermes2", &f), TD_EINVAL);
    ck_assert_int_eq(td_tool_fmt_detect(NULL), TD_TOOL_FMT_NONE);
    /* text with no format is text, even empty */
    td_tool_parsed_t p = P(TD_TOOL_FMT_NONE, "");
    ck_assert_str_eq(p.text, "");
    td_tool_parsed_free(&p);
}
END_TEST

START_TEST(test_stream)
{
    /* fed one byte at a time: text before the marker goes out, never a byte of the marker */
    const char *out = "Hi <b> there<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    td_tool_stream_t s;
    ck_assert_int_eq(td_tool_stream_init(&s, TD_TOOL_FMT_QWEN3, NULL), 0);
    td_buf_t rel;
    td_buf_init(&rel);
    for (size_t i = 0; out[i]; i++) {
        ck_assert_int_eq(td_tool_stream_feed(&s, out + i, 1, &rel), 0);
        ck_assert(rel.len <= 12);
    }
    ck_assert_str_eq(rel.data, "Hi <b> there");
    td_tool_parsed_t p;
    ck_assert_int_eq(td_tool_stream_end(&s, &p), 0);
    ck_assert_str_eq(p.text, "");
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "f");
    td_tool_parsed_free(&p);
    td_tool_stream_free(&s);
    /* a held prefix that turns out not to be a marker is released at the end */
    td_buf_reset(&rel);
    ck_assert_int_eq(td_tool_stream_init(&s, TD_TOOL_FMT_QWEN3, NULL), 0);
    ck_assert_int_eq(td_tool_stream_feed(&s, "a<tool", 6, &rel), 0);
    ck_assert_str_eq(rel.data, "a");
    ck_assert_int_eq(td_tool_stream_end(&s, &p), 0);
    ck_assert_str_eq(p.text, "<tool");
    td_tool_parsed_free(&p);
    td_tool_stream_free(&s);
    /* forced: everything is held, the prefill first */
    td_buf_reset(&rel);
    td_buf_t pf;
    td_buf_init(&pf);
    td_tool_prefill(TD_TOOL_FMT_LLAMA3, "g", &pf);
    ck_assert_int_eq(td_tool_stream_init(&s, TD_TOOL_FMT_LLAMA3, pf.data), 0);
    ck_assert_int_eq(td_tool_stream_feed(&s, "{\"k\": 2}}", 9, &rel), 0);
    ck_assert_uint_eq(rel.len, 0);
    ck_assert_int_eq(td_tool_stream_end(&s, &p), 0);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "g");
    ck_assert_str_eq(p.calls[0].arguments, "{\"k\":2}");
    td_tool_parsed_free(&p);
    td_tool_stream_free(&s);
    td_buf_free(&pf);
    td_buf_free(&rel);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("toolparse");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_deepseek);
    tcase_add_test(tc, test_qwen);
    tcase_add_test(tc, test_llama);
    tcase_add_test(tc, test_harmony);
    tcase_add_test(tc, test_prefill_roundtrip);
    tcase_add_test(tc, test_holdback_names);
    tcase_add_test(tc, test_stream);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return td_check_run(suite());
}
