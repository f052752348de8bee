/* fuzz_kvredis.c: the parser of a worker's set as read from Redis (td_kvredis_set_parse) over
 * arbitrary bytes. Whatever it accepts must be what a publisher writes: the header re-encoded
 * from the parsed epoch gives the same bytes, and the records fill the rest exactly. */
#include "fuzz.h"
#include "td_kvredis.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t epoch;
    size_t n;
    if (td_kvredis_set_parse(data, size, &epoch, &n) != 0)
        return 0;
    uint8_t hdr[TD_KVREDIS_SET_HEADER];
    td_kvredis_set_header(hdr, epoch);
    if (memcmp(hdr, data, sizeof(hdr)) != 0 ||
        TD_KVREDIS_SET_HEADER + n * TD_KVREDIS_REC != size)
        __builtin_trap(); /* accepted a set the publisher would not write */
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    uint8_t set[TD_KVREDIS_SET_HEADER + 3 * TD_KVREDIS_REC];
    td_kvredis_set_header(set, 0x1234567890abcdefull);
    for (size_t i = 0; i < 3; i++) {
        uint8_t *p = set + TD_KVREDIS_SET_HEADER + i * TD_KVREDIS_REC;
        p[0] = (uint8_t)(1 + i % 2);
        p[1] = (uint8_t)(i ? 2 : 0);
        for (int k = 0; k < 16; k++)
            p[2 + k] = (uint8_t)(i * 16 + (size_t)k);
    }
    td_buf_append(b, set, sizeof(set));
}
