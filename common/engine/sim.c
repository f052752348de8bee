/* sim.c: the SIMULATED engine (td_engine.h, td_sim_opts_t): the step takes the latency model's
 * time, the sequences advance as a real step would advance them, and each sampled token is a hash
 * of the request's seed and position (never EOS, so requests run to max_tokens): deterministic,
 * and cheap enough that one machine can host dozens of simulated workers. */
#include "engine_impl.h"
#include "td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int td_engine_create_sim(const td_model_t *m, const td_sim_opts_t *opts, td_engine_t **out)
{
    *out = NULL;
    td_engine_t *e = td_calloc(1, sizeof(*e));
    if (!e)
        return td_err_set(TD_ENOMEM, "out of memory");
    e->m = m;
    e->is_sim = true;
    e->sim = *opts;
    *out = e;
    return 0;
}

/* The token the simulated model "samples" after `pos` tokens of a request seeded `seed`. */
static int32_t sim_token(uint64_t seed, int pos, int vocab, int32_t eos)
{
    uint64_t x = seed ^ ((uint64_t)pos * 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    int32_t tok = (int32_t)(x % (uint64_t)vocab);
    if (tok == eos)
        tok = (tok + 1) % vocab;
    return tok;
}

int td__sim_step(td_engine_t *e, td_kv_pool_t *pool, td_batch_seq_t *seqs, int n)
{
    const td_sim_opts_t *o = &e->sim;
    for (int i = 0; i < n; i++) {
        int rc = td_kv_seq_reserve(pool, seqs[i].kv, seqs[i].kv->n_tokens + seqs[i].n_tokens);
        if (rc)
            return rc;
    }
    double us = o->step_us;
    for (int i = 0; i < n; i++) {
        if (seqs[i].decode)
            us += o->decode_us_per_seq + o->decode_us_per_ctx_token * seqs[i].kv->n_tokens;
        else
            us += o->prefill_us_per_token * seqs[i].n_tokens;
    }
    struct timespec ts = {(time_t)(us / 1e6), (long)(fmod(us, 1e6) * 1e3)};
    nanosleep(&ts, NULL);
    const td_model_cfg_t *c = &e->m->cfg;
    for (int i = 0; i < n; i++) {
        td_batch_seq_t *b = &seqs[i];
        b->kv->n_tokens += b->n_tokens;
        if (!b->smp)
            continue;
        memset(b->out, 0, sizeof(*b->out));
        b->out->token = sim_token(b->smp->p.seed, b->kv->n_tokens, c->vocab_size, c->eos_id);
        b->out->logprob = -1.0f;
        b->out->finish = td_sampler_accept(b->smp, b->out->token);
    }
    return 0;
}
