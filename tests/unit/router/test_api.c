/* test_api.c: the router's request parsing and validation for OpenAI completions, chat
 * completions and Anthropic messages, including malformed bodies. */
#include "api.h"
#include "td_tokenizer.h"
#include "td_error.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(td_api_kind_t k, const char *body, td_api_request_t *r, const char **param)
{
    return td_api_parse(k, body, strlen(body), r, param);
}

START_TEST(test_completions_defaults)
{
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, "{\"prompt\":\"hi\"}", &r, &param), 0);
    ck_assert_uint_eq(r.n_prompts, 1);
    ck_assert_str_eq(r.prompts[0].text, "hi");
    ck_assert_ptr_null(r.model);
    ck_assert_int_eq(r.max_tokens, -1);
    ck_assert(r.temperature == 1.0 && r.top_p == 1.0 && r.top_k == 0 && r.min_p == 0);
    ck_assert_int_eq(r.n, 1);
    ck_assert(!r.stream && !r.include_usage && !r.logprobs && !r.has_seed);
    td_api_request_free(&r);
}
END_TEST

START_TEST(test_completions_full)
{
    const char *body =
        "{\"model\":\"tiny\",\"prompt\":[\"a\",\"b\"],\"max_tokens\":16.0,\"temperature\":0,"
        "\"top_p\":0.9,\"top_k\":-1,\"min_p\":0.05,\"seed\":-7,\"stop\":\"\\n\\n\","
        "\"stop_token_ids\":[2,3],\"ignore_eos\":true,\"n\":2,\"logprobs\":3,\"echo\":true,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"user\":\"u1\","
        "\"unknown_field\":{\"x\":[1,2]},\"best_of\":2}";
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, body, &r, &param), 0);
    ck_assert_str_eq(r.model, "tiny");
    ck_assert_uint_eq(r.n_prompts, 2);
    ck_assert_str_eq(r.prompts[1].text, "b");
    ck_assert_int_eq(r.max_tokens, 16);
    ck_assert(r.temperature == 0 && r.top_p == 0.9 && r.top_k == 0 && r.min_p == 0.05);
    ck_assert(r.has_seed);
    ck_assert_int_eq(r.seed, -7);
    ck_assert_uint_eq(r.n_stop, 1);
    ck_assert_str_eq(r.stop[0], "\n\n");
    ck_assert_uint_eq(r.n_stop_token_ids, 2);
    ck_assert_int_eq(r.stop_token_ids[1], 3);
    ck_assert(r.ignore_eos && r.echo && r.stream && r.include_usage && r.logprobs);
    ck_assert_int_eq(r.top_logprobs, 3);
    ck_assert_int_eq(r.n, 2);
    ck_assert_str_eq(r.user, "u1");
    /* the engine's settings it asks for */
    td_sampling_t sp;
    td_api_sampling(&r, &sp);
    ck_assert(sp.temperature == 0 && sp.top_k == 0 && sp.top_p == 0.9f && sp.min_p == 0.05f);
    ck_assert_int_eq(sp.n_stop, 2);
    ck_assert_int_eq(sp.stop_ids[0], 2);
    ck_assert_int_eq(sp.stop_ids[1], 3);
    ck_assert(sp.ignore_eos);
    ck_assert_int_eq(sp.logprobs, 3);
    ck_assert_int_eq(sp.eos_id, -1);
    td_api_request_free(&r);
}
END_TEST

START_TEST(test_sampling_limits)
{
    /* as many stop token ids as the sampler holds: accepted, every one kept */
    td_buf_t b;
    td_buf_init(&b);
    td_buf_append_str(&b, "{\"prompt\":\"x\",\"top_k\":5,\"stop_token_ids\":[");
    for (int i = 0; i < TD_SAMPLER_MAX_STOP; i++)
        td_buf_printf(&b, "%s%d", i ? "," : "", 100 + i);
    td_buf_append_str(&b, "]}");
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, b.data, &r, &param), 0);
    td_sampling_t sp;
    td_api_sampling(&r, &sp);
    ck_assert_int_eq(sp.n_stop, TD_SAMPLER_MAX_STOP);
    ck_assert_int_eq(sp.stop_ids[TD_SAMPLER_MAX_STOP - 1], 100 + TD_SAMPLER_MAX_STOP - 1);
    ck_assert_int_eq(sp.top_k, 5);
    ck_assert_int_eq(sp.logprobs, -1); /* not asked: no logprob records */
    td_api_request_free(&r);
    td_buf_free(&b);
}
END_TEST

