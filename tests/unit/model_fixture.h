/* model_fixture.h: test-only writers of small models: a tensor set with deterministic random
 * weights (Hugging Face names), written as config.json + safetensors (F32, F16, BF16 or FP8 with
 * 128x128 block scales; single, sharded, or with fused experts) or as GGUF v3 (F32 or Q8_0).
 * Quantising writers round the set's own values in place, so an F32 copy written afterwards holds
 * exactly the weights the quantised file defines. Independent of the loader's code. */
#ifndef TD_TEST_MODEL_FIXTURE_H
#define TD_TEST_MODEL_FIXTURE_H

#include "half_fixture.h"

#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_tensor {
    char name[160];
    int ndim;
    int64_t shape[4];
    float *data;
} fx_tensor_t;

typedef struct fx_set {
    fx_tensor_t *t;
    int n, cap;
    uint64_t rng;
} fx_set_t;

typedef struct fx_cfg {
    bool deepseek; /* else llama */
    int vocab, hidden, layers, heads, kv_heads, head_dim, inter;
    /* deepseek */
    int q_lora, kv_lora, nope, rope, vdim, experts, shared, topk, moe_inter, groups, topk_groups;
    int dense;
    bool sigmoid;
    bool llama3; /* llama: Llama 3 rope scaling (HF rope_scaling; GGUF rope_freqs.weight) */
} fx_cfg_t;

static const fx_cfg_t fx_llama_cfg = {.deepseek = false,
                                      .vocab = 96,
                                      .hidden = 64,
                                      .layers = 2,
                                      .heads = 4,
                                      .kv_heads = 2,
                                      .head_dim = 16,
                                      .inter = 96};

static const fx_cfg_t fx_deepseek_cfg = {.deepseek = true,
                                         .vocab = 96,
                                         .hidden = 64,
                                         .layers = 3,
                                         .heads = 4,
                                         .kv_heads = 4,
                                         .inter = 96,
                                         .q_lora = 32,
                                         .kv_lora = 32,
                                         .nope = 16,
                                         .rope = 8,
                                         .vdim = 16,
                                         .experts = 8,
                                         .shared = 1,
                                         .topk = 2,
                                         .moe_inter = 32,
                                         .groups = 4,
                                         .topk_groups = 2,
                                         .dense = 1,
                                         .sigmoid = true};

