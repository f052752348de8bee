/* kvdisk_file.c: the disk tier's block file format (td_kvdisk.h, docs/kv-cache.md): a 72-byte
 * little-endian header, then the block's bytes.
 *
 *   0  magic "TDKVBLK\n"      8
 *   8  format version u32     4   TD_KVDISK_FORMAT_VERSION
 *  12  hash version u32       4   TD_KVHASH_VERSION
 *  16  layout fingerprint     16
 *  32  block hash             16
 *  48  payload length u64     8
 *  56  payload XXH3-64 u64    8
 *  64  header XXH3-64 u64     8   of bytes [0, 64)
 */
#include "td_error.h"
#include "td_kvdisk.h"

#include <string.h>
#include <xxhash.h>

enum {
    OFF_FORMAT = 8,
    OFF_HASHV = 12,
    OFF_FP = 16,
    OFF_HASH = 32,
    OFF_LEN = 48,
    OFF_SUM = 56,
    OFF_HSUM = 64
};

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void td_kvdisk_header_encode(uint8_t out[TD_KVDISK_HEADER_BYTES], const uint8_t fingerprint[16],
                             const td_kvhash_t *hash, const void *payload, size_t len)
{
    memcpy(out, TD_KVDISK_MAGIC, 8);
    put_le(out + OFF_FORMAT, TD_KVDISK_FORMAT_VERSION, 4);
    put_le(out + OFF_HASHV, TD_KVHASH_VERSION, 4);
    memcpy(out + OFF_FP, fingerprint, 16);
    memcpy(out + OFF_HASH, hash->b, 16);
    put_le(out + OFF_LEN, len, 8);
    put_le(out + OFF_SUM, XXH3_64bits(payload, len), 8);
    put_le(out + OFF_HSUM, XXH3_64bits(out, OFF_HSUM), 8);
}

int td_kvdisk_header_check(const uint8_t *buf, size_t len, const uint8_t fingerprint[16],
                           const td_kvhash_t *hash, size_t block_bytes, td_kvhash_t *hash_out,
                           uint64_t *payload_sum)
{
    if (len < TD_KVDISK_HEADER_BYTES)
        return td_err_set(TD_EPARSE, "truncated header (%zu of %d bytes)", len,
                          TD_KVDISK_HEADER_BYTES);
    if (memcmp(buf, TD_KVDISK_MAGIC, 8) != 0)
        return td_err_set(TD_EPARSE, "not a block file (bad magic)");
    if (get_le(buf + OFF_HSUM, 8) != XXH3_64bits(buf, OFF_HSUM))
        return td_err_set(TD_ECHECKSUM, "header checksum mismatch");
    uint64_t fv = get_le(buf + OFF_FORMAT, 4), hv = get_le(buf + OFF_HASHV, 4);
    if (fv != TD_KVDISK_FORMAT_VERSION || hv != TD_KVHASH_VERSION)
        return td_err_set(TD_EMISMATCH, "format version %llu, hash version %llu (want %d, %d)",
                          (unsigned long long)fv, (unsigned long long)hv, TD_KVDISK_FORMAT_VERSION,
                          TD_KVHASH_VERSION);
    if (memcmp(buf + OFF_FP, fingerprint, 16) != 0)
        return td_err_set(TD_EMISMATCH, "another layout fingerprint (a foreign block)");
    if (hash && memcmp(buf + OFF_HASH, hash->b, 16) != 0)
        return td_err_set(TD_EMISMATCH, "the header names another block hash");
    uint64_t plen = get_le(buf + OFF_LEN, 8);
    if (plen != block_bytes)
        return td_err_set(TD_EMISMATCH, "payload length %llu (block_bytes %zu)",
                          (unsigned long long)plen, block_bytes);
    if (hash_out)
        memcpy(hash_out->b, buf + OFF_HASH, 16);
    if (payload_sum)
        *payload_sum = get_le(buf + OFF_SUM, 8);
    return 0;
}

int td_kvdisk_parse(const uint8_t *buf, size_t len, const uint8_t fingerprint[16],
                    const td_kvhash_t *hash, size_t block_bytes, const uint8_t **payload)
{
    uint64_t sum;
    int rc = td_kvdisk_header_check(buf, len, fingerprint, hash, block_bytes, NULL, &sum);
    if (rc)
        return rc;
    size_t have = len - TD_KVDISK_HEADER_BYTES;
    if (have != block_bytes)
        return td_err_set(TD_EPARSE, "%s payload (%zu of %zu bytes)",
                          have < block_bytes ? "truncated" : "oversized", have, block_bytes);
    if (XXH3_64bits(buf + TD_KVDISK_HEADER_BYTES, block_bytes) != sum)
        return td_err_set(TD_ECHECKSUM, "payload checksum mismatch");
    *payload = buf + TD_KVDISK_HEADER_BYTES;
    return 0;
}
