/* engine.c: engine lifecycle, RoPE frequency tables, and the step: batch flattening, block
 * reservation, embedding, the architecture's forward (from the table in engine_arch.c), the output
 * norm and the LM head. */
#include "engine_impl.h"
#include "td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double td__yarn_mscale(double factor, double mscale)
{
    return factor <= 1 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

float td__yarn_mscale_ratio(const td_model_cfg_t *c)
{
    double f = c->rope_factor;
    return (float)(td__yarn_mscale(f, c->yarn_mscale) / td__yarn_mscale(f, c->yarn_mscale_all_dim));
}

/* The rotary dimension whose frequency turns `rotations` times over max_pos positions: the bounds
 * of YaRN's ramp between interpolated and original frequencies. */
static double yarn_correction_dim(double rotations, int dim, double base, int max_pos)
{
    return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

/* inv_freq[i] = theta^(-2i/d), then the configured scaling (as in the models' reference code). */
static void rope_tables(td_engine_t *e)
{
    const td_model_cfg_t *c = &e->m->cfg;
    int d = c->rope_dim, half = d / 2;
    double f = c->rope_factor;
    for (int i = 0; i < half; i++) {
        double freq = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / d));
        switch (c->rope_scaling) {
        case TD_ROPE_NONE:
            break;
        case TD_ROPE_LINEAR:
            freq /= f;
            break;
        case TD_ROPE_LLAMA3: {
            double lo_wl = c->rope_orig_ctx / c->rope_low_freq_factor;
            double hi_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
            double wl = 2 * M_PI / freq;
            if (wl > lo_wl) {
                freq /= f;
            } else if (wl >= hi_wl) {
                double smooth = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                freq = (1 - smooth) * freq / f + smooth * freq;
            }
            break;
        }
        case TD_ROPE_YARN: {
            double lo =
                floor(yarn_correction_dim(c->yarn_beta_fast, d, c->rope_theta, c->rope_orig_ctx));
            double hi =
                ceil(yarn_correction_dim(c->yarn_beta_slow, d, c->rope_theta, c->rope_orig_ctx));
            lo = fmax(lo, 0);
            hi = fmin(hi, d - 1);
            if (lo == hi)
                hi += 0.001;
            double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
            double smooth = 1 - ramp; /* 1: keep the original frequency (extrapolate) */
            freq = freq / f * (1 - smooth) + freq * smooth;
            break;
        }
        }
        if (e->m->rope_freqs) /* GGUF's per-frequency divisors (llama3 scaling baked in) */
            freq /= e->m->rope_freqs[i];
        e->inv_freq[i] = (float)freq;
    }
}

/* The backend's prepare hook for every matrix the forward passes multiply whole (td_backend.h).
 * MLA's wkv_b, wk_b_t and wv_b are multiplied a head's rows at a time, and keep to the first
 * use. */
static void prepare_weights(td_engine_t *e)
{
    td_backend_t *B = e->be;
    const td_model_t *m = e->m;
    if (!B->prepare)
        return;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const td_layer_w_t *L = &m->layers[l];
        const td_mat_t *ms[] = {&L->wq,       &L->wk,      &L->wv,     &L->wo,     &L->wq_a,
                                &L->wq_b,     &L->wkv_a,   &L->w_gate, &L->w_up,   &L->w_down,
                                &L->w_router, &L->sh_gate, &L->sh_up,  &L->sh_down};
        for (size_t i = 0; i < TD_ARRAY_LEN(ms); i++)
            if (ms[i]->data)
                B->prepare(B, ms[i]);
        for (int x = 0; L->is_moe && x < m->cfg.n_routed_experts; x++) {
            const td_mat_t *ex[] = {&L->exp_gate[x], &L->exp_up[x], &L->exp_down[x]};
            for (size_t i = 0; i < TD_ARRAY_LEN(ex); i++)
                if (ex[i]->data)
                    B->prepare(B, ex[i]);
        }
    }
    if (m->lm_head.data)
        B->prepare(B, &m->lm_head);
}

