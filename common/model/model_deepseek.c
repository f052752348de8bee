/* model_deepseek.c: loading DeepSeek V2/V3: Multi-head Latent Attention (the KV cache holds each
 * token's compressed latent and its shared RoPE key, [kv_lora_rank | qk_rope_dim]), optional q
 * LoRA, and DeepSeekMoE layers (routed experts in per-expert, fused or GGUF stacked form, plus
 * shared experts) after the first first_k_dense dense ones. */
#include "model_impl.h"
#include "td_error.h"

#include <stdio.h>
#include <string.h>

int td__deepseek_kv_token_floats(const td_model_cfg_t *c)
{
    return c->kv_lora_rank + c->qk_rope_dim;
}

/* config.json: MLA's widths, the MoE layout and routing. */
static int parse_json(td__loader_t *L, json_object *o)
{
    td_model_cfg_t *c = &L->m->cfg;
    int rc;
    c->rope_interleaved = td__jbool(o, "rope_interleave", true);
    if ((rc = td__jint(L, o, "q_lora_rank", 0, false, &c->q_lora_rank)) ||
        (rc = td__jint(L, o, "kv_lora_rank", 0, true, &c->kv_lora_rank)) ||
        (rc = td__jint(L, o, "qk_nope_head_dim", 0, true, &c->qk_nope_dim)) ||
        (rc = td__jint(L, o, "qk_rope_head_dim", 0, true, &c->qk_rope_dim)) ||
        (rc = td__jint(L, o, "v_head_dim", 0, true, &c->v_head_dim)) ||
        (rc = td__jint(L, o, "n_routed_experts", 0, false, &c->n_routed_experts)) ||
        (rc = td__jint(L, o, "n_shared_experts", 0, false, &c->n_shared_experts)) ||
        (rc = td__jint(L, o, "num_experts_per_tok", 0, false, &c->n_experts_per_tok)) ||
        (rc = td__jint(L, o, "moe_intermediate_size", 0, false, &c->moe_inter)) ||
        (rc = td__jint(L, o, "n_group", 1, false, &c->n_group)) ||
        (rc = td__jint(L, o, "topk_group", 1, false, &c->topk_group)) ||
        (rc = td__jint(L, o, "first_k_dense_replace", 0, false, &c->first_k_dense)) ||
        (rc = td__jfloat(L, o, "routed_scaling_factor", 1.0, &c->routed_scale)))
        return rc;
    c->rope_dim = c->qk_rope_dim;
    int moe_freq = 1;
    if ((rc = td__jint(L, o, "moe_layer_freq", 1, false, &moe_freq)))
        return rc;
    if (moe_freq != 1) { /* every released DeepSeek V2/V3 uses 1: MoE on every layer */
        return td_err_set(TD_ENOTSUP, "%s: field \"moe_layer_freq\" = %d (only 1 is supported)",
                          L->cfg_path, moe_freq);
    }
    const char *sf = td__jstr(o, "scoring_func");
    c->score_func = sf && strcmp(sf, "sigmoid") == 0 ? TD_SCORE_SIGMOID : TD_SCORE_SOFTMAX;
    if (sf && strcmp(sf, "sigmoid") != 0 && strcmp(sf, "softmax") != 0) {
        return td_err_set(TD_ENOTSUP, "%s: scoring_func \"%s\"", L->cfg_path, sf);
    }
    c->norm_topk_prob = td__jbool(o, "norm_topk_prob", false);
    const char *tm = td__jstr(o, "topk_method");
    if (tm && strcmp(tm, "greedy") == 0)
        c->n_group = c->topk_group = 1; /* plain top-k, no group limit */
    return 0;
}

/* GGUF "deepseek2": MLA's widths (llama.cpp's *_mla keys when present), the MoE layout and
 * routing; the gating function tells V3 (sigmoid) from V2 (softmax). */
