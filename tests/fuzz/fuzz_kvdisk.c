/* fuzz_kvdisk.c: the disk tier's block file parser (td_kvdisk_parse, td_kvdisk_header_check)
 * over arbitrary bytes: a whole file for a 64-byte block of a fixed fingerprint, checked for any
 * hash and for the seed's hash. Whatever it accepts must be a file the seed's writer could have
 * produced: the header re-encoded from the payload gives the same bytes. */
#include "fuzz.h"
#include "td_kvdisk.h"

#include <string.h>

enum { BLOCK = 64 };
static const uint8_t FP[16] = {0x5e, 0xed, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
static const td_kvhash_t HASH = {{0xab, 0xcd, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *payload;
    td_kvhash_t h;
    uint64_t sum;
    if (td_kvdisk_header_check(data, size, FP, NULL, BLOCK, &h, &sum) == 0 &&
        td_kvdisk_parse(data, size, FP, &h, BLOCK, &payload) == 0) {
        uint8_t hdr[TD_KVDISK_HEADER_BYTES];
        td_kvdisk_header_encode(hdr, FP, &h, payload, BLOCK);
        if (memcmp(hdr, data, sizeof(hdr)) != 0)
            __builtin_trap(); /* accepted a header the writer would not produce */
    }
    (void)td_kvdisk_parse(data, size, FP, &HASH, BLOCK, &payload);
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    uint8_t file[TD_KVDISK_HEADER_BYTES + BLOCK];
    for (int i = 0; i < BLOCK; i++)
        file[TD_KVDISK_HEADER_BYTES + i] = (uint8_t)(i * 13);
    td_kvdisk_header_encode(file, FP, &HASH, file + TD_KVDISK_HEADER_BYTES, BLOCK);
    td_buf_append(b, file, sizeof(file));
}
