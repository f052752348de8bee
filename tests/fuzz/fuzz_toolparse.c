/* fuzz_toolparse.c: the tool-call parsers over arbitrary model output. Input: a format byte,
 * then the text. Checks the text returned is no longer than the input and calls are named. */
#include "fuzz.h"
#include "toolparse.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    td_tool_fmt_t f = (td_tool_fmt_t)(data[0] % 5);
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    td_tool_parsed_t p;
    if (td_tool_parse(f, s, n, &p) == 0) {
        if (p.text_len > n || strlen(p.text) > p.text_len)
            abort();
        for (size_t i = 0; i < p.n_calls; i++)
            if (!p.calls[i].name || !p.calls[i].arguments)
                abort();
        td_tool_parsed_free(&p);
    }
    if (td_tool_holdback(f, s, n) > n || td_tool_find_start(f, s, n) > n)
        abort();
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    /* markers of every format, so mutations of the format byte meet real syntax */
    td_buf_append_char(b, 2); /* qwen3 */
    td_buf_append_str(b, "hi<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"x\"]}}\n"
                         "</tool_call><tool_call>{\"name\": \"g\", \"arguments\": q"
                         "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
                         "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>function"
                         "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>f\n```json\n{}\n```"
                         "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
                         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
                         "<|channel|>final<|message|>ok<|return|>"
                         "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\"");
}
