/* fuzz_safetensors.c: the safetensors header parser on arbitrary bytes. Returns 0 when the input
 * parses (so the driver can check its seed), 1 otherwise; never crashes. */
#include "fuzz.h"
#include "model_impl.h"
#include "td_error.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td__index_t ix = {0};
    td_mmap_t m = {data, size};
    int rc = td__safetensors_parse(&ix, &m, "fuzz.safetensors");
    if (rc == 0)
        rc = td__index_finish(&ix);
    for (size_t i = 0; rc == 0 && i < ix.n; i++) /* every accepted tensor lies inside the input */
        TD_ASSERT(ix.t[i].data >= data && ix.t[i].data + ix.t[i].nbytes <= data + size);
    td__index_free(&ix);
    return rc == 0 ? 0 : 1;
}

void fuzz_seed(td_buf_t *b)
{
    const char *hdr =
        "{\"__metadata__\": {\"format\": \"pt\"}, "
        "\"a.weight\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}, "
        "\"b.weight\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [24, 32]}, "
        "\"c\": {\"dtype\": \"F8_E4M3\", \"shape\": [2, 2], \"data_offsets\": [32, 36]}, "
        "\"d\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [36, 44]}}";
    uint64_t n = strlen(hdr);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    td_buf_append(b, len, 8);
    td_buf_append(b, hdr, n);
    for (int i = 0; i < 44; i++)
        td_buf_append_char(b, (char)i);
}
