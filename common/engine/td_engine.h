/* td_engine.h: the inference engine: one forward step over a batch that mixes prefill chunks and
 * single-token decodes of different sequences, reading and writing the paged KV cache.
 *
 * The engine borrows the model (which must outlive it) and owns a backend and its scratch
 * buffers. One step at a time per engine: td_engine_step is not reentrant.
 */
#ifndef TD_ENGINE_H
#define TD_ENGINE_H

#include "td_backend.h"
#include "td_kv.h"
#include "td_model.h"

typedef struct td_engine td_engine_t;

typedef struct td_engine_opts {
    int n_threads; /* CPU threads, the caller included; 0: 1 */
} td_engine_opts_t;

/* Create an engine for `m` on the CPU backend. 0 or TD_ENOMEM / TD_ENOTSUP. */
int td_engine_create(const td_model_t *m, const td_engine_opts_t *opts, td_engine_t **out);
void td_engine_free(td_engine_t *e);

/* One sequence's share of a step. */
typedef struct td_batch_seq {
    td_kv_seq_t *kv;       /* its cache: positions [0, kv->n_tokens) are stored */
    const int32_t *tokens; /* [n_tokens] new tokens at positions kv->n_tokens, ... */
    int n_tokens;          /* >= 1: a prefill chunk, or 1 for a decode */
    float *logits;         /* out: [vocab] logits after its last new token, or NULL for none */
} td_batch_seq_t;

/* Run one forward step over `n` sequences (each appears at most once): reserve their blocks in
 * `pool`, store the new tokens' KV, and write each requested logits row. On success every
 * kv->n_tokens has advanced by its n_tokens. Errors: TD_EINVAL (bad token id, empty item, the
 * same sequence twice), TD_ENOSPC (pool full: no sequence advanced), TD_ENOMEM. */
int td_engine_step(td_engine_t *e, td_kv_pool_t *pool, td_batch_seq_t *seqs, int n);

/* The model the engine runs. */
const td_model_t *td_engine_model(const td_engine_t *e);

#endif
