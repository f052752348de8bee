/* modelgen.c: deterministic random-weight models in Hugging Face and GGUF layouts (see
 * td_modelgen.h). */
#include "td_modelgen.h"

#include "td_error.h"
#include "td_util.h"

#include <errno.h>
#include <stdarg.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Hyperparameters                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct mg_hp {
    int vocab, hidden, n_layers, n_heads, n_kv, head_dim, inter, max_pos;
    double rms_eps, rope_theta;
    bool tie;
    /* llama3 rope scaling (llama) */
    double l3_factor, l3_low, l3_high;
    int l3_orig;
    /* MLA + MoE (DeepSeek) */
    int q_lora, kv_lora, nope, rope, v_dim;
    int n_exp, n_shared, top_k, moe_inter, n_group, topk_group, first_dense;
    double routed_scale, yarn_factor, yarn_mscale;
    int yarn_orig;
    bool norm_topk;
} mg_hp_t;

static bool is_deepseek(td_modelgen_arch_t a)
{
    return a == TD_MODELGEN_DEEPSEEK_V2 || a == TD_MODELGEN_DEEPSEEK_V3;
}

static void hp_init(mg_hp_t *h, td_modelgen_arch_t arch, td_modelgen_preset_t preset)
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
}

/* ------------------------------------------------------------------------------------------ */
/* The tensor list (Hugging Face names, per-expert form)                                       */
/* ------------------------------------------------------------------------------------------ */

enum { K_EMBED, K_LINEAR, K_NORM, K_FINAL_NORM, K_ROUTER, K_BIAS };

typedef struct mg_tensor {
    char name[96];
    int64_t rows; /* 1-D tensors: rows = length, cols = 0 */
    int64_t cols;
    int kind;
    bool fp8_ok; /* a linear weight DeepSeek's checkpoints store as F8_E4M3 */
} mg_tensor_t;

typedef struct mg_list {
    mg_tensor_t *t; /* [n] */
    int n, cap;
} mg_list_t;

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

static const mg_tensor_t *list_find(const mg_list_t *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0)
            return &l->t[i];
    return NULL;
}

static bool layer_is_moe(const mg_hp_t *h, td_modelgen_arch_t arch, int i)
{
    return is_deepseek(arch) && h->n_exp > 0 && i >= h->first_dense;
}

