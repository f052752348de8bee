/* engine_deepseek.c: the DeepSeek V2/V3 forward: Multi-head Latent Attention in its absorbed form
 * and the DeepSeekMoE feed-forward, following DeepSeek's inference/model.py.
 *
 * MLA. Per token: q = Wq_b rmsnorm(Wq_a h) (or Wq h), split per head into q_nope [nope] and
 * q_pe [rope]; [c | k_pe] = Wkv_a h with c the latent [kv_rank] (then RMSNorm'd) and k_pe [rope]
 * shared by all heads; RoPE on q_pe and k_pe. Only [c | k_pe] is cached. Wkv_b holds, per head,
 * Wk_h [nope][kv_rank] then Wv_h [v][kv_rank]; instead of expanding keys and values for every
 * cached token, the query is absorbed: q_lat_h = Wk_h^T q_nope_h, so
 *   score_p = scale * (q_lat_h . c_p + q_pe_h . k_pe_p),   o_h = Wv_h sum_p softmax_p c_p.
 * Prefill uses the same absorbed form as decode (one code path; the expanded form, cheaper for
 * long prompts, is not implemented).
 *
 * MoE. Layers >= first_k_dense_replace: router scores (softmax, or sigmoid plus a correction bias
 * used only for choosing), optional group limit (keep the topk_group best groups, scored by their
 * max, or by their top-2 sum when there is a bias), top-k experts, weights from the unbiased
 * scores, optionally renormalised, times routed_scaling_factor; plus the shared experts. */
#include "engine_impl.h"

#include <math.h>
#include <string.h>

/* Floats of scratch for T tokens: the buffers of forward(), each padded by td__scratch. */
static size_t scratch(const td_model_cfg_t *c, int T)
{
    size_t H = (size_t)c->hidden, nh = (size_t)c->n_heads, r = (size_t)c->kv_lora_rank;
    size_t qk = (size_t)(c->qk_nope_dim + c->qk_rope_dim);
    size_t ffn = (size_t)TD_MAX(c->inter, TD_MAX(c->moe_inter, c->n_shared_experts * c->moe_inter));
    size_t per_tok = H + (size_t)c->q_lora_rank + nh * qk + r + (size_t)c->qk_rope_dim +
                     2 * nh * r + nh * (size_t)c->v_head_dim + H + 2 * ffn +
                     (size_t)c->n_routed_experts + 3 * H + 2 * (size_t)c->n_experts_per_tok + 4;
    per_tok += (size_t)c->n_routed_experts; /* routing scratch, counted per token for simplicity */
    return (size_t)T * per_tok + 32 * 16;
}

/* Rows [row0, row0 + n) of W as a matrix of their own. */
static td_mat_t mat_rows(const td_mat_t *W, int64_t row0, int64_t n)
{
    td_mat_t v = *W;
    v.rows = n;
    v.data = (const uint8_t *)W->data + (size_t)row0 * td_dtype_row_bytes(W->dtype, W->cols);
    v.scale_row0 = W->scale_row0 + row0;
    return v;
}

/* y [T][hidden] = Wdown (silu(Wgate x) * Wup x), with gate/up scratch [T][inter]. */
static void mlp(td_engine_t *e, float *y, const float *x, int T, const td_mat_t *wg,
                const td_mat_t *wu, const td_mat_t *wd, float *gate, float *up)
{
    td_backend_t *B = e->be;
    int H = e->m->cfg.hidden, I = (int)wg->rows;
    B->matmul(B, gate, I, x, H, T, wg);
    B->matmul(B, up, I, x, H, T, wu);
    B->silu_mul(B, gate, I, up, I, T, I);
    B->matmul(B, y, H, gate, I, T, wd);
}

