/* fuzz_chat.c: the chat layer (common/text/chat.c): a tokenizer_config.json (its chat_template,
 * string or named list, and special tokens), then a NUL byte and an OpenAI `messages` array.
 * Each part is parsed on its own; when both parse, the messages are rendered with the config's
 * template. Checks: every call returns 0 or a TD_E* code with a message, a failure leaves the
 * template or list empty, a failed render appends nothing. */
#include "fuzz.h"
#include "td_chat.h"
#include "td_error.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t clen = nul ? (size_t)(nul - data) : size;
    td_chat_template_t t;
    memset(&t, 0, sizeof(t));
    int trc = td_chat_template_load_json(&t, (const char *)data, clen, "fuzz.json", NULL);
    if (trc && (trc > 0 || !td_err_msg()[0] || t.tpl || t.tokens))
        abort();
    td_chat_msgs_t m;
    memset(&m, 0, sizeof(m));
    int mrc = 1;
    if (nul) {
        mrc = td_chat_msgs_parse(&m, (const char *)nul + 1, size - clen - 1);
        if (mrc && (mrc > 0 || !td_err_msg()[0] || m.n || m.json))
            abort();
    }
    if (trc == 0 && mrc == 0) {
        td_chat_opts_t o = {.add_generation_prompt = true, .now_s = 1700000000};
        td_buf_t out;
        td_buf_init(&out);
        if (td_chat_render(&t, &m, &o, &out) != 0 && out.len != 0)
            abort();
        td_buf_free(&out);
    }
    td_chat_msgs_free(&m);
    td_chat_template_free(&t);
    return trc == 0 && (mrc == 0 || !nul) ? 0 : 1;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(
        b, "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\", \"lstrip\": false},"
           " \"added_tokens_decoder\": {\"0\": {\"content\": \"<unk>\", \"special\": true}},"
           " \"chat_template\": [{\"name\": \"default\", \"template\": \"{{ bos_token }}{% for m "
           "in messages %}<|{{ m.role }}|>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | "
           "tojson }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif "
           "%}\"}, {\"name\": \"tool_use\", \"template\": \"{{ tools }}\"}]}");
    td_buf_append_char(b, '\0');
    td_buf_append_str(
        b, "[{\"role\": \"system\", \"content\": \"be brief\"},"
           " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi \"},"
           " {\"type\": \"text\", \"text\": \"there\"}]},"
           " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"hm\","
           " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\":"
           " \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]},"
           " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"2\"}]");
}