static int build_list(const mg_hp_t *h, td_modelgen_arch_t arch, mg_list_t *l)
{
    int r = 0;
    int H = h->hidden;
    r |= list_add(l, K_EMBED, h->vocab, H, "model.embed_tokens.weight");
    for (int i = 0; i < h->n_layers && r == 0; i++) {
        char p[48];
        snprintf(p, sizeof(p), "model.layers.%d", i);
        r |= list_add(l, K_NORM, H, 0, "%s.input_layernorm.weight", p);
        r |= list_add(l, K_NORM, H, 0, "%s.post_attention_layernorm.weight", p);
        if (!is_deepseek(arch)) {
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
        if (layer_is_moe(h, arch, i)) {
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

static int64_t numel(const mg_tensor_t *t)
{
    return t->cols ? t->rows * t->cols : t->rows;
}

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Raw fp32 values of tensor `t`, out[numel]: a normal stream from (seed, name), scaled by kind. */
static void gen_raw(uint64_t seed, const mg_tensor_t *t, int hidden, float *out)
{
    uint64_t s = seed ^ fnv1a64(t->name);
    int64_t n = numel(t);
    double std, mean = 0.0;
    switch (t->kind) {
    case K_EMBED:
        std = 1.0 / sqrt((double)hidden);
        break;
    case K_NORM:
        mean = 1.0;
        std = 0.1;
        break;
    case K_FINAL_NORM: /* scales the logits to a standard deviation of about 3 */
        mean = 3.0;
        std = 0.3;
        break;
    case K_BIAS:
        std = 0.1;
        break;
    default: /* K_LINEAR, K_ROUTER */
        std = 1.0 / sqrt((double)t->cols);
        break;
    }
    for (int64_t i = 0; i < n; i += 2) {
        /* Box-Muller: u1 in (0, 1], u2 in [0, 1) */
        double u1 = ((double)(splitmix64(&s) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(splitmix64(&s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        out[i] = (float)(mean + std * r * cos(2.0 * M_PI * u2));
        if (i + 1 < n)
            out[i + 1] = (float)(mean + std * r * sin(2.0 * M_PI * u2));
    }
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half, value / 2^-24 rounded to even */
        float v;
        memcpy(&v, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(v * 16777216.0f));
    }
    ax += 0xc8000fffu + ((ax >> 13) & 1u); /* rebias exponent by -112, round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 0x400u), (int)e - 25);
    uint32_t x;
    memcpy(&x, &v, 4);
    x |= sign;
    memcpy(&v, &x, 4);
    return v;
}

/* E4M3 ("e4m3fn"): codes 0..126 are the non-negative finite values in increasing order. */
static float e4m3_value(int code)
{
    int e = (code >> 3) & 0xf, m = code & 7;
    return e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

/* Nearest E4M3 code to x (ties to the even code), saturating at +-448. */
static uint8_t f32_to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (!(a < 448.0f))
        return sign | 126;
    if (a < 0x1p-6f) /* subnormal: steps of 2^-9; 8 steps is 2^-6, code 8 */
        return (uint8_t)(sign | (uint8_t)lrintf(a * 512.0f));
    uint32_t u;
    memcpy(&u, &a, 4);
    u += 0x7ffffu + ((u >> 20) & 1u); /* keep 3 mantissa bits, round to nearest even */
    int code = ((int)(u >> 23) - 127 + 7) << 3 | (int)((u >> 20) & 7u);
    return (uint8_t)(sign | (code > 126 ? 126 : code));
}

#define FP8_BLOCK 128

/* DeepSeek's block quantisation of w [rows][cols]: per 128x128 block, scale = amax / 448,
 * q = e4m3(w / scale). q [rows][cols], scale [ceil(rows/128)][ceil(cols/128)]. */
static void fp8_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale)
{
    int64_t sc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    for (int64_t br = 0; br < rows; br += FP8_BLOCK) {
        for (int64_t bc = 0; bc < cols; bc += FP8_BLOCK) {
            int64_t re = TD_MIN(br + FP8_BLOCK, rows), ce = TD_MIN(bc + FP8_BLOCK, cols);
            float amax = 0.0f;
            for (int64_t r = br; r < re; r++)
                for (int64_t c = bc; c < ce; c++)
                    amax = fmaxf(amax, fabsf(w[r * cols + c]));
            float s = amax > 0.0f ? amax / 448.0f : 1.0f;
            scale[(br / FP8_BLOCK) * sc + bc / FP8_BLOCK] = s;
            for (int64_t r = br; r < re; r++)
                for (int64_t c = bc; c < ce; c++)
                    q[r * cols + c] = f32_to_e4m3(w[r * cols + c] / s);
        }
    }
}

typedef struct mg_ctx {
    const td_modelgen_opts_t *o;
    mg_hp_t hp;
    mg_list_t list;
    bool use_fp8;
} mg_ctx_t;

static bool tensor_fp8(const mg_ctx_t *c, const mg_tensor_t *t)
{
    return c->use_fp8 && t->fp8_ok;
}

/* The values the safetensors copy holds for `t` (after its dtype's rounding, or FP8 quantise +
 * dequantise), out[numel]. */
static int canonical(const mg_ctx_t *c, const mg_tensor_t *t, float *out)
{
    int64_t n = numel(t);
    gen_raw(c->o->seed, t, c->hp.hidden, out);
    if (tensor_fp8(c, t)) {
        int64_t sr = (t->rows + FP8_BLOCK - 1) / FP8_BLOCK,
                sc = (t->cols + FP8_BLOCK - 1) / FP8_BLOCK;
        uint8_t *q = malloc((size_t)n);
        float *s = td_calloc((size_t)(sr * sc), sizeof(float));
        if (!q || !s) {
            free(q);
            free(s);
            return TD_ENOMEM;
        }
        fp8_quantize(out, t->rows, t->cols, q, s);
        for (int64_t r = 0; r < t->rows; r++)
            for (int64_t k = 0; k < t->cols; k++) {
                uint8_t b = q[r * t->cols + k];
                float v = e4m3_value(b & 0x7f) * s[(r / FP8_BLOCK) * sc + k / FP8_BLOCK];
                out[r * t->cols + k] = (b & 0x80) ? -v : v;
            }
        free(q);
        free(s);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        if (c->o->dtype == TD_MODELGEN_BF16)
            out[i] = bf16_to_f32(f32_to_bf16(out[i]));
        else if (c->o->dtype == TD_MODELGEN_F16)
            out[i] = f16_to_f32(f32_to_f16(out[i]));
    }
    return 0;
}

static int canonical_by_name(const mg_ctx_t *c, const char *name, float *out)
{
    const mg_tensor_t *t = list_find(&c->list, name);
    TD_ASSERT(t != NULL);
    return canonical(c, t, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Output files                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct mg_file {
    FILE *f;
    char *path;
} mg_file_t;

static int file_open(mg_file_t *mf, const char *dir, const char *name)
{
    td_buf_t p;
    td_buf_init(&p);
    if (td_buf_printf(&p, "%s/%s", dir, name) != 0)
        return TD_ENOMEM;
    mf->path = td_buf_steal(&p, NULL);
    mf->f = fopen(mf->path, "wb");
    if (!mf->f) {
        int e = errno;
        int err = td_err_set(td_err_from_errno(e), "%s: %s", mf->path, strerror(e));
        free(mf->path);
        mf->path = NULL;
        return err;
    }
    return 0;
}

static int file_write(mg_file_t *mf, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, mf->f) != n) {
        int e = errno;
        return td_err_set(e == ENOSPC ? TD_ENOSPC : TD_EIO, "%s: write: %s", mf->path, strerror(e));
    }
    return 0;
}

static int file_pad(mg_file_t *mf, size_t n)
{
    static const uint8_t zeros[64];
    TD_ASSERT(n <= sizeof(zeros));
    return file_write(mf, zeros, n);
}

static int file_close(mg_file_t *mf, int err)
{
    if (mf->f) {
        if (fclose(mf->f) != 0 && err == 0) {
            int e = errno;
            err = td_err_set(td_err_from_errno(e), "%s: close: %s", mf->path, strerror(e));
        }
        if (err)
            remove(mf->path);
    }
    free(mf->path);
    mf->f = NULL;
    mf->path = NULL;
    return err;
}

static int write_text(const char *dir, const char *name, const td_buf_t *b)
{
    mg_file_t mf = {0};
    int err = file_open(&mf, dir, name);
    if (err)
        return err;
    err = file_write(&mf, b->data, b->len);
    return file_close(&mf, err);
}

/* Remove dir/name if it exists, so that a rewritten directory holds no stale weight files that a
 * loader would prefer (an index next to a single file). */
static void remove_stale(const char *dir, const char *name)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) < sizeof(path))
        (void)unlink(path);
}

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct mg_tok {
    char **tokens; /* [vocab] token strings by id (NULL for an unused id) */
    int *types;    /* [vocab] GGUF token types: 1 normal, 3 control, 4 user-defined, 5 unused */
    int vocab;
    char **merges; /* [n_merges] "a b" */
    int n_merges;
    int bos, eos;    /* -1 when unknown */
    const char *pre; /* GGUF tokenizer.ggml.pre */
    char *json, *cfg_json;
    size_t json_len, cfg_len;
} mg_tok_t;

static void tok_free(mg_tok_t *t)
{
    for (int i = 0; t->tokens && i < t->vocab; i++)
        free(t->tokens[i]);
    for (int i = 0; t->merges && i < t->n_merges; i++)
        free(t->merges[i]);
    free(t->tokens);
    free(t->types);
    free(t->merges);
    free(t->json);
    free(t->cfg_json);
    memset(t, 0, sizeof(*t));
}

static int tok_lookup(json_object *vocab, json_object *added, const char *s)
{
    json_object *v;
    if (json_object_object_get_ex(vocab, s, &v))
        return json_object_get_int(v);
    size_t n = json_object_array_length(added);
    for (size_t i = 0; i < n; i++) {
        json_object *a = json_object_array_get_idx(added, i), *c, *id;
        if (json_object_object_get_ex(a, "content", &c) &&
            json_object_object_get_ex(a, "id", &id) && strcmp(json_object_get_string(c), s) == 0)
            return json_object_get_int(id);
    }
    return -1;
}

/* bos_token / eos_token in tokenizer_config.json: a string, {"content": ...}, or null. */
static int tok_special(json_object *cfg, const char *key, json_object *vocab, json_object *added)
{
    json_object *v, *c;
    if (!json_object_object_get_ex(cfg, key, &v) || !v)
        return -1;
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &c))
        v = c;
    if (!json_object_is_type(v, json_type_string))
        return -1;
    return tok_lookup(vocab, added, json_object_get_string(v));
}

static int tok_load(mg_tok_t *t, const char *dir)
{
    td_buf_t p;
    json_object *root = NULL, *cfg = NULL, *model, *vocab, *added, *merges;
    int err;
    memset(t, 0, sizeof(*t));
    t->bos = t->eos = -1;
    td_buf_init(&p);
    if (td_buf_printf(&p, "%s/tokenizer.json", dir) != 0)
        return TD_ENOMEM;
    err = td_file_read_all(p.data, &t->json, &t->json_len);
    if (err)
        goto out;
    td_buf_reset(&p);
    td_buf_printf(&p, "%s/tokenizer_config.json", dir);
    err = td_file_read_all(p.data, &t->cfg_json, &t->cfg_len);
    if (err)
        goto out;
    td_buf_reset(&p);
    td_buf_printf(&p, "%s/tokenizer.json", dir);
    root = json_tokener_parse(t->json);
    cfg = json_tokener_parse(t->cfg_json);
    if (!root || !cfg) {
        err = td_err_set(TD_EPARSE, "%s/%s: not valid JSON", dir,
                         root ? "tokenizer_config.json" : "tokenizer.json");
        goto out;
    }
    if (!json_object_object_get_ex(root, "model", &model) ||
        !json_object_object_get_ex(model, "vocab", &vocab) ||
        !json_object_is_type(vocab, json_type_object)) {
        err = td_err_set(TD_EPARSE, "%s: field \"model.vocab\" missing or not an object", p.data);
        goto out;
    }
    if (!json_object_object_get_ex(root, "added_tokens", &added) ||
        !json_object_is_type(added, json_type_array)) {
        err = td_err_set(TD_EPARSE, "%s: field \"added_tokens\" missing or not an array", p.data);
        goto out;
    }
    int max_id = -1;
    json_object_object_foreach(vocab, k0, v0)
    {
        (void)k0;
        max_id = TD_MAX(max_id, json_object_get_int(v0));
    }
    size_t n_added = json_object_array_length(added);
    for (size_t i = 0; i < n_added; i++) {
        json_object *id;
        if (json_object_object_get_ex(json_object_array_get_idx(added, i), "id", &id))
            max_id = TD_MAX(max_id, json_object_get_int(id));
    }
    if (max_id < 0 || max_id > 10000000) {
        err = td_err_set(TD_EPARSE, "%s: vocabulary is empty or has ids out of range", p.data);
        goto out;
    }
    t->vocab = max_id + 1;
    t->tokens = td_calloc((size_t)t->vocab, sizeof(char *));
    t->types = td_calloc((size_t)t->vocab, sizeof(int));
    if (!t->tokens || !t->types) {
        err = TD_ENOMEM;
        goto out;
    }
    json_object_object_foreach(vocab, k, v)
    {
        int id = json_object_get_int(v);
        if (id < 0 || t->tokens[id])
            continue;
        if (!(t->tokens[id] = td_strdup(k))) {
            err = TD_ENOMEM;
            goto out;
        }
        t->types[id] = 1;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i), *id, *c, *sp;
        if (!json_object_object_get_ex(a, "id", &id) ||
            !json_object_object_get_ex(a, "content", &c))
            continue;
        int tid = json_object_get_int(id);
        if (tid < 0)
            continue;
        free(t->tokens[tid]);
        if (!(t->tokens[tid] = td_strdup(json_object_get_string(c)))) {
            err = TD_ENOMEM;
            goto out;
        }
        bool special = json_object_object_get_ex(a, "special", &sp) && json_object_get_boolean(sp);
        t->types[tid] = special ? 3 : 4;
    }
    if (json_object_object_get_ex(model, "merges", &merges) &&
        json_object_is_type(merges, json_type_array)) {
        size_t nm = json_object_array_length(merges);
        t->merges = td_calloc(nm ? nm : 1, sizeof(char *));
        if (!t->merges) {
            err = TD_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < nm; i++) {
            json_object *m = json_object_array_get_idx(merges, i);
            td_buf_t mb;
            td_buf_init(&mb);
            if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2)
                err = td_buf_printf(&mb, "%s %s",
                                    json_object_get_string(json_object_array_get_idx(m, 0)),
                                    json_object_get_string(json_object_array_get_idx(m, 1)));
            else
                err = td_buf_append_str(&mb, json_object_get_string(m));
            if (err) {
                td_buf_free(&mb);
                goto out;
            }
            t->merges[t->n_merges++] = td_buf_steal(&mb, NULL);
        }
    }
    t->bos = tok_special(cfg, "bos_token", vocab, added);
    t->eos = tok_special(cfg, "eos_token", vocab, added);
    if (tok_lookup(vocab, added, "<|begin_of_text|>") >= 0)
        t->pre = "llama-bpe";
    else if (tok_lookup(vocab, added,
                        "<\xef\xbd\x9c"
                        "begin\xe2\x96\x81of\xe2\x96\x81sentence"
                        "\xef\xbd\x9c>") >= 0)
        t->pre = "deepseek-v3";
    else if (tok_lookup(vocab, added, "<|im_start|>") >= 0)
        t->pre = "qwen2";
    else
        t->pre = "default";
    err = 0;
out:
    if (root)
        json_object_put(root);
    if (cfg)
        json_object_put(cfg);
    td_buf_free(&p);
    if (err)
        tok_free(t);
    return err;
}

