/* kvhash.c: chained XXH3-128 block hashes (see td_kvhash.h). */
#include "td_kvhash.h"
#include "td_error.h"
#include "td_util.h"

#include <string.h>
#include <xxhash.h>

size_t td_kvhash_blocks(const int32_t *tokens, size_t n_tokens, size_t block_tokens,
                        const uint8_t fingerprint[16], const void *salt, size_t salt_len,
                        const td_kvhash_t *prev, td_kvhash_t *out, size_t max_out)
{
    TD_ASSERT(block_tokens > 0);
    size_t n_blocks = n_tokens / block_tokens;
    td_kvhash_t h;
    if (prev)
        h = *prev;
    else
        memset(&h, 0, sizeof(h));
    XXH3_state_t *st = XXH3_createState();
    TD_ASSERT(st); /* a few hundred bytes; failing here means the process is out of memory */
    uint8_t le[256 * 4];
    for (size_t i = 0; i < n_blocks && i < max_out; i++) {
        XXH3_128bits_reset(st);
        XXH3_128bits_update(st, h.b, sizeof(h.b));
        XXH3_128bits_update(st, fingerprint, 16);
        if (salt_len)
            XXH3_128bits_update(st, salt, salt_len);
        const int32_t *t = tokens + i * block_tokens;
        for (size_t done = 0; done < block_tokens;) {
            size_t n = TD_MIN(block_tokens - done, sizeof(le) / 4);
            for (size_t k = 0; k < n; k++) {
                uint32_t v = (uint32_t)t[done + k];
                le[4 * k] = (uint8_t)v;
                le[4 * k + 1] = (uint8_t)(v >> 8);
                le[4 * k + 2] = (uint8_t)(v >> 16);
                le[4 * k + 3] = (uint8_t)(v >> 24);
            }
            XXH3_128bits_update(st, le, 4 * n);
            done += n;
        }
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
        memcpy(h.b, c.digest, 16);
        out[i] = h;
    }
    XXH3_freeState(st);
    return n_blocks;
}

void td_kvhash_hex(const td_kvhash_t *h, char out[33])
{
    td_hex_encode(h->b, 16, out);
}
