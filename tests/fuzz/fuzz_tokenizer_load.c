/* fuzz_tokenizer_load.c: libFuzzer target for the tokenizer.json loader. Any input must load or
 * fail with an error message; a tokenizer that loads must encode and decode without crashing. */
#include "fuzz.h"
#include "td_error.h"
#include "td_tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an optional tokenizer_config.json after a NUL byte */
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const char *cfg = nul ? (const char *)nul + 1 : NULL;
    size_t clen = nul ? size - jlen - 1 : 0;
    td_tokenizer_t *tok = NULL;
    int rc = td_tokenizer_load_mem((const char *)data, jlen, cfg, clen, "fuzz.json", &tok);
    if (rc) {
        if (tok || !td_err_msg()[0])
            abort(); /* a failure leaves no tokenizer and always says why */
        return 0;
    }
    static const char *const texts[] = {"", "abc <s> hello world 123", "\xF0\x9F\x98\x80 e\xCC\x81",
                                        "\xFF\xC0 invalid", "   \n\n\t x"};
    td_tokens_t ids;
    td_tokens_init(&ids);
    td_buf_t out;
    td_buf_init(&out);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        ids.len = 0;
        if (td_tokenizer_encode(tok, texts[i], strlen(texts[i]), i & 1, &ids) == 0) {
            for (size_t k = 0; k < ids.len; k++)
                if (ids.ids[k] < 0 || (size_t)ids.ids[k] >= td_tokenizer_vocab_size(tok))
                    abort();
            td_buf_reset(&out);
            (void)td_tokenizer_decode(tok, ids.ids, ids.len, i & 2, &out);
        }
    }
    td_buf_free(&out);
    td_tokens_free(&ids);
    td_tokenizer_free(tok);
    return 0;
}

/* The seed fuzz_driver.c mutates: a small tokenizer.json using every supported component, then a
 * NUL and a tokenizer_config.json. */
static const char seed_json[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"normalizer\": {\"type\":"
    " \"NFC\"}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Sp"
    "lit\", \"pattern\": {\"Regex\": \"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p"
    "{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\"
    "s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"Digits\", \"individual"
    "_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\":"
    " true, \"use_regex\": false}]}, \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_to"
    "ken\": null, \"ignore_merges\": true, \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120"
    "\": 3, \"ab\": 4, \"bc\": 5, \"abc\": 6, \"\\u010a\": 7, \"\\u0120a\": 8, \"1\": 9, \"2\":"
    " 10, \"12\": 11}, \"merges\": [\"b c\", [\"a\", \"b\"], \"a bc\", \"\\u0120 a\", \"1 2\"]}"
    ", \"added_tokens\": [{\"id\": 12, \"content\": \"<s>\", \"single_word\": false, \"lstrip\""
    ": false, \"rstrip\": false, \"normalized\": false, \"special\": true}, {\"id\": 13, \"cont"
    "ent\": \"</s>\", \"single_word\": false, \"lstrip\": true, \"rstrip\": true, \"normalized"
    "\": false, \"special\": true}, {\"id\": 14, \"content\": \"hello\", \"single_word\": true,"
    " \"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": false}], \"post_"
    "processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
    "\"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tok"
    "ens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [12], \"tokens\": [\"<s>\"]}}}, \"decoder\": {"
    "\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\""
    ": true}}";
static const char seed_config[] =
    "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token\": \"<s>\", \"eos_token\": "
    "{\"content\": \"</s>\"}}";

void fuzz_seed(td_buf_t *b)
{
    td_buf_append(b, seed_json, sizeof(seed_json) - 1);
    td_buf_append_char(b, '\0');
    td_buf_append(b, seed_config, sizeof(seed_config) - 1);
}