/* Without a tokenizer: GPT-2 byte-level tokens for ids 0..255, <s> 256, </s> 257, then
 * <|extra_N|> control tokens; no merges (so every text tokenizes to bytes). */
static int tok_synthetic(mg_tok_t *t, int vocab)
{
    memset(t, 0, sizeof(*t));
    t->vocab = vocab;
    t->bos = 256;
    t->eos = 257;
    t->pre = "default";
    t->tokens = td_calloc((size_t)vocab, sizeof(char *));
    t->types = td_calloc((size_t)vocab, sizeof(int));
    if (!t->tokens || !t->types)
        goto oom;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)extra++;
        char s[5] = {0};
        td_utf8_encode(cp, s);
        if (!(t->tokens[b] = td_strdup(s)))
            goto oom;
        t->types[b] = 1;
    }
    for (int i = 256; i < vocab; i++) {
        char s[32];
        if (i == 256)
            snprintf(s, sizeof(s), "<s>");
        else if (i == 257)
            snprintf(s, sizeof(s), "</s>");
        else
            snprintf(s, sizeof(s), "<|extra_%d|>", i - 258);
        if (!(t->tokens[i] = td_strdup(s)))
            goto oom;
        t->types[i] = 3;
    }
    return 0;
oom:
    tok_free(t);
    return TD_ENOMEM;
}

/* ------------------------------------------------------------------------------------------ */
/* config.json                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static const char *torch_dtype_name(td_modelgen_dtype_t d)
{
    return d == TD_MODELGEN_BF16 ? "bfloat16" : d == TD_MODELGEN_F16 ? "float16" : "float32";
}

/* A JSON number that reads back as a float (500000.0, 1e-06). */
static const char *jf(char *buf, double v)
{
    snprintf(buf, 32, "%.9g", v);
    if (!strpbrk(buf, ".eE"))
        strcat(buf, ".0");
    return buf;
}

static int write_config(const mg_ctx_t *c, const mg_tok_t *tok)
{
    const mg_hp_t *h = &c->hp;
    td_modelgen_arch_t arch = c->o->arch;
    td_buf_t b;
    char f1[40], f2[40], f3[40];
    td_buf_init(&b);
    static const char *archs[] = {"LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV2ForCausalLM",
                                  "DeepseekV3ForCausalLM"};
    static const char *types[] = {"llama", "qwen3", "deepseek_v2", "deepseek_v3"};
    int e = 0;
    e |= td_buf_printf(&b, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
                       archs[arch], types[arch]);
    e |= td_buf_printf(
        &b,
        "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
        "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
        "  \"num_key_value_heads\": %d,\n",
        h->vocab, h->hidden, h->inter, h->n_layers, h->n_heads, h->n_kv);
    if (!is_deepseek(arch))
        e |= td_buf_printf(&b, "  \"head_dim\": %d,\n", h->head_dim);
    e |= td_buf_printf(&b,
                       "  \"hidden_act\": \"silu\",\n  \"max_position_embeddings\": %d,\n"
                       "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n"
                       "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n",
                       h->max_pos, jf(f1, h->rms_eps), jf(f2, h->rope_theta));
    if (arch == TD_MODELGEN_LLAMA) {
        e |= td_buf_printf(&b,
                           "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %s, "
                           "\"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                           "\"original_max_position_embeddings\": %d},\n"
                           "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1,\n",
                           jf(f1, h->l3_factor), jf(f2, h->l3_low), jf(f3, h->l3_high), h->l3_orig);
    } else if (arch == TD_MODELGEN_QWEN3) {
        e |= td_buf_printf(&b,
                           "  \"rope_scaling\": null,\n  \"use_sliding_window\": false,\n"
                           "  \"sliding_window\": null,\n  \"max_window_layers\": %d,\n",
                           h->n_layers);
    } else {
        bool v3 = arch == TD_MODELGEN_DEEPSEEK_V3;
        if (h->q_lora)
            e |= td_buf_printf(&b, "  \"q_lora_rank\": %d,\n", h->q_lora);
        else
            e |= td_buf_printf(&b, "  \"q_lora_rank\": null,\n");
        e |= td_buf_printf(
            &b,
            "  \"kv_lora_rank\": %d,\n  \"qk_nope_head_dim\": %d,\n  \"qk_rope_head_dim\": %d,\n"
            "  \"v_head_dim\": %d,\n  \"moe_intermediate_size\": %d,\n"
            "  \"n_routed_experts\": %d,\n  \"n_shared_experts\": %d,\n"
            "  \"num_experts_per_tok\": %d,\n  \"n_group\": %d,\n  \"topk_group\": %d,\n"
            "  \"first_k_dense_replace\": %d,\n  \"moe_layer_freq\": 1,\n"
            "  \"scoring_func\": \"%s\",\n  \"topk_method\": \"%s\",\n"
            "  \"norm_topk_prob\": %s,\n  \"routed_scaling_factor\": %s,\n",
            h->kv_lora, h->nope, h->rope, h->v_dim, h->moe_inter, h->n_exp, h->n_shared, h->top_k,
            h->n_group, h->topk_group, h->first_dense, v3 ? "sigmoid" : "softmax",
            v3 ? "noaux_tc" : "group_limited_greedy", h->norm_topk ? "true" : "false",
            jf(f1, h->routed_scale));
        if (v3)
            e |= td_buf_printf(&b, "  \"rope_interleave\": true,\n"
                                   "  \"num_nextn_predict_layers\": 0,\n");
        e |= td_buf_printf(&b,
                           "  \"rope_scaling\": {\"type\": \"yarn\", \"rope_type\": \"yarn\", "
                           "\"factor\": %s, \"original_max_position_embeddings\": %d, "
                           "\"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": %s, "
                           "\"mscale_all_dim\": %s},\n",
                           jf(f1, h->yarn_factor), h->yarn_orig, jf(f2, h->yarn_mscale),
                           jf(f3, h->yarn_mscale));
        if (c->use_fp8)
            e |= td_buf_printf(&b, "  \"quantization_config\": {\"activation_scheme\": "
                                   "\"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\", "
                                   "\"weight_block_size\": [128, 128]},\n");
    }
    if (tok->bos >= 0)
        e |= td_buf_printf(&b, "  \"bos_token_id\": %d,\n", tok->bos);
    else
        e |= td_buf_printf(&b, "  \"bos_token_id\": null,\n");
    if (tok->eos >= 0)
        e |= td_buf_printf(&b, "  \"eos_token_id\": %d,\n", tok->eos);
    else
        e |= td_buf_printf(&b, "  \"eos_token_id\": null,\n");
    e |= td_buf_printf(&b,
                       "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n"
                       "  \"use_cache\": true,\n  \"tandem_mkmodel_seed\": %llu\n}\n",
                       h->tie ? "true" : "false", torch_dtype_name(c->o->dtype),
                       (unsigned long long)c->o->seed);
    int err = e ? TD_ENOMEM : write_text(c->o->out_dir, "config.json", &b);
    td_buf_free(&b);
    return err;
}