/* The logit adjustments reach the engine's settings (the sampler's tests check their effect). */
START_TEST(test_adjust_fields)
{
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
                       "\"repetition_penalty\":1.2,\"logit_bias\":{\"7\":-100,\"12\":2.5},"
                       "\"min_tokens\":3,\"max_tokens\":4,\"stop_token_ids\":[9]}";
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_CHAT, body, &r, &param), 0);
    td_sampling_t sp;
    td_api_sampling(&r, &sp);
    ck_assert(sp.presence_penalty == 0.5f && sp.frequency_penalty == -1.0f);
    ck_assert(sp.repetition_penalty == 1.2f);
    ck_assert_int_eq(sp.min_tokens, 3);
    ck_assert_int_eq(sp.n_logit_bias, 2);
    for (int i = 0; i < 2; i++)
        ck_assert(sp.logit_bias_ids[i] == 7 ? sp.logit_bias_values[i] == -100
                                            : sp.logit_bias_ids[i] == 12 &&
                                                  sp.logit_bias_values[i] == 2.5f);
    ck_assert_int_eq(sp.n_stop, 1);
    td_api_request_free(&r);
    /* Anthropic's Messages takes stop_token_ids and the adjustments too (vLLM's extensions) */
    ck_assert_int_eq(parse(TD_API_MESSAGES,
                           "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                           "\"x\"}],\"stop_token_ids\":[4],\"min_tokens\":2}",
                           &r, &param),
                     0);
    td_api_sampling(&r, &sp);
    ck_assert_int_eq(sp.stop_ids[0], 4);
    ck_assert_int_eq(sp.min_tokens, 2);
    ck_assert(sp.repetition_penalty == 1.0f && sp.n_logit_bias == 0);
    ck_assert_int_eq(sp.json_mode, 0);
    td_api_request_free(&r);
    /* structured outputs: json_object, json_schema (kept as compact text), Anthropic's */
    ck_assert_int_eq(parse(TD_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"response_format\":{\"type\":\"json_object\"}}",
                           &r, &param),
                     0);
    td_api_sampling(&r, &sp);
    ck_assert_int_eq(sp.json_mode, 1);
    td_api_request_free(&r);
    ck_assert_int_eq(parse(TD_API_COMPLETIONS,
                           "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                           "\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":"
                           "{ \"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                           "\"integer\"}}}}}}",
                           &r, &param),
                     0);
    td_api_sampling(&r, &sp);
    ck_assert_int_eq(sp.json_mode, 2);
    ck_assert_str_eq(sp.json_schema,
                     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    td_api_request_free(&r);
    ck_assert_int_eq(parse(TD_API_MESSAGES,
                           "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
                           "\"x\"}],\"output_format\":{\"type\":\"json_schema\",\"schema\":"
                           "{\"type\":\"array\"}}}",
                           &r, &param),
                     0);
    td_api_sampling(&r, &sp);
    ck_assert_int_eq(sp.json_mode, 2);
    td_api_request_free(&r);
}
END_TEST

/* bad_words are tokenized as vLLM does: as given and with a leading space. A byte-level BPE of
 * a, b, c, Ġ (space), ab, bc, abc: "abc" is [6] and " abc" is [3, 6]. */
START_TEST(test_bad_words)
{
    static const char tj[] =
        "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
        "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":"
        "{\"a\":0,\"b\":1,\"c\":2,\"\\u0120\":3,\"ab\":4,\"bc\":5,\"abc\":6},"
        "\"merges\":[\"b c\",\"a b\",\"a bc\"]}}";
    td_tokenizer_t *tok;
    ck_assert_int_eq(td_tokenizer_load_mem(tj, strlen(tj), NULL, 0, "mini", &tok), 0);
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_COMPLETIONS,
                           "{\"prompt\":\"x\",\"bad_words\":[\"abc\",\" abc\",\"b\"]}", &r,
                           &param),
                     0);
    ck_assert_int_eq(td_api_tokenize_bad_words(&r, tok, &param), 0);
    td_sampling_t sp;
    td_api_sampling(&r, &sp);
    /* "abc" -> [6], " abc" -> [3, 6]; " abc" again: the same two; "b" -> [1], " b" -> [3, 1] */
    ck_assert_int_eq(sp.n_bad_words, 4);
    int32_t want[] = {6, 3, 6, 1, 3, 1};
    uint32_t want_len[] = {1, 2, 1, 2};
    ck_assert_mem_eq(sp.bad_words, want, sizeof(want));
    ck_assert_mem_eq(sp.bad_word_len, want_len, sizeof(want_len));
    td_api_request_free(&r);
    td_tokenizer_free(tok);
}
END_TEST