static float fx_rand(fx_set_t *s)
{
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return (float)((s->rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Add a tensor: kind 'r' random in [-a, a], 'n' 1 + small noise (norm weights). */
static fx_tensor_t *fx_add(fx_set_t *s, const char *name, int ndim, int64_t d0, int64_t d1,
                           int64_t d2, char kind, float a)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->t = realloc(s->t, (size_t)s->cap * sizeof(*s->t));
        ck_assert_ptr_nonnull(s->t);
    }
    fx_tensor_t *t = &s->t[s->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= t->shape[i];
    t->data = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        t->data[i] = kind == 'n' ? 1.0f + 0.1f * fx_rand(s) : a * fx_rand(s);
    return t;
}

static int64_t fx_count(const fx_tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

static fx_tensor_t *fx_find(fx_set_t *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0)
            return &s->t[i];
    return NULL;
}

static void fx_free(fx_set_t *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->t[i].data);
    free(s->t);
    memset(s, 0, sizeof(*s));
}

static void fx_generate(fx_set_t *s, const fx_cfg_t *c, uint64_t seed)
{
    char n[160];
    int H = c->hidden;
    s->rng = seed * 2654435761u + 88172645463325252ull;
    fx_add(s, "model.embed_tokens.weight", 2, c->vocab, H, 0, 'r', 1.0f);
    fx_add(s, "model.norm.weight", 1, H, 0, 0, 'n', 0);
    fx_add(s, "lm_head.weight", 2, c->vocab, H, 0, 'r', 0.2f);
    for (int l = 0; l < c->layers; l++) {
#define P(fmt) (snprintf(n, sizeof(n), "model.layers.%d." fmt, l), n)
        fx_add(s, P("input_layernorm.weight"), 1, H, 0, 0, 'n', 0);
        fx_add(s, P("post_attention_layernorm.weight"), 1, H, 0, 0, 'n', 0);
        if (!c->deepseek) {
            int qd = c->heads * c->head_dim, kd = c->kv_heads * c->head_dim;
            fx_add(s, P("self_attn.q_proj.weight"), 2, qd, H, 0, 'r', 0.25f);
            fx_add(s, P("self_attn.k_proj.weight"), 2, kd, H, 0, 'r', 0.25f);
            fx_add(s, P("self_attn.v_proj.weight"), 2, kd, H, 0, 'r', 0.25f);
            fx_add(s, P("self_attn.o_proj.weight"), 2, H, qd, 0, 'r', 0.15f);
            fx_add(s, P("mlp.gate_proj.weight"), 2, c->inter, H, 0, 'r', 0.2f);
            fx_add(s, P("mlp.up_proj.weight"), 2, c->inter, H, 0, 'r', 0.2f);
            fx_add(s, P("mlp.down_proj.weight"), 2, H, c->inter, 0, 'r', 0.15f);
            continue;
        }
        int qk = c->nope + c->rope;
        fx_add(s, P("self_attn.q_a_proj.weight"), 2, c->q_lora, H, 0, 'r', 0.2f);
        fx_add(s, P("self_attn.q_a_layernorm.weight"), 1, c->q_lora, 0, 0, 'n', 0);
        fx_add(s, P("self_attn.q_b_proj.weight"), 2, c->heads * qk, c->q_lora, 0, 'r', 0.3f);
        fx_add(s, P("self_attn.kv_a_proj_with_mqa.weight"), 2, c->kv_lora + c->rope, H, 0, 'r',
               0.2f);
        fx_add(s, P("self_attn.kv_a_layernorm.weight"), 1, c->kv_lora, 0, 0, 'n', 0);
        fx_add(s, P("self_attn.kv_b_proj.weight"), 2, c->heads * (c->nope + c->vdim), c->kv_lora, 0,
               'r', 0.3f);
        fx_add(s, P("self_attn.o_proj.weight"), 2, H, c->heads * c->vdim, 0, 'r', 0.15f);
        if (l < c->dense) {
            fx_add(s, P("mlp.gate_proj.weight"), 2, c->inter, H, 0, 'r', 0.2f);
            fx_add(s, P("mlp.up_proj.weight"), 2, c->inter, H, 0, 'r', 0.2f);
            fx_add(s, P("mlp.down_proj.weight"), 2, H, c->inter, 0, 'r', 0.15f);
            continue;
        }
        fx_add(s, P("mlp.gate.weight"), 2, c->experts, H, 0, 'r', 0.3f);
        if (c->sigmoid)
            fx_add(s, P("mlp.gate.e_score_correction_bias"), 1, c->experts, 0, 0, 'r', 0.1f);
        for (int e = 0; e < c->experts; e++) {
            snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            fx_add(s, n, 2, c->moe_inter, H, 0, 'r', 0.2f);
            snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            fx_add(s, n, 2, c->moe_inter, H, 0, 'r', 0.2f);
            snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            fx_add(s, n, 2, H, c->moe_inter, 0, 'r', 0.15f);
        }
        int si = c->shared * c->moe_inter;
        fx_add(s, P("mlp.shared_experts.gate_proj.weight"), 2, si, H, 0, 'r', 0.2f);
        fx_add(s, P("mlp.shared_experts.up_proj.weight"), 2, si, H, 0, 'r', 0.2f);
        fx_add(s, P("mlp.shared_experts.down_proj.weight"), 2, H, si, 0, 'r', 0.15f);
#undef P
    }
}

static void fx_write_config(const char *dir, const fx_cfg_t *c)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    if (!c->deepseek) {
        fprintf(f,
                "{\"model_type\": \"llama\", \"vocab_size\": %d, \"hidden_size\": %d, "
                "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
                "\"num_key_value_heads\": %d, \"intermediate_size\": %d, \"rms_norm_eps\": 1e-5, "
                "\"rope_theta\": 10000.0, \"max_position_embeddings\": 512, %s"
                "\"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}\n",
                c->vocab, c->hidden, c->layers, c->heads, c->kv_heads, c->inter,
                c->llama3 ? "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                            "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                            "\"original_max_position_embeddings\": 64}, "
                          : "");
    } else {
        fprintf(f,
                "{\"model_type\": \"deepseek_v3\", \"vocab_size\": %d, \"hidden_size\": %d, "
                "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
                "\"num_key_value_heads\": %d, \"intermediate_size\": %d, "
                "\"moe_intermediate_size\": %d, \"n_routed_experts\": %d, "
                "\"n_shared_experts\": %d, \"num_experts_per_tok\": %d, \"n_group\": %d, "
                "\"topk_group\": %d, \"first_k_dense_replace\": %d, \"scoring_func\": \"%s\", "
                "\"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true, "
                "\"routed_scaling_factor\": 2.5, \"q_lora_rank\": %d, \"kv_lora_rank\": %d, "
                "\"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, \"v_head_dim\": %d, "
                "\"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, "
                "\"max_position_embeddings\": 512, \"rope_scaling\": {\"type\": \"yarn\", "
                "\"factor\": 4.0, \"original_max_position_embeddings\": 64, \"beta_fast\": 32, "
                "\"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0}, "
                "\"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}\n",
                c->vocab, c->hidden, c->layers, c->heads, c->kv_heads, c->inter, c->moe_inter,
                c->experts, c->shared, c->topk, c->groups, c->topk_groups, c->dense,
                c->sigmoid ? "sigmoid" : "softmax", c->q_lora, c->kv_lora, c->nope, c->rope,
                c->vdim);
    }
    fclose(f);
}

