/* test_response.c: OpenAI and Anthropic response formatting: exact chunk bytes for the OpenAI
 * framing, every SSE data line valid JSON, deltas that add up to the text, event order. */
#include "response.h"
#include "td_check.h"

#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static td_resp_ctx_t ctx(td_api_kind_t kind, bool usage, bool *role_sent)
{
    td_resp_ctx_t c = {0};
    c.kind = kind;
    c.id = kind == TD_API_CHAT ? "chatcmpl-1" : kind == TD_API_MESSAGES ? "msg_1" : "cmpl-1";
    c.model = "tiny";
    c.created = 1700000000;
    c.include_usage = usage;
    c.prompt_tokens = 5;
    c.role_sent = role_sent;
    return c;
}

START_TEST(test_chat_chunks_exact)
{
    bool role[1] = {false};
    td_resp_ctx_t c = ctx(TD_API_CHAT, false, role);
    td_buf_t b;
    td_buf_init(&b);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "Hi", 2, NULL), 0);
    ck_assert_str_eq(
        b.data,
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
        "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},"
        "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    td_buf_reset(&b);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "\"!\n", 3, NULL), 0); /* no second role chunk */
    ck_assert_str_eq(b.data,
                     "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
                     "1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                     "\"\\\"!\\n\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    td_buf_reset(&b);
    td_resp_usage_t u = {5, 2, 0};
    ck_assert_int_eq(td_resp_finish(&b, &c, 0, TD_RESP_LENGTH, &u), 0);
    ck_assert_int_eq(td_resp_done(&b, &c, &u), 0);
    ck_assert_str_eq(b.data,
                     "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
                     "1700000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{},"
                     "\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n");
    td_buf_free(&b);
}
END_TEST

/* Split an SSE body into its data payloads, check each parses, and return them. */
static size_t data_lines(const char *body, json_object **objs, size_t max, bool *done)
{
    size_t n = 0;
    *done = false;
    for (const char *p = body; (p = strstr(p, "data: ")); ) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        ck_assert_ptr_nonnull(end);
        if (strncmp(p, "[DONE]", 6) == 0) {
            ck_assert(end == p + 6);
            ck_assert_str_eq(end + 2, ""); /* [DONE] is last */
            *done = true;
        } else {
            char *line = strndup(p, (size_t)(end - p));
            json_object *o = json_tokener_parse(line);
            ck_assert_msg(o != NULL, "not JSON: %s", line);
            free(line);
            ck_assert_uint_lt(n, max);
            objs[n++] = o;
        }
        p = end + 2;
    }
    return n;
}

