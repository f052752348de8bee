/* fuzz_jsonschema.c: the structured-output schema compiler (common/engine/jsonfsm.c) on any
 * bytes; a schema that compiles then runs its automaton over the rest of the input (after a NUL),
 * which must never accept bytes after a rejection. */
#include "fuzz.h"
#include "td_jsonfsm.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    td_jsonfsm_t *f;
    if (td_jsonfsm_compile((const char *)data, slen, &f) != 0)
        return 0;
    td_jsonfsm_state_t s;
    td_jsonfsm_start(f, &s);
    bool dead = false;
    for (size_t i = slen + 1; i < size; i++) {
        bool ok = td_jsonfsm_byte(f, &s, data[i]);
        if (dead && ok)
            abort(); /* a dead automaton accepted a byte */
        dead |= !ok;
        (void)td_jsonfsm_complete(f, &s);
    }
    td_jsonfsm_free(f);
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(b, "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                         "\"maxLength\":5},\"n\":{\"type\":\"integer\"},\"c\":{\"enum\":[\"r\","
                         "\"g\",1.5,null]},\"xs\":{\"type\":\"array\",\"items\":{\"type\":"
                         "\"number\"},\"maxItems\":3},\"b\":{\"type\":\"boolean\"}},\"required\":"
                         "[\"name\",\"n\"],\"additionalProperties\":false}");
    td_buf_append_char(b, 0);
    td_buf_append_str(b, "{\"n\":-12,\"name\":\"a\\u00e9\",\"xs\":[1.5e3,0],\"c\":\"g\"}");
}