START_TEST(test_prompt_ids)
{
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, "{\"prompt\":[1,2,3]}", &r, &param), 0);
    ck_assert_uint_eq(r.n_prompts, 1);
    ck_assert_ptr_null(r.prompts[0].text);
    ck_assert_uint_eq(r.prompts[0].n_ids, 3);
    ck_assert_int_eq(r.prompts[0].ids[2], 3);
    td_api_request_free(&r);
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, "{\"prompt\":[[1,2],[3],\"x\"]}", &r, &param), 0);
    ck_assert_uint_eq(r.n_prompts, 3);
    ck_assert_uint_eq(r.prompts[0].n_ids, 2);
    ck_assert_uint_eq(r.prompts[1].n_ids, 1);
    ck_assert_str_eq(r.prompts[2].text, "x");
    td_api_request_free(&r);
}
END_TEST

/* body, expected code, expected param (NULL = none), a fragment of the message */
static const struct bad {
    td_api_kind_t kind;
    const char *body;
    int code;
    const char *param;
    const char *msg;
} bad[] = {
    {TD_API_COMPLETIONS, "", TD_EPARSE, NULL, "not valid JSON"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\"", TD_EPARSE, NULL, "not valid JSON"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\"} {}", TD_EPARSE, NULL, "JSON"},
    {TD_API_COMPLETIONS, "{'prompt':'x'}", TD_EPARSE, NULL, "not valid JSON"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"\xff\xfe\"}", TD_EPARSE, NULL, "not valid JSON"},
    {TD_API_COMPLETIONS, "[1,2]", TD_EINVAL, NULL, "JSON object"},
    {TD_API_COMPLETIONS, "{}", TD_EINVAL, "prompt", "required"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"\"}", TD_EINVAL, "prompt", "empty"},
    {TD_API_COMPLETIONS, "{\"prompt\":[]}", TD_EINVAL, "prompt", "empty"},
    {TD_API_COMPLETIONS, "{\"prompt\":[1,\"a\"]}", TD_EINVAL, "prompt", "element 1"},
    {TD_API_COMPLETIONS, "{\"prompt\":[-1]}", TD_EINVAL, "prompt", "out of range"},
    {TD_API_COMPLETIONS, "{\"prompt\":[[1],[]]}", TD_EINVAL, "prompt", "prompt[1]"},
    {TD_API_COMPLETIONS, "{\"prompt\":7}", TD_EINVAL, "prompt", "an integer"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":3}", TD_EINVAL, "temperature", "[0, 2]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", TD_EINVAL, "temperature", "a string"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}", TD_EINVAL, "top_p", "(0, 1]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", TD_EINVAL, "max_tokens", "[1,"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1.5}", TD_EINVAL, "max_tokens", "integer"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":17}", TD_EINVAL, "n", "[1, 16]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":21}", TD_EINVAL, "logprobs", "[0, 20]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":\"yes\"}", TD_EINVAL, "stream", "boolean"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", TD_EINVAL, "stream_options", "only allowed"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", TD_EINVAL, "stream_options.include_usage", "boolean"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"\"]}", TD_EINVAL, "stop", "empty"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[1]}", TD_EINVAL, "stop", "strings"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}", TD_EINVAL, "stop", "at most 16"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop_token_ids\":3}", TD_EINVAL, "stop_token_ids", "array"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", TD_EINVAL, "stop_token_ids", "17 ids; at most 16"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":\"y\"}", TD_ENOTSUP, "suffix", "not supported"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":3}", TD_ENOTSUP, "best_of", "not supported"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"seed\":\"1\"}", TD_EINVAL, "seed", "integer"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"presence_penalty\":2.5}", TD_EINVAL, "presence_penalty", "[-2, 2]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"frequency_penalty\":-3}", TD_EINVAL, "frequency_penalty", "[-2, 2]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"repetition_penalty\":0}", TD_EINVAL, "repetition_penalty", "(0, 100]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":[1]}", TD_EINVAL, "logit_bias", "object"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", TD_EINVAL, "logit_bias", "\"abc\" is not a token id"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"-1\":1}}", TD_EINVAL, "logit_bias", "not a token id"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":101}}", TD_EINVAL, "logit_bias", "[-100, 100]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":\"up\"}}", TD_EINVAL, "logit_bias", "number"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"bad_words\":\"x\"}", TD_EINVAL, "bad_words", "array of strings"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"bad_words\":[\"\"]}", TD_EINVAL, "bad_words", "bad_words[0]"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"bad_words\":[3]}", TD_EINVAL, "bad_words", "non-empty string"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":-1}", TD_EINVAL, "min_tokens", "[0,"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":1.5}", TD_EINVAL, "min_tokens", "integer"},
    {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"min_tokens\":9,\"max_tokens\":8}", TD_EINVAL, "min_tokens", "must not exceed"},
    {TD_API_CHAT, "{}", TD_EINVAL, "messages", "array"},
    {TD_API_CHAT, "{\"messages\":[]}", TD_EINVAL, "messages", "empty"},
    {TD_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", TD_EINVAL, "messages", "messages[0].role"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}", TD_EINVAL, "messages", "bot"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", TD_EINVAL, "top_logprobs", "requires"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", TD_EINVAL, "tools[0].function", "must be an object"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", TD_EINVAL, "tools", "must be an array"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", TD_EINVAL, "tools[1].function.name", "1 to 64"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{}}]}", TD_EINVAL, "tools[1].function.name", "must be a string"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"retrieval\"}]}", TD_EINVAL, "tools[0].type", "function"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}", TD_EINVAL, "tools[0].function.parameters", "Schema"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", TD_EINVAL, "tools[1].function.name", "twice"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", TD_EINVAL, "tool_choice", "no 'tools'"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"always\"}", TD_EINVAL, "tool_choice", "must be"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", TD_EINVAL, "tool_choice", "not in"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"messages\":[]}}", TD_EINVAL, "chat_template_kwargs", "cannot set"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}]}", TD_EINVAL, "tools.0.input_schema", "Schema"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}},{\"input_schema\":{}}]}", TD_EINVAL, "tools.1.name", "must be a string"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]}", TD_ENOTSUP, "tools.0.type", "custom"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}}", TD_EINVAL, "tool_choice", "not in"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"sometimes\"}}", TD_EINVAL, "tool_choice.type", "auto"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":3}]}]}", TD_EINVAL, "messages.0.content.0.input", "wrong type"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":\"r\"}]}]}", TD_EINVAL, "messages.0.content.0.tool_use_id", "string"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", TD_EINVAL, "response_format.type", "'xml'"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":\"json\"}", TD_EINVAL, "response_format", "object"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", TD_EINVAL, "response_format.json_schema", "'name'"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}}", TD_EINVAL, "response_format.json_schema.name", "non-empty"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"string\",\"pattern\":\"a\"}}}}", TD_ENOTSUP, "response_format.json_schema.schema", "'pattern'"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":5}}}", TD_EINVAL, "response_format.json_schema.schema", "schema object"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"output_format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}}}}}", TD_ENOTSUP, "output_format.schema", "schema.properties.a.$ref"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"output_format\":{\"type\":\"json\"}}", TD_EINVAL, "output_format.type", "json_schema"},
    {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", TD_EINVAL, "chat_template_kwargs.enable_thinking", "boolean"},
    {TD_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", TD_EINVAL, "max_tokens", "required"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", TD_EINVAL, "messages", "messages.0.role"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1.5}", TD_EINVAL, "temperature", "[0, 1]"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}", TD_ENOTSUP, "messages.0.content.0.type", "image"},
    {TD_API_MESSAGES, "{\"max_tokens\":5,\"system\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", TD_EINVAL, "system", "string"},
};