int td_engine_create(const td_model_t *m, const td_engine_opts_t *opts, td_engine_t **out)
{
    *out = NULL;
    const td_model_cfg_t *c = &m->cfg;
    const td__arch_t *arch = td__arch_find(c->arch);
    if (!arch)
        return td_err_set(TD_ENOTSUP, "%s: no forward for architecture %s", m->path,
                          td_arch_name(c->arch));
    td_backend_t *lent = opts ? opts->backend : NULL;
    int max_head = lent ? lent->max_head : TD_CPU_MAX_HEAD;
    if (arch->head_width(c) > max_head)
        return td_err_set(TD_ENOTSUP, "%s: head width beyond the %s backend's %d", m->path,
                          lent ? lent->name : "cpu", max_head);
    td_engine_t *e = td_calloc(1, sizeof(*e));
    if (!e)
        return td_err_set(TD_ENOMEM, "out of memory");
    e->m = m;
    e->arch = arch;
    e->inv_freq = td_calloc((size_t)c->rope_dim / 2 + 1, sizeof(float));
    e->own_be = lent == NULL;
    td_cpu_opts_t co = {.n_threads = opts && opts->n_threads > 0 ? opts->n_threads : 1,
                        .f32_activations = opts && opts->f32_activations,
                        .stored_rows = opts && opts->stored_rows};
    e->be = lent ? lent : td_cpu_backend_create_opts(&co);
    if (!e->inv_freq || !e->be) {
        td_engine_free(e);
        return td_err_set(TD_ENOMEM, "out of memory creating the engine");
    }
    rope_tables(e);
    prepare_weights(e);
    e->rope_mscale = arch->rope_mscale(c);
    e->attn_scale = arch->attn_scale(c);
    *out = e;
    return 0;
}

void td_engine_free(td_engine_t *e)
{
    if (!e)
        return;
    if (e->be) {
        e->be->free(e->be, e->arena, TD_MEM_SHARED);
        if (e->own_be)
            e->be->destroy(e->be);
    }
    free(e->inv_freq);
    free(e->emb);
    td_sampler_scratch_free(&e->smp_scratch);
    free(e);
}

bool td_engine_is_sim(const td_engine_t *e)
{
    return e->is_sim;
}

const td_model_t *td_engine_model(const td_engine_t *e)
{
    return e->m;
}

float *td__scratch(td_engine_t *e, size_t n)
{
    n = TD_ALIGN_UP(n, (size_t)16); /* keep every buffer 64-byte aligned */
    TD_ASSERT(e->arena_used + n <= e->arena_cap);
    float *p = e->arena + e->arena_used;
    e->arena_used += n;
    return p;
}

static int arena_reserve(td_engine_t *e, size_t n)
{
    if (n <= e->arena_cap)
        return 0;
    e->be->free(e->be, e->arena, TD_MEM_SHARED); /* host and device code both touch the arena */
    e->arena = e->be->alloc(e->be, n * sizeof(float), TD_MEM_SHARED);
    e->arena_cap = e->arena ? n : 0;
    return e->arena ? 0 : td_err_set(TD_ENOMEM, "out of memory: %zu floats of scratch", n);
}

/* x[t] = the embedding of tokens[t]. On a backend with host memory straight into x; otherwise
 * through a host buffer and the backend's copy, so the host never touches the arena. */
static int embed(td_engine_t *e, const int32_t *tokens, int T, float *x)
{
    size_t H = (size_t)e->m->cfg.hidden;
    if (e->be->kv_mem == TD_MEM_HOST) {
        for (int t = 0; t < T; t++)
            td_mat_row_f32(&e->m->tok_embd, tokens[t], x + t * H);
        return 0;
    }
    if ((size_t)T * H > e->emb_cap) {
        free(e->emb);
        e->emb_cap = 0;
        if (!(e->emb = malloc((size_t)T * H * sizeof(float))))
            return td_err_set(TD_ENOMEM, "out of memory: %d embeddings", T);
        e->emb_cap = (size_t)T * H;
    }
    for (int t = 0; t < T; t++)
        td_mat_row_f32(&e->m->tok_embd, tokens[t], e->emb + t * H);
    e->be->copy(e->be, x, e->emb, (size_t)T * H * sizeof(float));
    return 0;
}

