/* modelgen_gguf.c: the GGUF v3 copy: llama.cpp's tensor names and layouts, metadata, F32 / F16
 * data or llama.cpp's block formats (Q8_0, Q4_0, Q4_K, Q6_K; modelgen_quant.c). */
#include "modelgen_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GV_U32 = 4, GV_I32 = 5, GV_F32 = 6, GV_BOOL = 7, GV_STR = 8, GV_ARR = 9 };
#define GGUF_ALIGN 32

enum { GS_PLAIN, GS_PERMUTE_Q, GS_PERMUTE_K, GS_STACK, GS_K_B, GS_V_B, GS_ROPE_FREQS };

typedef struct gg_entry {
    char name[96];
    int what;     /* GS_* */
    char src[96]; /* HF name (GS_STACK: "model.layers.L.mlp.experts.%d.P_proj.weight" pattern) */
    int ndim;
    int64_t ne[3]; /* GGUF order: ne[0] is the row length */
    int type;      /* MG_GGML_* */
    size_t nbytes;
    size_t offset;
} gg_entry_t;

static size_t gg_bytes(int type, int64_t n)
{
    switch (type) {
    case MG_GGML_F32:
        return (size_t)n * 4;
    case MG_GGML_F16:
        return (size_t)n * 2;
    case MG_GGML_Q8_0:
        return (size_t)n / 32 * 34;
    case MG_GGML_Q4_0:
        return (size_t)n / 32 * 18;
    case MG_GGML_Q4_K:
        return (size_t)n / 256 * 144;
    default: /* Q6_K */
        return (size_t)n / 256 * 210;
    }
}

/* The type a matrix with rows of ne0 values gets when `want` is asked: a block format whose
 * block does not divide the row takes the next smaller one (Q4_K -> Q4_0, Q6_K -> Q8_0), and
 * F16 when none fits. */
static int gg_fit(int want, int64_t ne0)
{
    if ((want == MG_GGML_Q4_K || want == MG_GGML_Q6_K) && ne0 % 256)
        want = want == MG_GGML_Q4_K ? MG_GGML_Q4_0 : MG_GGML_Q8_0;
    if ((want == MG_GGML_Q4_0 || want == MG_GGML_Q8_0) && ne0 % 32)
        want = MG_GGML_F16;
    return want;
}

/* llama-quantize's use_more_bits: the layers of a Q4_K_M file whose attn_v and ffn_down get
 * Q6_K. */
static bool more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The type asked for GGUF tensor `name` of layer `layer` (-1 outside the layers). */
static int gg_want(const mg_ctx_t *c, const char *name, int layer)
{
    switch (c->o->gguf_dtype) {
    case TD_MODELGEN_F16:
        return MG_GGML_F16;
    case TD_MODELGEN_Q8_0:
        return MG_GGML_Q8_0;
    case TD_MODELGEN_Q4_0:
        return MG_GGML_Q4_0;
    case TD_MODELGEN_Q4_K:
        return MG_GGML_Q4_K;
    case TD_MODELGEN_Q6_K:
        return MG_GGML_Q6_K;
    case TD_MODELGEN_Q4_K_M:
        if (strcmp(name, "output.weight") == 0)
            return MG_GGML_Q6_K;
        if (layer >= 0 && (strstr(name, ".attn_v.") || strstr(name, ".ffn_down")) &&
            more_bits(layer, c->hp.n_layers))
            return MG_GGML_Q6_K;
        return MG_GGML_Q4_K;
    default:
        return MG_GGML_F32;
    }
}

typedef struct gg_list {
    gg_entry_t *e;
    int n, cap;
} gg_list_t;

static gg_entry_t *gg_add(const mg_ctx_t *c, gg_list_t *l, const char *name, int what,
                          const char *src, int ndim, int64_t ne0, int64_t ne1, int64_t ne2,
                          int layer, bool keep_f32)
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
    /* vectors stay F32 (llama.cpp does the same) */
    e->type = ndim == 1 || keep_f32 ? MG_GGML_F32 : gg_fit(gg_want(c, name, layer), ne0);
    e->nbytes = gg_bytes(e->type, n);
    return e;
}

