/* kvhash.c: hash version 1, chained XXH3-128 block hashes (td_kvhash.h, docs/kv-cache.md). */
#include "td_kvhash.h"
#include "td_error.h"
#include "td_util.h"

#include <string.h>
#include <xxhash.h>

static const char root_tag[] = "tandem-kv"; /* 9 ASCII bytes, no NUL */

static void put_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* The canonical bytes of the current digest of `st` into *h. */
static void digest(XXH3_state_t *st, td_kvhash_t *h)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(h->b, c.digest, 16);
}

int td_kvhash_root(const uint8_t fingerprint[16], const void *salt, size_t salt_len,
                   td_kvhash_t *out)
{
    if (salt_len && !salt)
        return td_err_set(TD_EINVAL, "kvhash root: salt is NULL with length %zu", salt_len);
    if (salt_len > UINT32_MAX)
        return td_err_set(TD_EINVAL, "kvhash root: salt of %zu bytes (at most 2^32-1)", salt_len);
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return td_err_set(TD_ENOMEM, "kvhash root: no memory for the XXH3 state");
    uint8_t u32[4];
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, root_tag, sizeof(root_tag) - 1);
    put_u32le(u32, TD_KVHASH_VERSION);
    XXH3_128bits_update(st, u32, 4);
    XXH3_128bits_update(st, fingerprint, 16);
    put_u32le(u32, (uint32_t)salt_len);
    XXH3_128bits_update(st, u32, 4);
    if (salt_len)
        XXH3_128bits_update(st, salt, salt_len);
    digest(st, out);
    XXH3_freeState(st);
    return 0;
}

size_t td_kvhash_blocks(const int32_t *tokens, size_t n_tokens, size_t block_tokens,
                        const td_kvhash_t *prev, td_kvhash_t *out, size_t max_out)
{
    TD_ASSERT(block_tokens > 0);
    TD_ASSERT(prev);
    size_t n_blocks = n_tokens / block_tokens;
    if (n_blocks == 0 || max_out == 0)
        return n_blocks;
    td_kvhash_t h = *prev;
    XXH3_state_t *st = XXH3_createState();
    TD_ASSERT(st); /* a few hundred bytes; failing here means the process is out of memory */
    uint8_t le[256 * 4];
    for (size_t i = 0; i < n_blocks && i < max_out; i++) {
        XXH3_128bits_reset(st);
        XXH3_128bits_update(st, h.b, sizeof(h.b));
        const int32_t *t = tokens + i * block_tokens;
        for (size_t done = 0; done < block_tokens;) {
            size_t n = TD_MIN(block_tokens - done, sizeof(le) / 4);
            for (size_t k = 0; k < n; k++)
                put_u32le(le + 4 * k, (uint32_t)t[done + k]);
            XXH3_128bits_update(st, le, 4 * n);
            done += n;
        }
        digest(st, &h);
        out[i] = h;
    }
    XXH3_freeState(st);
    return n_blocks;
}

void td_kvhash_hex(const td_kvhash_t *h, char out[33])
{
    td_hex_encode(h->b, 16, out);
}
