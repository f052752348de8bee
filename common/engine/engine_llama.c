/* engine_llama.c: the Llama family forward: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k
 * RMSNorm per head). Pre-norm blocks: x += Wo attn(rope(Wq h), rope(Wk h), Wv h) with
 * h = rmsnorm(x); then x += Wdown (silu(Wgate h) * Wup h) with h = rmsnorm(x). */
#include "engine_impl.h"

#include <math.h>

/* Floats of scratch for T tokens: the seven buffers of forward(), each padded by td__scratch. */
static size_t scratch(const td_model_cfg_t *c, int T)
{
    size_t H = (size_t)c->hidden, q = (size_t)c->n_heads * c->head_dim;
    size_t kv = 2 * (size_t)c->n_kv_heads * c->head_dim;
    return (size_t)T * (H + q + kv + q + H + 2 * (size_t)c->inter) + 8 * 16;
}

/* y[t][i] += b[i] for T rows of n values (row stride ld); nothing when b is NULL. */
static void add_bias(float *y, int ld, int T, const float *b, int n)
{
    if (!b)
        return;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++)
            y[(size_t)t * ld + i] += b[i];
}

/* The transformer body over the step's tokens, x [T][hidden] in place (engine_impl.h). */
static void forward(td_engine_t *e, const td__step_t *s, float *x)
{
    const td_model_cfg_t *c = &e->m->cfg;
    td_backend_t *B = e->be;
    const int T = s->T, H = c->hidden, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int qd = nh * hd, kd = nkv * hd, I = c->inter;

    float *h = td__scratch(e, (size_t)T * H);       /* [T][hidden] normed input */
    float *q = td__scratch(e, (size_t)T * qd);      /* [T][n_heads][head_dim] */
    float *kv = td__scratch(e, (size_t)T * 2 * kd); /* [T][K: n_kv][head_dim | V: same] */
    float *att = td__scratch(e, (size_t)T * qd);    /* [T][n_heads][head_dim] */
    float *y = td__scratch(e, (size_t)T * H);       /* [T][hidden] block output */
    float *gate = td__scratch(e, (size_t)T * I);    /* [T][inter] */
    float *up = td__scratch(e, (size_t)T * I);      /* [T][inter] */

    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_w_t *w = &e->m->layers[l];

        /* attention */
        B->rmsnorm(B, h, H, x, H, T, H, w->attn_norm, c->rms_eps);
        B->matmul(B, q, qd, h, H, T, &w->wq);
        B->matmul(B, kv, 2 * kd, h, H, T, &w->wk);
        B->matmul(B, kv + kd, 2 * kd, h, H, T, &w->wv);
        if (w->bq || w->bk || w->bv)
            td__sync(e); /* add_bias runs here, on the matmuls' outputs */
        add_bias(q, qd, T, w->bq, qd);
        add_bias(kv, 2 * kd, T, w->bk, kd);
        add_bias(kv + kd, 2 * kd, T, w->bv, kd);
        if (w->q_norm) { /* qwen3: RMSNorm over each head before RoPE */
            B->rmsnorm(B, q, hd, q, hd, T * nh, hd, w->q_norm, c->rms_eps);
            for (int t = 0; t < T; t++)
                B->rmsnorm(B, kv + (size_t)t * 2 * kd, hd, kv + (size_t)t * 2 * kd, hd, nkv, hd,
                           w->k_norm, c->rms_eps);
        }
        B->rope(B, q, qd, T, nh, hd, c->rope_dim, s->pos, e->inv_freq, e->rope_mscale,
                c->rope_interleaved);
        B->rope(B, kv, 2 * kd, T, nkv, hd, c->rope_dim, s->pos, e->inv_freq, e->rope_mscale,
                c->rope_interleaved);
        B->kv_store(B, s->pool, l, s->toks, T, kv, 2 * kd);
        B->attn_gqa(B, att, qd, q, qd, T, s->toks, s->pool, l, nh, nkv, hd, e->attn_scale);
        B->matmul(B, y, H, att, qd, T, &w->wo);
        B->add(B, x, y, (size_t)T * H);

        /* SwiGLU MLP */
        B->rmsnorm(B, h, H, x, H, T, H, w->ffn_norm, c->rms_eps);
        B->matmul(B, gate, I, h, H, T, &w->w_gate);
        B->matmul(B, up, I, h, H, T, &w->w_up);
        B->silu_mul(B, gate, I, up, I, T, I);
        B->matmul(B, y, H, gate, I, T, &w->w_down);
        B->add(B, x, y, (size_t)T * H);
    }
}

/* 1/sqrt(head_dim). */
static float attn_scale(const td_model_cfg_t *c)
{
    return (float)(1.0 / sqrt((double)c->head_dim));
}

/* YaRN's factor: DeepSeek's ratio form when mscale_all_dim is given, else mscale(factor, 1). */
static float rope_mscale(const td_model_cfg_t *c)
{
    if (c->rope_scaling != TD_ROPE_YARN)
        return 1.0f;
    if (c->yarn_mscale_all_dim != 0)
        return td__yarn_mscale_ratio(c);
    return (float)td__yarn_mscale(c->rope_factor, 1.0);
}

/* Attention accumulates one head of head_dim values. */
static int head_width(const td_model_cfg_t *c)
{
    return c->head_dim;
}

const td__arch_t td__arch_llama = {
    .name = "llama",
    .scratch = scratch,
    .forward = forward,
    .attn_scale = attn_scale,
    .rope_mscale = rope_mscale,
    .head_width = head_width,
};