static int parse_gguf(td__loader_t *L, const char *a)
{
    td_model_cfg_t *c = &L->m->cfg;
    char key[128];
    int rc;
    int key_len, gating = 1, val_len;
    bool norm;
    if ((rc = td__gint(L, a, "attention.q_lora_rank", false, 0, &c->q_lora_rank)) ||
        (rc = td__gint(L, a, "attention.kv_lora_rank", true, 0, &c->kv_lora_rank)) ||
        (rc = td__gint(L, a, "attention.key_length", true, 0, &key_len)) ||
        (rc = td__gint(L, a, "attention.value_length", true, 0, &val_len)) ||
        /* llama.cpp's MLA form: key/value_length describe the latent; these the heads */
        (rc = td__gint(L, a, "attention.key_length_mla", false, key_len, &key_len)) ||
        (rc = td__gint(L, a, "attention.value_length_mla", false, val_len, &val_len)) ||
        (rc = td__gint(L, a, "rope.dimension_count", true, 0, &c->qk_rope_dim)) ||
        (rc = td__gint(L, a, "leading_dense_block_count", false, 0, &c->first_k_dense)) ||
        (rc = td__gint(L, a, "expert_feed_forward_length", false, 0, &c->moe_inter)) ||
        (rc = td__gint(L, a, "expert_count", false, 0, &c->n_routed_experts)) ||
        (rc = td__gint(L, a, "expert_shared_count", false, 0, &c->n_shared_experts)) ||
        (rc = td__gint(L, a, "expert_used_count", false, 0, &c->n_experts_per_tok)) ||
        (rc = td__gint(L, a, "expert_group_count", false, 1, &c->n_group)) ||
        (rc = td__gint(L, a, "expert_group_used_count", false, 1, &c->topk_group)) ||
        (rc = td__gint(L, a, "expert_gating_func", false, 1, &gating)) ||
        (rc = td__gflt(L, a, "expert_weights_scale", 1.0, &c->routed_scale)))
        return rc;
    snprintf(key, sizeof(key), "%s.expert_weights_norm", a);
    const td__gguf_kv_t *nk = td__gguf_find(&L->ix, key);
    norm = nk && nk->type != TD__GGUF_STRING && nk->type != TD__GGUF_ARRAY && nk->num != 0;
    if (key_len <= c->qk_rope_dim)
        return td_err_set(TD_EPARSE, "%s: attention.key_length %d <= rope dimension %d",
                          L->cfg_path, key_len, c->qk_rope_dim);
    c->qk_nope_dim = key_len - c->qk_rope_dim;
    c->v_head_dim = val_len;
    c->norm_topk_prob = norm;
    c->score_func = gating == 2 ? TD_SCORE_SIGMOID : TD_SCORE_SOFTMAX;
    c->arch = gating == 2 ? TD_ARCH_DEEPSEEK_V3 : TD_ARCH_DEEPSEEK_V2;
    c->rope_dim = c->qk_rope_dim;
    return 0;
}

/* MLA's widths, and the MoE layout when there are routed experts. */
static bool check(const td_model_cfg_t *c)
{
    const int lim = 1 << 20;
    bool ok = c->kv_lora_rank > 0 && c->qk_nope_dim > 0 && c->qk_rope_dim > 0 &&
              c->qk_rope_dim % 2 == 0 && c->v_head_dim > 0 && c->q_lora_rank >= 0 &&
              c->kv_lora_rank < lim && c->qk_nope_dim < 8192 && c->qk_rope_dim < 8192 &&
              c->v_head_dim < 8192 && c->q_lora_rank < lim;
    if (ok && c->n_routed_experts > 0)
        ok = c->n_routed_experts < 65536 && c->n_experts_per_tok > 0 &&
             c->n_experts_per_tok <= c->n_routed_experts && c->moe_inter > 0 &&
             c->moe_inter < lim && c->n_group > 0 && c->n_routed_experts % c->n_group == 0 &&
             c->topk_group > 0 && c->topk_group <= c->n_group && c->n_group <= 256 &&
             c->n_shared_experts >= 0 && c->n_shared_experts < 256 &&
             c->n_experts_per_tok <= c->topk_group * (c->n_routed_experts / c->n_group);
    return ok;
}