/* ------------------------------------------------------------------------------------------ */
/* safetensors                                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum { ST_PLAIN, ST_FP8_W, ST_FP8_SCALE, ST_FUSED_GATE_UP, ST_FUSED_DOWN };

typedef struct st_entry {
    char name[96];
    int what;               /* ST_* */
    const mg_tensor_t *src; /* ST_PLAIN, ST_FP8_*: the tensor; fused: expert 0's gate/down */
    int layer;              /* fused: layer index */
    int ndim;
    int64_t shape[3];
    const char *dtype; /* "F32", "BF16", "F16", "F8_E4M3" */
    size_t nbytes;
    int shard;
} st_entry_t;

static size_t dtype_size(td_modelgen_dtype_t d)
{
    return d == TD_MODELGEN_F32 ? 4 : 2;
}

static const char *st_dtype_name(td_modelgen_dtype_t d)
{
    return d == TD_MODELGEN_BF16 ? "BF16" : d == TD_MODELGEN_F16 ? "F16" : "F32";
}

static void encode(td_modelgen_dtype_t d, const float *v, int64_t n, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        if (d == TD_MODELGEN_F32) {
            memcpy(out + 4 * i, &v[i], 4);
        } else {
            uint16_t h = d == TD_MODELGEN_BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
            memcpy(out + 2 * i, &h, 2); /* little-endian host */
        }
    }
}

/* The safetensors entries in file order. Fused experts replace the per-expert names. */
static int st_entries(const mg_ctx_t *c, st_entry_t **out, int *n_out)
{
    const mg_hp_t *h = &c->hp;
    st_entry_t *v = td_calloc((size_t)c->list.n * 2 + 8, sizeof(*v));
    if (!v)
        return TD_ENOMEM;
    int n = 0;
    for (int i = 0; i < c->list.n; i++) {
        const mg_tensor_t *t = &c->list.t[i];
        int layer = -1, ex = -1;
        char proj[16] = "";
        if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj", &layer, &ex, proj) ==
                3 &&
            c->o->fused_experts) {
            if (ex != 0 || strcmp(proj, "up") == 0)
                continue;
            st_entry_t *e = &v[n++];
            bool gu = strcmp(proj, "gate") == 0;
            snprintf(e->name, sizeof(e->name), "model.layers.%d.mlp.experts.%s", layer,
                     gu ? "gate_up_proj" : "down_proj");
            e->what = gu ? ST_FUSED_GATE_UP : ST_FUSED_DOWN;
            e->src = t;
            e->layer = layer;
            e->ndim = 3;
            e->shape[0] = h->n_exp;
            e->shape[1] = gu ? 2 * t->rows : t->rows;
            e->shape[2] = t->cols;
            e->dtype = st_dtype_name(c->o->dtype);
            e->nbytes = (size_t)(e->shape[0] * e->shape[1] * e->shape[2]) * dtype_size(c->o->dtype);
            continue;
        }
        st_entry_t *e = &v[n++];
        snprintf(e->name, sizeof(e->name), "%s", t->name);
        e->src = t;
        e->ndim = t->cols ? 2 : 1;
        e->shape[0] = t->rows;
        e->shape[1] = t->cols;
        if (tensor_fp8(c, t)) {
            e->what = ST_FP8_W;
            e->dtype = "F8_E4M3";
            e->nbytes = (size_t)numel(t);
            st_entry_t *s = &v[n++];
            snprintf(s->name, sizeof(s->name), "%s_scale_inv", t->name);
            s->what = ST_FP8_SCALE;
            s->src = t;
            s->ndim = 2;
            s->shape[0] = (t->rows + FP8_BLOCK - 1) / FP8_BLOCK;
            s->shape[1] = (t->cols + FP8_BLOCK - 1) / FP8_BLOCK;
            s->dtype = "F32";
            s->nbytes = (size_t)(s->shape[0] * s->shape[1]) * 4;
        } else {
            e->what = ST_PLAIN;
            e->dtype = st_dtype_name(c->o->dtype);
            e->nbytes = (size_t)numel(t) * dtype_size(c->o->dtype);
        }
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* Bytes of entry `e` into out[e->nbytes]. */
static int st_produce(const mg_ctx_t *c, const st_entry_t *e, uint8_t *out)
{
    const mg_tensor_t *t = e->src;
    int64_t n = numel(t);
    float *w = td_calloc((size_t)n, sizeof(float));
    int err = 0;
    if (!w)
        return TD_ENOMEM;
    switch (e->what) {
    case ST_PLAIN:
        err = canonical(c, t, w);
        if (!err)
            encode(c->o->dtype, w, n, out);
        break;
    case ST_FP8_W:
    case ST_FP8_SCALE: {
        size_t ns = (size_t)(((t->rows + FP8_BLOCK - 1) / FP8_BLOCK) *
                             ((t->cols + FP8_BLOCK - 1) / FP8_BLOCK));
        uint8_t *q = malloc((size_t)n);
        float *s = td_calloc(ns, sizeof(float));
        if (!q || !s) {
            err = TD_ENOMEM;
        } else {
            gen_raw(c->o->seed, t, c->hp.hidden, w);
            fp8_quantize(w, t->rows, t->cols, q, s);
            if (e->what == ST_FP8_W)
                memcpy(out, q, (size_t)n);
            else
                memcpy(out, s, ns * sizeof(float));
        }
        free(q);
        free(s);
        break;
    }
    case ST_FUSED_GATE_UP:
    case ST_FUSED_DOWN: {
        size_t esz = dtype_size(c->o->dtype);
        size_t off = 0;
        for (int ex = 0; ex < c->hp.n_exp && !err; ex++) {
            const char *projs[2] = {e->what == ST_FUSED_GATE_UP ? "gate" : "down", "up"};
            int np = e->what == ST_FUSED_GATE_UP ? 2 : 1;
            for (int k = 0; k < np && !err; k++) {
                char name[96];
                snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%d.%s_proj.weight",
                         e->layer, ex, projs[k]);
                err = canonical_by_name(c, name, w);
                if (!err)
                    encode(c->o->dtype, w, n, out + off);
                off += (size_t)n * esz;
            }
        }
        break;
    }
    }
    free(w);
    return err;
}