START_TEST(test_bad_requests)
{
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        td_api_request_t r;
        const char *param = "unset";
        int rc = parse(bad[i].kind, bad[i].body, &r, &param);
        if (rc != bad[i].code || !(bad[i].param ? param && strcmp(param, bad[i].param) == 0
                                                : param == NULL) ||
            !strstr(td_err_msg(), bad[i].msg))
            ck_abort_msg("case %zu (%s): rc %d param %s msg \"%s\"", i, bad[i].body, rc,
                         param ? param : "(null)", td_err_msg());
        ck_assert_ptr_null(r.prompts); /* nothing left allocated */
        ck_assert_ptr_null(r.stop);
    }
}
END_TEST

START_TEST(test_chat)
{
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},"
        "{\"type\":\"text\",\"text\":\"lo\"}]}],\"max_tokens\":100,\"max_completion_tokens\":7,"
        "\"logprobs\":true,\"top_logprobs\":5,\"chat_template_kwargs\":{\"enable_thinking\":false},"
        "\"response_format\":{\"type\":\"text\"},\"tools\":[]}";
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_CHAT, body, &r, &param), 0);
    ck_assert_uint_eq(r.msgs.n, 2);
    ck_assert_int_eq(r.msgs.v[0].role, TD_CHAT_ROLE_SYSTEM);
    ck_assert_str_eq(r.msgs.v[1].content, "hello");
    ck_assert_int_eq(r.max_tokens, 7); /* max_completion_tokens wins */
    ck_assert(r.logprobs && r.top_logprobs == 5 && r.disable_thinking && r.add_generation_prompt);
    td_api_request_free(&r);
}
END_TEST