int td_engine_step(td_engine_t *e, td_kv_pool_t *pool, td_batch_seq_t *seqs, int n)
{
    const td_model_cfg_t *c = &e->m->cfg;
    if (n < 1)
        return td_err_set(TD_EINVAL, "engine step with no sequences");
    if (memcmp(pool->layout.model_digest, e->m->digest, 16) != 0)
        return td_err_set(TD_EMISMATCH, "kv pool was laid out for another model");
    int T = 0, n_out = 0;
    for (int i = 0; i < n; i++) {
        if (!seqs[i].kv || seqs[i].n_tokens < 1 || !seqs[i].tokens)
            return td_err_set(TD_EINVAL, "batch item %d has no tokens", i);
        for (int j = 0; j < i; j++)
            if (seqs[j].kv == seqs[i].kv)
                return td_err_set(TD_EINVAL, "batch items %d and %d are the same sequence", j, i);
        for (int k = 0; k < seqs[i].n_tokens; k++)
            if (seqs[i].tokens[k] < 0 || seqs[i].tokens[k] >= c->vocab_size)
                return td_err_set(TD_EINVAL, "batch item %d: token id %d outside [0, %d)", i,
                                  seqs[i].tokens[k], c->vocab_size);
        if (seqs[i].n_tokens > INT32_MAX / 2 - T)
            return td_err_set(TD_EINVAL, "step too large");
        if (seqs[i].smp && (!seqs[i].out || (!seqs[i].logits && !e->is_sim)))
            return td_err_set(TD_EINVAL, "batch item %d: sampling needs logits and out", i);
        T += seqs[i].n_tokens;
        n_out += seqs[i].logits != NULL;
    }
    if (e->is_sim)
        return td__sim_step(e, pool, seqs, n);
    for (int i = 0; i < n; i++) {
        int rc = td_kv_seq_reserve(pool, seqs[i].kv, seqs[i].kv->n_tokens + seqs[i].n_tokens);
        if (rc)
            return rc;
    }
    int32_t *tokens = td_calloc((size_t)T, sizeof(int32_t));
    int32_t *pos = td_calloc((size_t)T, sizeof(int32_t));
    td_attn_tok_t *toks = td_calloc((size_t)T, sizeof(td_attn_tok_t));
    int rc = 0;
    size_t H = (size_t)c->hidden, V = (size_t)c->vocab_size;
    size_t need = T * H + (size_t)n_out * (H + V) + 64 + e->arch->scratch(c, T);
    if (!tokens || !pos || !toks) {
        rc = td_err_set(TD_ENOMEM, "out of memory for a step of %d tokens", T);
        goto out;
    }
    if ((rc = arena_reserve(e, need)))
        goto out;
    if (n_out && (rc = td_sampler_scratch_reserve(&e->smp_scratch, c->vocab_size)))
        goto out;
    e->arena_used = 0;
    for (int i = 0, t = 0; i < n; i++)
        for (int k = 0; k < seqs[i].n_tokens; k++, t++) {
            tokens[t] = seqs[i].tokens[k];
            pos[t] = seqs[i].kv->n_tokens + k;
            toks[t].blocks = seqs[i].kv->blocks;
            toks[t].pos = pos[t];
            toks[t].start =
                c->sliding_window > 0 ? TD_MAX(0, pos[t] - c->sliding_window + 1) : 0;
        }
    td__step_t s = {T, tokens, pos, toks, pool};

    float *x = td__scratch(e, T * H); /* [T][hidden] residual stream */
    if ((rc = embed(e, tokens, T, x)))
        goto out;

    e->arch->forward(e, &s, x);

    /* the rows and logits move with the backend's copy (memcpy on the CPU), so on a device the
     * arena's pages stay where the operations use them */
    td_backend_t *B = e->be;
    if (n_out) {
        float *h = td__scratch(e, (size_t)n_out * H);      /* [n_out][hidden] last tokens */
        float *logits = td__scratch(e, (size_t)n_out * V); /* [n_out][vocab] */
        for (int i = 0, t = 0, o = 0; i < n; i++) {
            t += seqs[i].n_tokens;
            if (seqs[i].logits)
                B->copy(B, h + (o++) * H, x + (size_t)(t - 1) * H, H * sizeof(float));
        }
        B->rmsnorm(B, h, (int)H, h, (int)H, n_out, (int)H, e->m->out_norm, c->rms_eps);
        B->matmul(B, logits, (int)V, h, (int)H, n_out, &e->m->lm_head);
        for (int i = 0, o = 0; i < n; i++)
            if (seqs[i].logits)
                B->copy(B, seqs[i].logits, logits + (o++) * V, V * sizeof(float));
    }
    td__sync(e); /* the step's operations, KV stores and logits copies are done */
    for (int i = 0; i < n; i++)
        if (seqs[i].smp)
            td_sampler_sample_in(seqs[i].smp, seqs[i].logits, seqs[i].out, &e->smp_scratch);
    for (int i = 0; i < n; i++)
        seqs[i].kv->n_tokens += seqs[i].n_tokens;
out:
    free(tokens);
    free(pos);
    free(toks);
    return rc;
}
