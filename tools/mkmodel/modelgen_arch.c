/* modelgen_arch.c: per architecture and preset, the hyperparameters and the list of tensors
 * (Hugging Face names, per-expert form). */
#include "modelgen_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Hyperparameters                                                                             */
/* ------------------------------------------------------------------------------------------ */

bool td__mg_is_deepseek(td_modelgen_arch_t a)
{
    return a == TD_MODELGEN_DEEPSEEK_V2 || a == TD_MODELGEN_DEEPSEEK_V3;
}

void td__mg_hp_init(mg_hp_t *h, td_modelgen_arch_t arch, td_modelgen_preset_t preset)
{
    bool bench = preset == TD_MODELGEN_BENCH;
    memset(h, 0, sizeof(*h));
    h->vocab = bench ? 32000 : 512;
    h->rms_eps = 1e-6;
    switch (arch) {
    case TD_MODELGEN_LLAMA:
        h->hidden = bench ? 768 : 64;
        h->n_layers = bench ? 8 : 2;
        h->n_heads = bench ? 12 : 4;
        h->n_kv = bench ? 4 : 2;
        h->head_dim = h->hidden / h->n_heads;
        h->inter = bench ? 2304 : 160;
        h->max_pos = 4096;
        h->rms_eps = 1e-5;
        h->rope_theta = 500000.0;
        h->l3_factor = 8.0;
        h->l3_low = 1.0;
        h->l3_high = 4.0;
        h->l3_orig = 8192;
        break;
    case TD_MODELGEN_QWEN3:
        h->hidden = bench ? 768 : 64;
        h->n_layers = bench ? 10 : 2;
        h->n_heads = bench ? 12 : 4;
        h->n_kv = bench ? 4 : 2;
        h->head_dim = bench ? 64 : 32; /* tiny: heads * head_dim = 128 != hidden */
        h->inter = bench ? 2304 : 128;
        h->max_pos = 4096;
        h->rope_theta = 1000000.0;
        h->tie = true;
        break;
    case TD_MODELGEN_DEEPSEEK_V2:
    case TD_MODELGEN_DEEPSEEK_V3: {
        bool v3 = arch == TD_MODELGEN_DEEPSEEK_V3;
        h->hidden = bench ? 512 : 64;
        h->n_layers = bench ? 8 : 3;
        h->first_dense = 1;
        h->n_heads = bench ? 8 : 4;
        h->n_kv = h->n_heads;
        h->q_lora = v3 ? (bench ? 192 : 32) : 0;
        h->kv_lora = bench ? 128 : 32;
        h->nope = bench ? 64 : 32;
        h->rope = bench ? 32 : 16;
        h->v_dim = bench ? 64 : 32;
        h->inter = bench ? 1408 : 128;
        h->moe_inter = bench ? 320 : 32;
        h->n_exp = bench ? 16 : 8;
        h->n_shared = v3 ? 1 : 2;
        h->top_k = v3 ? (bench ? 4 : 2) : 3;
        h->n_group = 4;
        h->topk_group = 2;
        h->routed_scale = v3 ? 2.5 : 2.0;
        h->norm_topk = v3;
        h->rope_theta = 10000.0;
        h->yarn_factor = 4.0;
        h->yarn_orig = bench ? 1024 : 64;
        h->yarn_mscale = v3 ? 1.0 : 0.707;
        h->max_pos = (int)(h->yarn_orig * h->yarn_factor);
        break;
    }
    }
    if (preset == TD_MODELGEN_LLAMA8B && arch == TD_MODELGEN_LLAMA) {
        h->vocab = 128256;
        h->hidden = 4096;
        h->n_layers = 32;
        h->n_heads = 32;
        h->n_kv = 8;
        h->head_dim = 128;
        h->inter = 14336;
        h->max_pos = 131072;
    } else if (preset == TD_MODELGEN_DSV2LITE && arch == TD_MODELGEN_DEEPSEEK_V2) {
        h->vocab = 102400;
        h->hidden = 2048;
        h->n_layers = 27;
        h->n_heads = h->n_kv = 16;
        h->q_lora = 0;
        h->kv_lora = 512;
        h->nope = 128;
        h->rope = 64;
        h->v_dim = 128;
        h->inter = 10944;
        h->moe_inter = 1408;
        h->n_exp = 64;
        h->n_shared = 2;
        h->top_k = 6;
        h->n_group = h->topk_group = 1;
        h->routed_scale = 1.0;
        h->norm_topk = false;
        h->yarn_factor = 40;
        h->yarn_orig = 4096;
        h->max_pos = 163840;
    }
    if (preset == TD_MODELGEN_SMALL) { /* tiny with rows of multiples of 256 */
        h->hidden = 256;
        if (arch == TD_MODELGEN_LLAMA)
            h->head_dim = h->hidden / h->n_heads;
        h->inter = td__mg_is_deepseek(arch) ? 512 : 768;
        h->moe_inter = td__mg_is_deepseek(arch) ? 256 : 0;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The tensor list (Hugging Face names, per-expert form)                                       */
/* ------------------------------------------------------------------------------------------ */

static int list_add(mg_list_t *l, int kind, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int list_add(mg_list_t *l, int kind, int64_t rows, int64_t cols, const char *fmt, ...)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        mg_tensor_t *t = td_reallocarray(l->t, (size_t)cap, sizeof(*t));
        if (!t)
            return TD_ENOMEM;
        l->t = t;
        l->cap = cap;
    }
    mg_tensor_t *t = &l->t[l->n++];
    memset(t, 0, sizeof(*t));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->rows = rows;
    t->cols = cols;
    t->kind = kind;
    t->fp8_ok = kind == K_LINEAR && strncmp(t->name, "model.layers.", 13) == 0;
    return 0;
}

const mg_tensor_t *td__mg_list_find(const mg_list_t *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0)
            return &l->t[i];
    return NULL;
}

