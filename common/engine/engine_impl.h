/* engine_impl.h: what the engine's files share: the engine, the per-step state that forward passes
 * read, the scratch arena, and the architecture table (engine_arch.c) whose rows are defined by
 * one file per family (engine_llama.c, engine_deepseek.c). */
#ifndef TD_ENGINE_IMPL_H
#define TD_ENGINE_IMPL_H

#include "td_engine.h"

/* The tokens of one step, flattened across sequences. */
typedef struct td__step {
    int T;                 /* tokens in the step */
    const int32_t *tokens; /* [T] */
    int32_t *pos;          /* [T] position of each token in its sequence */
    td_attn_tok_t *toks;   /* [T] cache location of each token */
    td_kv_pool_t *pool;
} td__step_t;

typedef struct td__arch td__arch_t;

struct td_engine {
    const td_model_t *m;
    const td__arch_t *arch; /* the row of m's architecture, looked up at td_engine_create */
    bool is_sim;       /* the simulated engine (sim.c): no backend, no math */
    td_sim_opts_t sim; /* its latency model */
    td_backend_t *be;
    bool own_be;       /* be was created here, not lent by the caller */
    float *inv_freq;   /* [rope_dim / 2] RoPE frequencies after scaling */
    float rope_mscale; /* multiplies cos and sin (YaRN attention factor) */
    float attn_scale;  /* softmax scale (MLA: with YaRN's mscale squared) */
    /* scratch arena, grown to the largest step seen */
    float *arena;
    size_t arena_cap; /* floats */
    size_t arena_used;
    float *emb; /* host staging of a step's embeddings for a device backend, grown as needed */
    size_t emb_cap;
    td_sampler_scratch_t smp_scratch; /* lent to every sampler of a step (one at a time) */
};

/* The simulated engine's step (sim.c), after td_engine_step's checks. */
int td__sim_step(td_engine_t *e, td_kv_pool_t *pool, td_batch_seq_t *seqs, int n);

/* Wait for the backend's queued operations: the engine calls it before its own code touches
 * arena memory an operation wrote (nothing on the CPU backend). */
static inline void td__sync(td_engine_t *e)
{
    e->be->sync(e->be);
}

/* Take n floats from the arena (valid until the next step). Never fails: sized beforehand. */
float *td__scratch(td_engine_t *e, size_t n);

/* What the engine does differently for one family of architectures: a row of the table. */
struct td__arch {
    const char *name; /* the family, for messages */
    /* Floats of scratch one forward needs for T tokens (td__scratch's total, with alignment). */
    size_t (*scratch)(const td_model_cfg_t *c, int T);
    /* The transformer body: x [T][hidden] embeddings in, final hidden states (before the output
     * norm) out, in place. Stores the step's tokens in the KV cache. */
    void (*forward)(td_engine_t *e, const td__step_t *s, float *x);
    /* Softmax scale of attention (1/sqrt of the q.k width, with any YaRN correction). */
    float (*attn_scale)(const td_model_cfg_t *c);
    /* Multiplier of RoPE's cos and sin: YaRN's attention factor, 1 without YaRN. */
    float (*rope_mscale)(const td_model_cfg_t *c);
    /* Widest per-head row attention accumulates (head_dim, or MLA's latent rank), which the
     * backend bounds by its max_head. */
    int (*head_width)(const td_model_cfg_t *c);
};

/* The row for architecture `a`, or NULL when the engine cannot run it. */
const td__arch_t *td__arch_find(td_arch_t a);

extern const td__arch_t td__arch_llama;
extern const td__arch_t td__arch_deepseek;

/* YaRN's attention temperature for a context extended `factor` times: 0.1 * mscale * ln(factor)
 * + 1 for factor > 1, else 1. */
double td__yarn_mscale(double factor, double mscale);
/* YaRN's RoPE multiplier as DeepSeek writes it: mscale(factor, yarn_mscale) over
 * mscale(factor, yarn_mscale_all_dim). */
float td__yarn_mscale_ratio(const td_model_cfg_t *c);

#endif