START_TEST(test_completions_stream_usage_and_logprobs)
{
    bool role[2] = {false, false};
    td_resp_ctx_t c = ctx(TD_API_COMPLETIONS, true, role);
    td_buf_t b;
    td_buf_init(&b);
    const char *toks[] = {"Hello", ",", " w\xc3\xb6rld"};
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        td_resp_top_t top[2] = {{toks[i], strlen(toks[i]), -0.5}, {"x", 1, -2.0}};
        td_resp_logprob_t lp = {toks[i], strlen(toks[i]), off, -0.5, top, 2};
        ck_assert_int_eq(td_resp_delta(&b, &c, i % 2, toks[i], strlen(toks[i]), &lp), 0);
        off += strlen(toks[i]);
    }
    td_resp_usage_t u = {5, 3, 4};
    ck_assert_int_eq(td_resp_finish(&b, &c, 0, TD_RESP_STOP, &u), 0);
    ck_assert_int_eq(td_resp_finish(&b, &c, 1, TD_RESP_STOP, &u), 0);
    ck_assert_int_eq(td_resp_done(&b, &c, &u), 0);
    json_object *o[16];
    bool done;
    size_t n = data_lines(b.data, o, 16, &done);
    ck_assert(done);
    ck_assert_uint_eq(n, 6);
    char text[2][64] = {"", ""};
    for (size_t i = 0; i < 5; i++) {
        json_object *ch = json_object_array_get_idx(json_object_object_get(o[i], "choices"), 0);
        ck_assert_str_eq(json_object_get_string(json_object_object_get(o[i], "object")),
                         "text_completion");
        ck_assert(json_object_is_type(json_object_object_get(o[i], "usage"), json_type_null));
        int idx = json_object_get_int(json_object_object_get(ch, "index"));
        strcat(text[idx], json_object_get_string(json_object_object_get(ch, "text")));
        json_object *lp = json_object_object_get(ch, "logprobs");
        if (i < 3) {
            json_object *tl = json_object_object_get(lp, "top_logprobs");
            ck_assert_int_eq(json_object_object_length(json_object_array_get_idx(tl, 0)), 2);
        }
    }
    ck_assert_str_eq(text[0], "Hello w\xc3\xb6rld");
    ck_assert_str_eq(text[1], ",");
    /* the usage chunk: no choices, usage with cached tokens */
    ck_assert_int_eq(json_object_array_length(json_object_object_get(o[5], "choices")), 0);
    json_object *usage = json_object_object_get(o[5], "usage");
    ck_assert_int_eq(json_object_get_int(json_object_object_get(usage, "total_tokens")), 8);
    ck_assert_int_eq(json_object_get_int(json_object_object_get(
                         json_object_object_get(usage, "prompt_tokens_details"), "cached_tokens")),
                     4);
    for (size_t i = 0; i < n; i++)
        json_object_put(o[i]);
    td_buf_free(&b);
}
END_TEST

/* One OpenAI stream (role, tokens with and without logprobs, a tool call, finish, usage, done)
 * into `out`, with the chunk opening kept in `head` or (head NULL) formatted for each chunk. */
static void openai_stream(td_api_kind_t kind, bool usage, td_buf_t *head, td_buf_t *out)
{
    bool role[2] = {false, false};
    td_resp_ctx_t c = ctx(kind, usage, role);
    c.id = kind == TD_API_CHAT ? "chatcmpl-\"q\"" : "cmpl-\\x"; /* escaped in the opening */
    c.model = "m\xc3\xa9";
    c.head = head;
    td_resp_top_t top = {"a", 1, -0.5, NULL, 0};
    td_resp_logprob_t lp = {"b", 1, 0, -0.25, &top, 1, NULL, 0};
    td_resp_usage_t u = {7, 3, 2};
    td_resp_tool_t call = {"call_1", "f", "{\"x\":1}"};
    ck_assert_int_eq(td_resp_delta(out, &c, 0, "He", 2, NULL), 0);
    ck_assert_int_eq(td_resp_delta(out, &c, 1, "b", 1, &lp), 0);
    ck_assert_int_eq(td_resp_delta(out, &c, 0, "\"\n", 2, NULL), 0);
    if (kind == TD_API_CHAT)
        ck_assert_int_eq(td_resp_tool_call(out, &c, 1, 0, &call), 0);
    ck_assert_int_eq(td_resp_finish(out, &c, 0, TD_RESP_LENGTH, &u), 0);
    ck_assert_int_eq(td_resp_finish(out, &c, 1, TD_RESP_STOP, &u), 0);
    ck_assert_int_eq(td_resp_done(out, &c, &u), 0);
}

/* A stream that keeps its chunk opening (as the router's do) sends the bytes of one that
 * formats it for every chunk, and the kept opening is the chunk's own. */