bool td__mg_layer_is_moe(const mg_hp_t *h, td_modelgen_arch_t arch, int i)
{
    return td__mg_is_deepseek(arch) && h->n_exp > 0 && i >= h->first_dense;
}

int td__mg_build_list(const mg_hp_t *h, td_modelgen_arch_t arch, mg_list_t *l)
{
    int r = 0;
    int H = h->hidden;
    r |= list_add(l, K_EMBED, h->vocab, H, "model.embed_tokens.weight");
    for (int i = 0; i < h->n_layers && r == 0; i++) {
        char p[48];
        snprintf(p, sizeof(p), "model.layers.%d", i);
        r |= list_add(l, K_NORM, H, 0, "%s.input_layernorm.weight", p);
        r |= list_add(l, K_NORM, H, 0, "%s.post_attention_layernorm.weight", p);
        if (!td__mg_is_deepseek(arch)) {
            int q = h->n_heads * h->head_dim, kv = h->n_kv * h->head_dim;
            r |= list_add(l, K_LINEAR, q, H, "%s.self_attn.q_proj.weight", p);
            r |= list_add(l, K_LINEAR, kv, H, "%s.self_attn.k_proj.weight", p);
            r |= list_add(l, K_LINEAR, kv, H, "%s.self_attn.v_proj.weight", p);
            r |= list_add(l, K_LINEAR, H, q, "%s.self_attn.o_proj.weight", p);
            if (arch == TD_MODELGEN_QWEN3) {
                r |= list_add(l, K_NORM, h->head_dim, 0, "%s.self_attn.q_norm.weight", p);
                r |= list_add(l, K_NORM, h->head_dim, 0, "%s.self_attn.k_norm.weight", p);
            }
        } else {
            int qk = h->nope + h->rope;
            if (h->q_lora) {
                r |= list_add(l, K_LINEAR, h->q_lora, H, "%s.self_attn.q_a_proj.weight", p);
                r |= list_add(l, K_NORM, h->q_lora, 0, "%s.self_attn.q_a_layernorm.weight", p);
                r |= list_add(l, K_LINEAR, h->n_heads * qk, h->q_lora,
                              "%s.self_attn.q_b_proj.weight", p);
            } else {
                r |= list_add(l, K_LINEAR, h->n_heads * qk, H, "%s.self_attn.q_proj.weight", p);
            }
            r |= list_add(l, K_LINEAR, h->kv_lora + h->rope, H,
                          "%s.self_attn.kv_a_proj_with_mqa.weight", p);
            r |= list_add(l, K_NORM, h->kv_lora, 0, "%s.self_attn.kv_a_layernorm.weight", p);
            r |= list_add(l, K_LINEAR, h->n_heads * (h->nope + h->v_dim), h->kv_lora,
                          "%s.self_attn.kv_b_proj.weight", p);
            r |= list_add(l, K_LINEAR, H, h->n_heads * h->v_dim, "%s.self_attn.o_proj.weight", p);
        }
        if (td__mg_layer_is_moe(h, arch, i)) {
            int I = h->moe_inter, S = h->n_shared * h->moe_inter;
            r |= list_add(l, K_ROUTER, h->n_exp, H, "%s.mlp.gate.weight", p);
            if (arch == TD_MODELGEN_DEEPSEEK_V3)
                r |= list_add(l, K_BIAS, h->n_exp, 0, "%s.mlp.gate.e_score_correction_bias", p);
            for (int e = 0; e < h->n_exp; e++) {
                r |= list_add(l, K_LINEAR, I, H, "%s.mlp.experts.%d.gate_proj.weight", p, e);
                r |= list_add(l, K_LINEAR, I, H, "%s.mlp.experts.%d.up_proj.weight", p, e);
                r |= list_add(l, K_LINEAR, H, I, "%s.mlp.experts.%d.down_proj.weight", p, e);
            }
            r |= list_add(l, K_LINEAR, S, H, "%s.mlp.shared_experts.gate_proj.weight", p);
            r |= list_add(l, K_LINEAR, S, H, "%s.mlp.shared_experts.up_proj.weight", p);
            r |= list_add(l, K_LINEAR, H, S, "%s.mlp.shared_experts.down_proj.weight", p);
        } else {
            r |= list_add(l, K_LINEAR, h->inter, H, "%s.mlp.gate_proj.weight", p);
            r |= list_add(l, K_LINEAR, h->inter, H, "%s.mlp.up_proj.weight", p);
            r |= list_add(l, K_LINEAR, H, h->inter, "%s.mlp.down_proj.weight", p);
        }
    }
    r |= list_add(l, K_FINAL_NORM, H, 0, "model.norm.weight");
    if (!h->tie)
        r |= list_add(l, K_EMBED, h->vocab, H, "lm_head.weight");
    return r ? TD_ENOMEM : 0;
}

int64_t td__mg_numel(const mg_tensor_t *t)
{
    return t->cols ? t->rows * t->cols : t->rows;
}