static int st_write_shard(const mg_ctx_t *c, const st_entry_t *v, int n, int shard,
                          const char *fname)
{
    td_buf_t hdr;
    mg_file_t mf = {0};
    uint8_t *buf = NULL;
    int err;
    size_t off = 0, maxb = 0;
    td_buf_init(&hdr);
    err = td_buf_append_str(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n && !err; i++) {
        if (v[i].shard != shard)
            continue;
        err |= td_buf_printf(&hdr, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", v[i].name, v[i].dtype);
        for (int d = 0; d < v[i].ndim; d++)
            err |= td_buf_printf(&hdr, "%s%lld", d ? "," : "", (long long)v[i].shape[d]);
        err |= td_buf_printf(&hdr, "],\"data_offsets\":[%zu,%zu]}", off, off + v[i].nbytes);
        off += v[i].nbytes;
        maxb = TD_MAX(maxb, v[i].nbytes);
    }
    err |= td_buf_append_char(&hdr, '}');
    while (!err && hdr.len % 8)
        err = td_buf_append_char(&hdr, ' ');
    if (err) {
        err = TD_ENOMEM;
        goto out;
    }
    buf = malloc(maxb ? maxb : 1);
    if (!buf) {
        err = TD_ENOMEM;
        goto out;
    }
    err = file_open(&mf, c->o->out_dir, fname);
    if (err)
        goto out;
    uint64_t hl = hdr.len;
    err = file_write(&mf, &hl, 8);
    if (!err)
        err = file_write(&mf, hdr.data, hdr.len);
    for (int i = 0; i < n && !err; i++) {
        if (v[i].shard != shard)
            continue;
        err = st_produce(c, &v[i], buf);
        if (!err)
            err = file_write(&mf, buf, v[i].nbytes);
    }
    err = file_close(&mf, err);
out:
    free(buf);
    td_buf_free(&hdr);
    return err;
}

static int write_safetensors(const mg_ctx_t *c, int *n_files)
{
    st_entry_t *v = NULL;
    int n = 0, err = st_entries(c, &v, &n);
    if (err)
        return err;
    int shards = TD_MAX(1, c->o->shards);
    size_t total = 0, acc = 0;
    for (int i = 0; i < n; i++)
        total += v[i].nbytes;
    /* Fill shard k until it holds about k+1 / shards of the bytes; a scale stays with its weight.
     */
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].what != ST_FP8_SCALE && k < shards - 1 &&
            acc >= total / (size_t)shards * (size_t)(k + 1))
            k++;
        v[i].shard = k;
        acc += v[i].nbytes;
    }
    if (shards == 1) {
        remove_stale(c->o->out_dir, "model.safetensors.index.json");
        err = st_write_shard(c, v, n, 0, "model.safetensors");
    } else {
        td_buf_t idx;
        td_buf_init(&idx);
        err = td_buf_printf(&idx, "{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {",
                            total);
        for (int i = 0; i < n && !err; i++)
            err = td_buf_printf(&idx, "%s\n    \"%s\": \"model-%05d-of-%05d.safetensors\"",
                                i ? "," : "", v[i].name, v[i].shard + 1, shards);
        if (!err)
            err = td_buf_append_str(&idx, "\n  }\n}\n");
        remove_stale(c->o->out_dir, "model.safetensors");
        for (int s = 0; s < shards && !err; s++) {
            char fname[64];
            snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", s + 1, shards);
            err = st_write_shard(c, v, n, s, fname);
        }
        if (!err)
            err = write_text(c->o->out_dir, "model.safetensors.index.json", &idx);
        td_buf_free(&idx);
    }
    *n_files = shards;
    free(v);
    return err;
}

/* ------------------------------------------------------------------------------------------ */
/* GGUF v3                                                                                     */
/* ------------------------------------------------------------------------------------------ */

enum { GT_F32 = 0, GT_F16 = 1, GT_Q8_0 = 8 };
enum { GV_U32 = 4, GV_I32 = 5, GV_F32 = 6, GV_BOOL = 7, GV_STR = 8, GV_ARR = 9 };
#define GGUF_ALIGN 32

enum { GS_PLAIN, GS_PERMUTE_Q, GS_PERMUTE_K, GS_STACK, GS_K_B, GS_V_B, GS_ROPE_FREQS };

typedef struct gg_entry {
    char name[96];
    int what;     /* GS_* */
    char src[96]; /* HF name (GS_STACK: "model.layers.L.mlp.experts.%d.P_proj.weight" pattern) */
    int ndim;
    int64_t ne[3]; /* GGUF order: ne[0] is the row length */
    int type;      /* GT_* */
    size_t nbytes;
    size_t offset;
} gg_entry_t;

static size_t gg_bytes(int type, int64_t n)
{
    return type == GT_F32 ? (size_t)n * 4 : type == GT_F16 ? (size_t)n * 2 : (size_t)n / 32 * 34;
}

typedef struct gg_list {
    gg_entry_t *e;
    int n, cap;
} gg_list_t;

static gg_entry_t *gg_add(gg_list_t *l, const char *name, int what, const char *src, int ndim,
                          int64_t ne0, int64_t ne1, int64_t ne2, int mat_type)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        gg_entry_t *e = td_reallocarray(l->e, (size_t)cap, sizeof(*e));
        if (!e)
            return NULL;
        l->e = e;
        l->cap = cap;
    }
    gg_entry_t *e = &l->e[l->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    snprintf(e->src, sizeof(e->src), "%s", src);
    e->what = what;
    e->ndim = ndim;
    e->ne[0] = ne0;
    e->ne[1] = ne1;
    e->ne[2] = ne2;
    int64_t n = ne0 * (ndim > 1 ? ne1 : 1) * (ndim > 2 ? ne2 : 1);
    /* vectors stay F32 (llama.cpp does the same); Q8_0 needs rows of a multiple of 32 */
    e->type = ndim == 1 ? GT_F32 : mat_type;
    if (e->type == GT_Q8_0 && ne0 % 32)
        e->type = GT_F16;
    e->nbytes = gg_bytes(e->type, n);
    return e;
}

