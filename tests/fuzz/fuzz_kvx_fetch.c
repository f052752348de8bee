/* fuzz_kvx_fetch.c: the data plane's FETCH message parser (td_kvx_fetch_parse) over arbitrary
 * bytes, for a requester pool of 64 blocks. Whatever it accepts must be a message the encoder
 * writes: re-encoding what was parsed gives the same bytes. */
#include "fuzz.h"
#include "td_kvx.h"

#include <string.h>

enum { POOL = 64 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t dst[POOL];
    td_kvx_fetch_req_t r;
    if (td_kvx_fetch_parse(data, size, POOL, POOL, dst, &r) != 0)
        return 0;
    if (r.n == 0 || r.n > POOL || td_kvx_fetch_size(r.n) != size)
        __builtin_trap();
    static uint8_t again[16 + POOL * (TD_KVX_KEY_BYTES + 4)];
    td_kvx_fetch_encode(again, r.keys, r.dst, r.n, r.flags);
    if (memcmp(again, data, size) != 0)
        __builtin_trap(); /* accepted a message the encoder would not write */
    for (uint32_t i = 0; i < r.n; i++)
        if (r.dst[i] >= POOL)
            __builtin_trap();
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    uint8_t keys[3 * TD_KVX_KEY_BYTES];
    uint32_t dst[3] = {5, 6, 63};
    for (size_t i = 0; i < sizeof(keys); i++)
        keys[i] = (uint8_t)(i * 11);
    uint8_t msg[16 + 3 * (TD_KVX_KEY_BYTES + 4)];
    td_kvx_fetch_encode(msg, keys, dst, 3, TD_KVX_F_CSUM);
    td_buf_append(b, msg, sizeof(msg));
}