static int gg_build(const mg_ctx_t *c, gg_list_t *l)
{
    const mg_hp_t *h = &c->hp;
    int H = h->hidden, i = -1;
    char g[96], s[96];
    bool ok = true;
#define ADD(...) ok = ok && gg_add(c, l, __VA_ARGS__, i, false) != NULL
    ADD("token_embd.weight", GS_PLAIN, "model.embed_tokens.weight", 2, H, h->vocab, 0);
    if (c->o->arch == TD_MODELGEN_LLAMA)
        ADD("rope_freqs.weight", GS_ROPE_FREQS, "", 1, h->head_dim / 2, 0, 0);
    for (i = 0; i < h->n_layers && ok; i++) {
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
            const mg_tensor_t *t = td__mg_list_find(&c->list, s);
            if (!t)
                continue;
            snprintf(g, sizeof(g), "blk.%d.%s.weight", i, plain[k].g);
            /* the router stays F32, as llama.cpp's converter keeps it */
            ok = ok && gg_add(c, l, g, GS_PLAIN, s, t->cols ? 2 : 1, t->cols ? t->cols : t->rows,
                              t->rows, 0, i, t->kind == K_ROUTER) != NULL;
        }
        snprintf(s, sizeof(s), "model.layers.%d.self_attn.q_proj.weight", i);
        const mg_tensor_t *tq = td__mg_list_find(&c->list, s);
        if (tq) {
            snprintf(g, sizeof(g), "blk.%d.attn_q.weight", i);
            ADD(g, c->o->arch == TD_MODELGEN_LLAMA ? GS_PERMUTE_Q : GS_PLAIN, s, 2, tq->cols,
                tq->rows, 0);
        }
        snprintf(s, sizeof(s), "model.layers.%d.self_attn.k_proj.weight", i);
        const mg_tensor_t *tk = td__mg_list_find(&c->list, s);
        if (tk) {
            snprintf(g, sizeof(g), "blk.%d.attn_k.weight", i);
            ADD(g, GS_PERMUTE_K, s, 2, tk->cols, tk->rows, 0);
        }
        snprintf(s, sizeof(s), "model.layers.%d.self_attn.kv_b_proj.weight", i);
        if (td__mg_list_find(&c->list, s)) {
            /* llama.cpp's current MLA form: k_b [n_head][kv_lora][nope] (transposed per head),
             * v_b [n_head][v][kv_lora] */
            snprintf(g, sizeof(g), "blk.%d.attn_k_b.weight", i);
            ADD(g, GS_K_B, s, 3, h->nope, h->kv_lora, h->n_heads);
            snprintf(g, sizeof(g), "blk.%d.attn_v_b.weight", i);
            ADD(g, GS_V_B, s, 3, h->kv_lora, h->v_dim, h->n_heads);
        }
        snprintf(s, sizeof(s), "model.layers.%d.mlp.gate.e_score_correction_bias", i);
        if (td__mg_list_find(&c->list, s)) {
            snprintf(g, sizeof(g), "blk.%d.exp_probs_b.bias", i);
            ADD(g, GS_PLAIN, s, 1, h->n_exp, 0, 0);
        }
        if (td__mg_layer_is_moe(h, c->o->arch, i)) {
            const char *pr[3] = {"gate", "up", "down"};
            for (int k = 0; k < 3 && ok; k++) {
                snprintf(g, sizeof(g), "blk.%d.ffn_%s_exps.weight", i, pr[k]);
                snprintf(s, sizeof(s), "model.layers.%d.mlp.experts.%%d.%s_proj.weight", i, pr[k]);
                bool down = k == 2;
                ADD(g, GS_STACK, s, 3, down ? h->moe_inter : H, down ? H : h->moe_inter,
                    h->n_exp);
            }
        }
    }
    i = -1;
    ADD("output_norm.weight", GS_PLAIN, "model.norm.weight", 1, H, 0, 0);
    if (!h->tie)
        ADD("output.weight", GS_PLAIN, "lm_head.weight", 2, H, h->vocab, 0);
