/* engine_impl.h: what the engine's files share: the engine, the per-step state that forward passes
 * read, and the scratch arena. */
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

struct td_engine {
    const td_model_t *m;
    bool is_sim;       /* the simulated engine (sim.c): no backend, no math */
    td_sim_opts_t sim; /* its latency model */
    td_backend_t *be;
    float *inv_freq;   /* [rope_dim / 2] RoPE frequencies after scaling */
    float rope_mscale; /* multiplies cos and sin (YaRN attention factor) */
    float attn_scale;  /* softmax scale (MLA: with YaRN's mscale squared) */
    /* scratch arena, grown to the largest step seen */
    float *arena;
    size_t arena_cap; /* floats */
    size_t arena_used;
};

/* The simulated engine's step (sim.c), after td_engine_step's checks. */
int td__sim_step(td_engine_t *e, td_kv_pool_t *pool, td_batch_seq_t *seqs, int n);

/* Take n floats from the arena (valid until the next step). Never fails: sized beforehand. */
float *td__scratch(td_engine_t *e, size_t n);

/* Floats of scratch one forward needs for T tokens. */
size_t td__llama_scratch(const td_model_cfg_t *c, int T);
size_t td__deepseek_scratch(const td_model_cfg_t *c, int T);

/* The transformer body: x [T][hidden] embeddings in, final hidden states (before the output
 * norm) out, in place. */
void td__llama_forward(td_engine_t *e, const td__step_t *s, float *x);
void td__deepseek_forward(td_engine_t *e, const td__step_t *s, float *x);

#endif