START_TEST(test_kept_head_same_bytes)
{
    static const td_api_kind_t kinds[] = {TD_API_COMPLETIONS, TD_API_CHAT};
    for (size_t k = 0; k < 2; k++)
        for (int usage = 0; usage < 2; usage++) {
            td_buf_t plain, kept, head;
            td_buf_init(&plain);
            td_buf_init(&kept);
            td_buf_init(&head);
            openai_stream(kinds[k], usage, NULL, &plain);
            openai_stream(kinds[k], usage, &head, &kept);
            ck_assert_uint_gt(head.len, 0);
            ck_assert_uint_eq(kept.len, plain.len);
            ck_assert_mem_eq(kept.data, plain.data, plain.len);
            ck_assert_mem_eq(plain.data, head.data, head.len);
            ck_assert_ptr_nonnull(strstr(head.data, kinds[k] == TD_API_CHAT
                                                         ? "\"id\":\"chatcmpl-\\\"q\\\"\""
                                                         : "\"id\":\"cmpl-\\\\x\""));
            td_buf_free(&plain);
            td_buf_free(&kept);
            td_buf_free(&head);
        }
}
END_TEST

START_TEST(test_anthropic_stream_order)
{
    bool started[1] = {false};
    td_resp_ctx_t c = ctx(TD_API_MESSAGES, false, started);
    td_buf_t b;
    td_buf_init(&b);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "Hel", 3, NULL), 0);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "", 0, NULL), 0);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "lo", 2, NULL), 0);
    td_resp_usage_t u = {5, 3, 0};
    c.stop_sequence = "END";
    ck_assert_int_eq(td_resp_finish(&b, &c, 0, TD_RESP_STOP, &u), 0);
    ck_assert_int_eq(td_resp_done(&b, &c, &u), 0);
    static const char *order[] = {"message_start", "content_block_start", "ping",
                                  "content_block_delta", "content_block_delta",
                                  "content_block_stop", "message_delta", "message_stop"};
    const char *p = b.data;
    for (size_t i = 0; i < 8; i++) {
        char want[64];
        snprintf(want, sizeof(want), "event: %s\ndata: {\"type\":\"%s\"", order[i], order[i]);
        ck_assert_msg(strncmp(p, want, strlen(want)) == 0, "event %zu: %.60s", i, p);
        p = strstr(p, "\n\n") + 2;
    }
    ck_assert_str_eq(p, "");
    ck_assert_ptr_nonnull(strstr(b.data, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\""));
    ck_assert_ptr_nonnull(strstr(b.data, "\"input_tokens\":5"));
    td_buf_free(&b);
}
END_TEST

START_TEST(test_full_bodies)
{
    bool role[1] = {false};
    td_buf_t b;
    td_buf_init(&b);
    td_resp_choice_t ch = {"4", 1, TD_RESP_STOP, NULL, 0};
    td_resp_usage_t u = {9, 1, 0};
    td_resp_ctx_t c = ctx(TD_API_CHAT, false, role);
    ck_assert_int_eq(td_resp_full(&b, &c, &ch, 1, &u), 0);
    json_object *o = json_tokener_parse(b.data);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(o, "object")), "chat.completion");
    json_object *msg = json_object_object_get(
        json_object_array_get_idx(json_object_object_get(o, "choices"), 0), "message");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(msg, "content")), "4");
    json_object_put(o);
    td_buf_reset(&b);
    c = ctx(TD_API_MESSAGES, false, role);
    ch.finish = TD_RESP_LENGTH;
    ck_assert_int_eq(td_resp_full(&b, &c, &ch, 1, &u), 0);
    o = json_tokener_parse(b.data);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(o, "stop_reason")), "max_tokens");
    ck_assert_int_eq(json_object_get_int(json_object_object_get(json_object_object_get(o, "usage"),
                                                                "output_tokens")),
                     1);
    json_object_put(o);
    td_buf_reset(&b);
    c = ctx(TD_API_CHAT, false, role);
    ck_assert_int_eq(td_resp_stream_error(&b, &c, "server_error", "worker \"d0\" died"), 0);
    ck_assert_str_eq(b.data, "data: {\"error\":{\"message\":\"worker \\\"d0\\\" died\",\"type\":"
                             "\"server_error\",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n");
    td_buf_free(&b);
}
END_TEST

