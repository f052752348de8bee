/* model_digest.c: the model's digest. It enters the KV layout's fingerprint, which workers compare
 * before they exchange blocks, and td_engine_step checks that a pool was laid out for its model. */
#include "model_impl.h"
#include "td_error.h"

#include <string.h>
#include <xxhash.h>

/* Digest: the hyperparameters, every tensor's name, dtype and shape, and up to three 4 KiB samples
 * of its bytes (start, middle, end). Cheap for large checkpoints, yet it tells fine-tunes of one
 * architecture apart. */
int td__digest(td__loader_t *L)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return td_err_set(TD_ENOMEM, "out of memory");
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, &L->m->cfg, sizeof(L->m->cfg));
    for (size_t i = 0; i < L->ix.n; i++) {
        const td__tensor_t *t = &L->ix.t[i];
        XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(st, t->dtype_str, sizeof(t->dtype_str));
        XXH3_128bits_update(st, t->shape, sizeof(t->shape));
        size_t s = TD_MIN(t->nbytes, (size_t)4096);
        XXH3_128bits_update(st, t->data, s);
        XXH3_128bits_update(st, t->data + t->nbytes / 2 - TD_MIN(t->nbytes / 2, s / 2), s);
        XXH3_128bits_update(st, t->data + t->nbytes - s, s);
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, h);
    memcpy(L->m->digest, canon.digest, 16);
    XXH3_freeState(st);
    return 0;
}