/* Choose the experts of one token from its router logits [n_routed] (overwritten). */
static void route(const td_model_cfg_t *c, const float *bias, float *scores, int32_t *idx,
                  float *wts, float *sel /* [n_routed] scratch */)
{
    int E = c->n_routed_experts, K = c->n_experts_per_tok;
    if (c->score_func == TD_SCORE_SOFTMAX) {
        float mx = -INFINITY, sum = 0;
        for (int i = 0; i < E; i++)
            mx = fmaxf(mx, scores[i]);
        for (int i = 0; i < E; i++)
            sum += scores[i] = expf(scores[i] - mx);
        for (int i = 0; i < E; i++)
            scores[i] /= sum;
    } else {
        for (int i = 0; i < E; i++)
            scores[i] = 1.0f / (1.0f + expf(-scores[i]));
    }
    for (int i = 0; i < E; i++)
        sel[i] = scores[i] + (bias ? bias[i] : 0.0f);
    if (c->n_group > 1) {
        int G = c->n_group, gs = E / G;
        float gscore[256];
        bool keep[256] = {false};
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY; /* best and second best in the group */
            for (int i = g * gs; i < (g + 1) * gs; i++) {
                if (sel[i] > a) {
                    b = a;
                    a = sel[i];
                } else if (sel[i] > b) {
                    b = sel[i];
                }
            }
            gscore[g] = bias ? a + (gs > 1 ? b : 0) : a;
        }
        for (int k = 0; k < c->topk_group; k++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gscore[g] > gscore[best]))
                    best = g;
            keep[best] = true;
        }
        for (int i = 0; i < E; i++)
            if (!keep[i / gs])
                sel[i] = -INFINITY;
    }
    float sum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < E; i++)
            if (sel[i] != -INFINITY && (best < 0 || sel[i] > sel[best]))
                best = i;
        if (best < 0) /* only with non-finite router inputs: stay in bounds */
            best = k;
        idx[k] = best;
        sel[best] = -INFINITY;
        wts[k] = scores[best];
        sum += wts[k];
    }
    for (int k = 0; k < K; k++)
        wts[k] = (c->norm_topk_prob ? wts[k] / (sum + 1e-20f) : wts[k]) * c->routed_scale;
}