/* Each `data:` line of an SSE buffer parsed; returns how many, calling fn on each object. */
static int each_data(const char *s, void (*fn)(json_object *, void *), void *ud)
{
    int n = 0;
    for (const char *p = strstr(s, "data: "); p; p = strstr(p, "data: ")) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        ck_assert_ptr_nonnull(e);
        char *line = strndup(p, (size_t)(e - p));
        json_object *o = json_tokener_parse(line);
        free(line);
        ck_assert_msg(o != NULL, "bad data line: %.*s", (int)(e - p), p);
        fn(o, ud);
        json_object_put(o);
        n++;
        p = e;
    }
    return n;
}

static void seq_check(json_object *o, void *ud)
{
    int64_t *next = ud;
    ck_assert_int_eq(json_object_get_int64(json_object_object_get(o, "sequence_number")), *next);
    (*next)++;
}

START_TEST(test_tool_calls)
{
    bool role[1] = {false};
    td_resp_tool_t t = {"call_1", "get_weather", "{\"city\":\"Paris\"}"};
    td_resp_choice_t ch = {"", 0, TD_RESP_TOOLS, NULL, 0, &t, 1};
    td_resp_usage_t u = {5, 3, 0};
    td_buf_t b;
    td_buf_init(&b);
    /* chat: content null beside the calls, finish tool_calls */
    td_resp_ctx_t c = ctx(TD_API_CHAT, false, role);
    ck_assert_int_eq(td_resp_full(&b, &c, &ch, 1, &u), 0);
    ck_assert_ptr_nonnull(strstr(b.data, "\"message\":{\"role\":\"assistant\",\"content\":null,"
                                         "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                                         "\"function\":{\"name\":\"get_weather\",\"arguments\":"
                                         "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]}"));
    ck_assert_ptr_nonnull(strstr(b.data, "\"finish_reason\":\"tool_calls\""));
    /* chat stream: name chunk, then arguments chunk */
    td_buf_reset(&b);
    ck_assert_int_eq(td_resp_tool_call(&b, &c, 0, 0, &t), 0);
    ck_assert_ptr_nonnull(strstr(b.data, "\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\","
                                         "\"type\":\"function\",\"function\":{\"name\":"
                                         "\"get_weather\",\"arguments\":\"\"}}]}"));
    ck_assert_ptr_nonnull(strstr(b.data, "\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                                         "{\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]}"));
    /* Anthropic: the text block closes before the tool_use block at index 1 */
    bool role2[1] = {false};
    td_resp_blocks_t bl = {0};
    c = ctx(TD_API_MESSAGES, false, role2);
    c.blocks = &bl;
    td_resp_tool_t at = {"toolu_1", "get_weather", "{\"city\":\"Paris\"}"};
    td_buf_reset(&b);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "Hm.", 3, NULL), 0);
    ck_assert_int_eq(td_resp_tool_call(&b, &c, 0, 0, &at), 0);
    ck_assert_int_eq(td_resp_finish(&b, &c, 0, TD_RESP_TOOLS, &u), 0);
    const char *order[] = {"content_block_start\",\"index\":0", "text_delta",
                           "content_block_stop\",\"index\":0", "content_block_start\",\"index\":1",
                           "input_json_delta", "content_block_stop\",\"index\":1",
                           "\"stop_reason\":\"tool_use\""};
    const char *p = b.data;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        p = strstr(p, order[i]);
        ck_assert_msg(p != NULL, "missing or out of order: %s", order[i]);
    }
    ck_assert_ptr_null(strstr(p, "content_block_stop\",\"index\":0")); /* closed once */
    /* Anthropic whole: no empty text block, input an object */
    td_buf_reset(&b);
    td_resp_choice_t ach = {"", 0, TD_RESP_TOOLS, NULL, 0, &at, 1};
    ck_assert_int_eq(td_resp_full(&b, &c, &ach, 1, &u), 0);
    ck_assert_ptr_nonnull(strstr(b.data, "\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\","
                                         "\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]"));
    td_buf_free(&b);
}
END_TEST