START_TEST(test_anthropic)
{
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":64,\"system\":[{\"type\":\"text\",\"text\":\"sys\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
        "\"content\":[{\"type\":\"text\",\"text\":\"yo\"}]},{\"role\":\"user\",\"content\":\"q\"}],"
        "\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_k\":40,\"stream\":true,"
        "\"metadata\":{\"user_id\":\"u9\"}}";
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(parse(TD_API_MESSAGES, body, &r, &param), 0);
    ck_assert_uint_eq(r.msgs.n, 4);
    ck_assert_int_eq(r.msgs.v[0].role, TD_CHAT_ROLE_SYSTEM);
    ck_assert_str_eq(r.msgs.v[0].content, "sys");
    ck_assert_int_eq(r.msgs.v[2].role, TD_CHAT_ROLE_ASSISTANT);
    ck_assert_str_eq(r.msgs.v[2].content, "yo");
    ck_assert_int_eq(r.max_tokens, 64);
    ck_assert_uint_eq(r.n_stop, 1);
    ck_assert_str_eq(r.stop[0], "END");
    ck_assert(r.temperature == 0.5 && r.top_k == 40 && r.stream);
    ck_assert_str_eq(r.user, "u9");
    td_api_request_free(&r);
}
END_TEST

START_TEST(test_every_truncation_fails_cleanly)
{
    const char *body =
        "{\"model\":\"m\",\"prompt\":[[1,2],\"ab\"],\"stop\":[\"x\"],\"stop_token_ids\":[1],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":3}";
    size_t n = strlen(body);
    for (size_t cut = 0; cut < n; cut++) {
        td_api_request_t r;
        const char *param;
        ck_assert_int_ne(td_api_parse(TD_API_COMPLETIONS, body, cut, &r, &param), 0);
    }
    td_api_request_t r;
    const char *param;
    ck_assert_int_eq(td_api_parse(TD_API_COMPLETIONS, body, n, &r, &param), 0);
    td_api_request_free(&r);
}
END_TEST

/* The parser's tokener is kept between bodies: nothing of one body (an unfinished string, a
 * failed parse, a large body that made it drop its buffer) reaches the next. */
