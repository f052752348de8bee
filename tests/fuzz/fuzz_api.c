/* fuzz_api.c: the router's request parser for all three APIs (OpenAI completions and chat,
 * Anthropic messages). Input: a kind byte, then the JSON body. */
#include "api.h"
#include "fuzz.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    td_api_kind_t kind = (td_api_kind_t)(data[0] % 4);
    td_api_request_t r;
    const char *param;
    if (td_api_parse(kind, (const char *)data + 1, size - 1, &r, &param) == 0)
        td_api_request_free(&r);
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_char(b, 1); /* chat */
    td_buf_append_str(b, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                         "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
                         "\"max_tokens\":16,\"temperature\":0.5,\"stop\":[\"x\",\"y\"],"
                         "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                         "\"logprobs\":true,\"top_logprobs\":2,\"seed\":7}");
}
