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
#include "td_sampler.h"

#include <stdbool.h>

typedef struct td_engine td_engine_t;

typedef struct td_engine_opts {
    int n_threads;         /* CPU threads, the caller included; 0: 1 */
    td_backend_t *backend; /* run on this backend (borrowed: it outlives the engine). A backend
                              caches weights by host address (a device backend its uploads, the
                              CPU backend its grouped F16 copies): lend it to one engine only.
                              NULL: a CPU backend of n_threads the engine owns */
    bool f32_activations;  /* that CPU backend's td_cpu_opts_t.f32_activations: Q8_0, Q4_0,
                              Q4_K and Q6_K weights against fp32 activations instead of 8-bit
                              ones */
    bool stored_rows;      /* that CPU backend's td_cpu_opts_t.stored_rows: F16 matrices
                              multiplied where they are stored, without the grouped copy */
} td_engine_opts_t;

/* Create an engine for `m` on the CPU backend, or opts->backend. Its KV pool must be in that
 * backend's memory (td_backend_kv_pool_init; a td_kv_pool_init pool is host memory, right for the
 * CPU backend). 0 or TD_ENOMEM / TD_ENOTSUP. */
int td_engine_create(const td_model_t *m, const td_engine_opts_t *opts, td_engine_t **out);

/* The SIMULATED engine's latency model (engine kind "sim", sim.c). It does no model math: a step
 * sleeps step_us + prefill_us_per_token x prompt tokens + the sum over decodes of
 * (decode_us_per_seq + decode_us_per_ctx_token x context tokens); KV positions advance as in a
 * real step (the KV bytes are not written), and each sampled token is a hash of the request's
 * seed and position, never EOS, accepted through td_sampler_accept. It lets one machine stand in
 * for dozens of workers while batching, block reservation and KV transfer stay real. */
typedef struct td_sim_opts {
    double step_us;                 /* fixed cost of a step */
    double prefill_us_per_token;    /* per prompt token in the step */
    double decode_us_per_seq;       /* per decoding sequence */
    double decode_us_per_ctx_token; /* per cached token a decoding sequence attends to */
} td_sim_opts_t;

/* Create a simulated engine for `m` (only its configuration is read). 0 or TD_ENOMEM. */
int td_engine_create_sim(const td_model_t *m, const td_sim_opts_t *opts, td_engine_t **out);
/* Whether `e` is the simulated engine. */
bool td_engine_is_sim(const td_engine_t *e);
void td_engine_free(td_engine_t *e);

/* One sequence's share of a step. */
typedef struct td_batch_seq {
    td_kv_seq_t *kv;       /* its cache: positions [0, kv->n_tokens) are stored */
    const int32_t *tokens; /* [n_tokens] new tokens at positions kv->n_tokens, ... */
    int n_tokens;          /* >= 1: a prefill chunk, or 1 for a decode */
    float *logits;         /* out: [vocab] logits after its last new token, or NULL for none */
    td_sampler_t *smp;     /* with logits: sample the next token from them into *out */
    td_sample_t *out;
    bool decode;           /* a running sequence's next token (the simulated engine's cost) */
} td_batch_seq_t;

/* Run one forward step over `n` sequences (each appears at most once): reserve their blocks in
 * `pool`, store the new tokens' KV, write each requested logits row and sample where asked. On success every
 * kv->n_tokens has advanced by its n_tokens. Errors: TD_EINVAL (bad token id, empty item, the
 * same sequence twice), TD_ENOSPC (pool full: no sequence advanced), TD_ENOMEM. */
int td_engine_step(td_engine_t *e, td_kv_pool_t *pool, td_batch_seq_t *seqs, int n);

/* The model the engine runs. */
const td_model_t *td_engine_model(const td_engine_t *e);

#endif