START_TEST(test_bodies_independent)
{
    td_api_request_t r;
    const char *param;
    ck_assert_int_ne(parse(TD_API_COMPLETIONS, "{\"prompt\":\"ab", &r, &param), 0);
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, "{\"prompt\":\"cd\"}", &r, &param), 0);
    ck_assert_str_eq(r.prompts[0].text, "cd");
    td_api_request_free(&r);
    ck_assert_int_ne(parse(TD_API_COMPLETIONS, "{\"prompt\":[1,{", &r, &param), 0);
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, "{\"prompt\":\"ef\",\"n\":2}", &r, &param), 0);
    ck_assert_str_eq(r.prompts[0].text, "ef");
    ck_assert_int_eq(r.n, 2);
    td_api_request_free(&r);
    size_t big = 100000;
    char *b = malloc(big + 32);
    ck_assert_ptr_nonnull(b);
    int h = snprintf(b, 32, "{\"prompt\":\"");
    memset(b + h, 'x', big);
    strcpy(b + h + big, "\"}");
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, b, &r, &param), 0);
    ck_assert_uint_eq(strlen(r.prompts[0].text), big);
    td_api_request_free(&r);
    free(b);
    ck_assert_int_eq(parse(TD_API_COMPLETIONS, "{\"prompt\":\"gh\"}", &r, &param), 0);
    ck_assert_str_eq(r.prompts[0].text, "gh");
    td_api_request_free(&r);
}
END_TEST

/* A number beyond 64 bits (json-c saturates it) is refused naming the field and echoing the
 * value as the client wrote it, in every API. */
START_TEST(test_huge_numbers_echoed)
{
    struct {
        td_api_kind_t kind;
        const char *body, *param, *says;
    } cases[] = {
        {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":18446744073709551616}",
         "max_tokens", "got 18446744073709551616"},
        {TD_API_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"\\\"max_tokens\\\": 3\"}],"
         "\"max_tokens\" :\n 99999999999999999999999}",
         "max_tokens", "got 99999999999999999999999"},
        {TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"max_completion_tokens\":18446744073709551616}",
         "max_completion_tokens", "got 18446744073709551616"},
        {TD_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                          "\"max_tokens\":-18446744073709551616}",
         "max_tokens", "got -18446744073709551616"},
        {TD_API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":4294967296}", "max_tokens",
         "got 4294967296"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        td_api_request_t r;
        const char *param = NULL;
        ck_assert_int_eq(parse(cases[i].kind, cases[i].body, &r, &param), TD_EINVAL);
        ck_assert_msg(param && strcmp(param, cases[i].param) == 0, "case %zu: param %s", i,
                      param ? param : "(null)");
        ck_assert_msg(strstr(td_err_msg(), cases[i].says) != NULL, "case %zu: %s", i,
                      td_err_msg());
    }
}
END_TEST

START_TEST(test_tools)
{
    td_api_request_t r;
    const char *param;
    const char *chat =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"c1\",\"content\":\"r\"}],\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}},{\"type\":"
        "\"function\",\"function\":{\"name\":\"g\"}}],\"tool_choice\":\"required\","
        "\"chat_template_kwargs\":{\"enable_thinking\":false,\"x\":1}}";
    ck_assert_int_eq(parse(TD_API_CHAT, chat, &r, &param), 0);
    ck_assert_uint_eq(json_object_array_length(r.tools), 2);
    ck_assert_int_eq(r.tool_choice, TD_API_TOOLS_REQUIRED);
    ck_assert_str_eq(r.tool_name, "f"); /* required forces the first tool */
    ck_assert(td_api_tool_forced(&r) && r.disable_thinking && r.template_kwargs);
    ck_assert_uint_eq(r.msgs.n, 3);
    td_api_request_free(&r);
    /* tool_choice none, and an empty tools list is no tools */
    ck_assert_int_eq(parse(TD_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                        "\"tools\":[],\"tool_choice\":\"none\"}", &r, &param), 0);
    ck_assert_ptr_null(r.tools);
    ck_assert(!td_api_tool_forced(&r));
    td_api_request_free(&r);
    /* Anthropic: tools converted to OpenAI's form, tool_use and tool_result to messages */
    const char *msg =
        "{\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"S\"}],\"messages\":["
        "{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"w\",\"input\":{\"c\":\"P\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"sun\"}]},{\"type\":\"text\",\"text\":\"and?\"}]}],"
        "\"tools\":[{\"name\":\"w\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"w\"}}";
    ck_assert_int_eq(parse(TD_API_MESSAGES, msg, &r, &param), 0);
    ck_assert_int_eq(r.tool_choice, TD_API_TOOLS_NAMED);
    ck_assert_str_eq(r.tool_name, "w");
    ck_assert_str_eq(json_object_to_json_string_ext(r.tools, JSON_C_TO_STRING_PLAIN),
                     "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"d\","
                     "\"parameters\":{\"type\":\"object\"}}}]");
    ck_assert_uint_eq(r.msgs.n, 5); /* system, user, assistant+call, tool, user */
    ck_assert_int_eq(r.msgs.v[2].role, TD_CHAT_ROLE_ASSISTANT);
    ck_assert_uint_eq(r.msgs.v[2].n_tool_calls, 1);
    ck_assert_str_eq(r.msgs.v[2].content, "ok");
    ck_assert_int_eq(r.msgs.v[3].role, TD_CHAT_ROLE_TOOL);
    ck_assert_str_eq(r.msgs.v[3].content, "sun");
    ck_assert_str_eq(r.msgs.v[4].content, "and?");
    json_object *call = json_object_array_get_idx(
        json_object_object_get(json_object_array_get_idx(r.msgs.json, 2), "tool_calls"), 0);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(call, "id")), "toolu_1");
    td_api_request_free(&r);
}
END_TEST