/* ---- number formats (independent of the loader) ---- */

static uint16_t fx_to_bf16(float *x)
{
    uint32_t u;
    memcpy(&u, x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    uint16_t h = (uint16_t)(u >> 16);
    u = (uint32_t)h << 16;
    memcpy(x, &u, 4);
    return h;
}

static uint16_t fx_to_f16(float *x)
{
    uint16_t b = fx_f32_to_f16(*x);
    *x = fx_f16_to_f32(b);
    return b;
}

static float fx_e4m3_value(int v)
{
    int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float f = e == 0 ? ldexpf(m / 8.0f, -6) : ldexpf(1 + m / 8.0f, e - 7);
    return sign ? -f : f;
}

static uint8_t fx_to_e4m3(float x)
{
    int best = 0;
    float bd = INFINITY;
    for (int v = 0; v < 256; v++) {
        if ((v & 0x7f) == 0x7f)
            continue; /* NaN */
        float d = fabsf(fx_e4m3_value(v) - x);
        if (d < bd) {
            bd = d;
            best = v;
        }
    }
    return (uint8_t)best;
}

/* ---- safetensors ---- */

typedef enum { FX_F32, FX_F16, FX_BF16, FX_F8 } fx_dtype_t;

typedef struct fx_blob {
    char name[176];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    uint8_t *bytes;
    size_t n;
} fx_blob_t;

/* Encode t as dtype (2-D and 3-D only; vectors stay F32), rounding t in place. F8 appends the
 * scale tensor as a second blob. Returns the number of blobs written to out[0..1]. */
static int fx_encode(fx_tensor_t *t, fx_dtype_t dt, fx_blob_t *out)
{
    int64_t n = fx_count(t);
    if (t->ndim == 1)
        dt = FX_F32;
    fx_blob_t *b = &out[0];
    memset(b, 0, sizeof(*b));
    snprintf(b->name, sizeof(b->name), "%s", t->name);
    b->ndim = t->ndim;
    memcpy(b->shape, t->shape, sizeof(b->shape));
    if (dt == FX_F32) {
        b->dtype = "F32";
        b->n = (size_t)n * 4;
        b->bytes = malloc(b->n);
        memcpy(b->bytes, t->data, b->n);
        return 1;
    }
    if (dt == FX_F16 || dt == FX_BF16) {
        b->dtype = dt == FX_F16 ? "F16" : "BF16";
        b->n = (size_t)n * 2;
        b->bytes = malloc(b->n);
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = dt == FX_F16 ? fx_to_f16(&t->data[i]) : fx_to_bf16(&t->data[i]);
            memcpy(b->bytes + 2 * i, &h, 2);
        }
        return 1;
    }
    /* FP8 E4M3 with one scale per 128x128 block of each [rows][cols] matrix */
    int64_t mats = t->ndim == 3 ? t->shape[0] : 1;
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    b->dtype = "F8_E4M3";
    b->n = (size_t)n;
    b->bytes = malloc(b->n);
    fx_blob_t *s = &out[1];
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s_scale_inv", t->name);
    s->dtype = "F32";
    s->ndim = t->ndim;
    if (t->ndim == 3) {
        s->shape[0] = mats;
        s->shape[1] = sr;
        s->shape[2] = sc;
    } else {
        s->shape[0] = sr;
        s->shape[1] = sc;
    }
    s->n = (size_t)(mats * sr * sc) * 4;
    float *scales = malloc(s->n);
    for (int64_t m = 0; m < mats; m++)
        for (int64_t br = 0; br < sr; br++)
            for (int64_t bc = 0; bc < sc; bc++) {
                float mx = 0;
                for (int64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
                    for (int64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++)
                        mx = fmaxf(mx, fabsf(t->data[(m * rows + r) * cols + c]));
                float sv = mx > 0 ? mx / 448.0f : 1.0f;
                scales[(m * sr + br) * sc + bc] = sv;
                for (int64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
                    for (int64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++) {
                        int64_t i = (m * rows + r) * cols + c;
                        uint8_t q = fx_to_e4m3(t->data[i] / sv);
                        b->bytes[i] = q;
                        t->data[i] = fx_e4m3_value(q) * sv;
                    }
            }
    s->bytes = (uint8_t *)scales;
    return 2;
}

static void fx_write_safetensors_blobs(const char *path, fx_blob_t *b, int nb)
{
    char *hdr = malloc(1 << 20);
    size_t o = 0, off = 0;
    o += (size_t)sprintf(hdr + o, "{\"__metadata__\": {\"format\": \"pt\"}");
    for (int i = 0; i < nb; i++) {
        o += (size_t)sprintf(hdr + o, ", \"%s\": {\"dtype\": \"%s\", \"shape\": [", b[i].name,
                             b[i].dtype);
        for (int d = 0; d < b[i].ndim; d++)
            o += (size_t)sprintf(hdr + o, "%s%lld", d ? ", " : "", (long long)b[i].shape[d]);
        o += (size_t)sprintf(hdr + o, "], \"data_offsets\": [%zu, %zu]}", off, off + b[i].n);
        off += b[i].n;
    }
    o += (size_t)sprintf(hdr + o, "}");
    while ((o + 8) % 8)
        hdr[o++] = ' ';
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t hl = o;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, o, f);
    for (int i = 0; i < nb; i++)
        fwrite(b[i].bytes, 1, b[i].n, f);
    fclose(f);
    free(hdr);
}

typedef struct fx_st_opts {
    fx_dtype_t dtype; /* for matrices */
    int shards;       /* 0/1: model.safetensors; n: n files + index */
    bool fused;       /* experts as experts.gate_up_proj / experts.down_proj */
} fx_st_opts_t;

/* Write `s` as a Hugging Face directory (config.json must be written separately). */
static void fx_write_safetensors(const char *dir, fx_set_t *s, const fx_cfg_t *c,
                                 const fx_st_opts_t *o)
{
    fx_blob_t *b = calloc((size_t)s->n * 2 + 64, sizeof(*b));
    int nb = 0;
    for (int i = 0; i < s->n; i++) {
        fx_tensor_t *t = &s->t[i];
        if (o->fused && strstr(t->name, ".mlp.experts.")) {
            int l, e;
            char kind[16];
            if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj", &l, &e, kind) != 3)
                continue;
            if (e != 0 || strcmp(kind, "gate") != 0)
                continue; /* the stack is built once, at expert 0's gate */
            int E = c->experts, I = c->moe_inter, H = c->hidden;
            fx_tensor_t gu = {0}, dn = {0};
            snprintf(gu.name, sizeof(gu.name), "model.layers.%d.mlp.experts.gate_up_proj", l);
            snprintf(dn.name, sizeof(dn.name), "model.layers.%d.mlp.experts.down_proj", l);
            gu.ndim = dn.ndim = 3;
            gu.shape[0] = dn.shape[0] = E;
            gu.shape[1] = 2 * I;
            gu.shape[2] = H;
            dn.shape[1] = H;
            dn.shape[2] = I;
            gu.data = malloc((size_t)E * 2 * I * H * 4);
            dn.data = malloc((size_t)E * H * I * 4);
            char nm[160];
            for (int x = 0; x < E; x++) {
                snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, x);
                memcpy(gu.data + (size_t)x * 2 * I * H, fx_find(s, nm)->data, (size_t)I * H * 4);
                snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, x);
                memcpy(gu.data + (size_t)x * 2 * I * H + (size_t)I * H, fx_find(s, nm)->data,
                       (size_t)I * H * 4);
                snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, x);
                memcpy(dn.data + (size_t)x * H * I, fx_find(s, nm)->data, (size_t)H * I * 4);
            }
            nb += fx_encode(&gu, o->dtype, &b[nb]);
            nb += fx_encode(&dn, o->dtype, &b[nb]);
            /* write the rounded values back so an F32 copy matches */
            for (int x = 0; x < E; x++) {
                snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, x);
                memcpy(fx_find(s, nm)->data, gu.data + (size_t)x * 2 * I * H, (size_t)I * H * 4);
                snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, x);
                memcpy(fx_find(s, nm)->data, gu.data + (size_t)x * 2 * I * H + (size_t)I * H,
                       (size_t)I * H * 4);
                snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, x);
                memcpy(fx_find(s, nm)->data, dn.data + (size_t)x * H * I, (size_t)H * I * 4);
            }
            free(gu.data);
            free(dn.data);
            continue;
        }
        nb += fx_encode(t, o->dtype, &b[nb]);
    }
    char path[512];
    int shards = o->shards > 1 ? o->shards : 1;
    if (shards == 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        fx_write_safetensors_blobs(path, b, nb);
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
        FILE *idx = fopen(path, "w");
        fprintf(idx, "{\"metadata\": {}, \"weight_map\": {");
        int per = (nb + shards - 1) / shards;
        for (int sh = 0; sh < shards; sh++) {
            int lo = sh * per, hi = lo + per < nb ? lo + per : nb;
            char fname[64];
            snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", sh + 1, shards);
            snprintf(path, sizeof(path), "%s/%s", dir, fname);
            fx_write_safetensors_blobs(path, b + lo, hi - lo);
            for (int i = lo; i < hi; i++)
                fprintf(idx, "%s\"%s\": \"%s\"", i ? ", " : "", b[i].name, fname);
        }
        fprintf(idx, "}}\n");
        fclose(idx);
    }
    for (int i = 0; i < nb; i++)
        free(b[i].bytes);
    free(b);
}