/* The routed experts of layer l: per-expert names, HF's fused experts.gate_up_proj [E][2I][H]
 * (gate rows first) with experts.down_proj [E][H][I], or GGUF's stacked ffn_*_exps. */
static int bind_experts(td__loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    int E = c->n_routed_experts, I = c->moe_inter, H = c->hidden, rc = 0;
    char n1[256], n2[256], n3[256];
    w->exp_gate = td__own(L->m, td_calloc((size_t)E, sizeof(td_mat_t)));
    w->exp_up = td__own(L->m, td_calloc((size_t)E, sizeof(td_mat_t)));
    w->exp_down = td__own(L->m, td_calloc((size_t)E, sizeof(td_mat_t)));
    if (!w->exp_gate || !w->exp_up || !w->exp_down)
        return td_err_set(TD_ENOMEM, "out of memory binding experts");
    if (L->gguf) {
        const char *kind[3] = {"gate", "up", "down"};
        td_mat_t *dst[3] = {w->exp_gate, w->exp_up, w->exp_down};
        for (int k = 0; k < 3; k++) {
            snprintf(n1, sizeof(n1), "blk.%d.ffn_%s_exps.weight", l, kind[k]);
            const td__tensor_t *t = td__find(L, n1, true, &rc);
            if (!t)
                return rc;
            int64_t rows = k == 2 ? H : I, cols = k == 2 ? I : H;
            if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols) {
                char want[64];
                snprintf(want, sizeof(want), "%d, %lld, %lld", E, (long long)rows, (long long)cols);
                return td__shape_err(t, want);
            }
            for (int e = 0; e < E; e++)
                if ((rc = td__bind_view(L, t, rows, cols, e, &dst[k][e])))
                    return rc;
        }
        return 0;
    }
    snprintf(n1, sizeof(n1), "model.layers.%d.mlp.experts.gate_up_proj", l);
    const td__tensor_t *gu = td__index_find(&L->ix, n1);
    if (gu) {
        snprintf(n2, sizeof(n2), "model.layers.%d.mlp.experts.down_proj", l);
        const td__tensor_t *dn = td__find(L, n2, true, &rc);
        if (!dn)
            return rc;
        if (gu->dtype < 0 || dn->dtype < 0)
            return td__find(L, gu->dtype < 0 ? n1 : n2, true, &rc), rc;
        if (gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != H) {
            char want[64];
            snprintf(want, sizeof(want), "%d, %d, %d", E, 2 * I, H);
            return td__shape_err(gu, want);
        }
        if (dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != H || dn->shape[2] != I) {
            char want[64];
            snprintf(want, sizeof(want), "%d, %d, %d", E, H, I);
            return td__shape_err(dn, want);
        }
        for (int e = 0; e < E; e++) {
            td_mat_t both;
            if ((rc = td__bind_view(L, gu, 2 * I, H, e, &both)) ||
                (rc = td__bind_view(L, dn, H, I, e, &w->exp_down[e])))
                return rc;
            w->exp_gate[e] = both;
            w->exp_gate[e].rows = I;
            w->exp_up[e] = both;
            w->exp_up[e].rows = I;
            w->exp_up[e].data =
                (const uint8_t *)both.data + (size_t)I * td_dtype_row_bytes(both.dtype, H);
            w->exp_up[e].scale_row0 = I;
        }
        return 0;
    }
    for (int e = 0; e < E; e++) {
        snprintf(n1, sizeof(n1), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
        snprintf(n2, sizeof(n2), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
        snprintf(n3, sizeof(n3), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
        if ((rc = td__get_mat(L, n1, I, H, true, &w->exp_gate[e])) ||
            (rc = td__get_mat(L, n2, I, H, true, &w->exp_up[e])) ||
            (rc = td__get_mat(L, n3, H, I, true, &w->exp_down[e])))
            return rc;
    }
    return 0;
}

/* A 3-D tensor [d0][d1][d2] bound as the matrix [d0*d1][d2]. */
static int get_mat3(td__loader_t *L, const char *name, int64_t d0, int64_t d1, int64_t d2,
                    td_mat_t *out)
{
    int rc = 0;
    memset(out, 0, sizeof(*out));
    const td__tensor_t *t = td__find(L, name, true, &rc);
    if (!t)
        return rc;
    if (t->ndim != 3 || t->shape[0] != d0 || t->shape[1] != d1 || t->shape[2] != d2) {
        char want[64];
        snprintf(want, sizeof(want), "%lld, %lld, %lld", (long long)d0, (long long)d1,
                 (long long)d2);
        return td__shape_err(t, want);
    }
    return td__bind_view(L, t, d0 * d1, d2, 0, out);
}

/* MLA's up-projection: HF's kv_b_proj (and older GGUF attn_kv_b), or newer GGUF's split
 * attn_k_b [n_heads][kv_rank][nope] (already transposed) and attn_v_b [n_heads][v][kv_rank]. */
static int bind_kv_b(td__loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    char b[256];
    int64_t nh = c->n_heads, R = c->kv_lora_rank;
    td__nm(b, sizeof(b), L->N->kv_b, l);
    if (!L->gguf || td__index_find(&L->ix, b))
        return td__get_mat(L, b, nh * (c->qk_nope_dim + c->v_head_dim), R, true, &w->wkv_b);
    int rc = get_mat3(L, td__nm(b, sizeof(b), "blk.%d.attn_k_b.weight", l), nh, R, c->qk_nope_dim,
                      &w->wk_b_t);
    if (rc)
        return rc;
    return get_mat3(L, td__nm(b, sizeof(b), "blk.%d.attn_v_b.weight", l), nh, c->v_head_dim, R,
                    &w->wv_b);
}

/* MLA's projections of layer l, then its dense MLP or its router, routed and shared experts. */
static int bind_layer(td__loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    const td__names_t *N = L->N;
    int H = c->hidden, qk = c->qk_nope_dim + c->qk_rope_dim, nh = c->n_heads, rc;
    char b[256];
    if (c->q_lora_rank > 0) {
        if ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->q_a, l), c->q_lora_rank, H, true,
                              &w->wq_a)) ||
            (rc = td__get_vec(L, td__nm(b, sizeof(b), N->q_a_norm, l), c->q_lora_rank, true,
                              &w->q_a_norm)) ||
            (rc = td__get_mat(L, td__nm(b, sizeof(b), N->q_b, l), (int64_t)nh * qk, c->q_lora_rank,
                              true, &w->wq_b)))
            return rc;
    } else if ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->q, l), (int64_t)nh * qk, H, true,
                                 &w->wq_b))) {
        return rc;
    }
    if ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->kv_a, l), c->kv_lora_rank + c->qk_rope_dim, H,
                          true, &w->wkv_a)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->kv_a_norm, l), c->kv_lora_rank, true,
                          &w->kv_a_norm)) ||
        (rc = bind_kv_b(L, l, w)) ||
        (rc = td__get_mat(L, td__nm(b, sizeof(b), N->o, l), H, (int64_t)nh * c->v_head_dim, true,
                          &w->wo)))
        return rc;
    w->is_moe = c->n_routed_experts > 0 && l >= c->first_k_dense;
    if (!w->is_moe)
        return td__bind_mlp(L, l, w);
    int si = c->n_shared_experts * c->moe_inter;
    if ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->router, l), c->n_routed_experts, H, true,
                          &w->w_router)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->router_bias, l), c->n_routed_experts,
                          c->score_func == TD_SCORE_SIGMOID, &w->router_bias)) ||
        (rc = bind_experts(L, l, w)))
        return rc;
    if (si > 0 &&
        ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->sh_gate, l), si, H, true, &w->sh_gate)) ||
         (rc = td__get_mat(L, td__nm(b, sizeof(b), N->sh_up, l), si, H, true, &w->sh_up)) ||
         (rc = td__get_mat(L, td__nm(b, sizeof(b), N->sh_down, l), H, si, true, &w->sh_down))))
        return rc;
    return 0;
}

const td__family_t td__family_deepseek = {
    .parse_json = parse_json,
    .parse_gguf = parse_gguf,
    .check = check,
    .bind_layer = bind_layer,
};