START_TEST(test_responses)
{
    td_api_request_t r;
    const char *param;
    const char *body =
        "{\"model\":\"m\",\"instructions\":\"be brief\",\"max_output_tokens\":9,\"temperature\":0.5,"
        "\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"hi\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{}}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"stream\":true}";
    ck_assert_int_eq(parse(TD_API_RESPONSES, body, &r, &param), 0);
    ck_assert_uint_eq(r.msgs.n, 4); /* system, user, one assistant with both calls, tool */
    ck_assert_int_eq(r.msgs.v[0].role, TD_CHAT_ROLE_SYSTEM);
    ck_assert_str_eq(r.msgs.v[1].content, "hi");
    ck_assert_uint_eq(r.msgs.v[2].n_tool_calls, 2);
    ck_assert_int_eq(r.msgs.v[3].role, TD_CHAT_ROLE_TOOL);
    ck_assert_int_eq(r.max_tokens, 9);
    ck_assert(r.stream && r.temperature == 0.5);
    ck_assert_int_eq(r.tool_choice, TD_API_TOOLS_NAMED);
    ck_assert_str_eq(r.tool_name, "f");
    td_api_request_free(&r);
    ck_assert_int_eq(parse(TD_API_RESPONSES, "{\"input\":\"hi\"}", &r, &param), 0);
    ck_assert_uint_eq(r.msgs.n, 1);
    td_api_request_free(&r);
    /* structured outputs in Responses: text.format, flat */
    ck_assert_int_eq(parse(TD_API_RESPONSES,
                           "{\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\","
                           "\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"object\"}}}}",
                           &r, &param),
                     0);
    ck_assert_int_eq(r.json_mode, 2);
    ck_assert_str_eq(r.json_schema, "{\"type\":\"object\"}");
    td_api_request_free(&r);
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":3}", "input"},
        {"{\"input\":\"x\",\"instructions\":1}", "instructions"},
        {"{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}", "input[0].content[0]"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\"}]}", "input[0].arguments"},
        {"{\"input\":[{\"type\":\"reasoning\"}]}", "input[0].type"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":1}]}", "tools[0].parameters"},
        {"{\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":{}}}}", "text.format.name"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"anyOf\":[]}}}}", "text.format.schema"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = parse(TD_API_RESPONSES, bad[i].body, &r, &param);
        ck_assert_msg(rc != 0 && param && strcmp(param, bad[i].param) == 0,
                      "case %zu: rc %d param %s (%s)", i, rc, param ? param : "(null)", td_err_msg());
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_completions_defaults);
    tcase_add_test(tc, test_completions_full);
    tcase_add_test(tc, test_prompt_ids);
    tcase_add_test(tc, test_adjust_fields);
    tcase_add_test(tc, test_bad_words);
    tcase_add_test(tc, test_bad_requests);
    tcase_add_test(tc, test_sampling_limits);
    tcase_add_test(tc, test_chat);
    tcase_add_test(tc, test_anthropic);
    tcase_add_test(tc, test_tools);
    tcase_add_test(tc, test_responses);
    tcase_add_test(tc, test_every_truncation_fails_cleanly);
    tcase_add_test(tc, test_bodies_independent);
    tcase_add_test(tc, test_huge_numbers_echoed);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