static int gg_build(const mg_ctx_t *c, gg_list_t *l)
{
    const mg_hp_t *h = &c->hp;
    int mt = c->o->gguf_dtype == TD_MODELGEN_Q8_0  ? GT_Q8_0
             : c->o->gguf_dtype == TD_MODELGEN_F16 ? GT_F16
                                                   : GT_F32;
    int H = h->hidden;
    char g[96], s[96];
    bool ok = true;
#define ADD(...) ok = ok && gg_add(l, __VA_ARGS__) != NULL
    ADD("token_embd.weight", GS_PLAIN, "model.embed_tokens.weight", 2, H, h->vocab, 0, mt);
    if (c->o->arch == TD_MODELGEN_LLAMA)
        ADD("rope_freqs.weight", GS_ROPE_FREQS, "", 1, h->head_dim / 2, 0, 0, GT_F32);
    for (int i = 0; i < h->n_layers && ok; i++) {
        const struct {
            const char *g, *hf;
        } plain[] = {
            {"attn_norm", "input_layernorm"},
            {"ffn_norm", "post_attention_layernorm"},
            {"attn_output", "self_attn.o_proj"},
            {"attn_v", "self_attn.v_proj"},
            {"attn_q_a", "self_attn.q_a_proj"},
            {"attn_q_a_norm", "self_attn.q_a_layernorm"},
            {"attn_q_b", "self_attn.q_b_proj"},
            {"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"},
            {"attn_kv_a_norm", "self_attn.kv_a_layernorm"},
            {"ffn_gate", "mlp.gate_proj"},
            {"ffn_up", "mlp.up_proj"},
            {"ffn_down", "mlp.down_proj"},
            {"ffn_gate_inp", "mlp.gate"},
            {"ffn_gate_shexp", "mlp.shared_experts.gate_proj"},
            {"ffn_up_shexp", "mlp.shared_experts.up_proj"},
            {"ffn_down_shexp", "mlp.shared_experts.down_proj"},
        };
        for (size_t k = 0; k < TD_ARRAY_LEN(plain) && ok; k++) {
            snprintf(s, sizeof(s), "model.layers.%d.%s.weight", i, plain[k].hf);
            const mg_tensor_t *t = list_find(&c->list, s);
            if (!t)
                continue;
            snprintf(g, sizeof(g), "blk.%d.%s.weight", i, plain[k].g);
            /* the router stays F32, as llama.cpp's converter keeps it */
            int type = t->kind == K_ROUTER ? GT_F32 : mt;
            ADD(g, GS_PLAIN, s, t->cols ? 2 : 1, t->cols ? t->cols : t->rows, t->rows, 0, type);
        }
        snprintf(s, sizeof(s), "model.layers.%d.self_attn.q_proj.weight", i);
        const mg_tensor_t *tq = list_find(&c->list, s);
        if (tq) {
            snprintf(g, sizeof(g), "blk.%d.attn_q.weight", i);
            ADD(g, c->o->arch == TD_MODELGEN_LLAMA ? GS_PERMUTE_Q : GS_PLAIN, s, 2, tq->cols,
                tq->rows, 0, mt);
        }
        snprintf(s, sizeof(s), "model.layers.%d.self_attn.k_proj.weight", i);
        const mg_tensor_t *tk = list_find(&c->list, s);
        if (tk) {
            snprintf(g, sizeof(g), "blk.%d.attn_k.weight", i);
            ADD(g, GS_PERMUTE_K, s, 2, tk->cols, tk->rows, 0, mt);
        }
        snprintf(s, sizeof(s), "model.layers.%d.self_attn.kv_b_proj.weight", i);
        if (list_find(&c->list, s)) {
            /* llama.cpp's current MLA form: k_b [n_head][kv_lora][nope] (transposed per head),
             * v_b [n_head][v][kv_lora] */
            snprintf(g, sizeof(g), "blk.%d.attn_k_b.weight", i);
            ADD(g, GS_K_B, s, 3, h->nope, h->kv_lora, h->n_heads, mt);
            snprintf(g, sizeof(g), "blk.%d.attn_v_b.weight", i);
            ADD(g, GS_V_B, s, 3, h->kv_lora, h->v_dim, h->n_heads, mt);
        }
        snprintf(s, sizeof(s), "model.layers.%d.mlp.gate.e_score_correction_bias", i);
        if (list_find(&c->list, s)) {
            snprintf(g, sizeof(g), "blk.%d.exp_probs_b.bias", i);
            ADD(g, GS_PLAIN, s, 1, h->n_exp, 0, 0, GT_F32);
        }
        if (layer_is_moe(h, c->o->arch, i)) {
            const char *pr[3] = {"gate", "up", "down"};
            for (int k = 0; k < 3 && ok; k++) {
                snprintf(g, sizeof(g), "blk.%d.ffn_%s_exps.weight", i, pr[k]);
                snprintf(s, sizeof(s), "model.layers.%d.mlp.experts.%%d.%s_proj.weight", i, pr[k]);
                bool down = k == 2;
                ADD(g, GS_STACK, s, 3, down ? h->moe_inter : H, down ? H : h->moe_inter, h->n_exp,
                    mt);
            }
        }
    }
    ADD("output_norm.weight", GS_PLAIN, "model.norm.weight", 1, H, 0, 0, GT_F32);
    if (!h->tie)
        ADD("output.weight", GS_PLAIN, "lm_head.weight", 2, H, h->vocab, 0, mt);
#undef ADD
    if (!ok)
        return TD_ENOMEM;
    size_t off = 0;
    for (int i = 0; i < l->n; i++) {
        l->e[i].offset = off;
        off = TD_ALIGN_UP(off + l->e[i].nbytes, (size_t)GGUF_ALIGN);
    }
    return 0;
}

/* llama.cpp's converter permutes the rows of q_proj / k_proj so that RoPE rotates adjacent
 * pairs: within each head, row (i, half j) moves to (2i + j). */
static void permute_rows(const float *in, float *out, int64_t rows, int64_t cols, int n_head)
{
    int64_t hd = rows / n_head, half = hd / 2;
    for (int h = 0; h < n_head; h++)
        for (int j = 0; j < 2; j++)
            for (int64_t i = 0; i < half; i++)
                memcpy(out + (h * hd + 2 * i + j) * cols, in + (h * hd + j * half + i) * cols,
                       (size_t)cols * sizeof(float));
}

/* Values of GGUF entry `e` in GGUF order (ne[0] fastest), out[numel]. */
static int gg_values(const mg_ctx_t *c, const gg_entry_t *e, float *out)
{
    const mg_hp_t *h = &c->hp;
    int64_t n = e->ne[0] * (e->ndim > 1 ? e->ne[1] : 1) * (e->ndim > 2 ? e->ne[2] : 1);
    int err = 0;
    switch (e->what) {
    case GS_PLAIN:
        return canonical_by_name(c, e->src, out);
    case GS_ROPE_FREQS: {
        /* llama3 scaling as per-frequency divisors, as llama.cpp's converter writes them */
        double lo_wl = h->l3_orig / h->l3_low, hi_wl = h->l3_orig / h->l3_high;
        for (int64_t i = 0; i < n; i++) {
            double freq = 1.0 / pow(h->rope_theta, (double)(2 * i) / h->head_dim);
            double wl = 2.0 * M_PI / freq, f;
            if (wl < hi_wl)
                f = 1.0;
            else if (wl > lo_wl)
                f = h->l3_factor;
            else {
                double sm = (h->l3_orig / wl - h->l3_low) / (h->l3_high - h->l3_low);
                f = 1.0 / ((1.0 - sm) / h->l3_factor + sm);
            }
            out[i] = (float)f;
        }
        return 0;
    }
    case GS_PERMUTE_Q:
    case GS_PERMUTE_K: {
        float *tmp = td_calloc((size_t)n, sizeof(float));
        if (!tmp)
            return TD_ENOMEM;
        err = canonical_by_name(c, e->src, tmp);
        if (!err)
            permute_rows(tmp, out, e->ne[1], e->ne[0],
                         e->what == GS_PERMUTE_Q ? h->n_heads : h->n_kv);
        free(tmp);
        return err;
    }
    case GS_STACK: {
        int64_t per = e->ne[0] * e->ne[1];
        for (int x = 0; x < e->ne[2] && !err; x++) {
            char name[96];
            snprintf(name, sizeof(name), e->src, x);
            err = canonical_by_name(c, name, out + x * per);
        }
        return err;
    }
    case GS_K_B:
    case GS_V_B: {
        int64_t r = h->kv_lora, per = h->nope + h->v_dim;
        float *kvb = td_calloc((size_t)(h->n_heads * per * r), sizeof(float));
        if (!kvb)
            return TD_ENOMEM;
        err = canonical_by_name(c, e->src, kvb); /* [n_head * (nope + v)][kv_lora] */
        for (int hh = 0; hh < h->n_heads && !err; hh++) {
            const float *base = kvb + hh * per * r;
            if (e->what == GS_K_B) { /* [h][kv_lora][nope]: k_b[h][c][j] = kv_b[h][j][c] */
                for (int64_t cc = 0; cc < r; cc++)
                    for (int64_t j = 0; j < h->nope; j++)
                        out[(hh * r + cc) * h->nope + j] = base[j * r + cc];
            } else { /* [h][v][kv_lora] */
                memcpy(out + hh * h->v_dim * r, base + h->nope * r,
                       (size_t)(h->v_dim * r) * sizeof(float));
            }
        }
        free(kvb);
        return err;
    }
    }
    return TD_EINTERNAL;
}

