/* fuzz_gguf.c: the GGUF v3 parser (metadata and tensor infos) on arbitrary bytes. Returns 0 when
 * the input parses, 1 otherwise; never crashes. */
#include "fuzz.h"
#include "model_impl.h"
#include "td_error.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td__index_t ix = {0};
    td_mmap_t m = {data, size};
    int rc = td__gguf_parse(&ix, &m, "fuzz.gguf");
    if (rc == 0)
        rc = td__index_finish(&ix);
    for (size_t i = 0; rc == 0 && i < ix.n; i++)
        TD_ASSERT(ix.t[i].data >= data && ix.t[i].data + ix.t[i].nbytes <= data + size);
    td__index_free(&ix);
    return rc == 0 ? 0 : 1;
}

static void u32(td_buf_t *b, uint32_t v)
{
    td_buf_append(b, &v, 4);
}

static void u64(td_buf_t *b, uint64_t v)
{
    td_buf_append(b, &v, 8);
}

static void str(td_buf_t *b, const char *s)
{
    u64(b, strlen(s));
    td_buf_append(b, s, strlen(s));
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append(b, "GGUF", 4);
    u32(b, 3);
    u64(b, 2); /* tensors */
    u64(b, 4); /* metadata */
    str(b, "general.architecture");
    u32(b, 8);
    str(b, "llama");
    str(b, "general.alignment");
    u32(b, 4);
    u32(b, 32);
    str(b, "llama.rope.freq_base");
    u32(b, 6);
    float f = 10000.0f;
    td_buf_append(b, &f, 4);
    str(b, "tokenizer.ggml.tokens");
    u32(b, 9);
    u32(b, 8);
    u64(b, 2);
    str(b, "a");
    str(b, "bc");
    str(b, "w"); /* F32 [2][32] */
    u32(b, 2);
    u64(b, 32);
    u64(b, 2);
    u32(b, 0);
    u64(b, 0);
    str(b, "q"); /* Q8_0 [1][32] */
    u32(b, 2);
    u64(b, 32);
    u64(b, 1);
    u32(b, 8);
    u64(b, 256);
    while (b->len % 32)
        td_buf_append_char(b, 0);
    for (int i = 0; i < 256 + 34; i++)
        td_buf_append_char(b, (char)(i * 7));
}
