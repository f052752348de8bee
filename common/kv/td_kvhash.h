/* td_kvhash.h: prompt block hashes, the keys of the prefix cache and of the cluster's KV index.
 *
 *   h_i = XXH3-128( h_{i-1} || layout fingerprint || tenant salt || tokens of block i )
 *
 * with h_{-1} = 16 zero bytes, tokens as 32-bit little-endian integers, and each hash kept in
 * XXH3's canonical (big-endian) byte order, so `xxhsum -H2` over the same bytes prints the same
 * hex. Only full blocks are hashed. The hashes are stable across processes, machines and restarts
 * (no per-process seed); the fingerprint keeps different models or layouts apart, the salt keeps
 * tenants apart. Because each hash covers everything before it, equal h_i means an equal prefix.
 */
#ifndef TD_KVHASH_H
#define TD_KVHASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct td_kvhash {
    uint8_t b[16]; /* canonical XXH128 bytes */
} td_kvhash_t;

/* Hash the full blocks of tokens[0..n_tokens), `block_tokens` tokens each, continuing the chain
 * from `prev` (NULL: start of a prompt). Writes at most `max_out` hashes and returns how many
 * full blocks there were (which may exceed max_out; only max_out are written). */
size_t td_kvhash_blocks(const int32_t *tokens, size_t n_tokens, size_t block_tokens,
                        const uint8_t fingerprint[16], const void *salt, size_t salt_len,
                        const td_kvhash_t *prev, td_kvhash_t *out, size_t max_out);

/* Lower-case hex of a hash into out[33]. */
void td_kvhash_hex(const td_kvhash_t *h, char out[33]);

#endif