START_TEST(test_responses)
{
    bool role[1] = {false};
    td_resp_rstate_t rs = {0};
    rs.msg_id = "msg_1";
    td_resp_ctx_t c = ctx(TD_API_RESPONSES, false, role);
    c.id = "resp_1";
    c.rs = &rs;
    c.max_output_tokens = 9;
    td_resp_tool_t t = {"call_7", "f", "{\"a\":1}"};
    td_resp_usage_t u = {5, 3, 2};
    td_buf_t b;
    td_buf_init(&b);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "He", 2, NULL), 0);
    ck_assert_int_eq(td_resp_delta(&b, &c, 0, "y", 1, NULL), 0);
    ck_assert_int_eq(td_resp_tool_call(&b, &c, 0, 0, &t), 0);
    ck_assert_int_eq(td_resp_finish(&b, &c, 0, TD_RESP_TOOLS, &u), 0);
    ck_assert_int_eq(td_resp_done(&b, &c, &u), 0);
    int64_t next = 0;
    ck_assert_int_eq(each_data(b.data, seq_check, &next), 14);
    const char *order[] = {"event: response.created", "event: response.in_progress",
                           "event: response.output_item.added", "event: response.content_part.added",
                           "event: response.output_text.delta", "event: response.output_text.delta",
                           "event: response.output_text.done", "event: response.content_part.done",
                           "event: response.output_item.done", "event: response.output_item.added",
                           "event: response.function_call_arguments.delta",
                           "event: response.function_call_arguments.done",
                           "event: response.output_item.done", "event: response.completed"};
    const char *p = b.data;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        p = strstr(p, order[i]);
        ck_assert_msg(p != NULL, "missing or out of order: %s", order[i]);
        p += strlen(order[i]);
    }
    json_object *done = json_tokener_parse(strstr(p, "data: ") + 6);
    json_object *r = json_object_object_get(done, "response");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(r, "status")), "completed");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(r, "output_text")), "Hey");
    json_object *out = json_object_object_get(r, "output");
    ck_assert_uint_eq(json_object_array_length(out), 2);
    json_object *fc = json_object_array_get_idx(out, 1);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(fc, "id")), "fc_7");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(fc, "call_id")), "call_7");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(fc, "arguments")), "{\"a\":1}");
    json_object *us = json_object_object_get(r, "usage");
    ck_assert_int_eq(json_object_get_int(json_object_object_get(us, "total_tokens")), 8);
    ck_assert_int_eq(json_object_get_int(json_object_object_get(
                         json_object_object_get(us, "input_tokens_details"), "cached_tokens")), 2);
    json_object_put(done);
    td_resp_rstate_free(&rs);
    /* whole, cut by the limit: incomplete */
    td_buf_reset(&b);
    td_resp_choice_t ch = {"Hey", 3, TD_RESP_LENGTH, NULL, 0, NULL, 0};
    ck_assert_int_eq(td_resp_full(&b, &c, &ch, 1, &u), 0);
    json_object *w = json_tokener_parse(b.data);
    ck_assert_ptr_nonnull(w);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(w, "status")), "incomplete");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(
                         json_object_object_get(w, "incomplete_details"), "reason")),
                     "max_output_tokens");
    ck_assert_str_eq(json_object_get_string(json_object_object_get(
                         json_object_array_get_idx(json_object_object_get(w, "output"), 0), "id")),
                     "msg_1");
    json_object_put(w);
    td_buf_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("response");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_chat_chunks_exact);
    tcase_add_test(tc, test_kept_head_same_bytes);
    tcase_add_test(tc, test_completions_stream_usage_and_logprobs);
    tcase_add_test(tc, test_anthropic_stream_order);
    tcase_add_test(tc, test_full_bodies);
    tcase_add_test(tc, test_tool_calls);
    tcase_add_test(tc, test_responses);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
