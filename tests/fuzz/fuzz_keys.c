/* fuzz_keys.c: the router's API key file parser (router/auth.c). Input: the file's bytes. A
 * parsed set must be usable: every key found by its own hash text fails (keys are looked up by
 * their text, never their hash) and admission works on each entry. */
#include "auth.h"
#include "fuzz.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_keyset_t ks;
    if (td_keyset_parse((const char *)data, size, "fuzz.keys", 60, 0, &ks) != 0)
        return 0;
    for (size_t i = 0; i < ks.n_keys; i++) {
        td_apikey_t *k = &ks.keys[i];
        if (!k->tenant || !*k->tenant)
            __builtin_trap();
        td_bucket_take(&k->req, 1, 1);
        td_bucket_take(&k->tok, 10, 1);
    }
    td_keyset_find(&ks, (const char *)data, size);
    td_keyset_free(&ks);
    return 0;
}

void fuzz_seed(td_buf_t *b)
{
    td_buf_append_str(b, "# keys\n"
                         "sha256:8a2ddc2d9b1e0f9b0d36a2a7c1c1b8c7c0b3f0d0e8c5b8f1f4e6a3a1b2c3d4e5 "
                         "tenant=acme rpm=60 tpm=90000 name=alice\n"
                         "sha256:0000000000000000000000000000000000000000000000000000000000000001\t"
                         "tenant=b.c:d@e\r\n"
                         "tenant acme max_concurrent=8\n");
}