/* The transformer body over the step's tokens, x [T][hidden] in place (engine_impl.h). */
static void forward(td_engine_t *e, const td__step_t *s, float *x)
{
    const td_model_cfg_t *c = &e->m->cfg;
    td_backend_t *B = e->be;
    const int T = s->T, H = c->hidden, nh = c->n_heads, R = c->kv_lora_rank;
    const int nope = c->qk_nope_dim, rope = c->qk_rope_dim, qk = nope + rope, vd = c->v_head_dim;
    const int QR = c->q_lora_rank, E = c->n_routed_experts, K = c->n_experts_per_tok;
    const int ffn = TD_MAX(c->inter, TD_MAX(c->moe_inter, c->n_shared_experts * c->moe_inter));

    float *h = td__scratch(e, (size_t)T * H);                /* [T][hidden] normed input */
    float *qa = td__scratch(e, (size_t)T * QR);              /* [T][q_lora_rank] */
    float *q = td__scratch(e, (size_t)T * nh * qk);          /* [T][n_heads][nope | rope] */
    float *ckv = td__scratch(e, (size_t)T * (R + rope));     /* [T][latent c (R) | k_pe (rope)] */
    float *q_lat = td__scratch(e, (size_t)T * nh * R);       /* [T][n_heads][R] absorbed query */
    float *o_lat = td__scratch(e, (size_t)T * nh * R);       /* [T][n_heads][R] attended latent */
    float *o = td__scratch(e, (size_t)T * nh * vd);          /* [T][n_heads][v_head_dim] */
    float *y = td__scratch(e, (size_t)T * H);                /* [T][hidden] block output */
    float *gate = td__scratch(e, (size_t)T * ffn);           /* [T][ffn] */
    float *up = td__scratch(e, (size_t)T * ffn);             /* [T][ffn] */
    float *logit = td__scratch(e, (size_t)T * E);            /* [T][n_routed] router scores */
    float *xg = td__scratch(e, (size_t)T * H);               /* [T][hidden] tokens of one expert */
    float *yg = td__scratch(e, (size_t)T * H);               /* [T][hidden] their expert output */
    float *ysh = td__scratch(e, (size_t)T * H);              /* [T][hidden] shared experts */
    float *wts = td__scratch(e, (size_t)T * K);              /* [T][top-k] routing weights */
    int32_t *idx = (int32_t *)td__scratch(e, (size_t)T * K); /* [T][top-k] chosen experts */
    int32_t *rows = (int32_t *)td__scratch(e, (size_t)T);    /* tokens routed to one expert */
    float *roww = td__scratch(e, (size_t)T);                 /* and their weights */
    float *sel = td__scratch(e, (size_t)E);                  /* [n_routed] routing scratch */

    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_w_t *w = &e->m->layers[l];

        /* MLA: projections */
        B->rmsnorm(B, h, H, x, H, T, H, w->attn_norm, c->rms_eps);
        if (QR > 0) {
            B->matmul(B, qa, QR, h, H, T, &w->wq_a);
            B->rmsnorm(B, qa, QR, qa, QR, T, QR, w->q_a_norm, c->rms_eps);
            B->matmul(B, q, nh * qk, qa, QR, T, &w->wq_b);
        } else {
            B->matmul(B, q, nh * qk, h, H, T, &w->wq_b);
        }
        B->matmul(B, ckv, R + rope, h, H, T, &w->wkv_a);
        B->rmsnorm(B, ckv, R + rope, ckv, R + rope, T, R, w->kv_a_norm, c->rms_eps);
        B->rope(B, q + nope, nh * qk, T, nh, qk, rope, s->pos, e->inv_freq, e->rope_mscale,
                c->rope_interleaved);
        B->rope(B, ckv + R, R + rope, T, 1, 0, rope, s->pos, e->inv_freq, e->rope_mscale,
                c->rope_interleaved);
        B->kv_store(B, s->pool, l, s->toks, T, ckv, R + rope);

        /* MLA: absorbed attention over the cached latents */
        for (int hh = 0; hh < nh; hh++) {
            float *ql = q_lat + (size_t)hh * R, *qn = q + (size_t)hh * qk;
            if (w->wk_b_t.data) { /* GGUF split form: Wk_h^T stored as [R][nope] */
                td_mat_t wk = mat_rows(&w->wk_b_t, (int64_t)hh * R, R);
                B->matmul(B, ql, nh * R, qn, nh * qk, T, &wk);
            } else {
                B->matmul_t(B, ql, nh * R, qn, nh * qk, T, &w->wkv_b, (int64_t)hh * (nope + vd),
                            nope);
            }
        }
        B->attn_mla(B, o_lat, q_lat, q + nope, nh * qk, qk, T, s->toks, s->pool, l, nh, R, rope,
                    e->attn_scale);
        for (int hh = 0; hh < nh; hh++) {
            td_mat_t wv = w->wv_b.data ? mat_rows(&w->wv_b, (int64_t)hh * vd, vd)
                                       : mat_rows(&w->wkv_b, (int64_t)hh * (nope + vd) + nope, vd);
            B->matmul(B, o + (size_t)hh * vd, nh * vd, o_lat + (size_t)hh * R, nh * R, T, &wv);
        }
        B->matmul(B, y, H, o, nh * vd, T, &w->wo);
        B->add(B, x, y, (size_t)T * H);

        /* feed-forward */
        B->rmsnorm(B, h, H, x, H, T, H, w->ffn_norm, c->rms_eps);
        if (!w->is_moe) {
            mlp(e, y, h, T, &w->w_gate, &w->w_up, &w->w_down, gate, up);
            B->add(B, x, y, (size_t)T * H);
            continue;
        }
        B->matmul(B, logit, E, h, H, T, &w->w_router);
        td__sync(e); /* routing and the experts' gather and scatter run here, on h and logit */
        for (int t = 0; t < T; t++)
            route(c, w->router_bias, logit + (size_t)t * E, idx + (size_t)t * K,
                  wts + (size_t)t * K, sel);
        memset(y, 0, (size_t)T * H * sizeof(float));
        for (int ex = 0; ex < E; ex++) {
            int n = 0;
            for (int t = 0; t < T; t++)
                for (int k = 0; k < K; k++)
                    if (idx[t * K + k] == ex) {
                        rows[n] = t;
                        roww[n] = wts[t * K + k];
                        memcpy(xg + (size_t)n * H, h + (size_t)t * H, (size_t)H * sizeof(float));
                        n++;
                    }
            if (n == 0)
                continue;
            mlp(e, yg, xg, n, &w->exp_gate[ex], &w->exp_up[ex], &w->exp_down[ex], gate, up);
            td__sync(e);
            for (int i = 0; i < n; i++)
                for (int d = 0; d < H; d++)
                    y[(size_t)rows[i] * H + d] += roww[i] * yg[(size_t)i * H + d];
        }
        if (c->n_shared_experts > 0) {
            mlp(e, ysh, h, T, &w->sh_gate, &w->sh_up, &w->sh_down, gate, up);
            B->add(B, y, ysh, (size_t)T * H);
        }
        B->add(B, x, y, (size_t)T * H);
    }
}

/* 1/sqrt(qk_nope + qk_rope); with YaRN and mscale_all_dim, times mscale(factor, mscale_all_dim)
 * squared, as DeepSeek's softmax_scale. */
static float attn_scale(const td_model_cfg_t *c)
{
    double s = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    if (c->rope_scaling == TD_ROPE_YARN && c->yarn_mscale_all_dim != 0) {
        double ms = td__yarn_mscale(c->rope_factor, c->yarn_mscale_all_dim);
        s *= ms * ms; /* the softmax scale takes YaRN's mscale squared */
    }
    return (float)s;
}

/* YaRN's factor in DeepSeek's ratio form; 1 without YaRN. */
static float rope_mscale(const td_model_cfg_t *c)
{
    return c->rope_scaling == TD_ROPE_YARN ? td__yarn_mscale_ratio(c) : 1.0f;
}

/* Absorbed attention accumulates one head's latent of kv_lora_rank values. */
static int head_width(const td_model_cfg_t *c)
{
    return c->kv_lora_rank;
}

const td__arch_t td__arch_deepseek = {
    .name = "deepseek",
    .scratch = scratch,
    .forward = forward,
    .attn_scale = attn_scale,
    .rope_mscale = rope_mscale,
    .head_width = head_width,
};