/* ---- GGUF ---- */

typedef struct fx_w {
    FILE *f;
} fx_w_t;

static void fx_gstr(FILE *f, const char *s)
{
    uint64_t n = strlen(s);
    fwrite(&n, 8, 1, f);
    fwrite(s, 1, n, f);
}

static void fx_gkv_u32(FILE *f, const char *k, uint32_t v)
{
    uint32_t t = 4;
    fx_gstr(f, k);
    fwrite(&t, 4, 1, f);
    fwrite(&v, 4, 1, f);
}

static void fx_gkv_f32(FILE *f, const char *k, float v)
{
    uint32_t t = 6;
    fx_gstr(f, k);
    fwrite(&t, 4, 1, f);
    fwrite(&v, 4, 1, f);
}

static void fx_gkv_bool(FILE *f, const char *k, bool v)
{
    uint32_t t = 7;
    uint8_t b = v;
    fx_gstr(f, k);
    fwrite(&t, 4, 1, f);
    fwrite(&b, 1, 1, f);
}

static void fx_gkv_str(FILE *f, const char *k, const char *v)
{
    uint32_t t = 8;
    fx_gstr(f, k);
    fwrite(&t, 4, 1, f);
    fx_gstr(f, v);
}

/* GGUF name of an HF tensor ("" when it is an expert folded into a stack). */
static void fx_gguf_name(const char *hf, char *out, size_t n)
{
    static const char *map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
        {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
        {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
        {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
        {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
        {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
        {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
        {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
    };
    int l, e;
    char rest[160];
    out[0] = '\0';
    if (strcmp(hf, "model.embed_tokens.weight") == 0)
        snprintf(out, n, "token_embd.weight");
    else if (strcmp(hf, "model.norm.weight") == 0)
        snprintf(out, n, "output_norm.weight");
    else if (strcmp(hf, "lm_head.weight") == 0)
        snprintf(out, n, "output.weight");
    else if (sscanf(hf, "model.layers.%d.mlp.experts.%d.%159s", &l, &e, rest) == 3)
        return;
    else if (sscanf(hf, "model.layers.%d.%159s", &l, rest) == 2)
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
            if (strcmp(rest, map[i][0]) == 0)
                snprintf(out, n, "blk.%d.%s", l, map[i][1]);
}

/* Row permutation HF (rotate halves) -> GGUF llama (rotate adjacent pairs), per head. */
static void fx_permute_rows(float *w, int heads, int hd, int cols)
{
    float *tmp = malloc((size_t)heads * hd * cols * 4);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++) {
            memcpy(tmp + ((size_t)h * hd + 2 * i) * cols, w + ((size_t)h * hd + i) * cols,
                   (size_t)cols * 4);
            memcpy(tmp + ((size_t)h * hd + 2 * i + 1) * cols,
                   w + ((size_t)h * hd + hd / 2 + i) * cols, (size_t)cols * 4);
        }
    memcpy(w, tmp, (size_t)heads * hd * cols * 4);
    free(tmp);
}

typedef struct fx_gt {
    char name[160];
    int ndim;
    int64_t shape[3]; /* outermost first */
    float *data;      /* owned copy */
} fx_gt_t;

/* Write `s` as a GGUF v3 file (llama or deepseek2) with matrices in F32 or Q8_0 (q8 = true;
 * rounds the set in place). Llama q/k rows are permuted to GGUF's adjacent-pair RoPE. */
static void fx_write_gguf(const char *path, fx_set_t *s, const fx_cfg_t *c, bool q8, bool split)
{
    fx_gt_t *g = calloc((size_t)s->n + 64, sizeof(*g));
    bool *keep_f32 = calloc((size_t)s->n + 64, sizeof(bool));
    int ng = 0;
    if (!c->deepseek && c->llama3) { /* llama.cpp's rope_freqs: divisors of each frequency */
        fx_gt_t *t = &g[ng++];
        int half = c->head_dim / 2;
        snprintf(t->name, sizeof(t->name), "rope_freqs.weight");
        t->ndim = 1;
        t->shape[0] = half;
        t->data = malloc((size_t)half * 4);
        for (int i = 0; i < half; i++) {
            double freq = pow(10000.0, -2.0 * i / c->head_dim), wl = 2 * M_PI / freq;
            double lo_wl = 64 / 1.0, hi_wl = 64 / 4.0, f = 8.0;
            if (wl < hi_wl)
                t->data[i] = 1.0f;
            else if (wl > lo_wl)
                t->data[i] = (float)f;
            else {
                double sm = (64 / wl - 1.0) / (4.0 - 1.0);
                t->data[i] = (float)(1.0 / ((1 - sm) / f + sm));
            }
        }
    }
    for (int i = 0; i < s->n; i++) {
        char gn[160];
        fx_gguf_name(s->t[i].name, gn, sizeof(gn));
        if (!gn[0])
            continue;
        if (split && strstr(gn, "attn_kv_b")) { /* [nh][nope+v][R] -> k_b [nh][R][nope], v_b */
            int nh = c->heads, R = c->kv_lora, np = c->nope, vd = c->vdim, l;
            sscanf(gn, "blk.%d.", &l);
            const float *kv = s->t[i].data;
            fx_gt_t *k = &g[ng], *v = &g[ng + 1];
            keep_f32[ng] = keep_f32[ng + 1] = true;
            ng += 2;
            snprintf(k->name, sizeof(k->name), "blk.%d.attn_k_b.weight", l);
            snprintf(v->name, sizeof(v->name), "blk.%d.attn_v_b.weight", l);
            k->ndim = v->ndim = 3;
            k->shape[0] = v->shape[0] = nh;
            k->shape[1] = R;
            k->shape[2] = np;
            v->shape[1] = vd;
            v->shape[2] = R;
            k->data = malloc((size_t)nh * R * np * 4);
            v->data = malloc((size_t)nh * vd * R * 4);
            for (int h = 0; h < nh; h++) {
                for (int r = 0; r < R; r++)
                    for (int d = 0; d < np; d++)
                        k->data[((size_t)h * R + r) * np + d] =
                            kv[((size_t)h * (np + vd) + d) * R + r];
                for (int j = 0; j < vd; j++)
                    for (int r = 0; r < R; r++)
                        v->data[((size_t)h * vd + j) * R + r] =
                            kv[((size_t)h * (np + vd) + np + j) * R + r];
            }
            continue;
        }
        fx_gt_t *t = &g[ng++];
        snprintf(t->name, sizeof(t->name), "%s", gn);
        t->ndim = s->t[i].ndim;
        memcpy(t->shape, s->t[i].shape, sizeof(t->shape));
        t->data = malloc((size_t)fx_count(&s->t[i]) * 4);
        memcpy(t->data, s->t[i].data, (size_t)fx_count(&s->t[i]) * 4);
        if (!c->deepseek && strstr(gn, "attn_q.weight"))
            fx_permute_rows(t->data, c->heads, c->head_dim, c->hidden);
        if (!c->deepseek && strstr(gn, "attn_k.weight"))
            fx_permute_rows(t->data, c->kv_heads, c->head_dim, c->hidden);
    }
    if (c->deepseek) /* stacked experts */
        for (int l = c->dense; l < c->layers; l++) {
            const char *kinds[3] = {"gate", "up", "down"};
            for (int k = 0; k < 3; k++) {
                fx_gt_t *t = &g[ng++];
                snprintf(t->name, sizeof(t->name), "blk.%d.ffn_%s_exps.weight", l, kinds[k]);
                t->ndim = 3;
                t->shape[0] = c->experts;
                t->shape[1] = k == 2 ? c->hidden : c->moe_inter;
                t->shape[2] = k == 2 ? c->moe_inter : c->hidden;
                size_t per = (size_t)c->hidden * c->moe_inter;
                t->data = malloc(per * c->experts * 4);
                for (int e = 0; e < c->experts; e++) {
                    char nm[160];
                    snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e,
                             kinds[k]);
                    memcpy(t->data + per * e, fx_find(s, nm)->data, per * 4);
                }
            }
        }
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    const char *a = c->deepseek ? "deepseek2" : "llama";
    char k[128];
    uint32_t ver = 3;
    uint64_t nt = (uint64_t)ng, nkv = c->deepseek ? 32 + split : 13;
    fwrite("GGUF", 1, 4, f);
    fwrite(&ver, 4, 1, f);
    fwrite(&nt, 8, 1, f);
    fwrite(&nkv, 8, 1, f);
#define K(x) (snprintf(k, sizeof(k), "%s." x, a), k)
    fx_gkv_str(f, "general.architecture", a);
    fx_gkv_u32(f, "general.alignment", 32);
    fx_gkv_u32(f, K("embedding_length"), (uint32_t)c->hidden);
    fx_gkv_u32(f, K("block_count"), (uint32_t)c->layers);
    fx_gkv_u32(f, K("feed_forward_length"), (uint32_t)c->inter);
    fx_gkv_u32(f, K("attention.head_count"), (uint32_t)c->heads);
    fx_gkv_u32(f, K("attention.head_count_kv"), (uint32_t)c->kv_heads);
    fx_gkv_f32(f, K("attention.layer_norm_rms_epsilon"), c->deepseek ? 1e-6f : 1e-5f);
    fx_gkv_f32(f, K("rope.freq_base"), 10000.0f);
    fx_gkv_u32(f, K("context_length"), 512);
    fx_gkv_u32(f, K("vocab_size"), (uint32_t)c->vocab);
    fx_gkv_u32(f, "tokenizer.ggml.bos_token_id", c->deepseek ? 0 : 1);
    fx_gkv_u32(f, "tokenizer.ggml.eos_token_id", c->deepseek ? 1 : 2);
    if (c->deepseek) {
        fx_gkv_u32(f, K("attention.q_lora_rank"), (uint32_t)c->q_lora);
        fx_gkv_u32(f, K("attention.kv_lora_rank"), (uint32_t)c->kv_lora);
        fx_gkv_u32(f, K("attention.key_length"), (uint32_t)(c->nope + c->rope));
        fx_gkv_u32(f, K("attention.value_length"), (uint32_t)(split ? c->kv_lora : c->vdim));
        if (split) /* llama.cpp's MLA form: key_length describes the latent, this the heads */
            fx_gkv_u32(f, K("attention.value_length_mla"), (uint32_t)c->vdim);
        fx_gkv_u32(f, K("rope.dimension_count"), (uint32_t)c->rope);
        fx_gkv_u32(f, K("leading_dense_block_count"), (uint32_t)c->dense);
        fx_gkv_u32(f, K("expert_feed_forward_length"), (uint32_t)c->moe_inter);
        fx_gkv_u32(f, K("expert_count"), (uint32_t)c->experts);
        fx_gkv_u32(f, K("expert_shared_count"), (uint32_t)c->shared);
        fx_gkv_u32(f, K("expert_used_count"), (uint32_t)c->topk);
        fx_gkv_u32(f, K("expert_group_count"), (uint32_t)c->groups);
        fx_gkv_u32(f, K("expert_group_used_count"), (uint32_t)c->topk_groups);
        fx_gkv_u32(f, K("expert_gating_func"), c->sigmoid ? 2 : 1);
        fx_gkv_f32(f, K("expert_weights_scale"), 2.5f);
        fx_gkv_bool(f, K("expert_weights_norm"), true);
        fx_gkv_str(f, K("rope.scaling.type"), "yarn");
        fx_gkv_f32(f, K("rope.scaling.factor"), 4.0f);
        fx_gkv_u32(f, K("rope.scaling.original_context_length"), 64);
        fx_gkv_f32(f, K("rope.scaling.yarn_log_multiplier"), 0.1f);
    }
#undef K
    uint64_t off = 0;
    for (int i = 0; i < ng; i++) {
        fx_gt_t *t = &g[i];
        fx_gstr(f, t->name);
        bool quant = q8 && t->ndim >= 2 && !keep_f32[i];
        uint32_t nd = (uint32_t)t->ndim, type = quant ? 8 : 0;
        fwrite(&nd, 4, 1, f);
        uint64_t cnt = 1;
        for (int d = t->ndim - 1; d >= 0; d--) {
            uint64_t ne = (uint64_t)t->shape[d];
            fwrite(&ne, 8, 1, f);
            cnt *= ne;
        }
        fwrite(&type, 4, 1, f);
        fwrite(&off, 8, 1, f);
        uint64_t bytes = type == 8 ? cnt / 32 * 34 : cnt * 4;
        off += (bytes + 31) / 32 * 32;
    }
    long pos = ftell(f);
    while (pos % 32) {
        fputc(0, f);
        pos++;
    }
    for (int i = 0; i < ng; i++) {
        fx_gt_t *t = &g[i];
        uint64_t cnt = 1;
        for (int d = 0; d < t->ndim; d++)
            cnt *= (uint64_t)t->shape[d];
        uint64_t bytes;
        if (q8 && t->ndim >= 2 && !keep_f32[i]) {
            bytes = cnt / 32 * 34;
            for (uint64_t b = 0; b < cnt / 32; b++) {
                float *x = t->data + b * 32, mx = 0;
                for (int j = 0; j < 32; j++)
                    mx = fmaxf(mx, fabsf(x[j]));
                float d = mx / 127.0f;
                uint16_t dh = fx_to_f16(&d);
                fwrite(&dh, 2, 1, f);
                for (int j = 0; j < 32; j++) {
                    int8_t q = (int8_t)(d > 0 ? lrintf(x[j] / d) : 0);
                    fwrite(&q, 1, 1, f);
                    x[j] = d * q;
                }
            }
        } else {
            bytes = cnt * 4;
            fwrite(t->data, 4, cnt, f);
        }
        for (uint64_t p = bytes; p % 32; p++)
            fputc(0, f);
    }
    fclose(f);
    /* write the Q8_0-rounded values back into the set (undoing the llama permutation) */
    if (q8)
        for (int i = 0; i < ng; i++) {
            fx_gt_t *t = &g[i];
            int l, end = 0;
            char kind[16];
            if (sscanf(t->name, "blk.%d.ffn_%15[a-z]_exps.weight%n", &l, kind, &end) == 2 &&
                end > 0 && t->name[end] == '\0') {
                size_t per = (size_t)c->hidden * c->moe_inter;
                for (int e = 0; e < c->experts; e++) {
                    char nm[160];
                    snprintf(nm, sizeof(nm), "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e,
                             kind);
                    memcpy(fx_find(s, nm)->data, t->data + per * e, per * 4);
                }
                continue;
            }
            for (int j = 0; j < s->n; j++) {
                char gn[160];
                fx_gguf_name(s->t[j].name, gn, sizeof(gn));
                if (strcmp(gn, t->name) != 0 || t->ndim < 2)
                    continue;
                int64_t cnt = fx_count(&s->t[j]);
                bool pq = !c->deepseek && strstr(gn, "attn_q.weight");
                bool pk = !c->deepseek && strstr(gn, "attn_k.weight");
                if (pq || pk) { /* inverse permutation: adjacent pairs back to halves */
                    int heads = pq ? c->heads : c->kv_heads, hd = c->head_dim, cols = c->hidden;
                    for (int h = 0; h < heads; h++)
                        for (int r = 0; r < hd / 2; r++) {
                            memcpy(s->t[j].data + ((size_t)h * hd + r) * cols,
                                   t->data + ((size_t)h * hd + 2 * r) * cols, (size_t)cols * 4);
                            memcpy(s->t[j].data + ((size_t)h * hd + hd / 2 + r) * cols,
                                   t->data + ((size_t)h * hd + 2 * r + 1) * cols, (size_t)cols * 4);
                        }
                } else {
                    memcpy(s->t[j].data, t->data, (size_t)cnt * 4);
                }
            }
        }
    for (int i = 0; i < ng; i++)
        free(g[i].data);
    free(g);
    free(keep_f32);
}

#endif