#undef ADD
    if (!ok)
        return TD_ENOMEM;
    size_t off = 0;
    for (int k = 0; k < l->n; k++) {
        l->e[k].offset = off;
        off = TD_ALIGN_UP(off + l->e[k].nbytes, (size_t)GGUF_ALIGN);
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

/* Values of GGUF entry `e` in GGUF order (ne[0] fastest), out[td__mg_numel]. */
static int gg_values(const mg_ctx_t *c, const gg_entry_t *e, float *out)
{
    const mg_hp_t *h = &c->hp;
    int64_t n = e->ne[0] * (e->ndim > 1 ? e->ne[1] : 1) * (e->ndim > 2 ? e->ne[2] : 1);
    int err = 0;
    switch (e->what) {
    case GS_PLAIN:
        return td__mg_canonical_by_name(c, e->src, out);
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
        err = td__mg_canonical_by_name(c, e->src, tmp);
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
            err = td__mg_canonical_by_name(c, name, out + x * per);
        }
        return err;
    }
    case GS_K_B:
    case GS_V_B: {
        int64_t r = h->kv_lora, per = h->nope + h->v_dim;
        float *kvb = td_calloc((size_t)(h->n_heads * per * r), sizeof(float));
        if (!kvb)
            return TD_ENOMEM;
        err = td__mg_canonical_by_name(c, e->src, kvb); /* [n_head * (nope + v)][kv_lora] */
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
    bool ds = td__mg_is_deepseek(c->o->arch);
    const char *a = ds ? "deepseek2" : "llama";
    char k[96];
    int e = 0;
#define K(suffix) (snprintf(k, sizeof(k), "%s.%s", a, suffix), k)
    e |= kv_s(b, n, "general.architecture", a);
    e |= kv_s(b, n, "general.name", "tandem-mkmodel");
    e |= kv_u32(b, n, "general.alignment", GGUF_ALIGN);
    /* llama_ftype: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q8_0 7, Q4_K_S 14, Q4_K_M 15, Q6_K 18 */
    static const uint32_t ftype[] = {[TD_MODELGEN_F32] = 0,   [TD_MODELGEN_F16] = 1,
                                     [TD_MODELGEN_Q8_0] = 7,  [TD_MODELGEN_Q4_0] = 2,
                                     [TD_MODELGEN_Q4_K] = 14, [TD_MODELGEN_Q6_K] = 18,
                                     [TD_MODELGEN_Q4_K_M] = 15};
    e |= kv_u32(b, n, "general.file_type", ftype[c->o->gguf_dtype]);
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

int td__mg_write_gguf(const mg_ctx_t *c, const mg_tok_t *tok)
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
    err = td__mg_file_open(&mf, c->o->out_dir, "model.gguf");
    if (err)
        goto out;
    err = td__mg_file_write(&mf, hdr.data, hdr.len);
    size_t pos = 0;
    for (int i = 0; i < l.n && !err; i++) {
        gg_entry_t *g = &l.e[i];
        int64_t n = g->ne[0] * (g->ndim > 1 ? g->ne[1] : 1) * (g->ndim > 2 ? g->ne[2] : 1);
        err = td__mg_file_pad(&mf, g->offset - pos);
        if (!err)
            err = gg_values(c, g, vals);
        if (err)
            break;
        if (g->type == MG_GGML_F32 || g->type == MG_GGML_F16)
            td__mg_encode(g->type == MG_GGML_F16 ? TD_MODELGEN_F16 : TD_MODELGEN_F32, vals, n,
                          bytes);
        else
            td__mg_quantize(g->type, vals, n, bytes);
        err = td__mg_file_write(&mf, bytes, g->nbytes);
        pos = g->offset + g->nbytes;
    }
    err = td__mg_file_close(&mf, err);
out:
    free(vals);
    free(bytes);
    free(l.e);
    td_buf_free(&meta);
    td_buf_free(&hdr);
    return err;
}