static void q8_0_encode(const float *v, int64_t n, uint8_t *out)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const float *x = v + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d);
        uint8_t *blk = out + b * 34;
        memcpy(blk, &dh, 2);
        for (int i = 0; i < 32; i++)
            blk[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

static int kv_str(td_buf_t *b, const char *s)
{
    uint64_t n = strlen(s);
    return td_buf_append(b, &n, 8) | td_buf_append(b, s, n);
}

static int kv_key(td_buf_t *b, const char *key, uint32_t type)
{
    return kv_str(b, key) | td_buf_append(b, &type, 4);
}

static int kv_u32(td_buf_t *b, int *n, const char *key, uint32_t v)
{
    (*n)++;
    return kv_key(b, key, GV_U32) | td_buf_append(b, &v, 4);
}

static int kv_f32(td_buf_t *b, int *n, const char *key, double v)
{
    float f = (float)v;
    (*n)++;
    return kv_key(b, key, GV_F32) | td_buf_append(b, &f, 4);
}

static int kv_bool(td_buf_t *b, int *n, const char *key, bool v)
{
    uint8_t x = v;
    (*n)++;
    return kv_key(b, key, GV_BOOL) | td_buf_append(b, &x, 1);
}

static int kv_s(td_buf_t *b, int *n, const char *key, const char *v)
{
    (*n)++;
    return kv_key(b, key, GV_STR) | kv_str(b, v);
}

static int gg_metadata(const mg_ctx_t *c, const mg_tok_t *tok, td_buf_t *b, int *n)
{
    const mg_hp_t *h = &c->hp;
    bool ds = is_deepseek(c->o->arch);
    const char *a = ds ? "deepseek2" : "llama";
    char k[96];
    int e = 0;
#define K(suffix) (snprintf(k, sizeof(k), "%s.%s", a, suffix), k)
    e |= kv_s(b, n, "general.architecture", a);
    e |= kv_s(b, n, "general.name", "tandem-mkmodel");
    e |= kv_u32(b, n, "general.alignment", GGUF_ALIGN);
    e |= kv_u32(b, n, "general.file_type",
                c->o->gguf_dtype == TD_MODELGEN_Q8_0  ? 7
                : c->o->gguf_dtype == TD_MODELGEN_F16 ? 1
                                                      : 0);
    e |= kv_u32(b, n, K("context_length"), (uint32_t)h->max_pos);
    e |= kv_u32(b, n, K("embedding_length"), (uint32_t)h->hidden);
    e |= kv_u32(b, n, K("block_count"), (uint32_t)h->n_layers);
    e |= kv_u32(b, n, K("feed_forward_length"), (uint32_t)h->inter);
    e |= kv_u32(b, n, K("attention.head_count"), (uint32_t)h->n_heads);
    e |= kv_f32(b, n, K("attention.layer_norm_rms_epsilon"), h->rms_eps);
    e |= kv_f32(b, n, K("rope.freq_base"), h->rope_theta);
    e |= kv_u32(b, n, K("vocab_size"), (uint32_t)h->vocab);
    if (!ds) {
        e |= kv_u32(b, n, K("attention.head_count_kv"), (uint32_t)h->n_kv);
        e |= kv_u32(b, n, K("rope.dimension_count"), (uint32_t)h->head_dim);
    } else {
        /* llama.cpp's MLA form: MQA over the latent (one KV head of kv_lora + rope) */
        e |= kv_u32(b, n, K("attention.head_count_kv"), 1);
        e |= kv_u32(b, n, K("rope.dimension_count"), (uint32_t)h->rope);
        e |= kv_u32(b, n, K("leading_dense_block_count"), (uint32_t)h->first_dense);
        if (h->q_lora)
            e |= kv_u32(b, n, K("attention.q_lora_rank"), (uint32_t)h->q_lora);
        e |= kv_u32(b, n, K("attention.kv_lora_rank"), (uint32_t)h->kv_lora);
        e |= kv_u32(b, n, K("attention.key_length"), (uint32_t)(h->kv_lora + h->rope));
        e |= kv_u32(b, n, K("attention.value_length"), (uint32_t)h->kv_lora);
        e |= kv_u32(b, n, K("attention.key_length_mla"), (uint32_t)(h->nope + h->rope));
        e |= kv_u32(b, n, K("attention.value_length_mla"), (uint32_t)h->v_dim);
        e |= kv_u32(b, n, K("expert_feed_forward_length"), (uint32_t)h->moe_inter);
        e |= kv_u32(b, n, K("expert_count"), (uint32_t)h->n_exp);
        e |= kv_u32(b, n, K("expert_used_count"), (uint32_t)h->top_k);
        e |= kv_u32(b, n, K("expert_shared_count"), (uint32_t)h->n_shared);
        e |= kv_f32(b, n, K("expert_weights_scale"), h->routed_scale);
        e |= kv_bool(b, n, K("expert_weights_norm"), h->norm_topk);
        e |= kv_u32(b, n, K("expert_gating_func"), c->o->arch == TD_MODELGEN_DEEPSEEK_V3 ? 2 : 1);
        e |= kv_u32(b, n, K("expert_group_count"), (uint32_t)h->n_group);
        e |= kv_u32(b, n, K("expert_group_used_count"), (uint32_t)h->topk_group);
        e |= kv_s(b, n, K("rope.scaling.type"), "yarn");
        e |= kv_f32(b, n, K("rope.scaling.factor"), h->yarn_factor);
        e |= kv_u32(b, n, K("rope.scaling.original_context_length"), (uint32_t)h->yarn_orig);
        e |= kv_f32(b, n, K("rope.scaling.yarn_log_multiplier"), 0.1 * h->yarn_mscale);
    }
#undef K
    /* tokenizer */
    e |= kv_s(b, n, "tokenizer.ggml.model", "gpt2");
    e |= kv_s(b, n, "tokenizer.ggml.pre", tok->pre);
    (*n)++;
    e |= kv_key(b, "tokenizer.ggml.tokens", GV_ARR);
    uint32_t at = GV_STR;
    uint64_t cnt = (uint64_t)h->vocab;
    e |= td_buf_append(b, &at, 4) | td_buf_append(b, &cnt, 8);
    for (int i = 0; i < h->vocab; i++) {
        char pad[32];
        snprintf(pad, sizeof(pad), "[PAD%d]", i);
        e |= kv_str(b, i < tok->vocab && tok->tokens[i] ? tok->tokens[i] : pad);
    }
    (*n)++;
    e |= kv_key(b, "tokenizer.ggml.token_type", GV_ARR);
    at = GV_I32;
    e |= td_buf_append(b, &at, 4) | td_buf_append(b, &cnt, 8);
    for (int i = 0; i < h->vocab; i++) {
        int32_t ty = i < tok->vocab && tok->tokens[i] ? tok->types[i] : 5;
        e |= td_buf_append(b, &ty, 4);
    }
    (*n)++;
    e |= kv_key(b, "tokenizer.ggml.merges", GV_ARR);
    at = GV_STR;
    cnt = (uint64_t)tok->n_merges;
    e |= td_buf_append(b, &at, 4) | td_buf_append(b, &cnt, 8);
    for (int i = 0; i < tok->n_merges; i++)
        e |= kv_str(b, tok->merges[i]);
    if (tok->bos >= 0)
        e |= kv_u32(b, n, "tokenizer.ggml.bos_token_id", (uint32_t)tok->bos);
    if (tok->eos >= 0)
        e |= kv_u32(b, n, "tokenizer.ggml.eos_token_id", (uint32_t)tok->eos);
    return e ? TD_ENOMEM : 0;
}

static int write_gguf(const mg_ctx_t *c, const mg_tok_t *tok)
{
    gg_list_t l = {0};
    td_buf_t meta, hdr;
    mg_file_t mf = {0};
    float *vals = NULL;
    uint8_t *bytes = NULL;
    int n_kv = 0, err;
    td_buf_init(&meta);
    td_buf_init(&hdr);
    err = gg_build(c, &l);
    if (!err)
        err = gg_metadata(c, tok, &meta, &n_kv);
    if (err)
        goto out;
    uint32_t version = 3;
    uint64_t nt = (uint64_t)l.n, nkv = (uint64_t)n_kv;
    int e = td_buf_append(&hdr, "GGUF", 4) | td_buf_append(&hdr, &version, 4) |
            td_buf_append(&hdr, &nt, 8) | td_buf_append(&hdr, &nkv, 8) |
            td_buf_append(&hdr, meta.data, meta.len);
    size_t maxn = 0;
    for (int i = 0; i < l.n; i++) {
        gg_entry_t *g = &l.e[i];
        uint32_t nd = (uint32_t)g->ndim, ty = (uint32_t)g->type;
        uint64_t off = g->offset;
        e |= kv_str(&hdr, g->name) | td_buf_append(&hdr, &nd, 4);
        for (int d = 0; d < g->ndim; d++) {
            uint64_t ne = (uint64_t)g->ne[d];
            e |= td_buf_append(&hdr, &ne, 8);
        }
        e |= td_buf_append(&hdr, &ty, 4) | td_buf_append(&hdr, &off, 8);
        maxn = TD_MAX(
            maxn, (size_t)(g->ne[0] * (g->ndim > 1 ? g->ne[1] : 1) * (g->ndim > 2 ? g->ne[2] : 1)));
    }
    while (!e && hdr.len % GGUF_ALIGN)
        e = td_buf_append_char(&hdr, 0);
    vals = td_calloc(maxn ? maxn : 1, sizeof(float));
    bytes = malloc(maxn * 4 + 64);
    if (e || !vals || !bytes) {
        err = TD_ENOMEM;
        goto out;
    }
    err = file_open(&mf, c->o->out_dir, "model.gguf");
    if (err)
        goto out;
    err = file_write(&mf, hdr.data, hdr.len);
    size_t pos = 0;
    for (int i = 0; i < l.n && !err; i++) {
        gg_entry_t *g = &l.e[i];
        int64_t n = g->ne[0] * (g->ndim > 1 ? g->ne[1] : 1) * (g->ndim > 2 ? g->ne[2] : 1);
        err = file_pad(&mf, g->offset - pos);
        if (!err)
            err = gg_values(c, g, vals);
        if (err)
            break;
        if (g->type == GT_Q8_0)
            q8_0_encode(vals, n, bytes);
        else
            encode(g->type == GT_F16 ? TD_MODELGEN_F16 : TD_MODELGEN_F32, vals, n, bytes);
        err = file_write(&mf, bytes, g->nbytes);
        pos = g->offset + g->nbytes;
    }
    err = file_close(&mf, err);
out:
    free(vals);
    free(bytes);
    free(l.e);
    td_buf_free(&meta);
    td_buf_free(&hdr);
    return err;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */
/* ------------------------------------------------------------------------------------------ */

int td_modelgen_parse_arch(const char *s, td_modelgen_arch_t *out)
{
    static const char *names[] = {"llama", "qwen3", "deepseek_v2", "deepseek_v3"};
    for (size_t i = 0; s && i < TD_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (td_modelgen_arch_t)i;
            return 0;
        }
    return td_err_set(TD_EINVAL,
                      "unknown architecture \"%s\" (llama, qwen3, deepseek_v2, "
                      "deepseek_v3)",
                      s ? s : "");
}

int td_modelgen_parse_preset(const char *s, td_modelgen_preset_t *out)
{
    if (td_str_eq(s, "tiny"))
        *out = TD_MODELGEN_TINY;
    else if (td_str_eq(s, "bench"))
        *out = TD_MODELGEN_BENCH;
    else
        return td_err_set(TD_EINVAL, "unknown preset \"%s\" (tiny, bench)", s ? s : "");
    return 0;
}

int td_modelgen_parse_dtype(const char *s, td_modelgen_dtype_t *out)
{
    static const char *names[] = {"f32", "f16", "bf16", "q8_0"};
    for (size_t i = 0; s && i < TD_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (td_modelgen_dtype_t)i;
            return 0;
        }
    return td_err_set(TD_EINVAL, "unknown dtype \"%s\" (f32, f16, bf16, q8_0)", s ? s : "");
}

/* Write `len` bytes of `data` as to_dir/name. */
static int copy_file(const char *to_dir, const char *name, const char *data, size_t len)
{
    td_buf_t b = {(char *)data, len, len + 1};
    return write_text(to_dir, name, &b);
}

int td_modelgen_write(const td_modelgen_opts_t *o, td_modelgen_info_t *info)
{
    mg_ctx_t c;
    mg_tok_t tok;
    int err, n_files = 0;
    memset(&c, 0, sizeof(c));
    memset(&tok, 0, sizeof(tok));
    c.o = o;
    if (!o->out_dir || !*o->out_dir)
        return td_err_set(TD_EINVAL, "mkmodel: no output directory");
    if ((unsigned)o->arch > TD_MODELGEN_DEEPSEEK_V3)
        return td_err_set(TD_EINVAL, "mkmodel: unknown architecture %d", (int)o->arch);
    if (o->dtype == TD_MODELGEN_Q8_0)
        return td_err_set(TD_EINVAL, "mkmodel: --dtype q8_0 is for GGUF only (use --gguf q8_0)");
    if (o->fp8 && !is_deepseek(o->arch))
        return td_err_set(TD_EINVAL, "mkmodel: --fp8 is for the DeepSeek architectures");
    if (o->fp8 && o->fused_experts)
        return td_err_set(TD_EINVAL, "mkmodel: --fp8 with --fused-experts is not supported");
    if (o->fused_experts && !is_deepseek(o->arch))
        return td_err_set(TD_EINVAL, "mkmodel: --fused-experts needs an MoE architecture");
    if (o->gguf && o->arch == TD_MODELGEN_QWEN3)
        return td_err_set(TD_EINVAL, "mkmodel: --gguf supports llama, deepseek_v2, deepseek_v3");
    if (o->gguf && o->gguf_dtype == TD_MODELGEN_BF16)
        return td_err_set(TD_EINVAL, "mkmodel: --gguf type must be f32, f16 or q8_0");
    if (o->shards < 0 || o->shards > 99)
        return td_err_set(TD_EINVAL, "mkmodel: --shards must be 1..99");
    hp_init(&c.hp, o->arch, o->preset);
    if (o->context < 0 || o->context > (1 << 20))
        return td_err_set(TD_EINVAL, "mkmodel: --context must be 1..1048576");
    if (o->context > 0 && is_deepseek(o->arch)) {
        c.hp.yarn_factor = TD_MAX(1.0, (double)o->context / c.hp.yarn_orig);
        c.hp.max_pos = o->context;
    } else if (o->context > 0) {
        c.hp.max_pos = o->context;
    }
    c.use_fp8 = o->fp8;
    if (o->tokenizer_dir) {
        err = tok_load(&tok, o->tokenizer_dir);
        if (err)
            return err;
        c.hp.vocab = tok.vocab;
    } else {
        err = tok_synthetic(&tok, c.hp.vocab);
        if (err)
            return err;
    }
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        err = td_err_set(td_err_from_errno(e), "%s: mkdir: %s", o->out_dir, strerror(e));
        goto out;
    }
    err = build_list(&c.hp, o->arch, &c.list);
    if (!err)
        err = write_config(&c, &tok);
    if (!err)
        err = write_safetensors(&c, &n_files);
    if (!err && o->tokenizer_dir) {
        err = copy_file(o->out_dir, "tokenizer.json", tok.json, tok.json_len);
        if (!err)
            err = copy_file(o->out_dir, "tokenizer_config.json", tok.cfg_json, tok.cfg_len);
    }
    if (!err && o->gguf)
        err = write_gguf(&c, &tok);
    if (!err && info) {
        info->n_params = 0;
        for (int i = 0; i < c.list.n; i++)
            info->n_params += numel(&c.list.t[i]);
        info->vocab_size = c.hp.vocab;
        info->n_files = n_files;
    }
out:
    free(c.list.t);
    tok_free(&tok);
    return err;
}
