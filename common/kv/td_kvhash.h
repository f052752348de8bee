/* td_kvhash.h: prompt block hashes, hash version 1: the keys of the prefix cache, of the disk
 * tier (td_kvdisk.h) and of the cluster's KV index. docs/kv-cache.md is the specification; in
 * short:
 *
 *   h_root = XXH3-128( "tandem-kv" || u32le(1) || layout fingerprint (16 bytes)
 *                      || u32le(salt length) || tenant salt )
 *   h_i    = XXH3-128( h_{i-1} || tokens of block i, each as u32le )      with h_{-1} = h_root
 *
 * Every hash is kept in XXH3's canonical (big-endian) byte order, so `xxhsum -H2` over the same
 * bytes prints the same hex. Only full blocks are hashed. Nothing is seeded per process: the
 * hashes are equal across processes, machines and restarts (tests/data/kvhash-v1.txt holds test
 * vectors). The root binds the model and cache layout (the fingerprint) and the tenant (the salt),
 * and each h_i covers everything before it, so equal h_i means an equal prefix of i + 1 blocks
 * under the same model, layout and tenant.
 */
#ifndef TD_KVHASH_H
#define TD_KVHASH_H

#include <stddef.h>
#include <stdint.h>

/* The hash version this code computes; stored in disk-tier files and bumped on any change to
 * the encodings above. */
#define TD_KVHASH_VERSION 1

typedef struct td_kvhash {
    uint8_t b[16]; /* canonical XXH128 bytes */
} td_kvhash_t;

/* The root of a prompt's chain for a layout `fingerprint` (td_kv_layout_t.fingerprint) and a
 * tenant salt of `salt_len` bytes (NULL/0: no tenant). Writes *out. 0, or TD_EINVAL (salt NULL
 * with a length, or longer than 4 GiB - 1, td_err_msg says which) and *out is left alone. */
int td_kvhash_root(const uint8_t fingerprint[16], const void *salt, size_t salt_len,
                   td_kvhash_t *out);

/* Hash the full blocks of tokens[0..n_tokens), `block_tokens` (> 0) tokens each, continuing the
 * chain from `prev`: the root (td_kvhash_root) at the start of a prompt, or the hash of the block
 * just before tokens[0]. `prev` is required. Writes at most `max_out` hashes to `out` and returns
 * how many full blocks there were (which may exceed max_out). A trailing partial block is not
 * hashed. Cannot fail. */
size_t td_kvhash_blocks(const int32_t *tokens, size_t n_tokens, size_t block_tokens,
                        const td_kvhash_t *prev, td_kvhash_t *out, size_t max_out);

/* Lower-case hex of a hash into out[33] (NUL-terminated). */
void td_kvhash_hex(const td_kvhash_t *h, char out[33]);

#endif
