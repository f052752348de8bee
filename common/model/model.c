/* model.c: opening a model: the tensor index, dtype conversion, the configuration (config.json or
 * GGUF metadata), binding each architecture's weights by name with shape checks, and the digest. */
#include "model_impl.h"
#include "td_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---------- dtypes ---------- */

const char *td_dtype_name(td_dtype_t t)
{
    static const char *names[] = {"F32", "F16", "BF16", "F8_E4M3", "Q8_0"};
    return (unsigned)t < TD_ARRAY_LEN(names) ? names[t] : "unknown";
}

size_t td__dtype_elt_size(td_dtype_t t)
{
    switch (t) {
    case TD_DTYPE_F32:
        return 4;
    case TD_DTYPE_F16:
    case TD_DTYPE_BF16:
        return 2;
    case TD_DTYPE_F8_E4M3:
        return 1;
    default:
        return 0;
    }
}

size_t td_dtype_row_bytes(td_dtype_t t, int64_t cols)
{
    if (t == TD_DTYPE_Q8_0)
        return (size_t)cols / 32 * 34;
    return (size_t)cols * td__dtype_elt_size(t);
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000 | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* OCP FP8 E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN. */
static float e4m3_to_f32(uint8_t v)
{
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float f;
    if (exp == 0xf && man == 7)
        f = NAN;
    else if (exp == 0)
        f = ldexpf((float)man / 8.0f, -6);
    else
        f = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -f : f;
}

static float f16_table[65536];
static float e4m3_table[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = f16_to_f32((uint16_t)i);
    for (uint32_t i = 0; i < 256; i++)
        e4m3_table[i] = e4m3_to_f32((uint8_t)i);
}

static void convert_f32(td_dtype_t t, const uint8_t *src, int64_t n, float *out)
{
    pthread_once(&tables_once, init_tables);
    switch (t) {
    case TD_DTYPE_F32:
        memcpy(out, src, (size_t)n * 4);
        break;
    case TD_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = f16_table[h];
        }
        break;
    case TD_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(&out[i], &u, 4);
        }
        break;
    case TD_DTYPE_F8_E4M3:
        for (int64_t i = 0; i < n; i++)
            out[i] = e4m3_table[src[i]];
        break;
    case TD_DTYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 34;
            uint16_t h;
            memcpy(&h, blk, 2);
            float d = f16_table[h];
            for (int j = 0; j < 32; j++)
                out[b * 32 + j] = d * (float)(int8_t)blk[2 + j];
        }
        break;
    default:
        TD_ASSERT(0);
    }
}

void td_mat_row_f32(const td_mat_t *m, int64_t r, float *out)
{
    const uint8_t *row =
        (const uint8_t *)m->data + (size_t)r * td_dtype_row_bytes(m->dtype, m->cols);
    convert_f32(m->dtype, row, m->cols, out);
    if (m->dtype == TD_DTYPE_F8_E4M3) {
        const float *s = m->scale + ((m->scale_row0 + r) / 128) * m->scale_cols;
        for (int64_t c = 0; c < m->cols; c++)
            out[c] *= s[c / 128];
    }
}

/* ---------- tensor index ---------- */

void td__index_free(td__index_t *ix)
{
    for (size_t i = 0; i < ix->n; i++)
        free(ix->t[i].name);
    free(ix->t);
    for (int i = 0; i < ix->n_files; i++)
        free(ix->files[i]);
    free(ix->files);
    for (size_t i = 0; i < ix->n_kv; i++) {
        free(ix->kv[i].key);
        free(ix->kv[i].str);
    }
    free(ix->kv);
    memset(ix, 0, sizeof(*ix));
}

int td__index_add(td__index_t *ix, const td__tensor_t *t)
{
    if (ix->n == ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 256;
        td__tensor_t *p = td_reallocarray(ix->t, cap, sizeof(*p));
        if (!p)
            return td_err_set(TD_ENOMEM, "out of memory indexing tensors");
        ix->t = p;
        ix->cap = cap;
    }
    ix->t[ix->n] = *t;
    ix->t[ix->n].name = td_strdup(t->name);
    if (!ix->t[ix->n].name)
        return td_err_set(TD_ENOMEM, "out of memory indexing tensors");
    ix->n++;
    return 0;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const td__tensor_t *)a)->name, ((const td__tensor_t *)b)->name);
}

int td__index_finish(td__index_t *ix)
{
    if (ix->n > 1)
        qsort(ix->t, ix->n, sizeof(*ix->t), cmp_tensor);
    for (size_t i = 1; i < ix->n; i++)
        if (strcmp(ix->t[i - 1].name, ix->t[i].name) == 0)
            return td_err_set(TD_EPARSE, "tensor \"%s\" appears twice (%s and %s)", ix->t[i].name,
                              ix->t[i - 1].file, ix->t[i].file);
    return 0;
}

const td__tensor_t *td__index_find(const td__index_t *ix, const char *name)
{
    td__tensor_t key = {.name = (char *)name};
    return ix->n ? bsearch(&key, ix->t, ix->n, sizeof(*ix->t), cmp_tensor) : NULL;
}

const td__gguf_kv_t *td__gguf_find(const td__index_t *ix, const char *key)
{
    for (size_t i = 0; i < ix->n_kv; i++)
        if (ix->kv[i].key && strcmp(ix->kv[i].key, key) == 0)
            return &ix->kv[i];
    return NULL;
}

/* ---------- names ---------- */

const char *td_arch_name(td_arch_t a)
{
    switch (a) {
    case TD_ARCH_LLAMA:
        return "llama";
    case TD_ARCH_QWEN2:
        return "qwen2";
    case TD_ARCH_QWEN3:
        return "qwen3";
    case TD_ARCH_DEEPSEEK_V2:
        return "deepseek_v2";
    case TD_ARCH_DEEPSEEK_V3:
        return "deepseek_v3";
    }
    return "unknown";
}

static bool is_mla(td_arch_t a)
{
    return a == TD_ARCH_DEEPSEEK_V2 || a == TD_ARCH_DEEPSEEK_V3;
}

/* ---------- loading context ---------- */

typedef struct loader {
    td_model_t *m;
    td__index_t ix;
    bool gguf;
    const char *cfg_path; /* config.json or the GGUF file, for messages */
} loader_t;

static void *own(td_model_t *m, void *p)
{
    if (!p)
        return NULL;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **q = td_reallocarray(m->owned, (size_t)cap, sizeof(*q));
        if (!q) {
            free(p);
            return NULL;
        }
        m->owned = q;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

static const td__tensor_t *find(loader_t *L, const char *name, bool required, int *rc)
{
    const td__tensor_t *t = td__index_find(&L->ix, name);
    if (!t && required)
        *rc = td_err_set(TD_ENOENT, "%s: missing tensor \"%s\"", L->m->path, name);
    if (t && t->dtype < 0) {
        *rc = td_err_set(TD_ENOTSUP, "%s: tensor \"%s\": unsupported dtype %s", t->file, name,
                         t->dtype_str);
        return NULL;
    }
    return t;
}

static int shape_err(const td__tensor_t *t, const char *want)
{
    char got[96] = "";
    size_t o = 0;
    for (int i = 0; i < t->ndim; i++)
        o += (size_t)snprintf(got + o, sizeof(got) - o, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    return td_err_set(TD_EMISMATCH, "%s: tensor \"%s\": shape [%s], expected [%s]", t->file,
                      t->name, got, want);
}

/* Bind a matrix view of rows x cols starting `sub` matrices into tensor t (for stacked experts). */
static int bind_view(loader_t *L, const td__tensor_t *t, int64_t rows, int64_t cols, int64_t sub,
                     td_mat_t *out)
{
    out->dtype = (td_dtype_t)t->dtype;
    out->rows = rows;
    out->cols = cols;
    if (t->dtype == TD_DTYPE_Q8_0 && cols % 32)
        return td_err_set(TD_EMISMATCH, "%s: tensor \"%s\": Q8_0 rows of %lld values", t->file,
                          t->name, (long long)cols);
    size_t mat_bytes = td_dtype_row_bytes(out->dtype, cols) * (size_t)rows;
    out->data = t->data + (size_t)sub * mat_bytes;
    out->scale = NULL;
    out->scale_row0 = 0;
    if (t->dtype == TD_DTYPE_F8_E4M3) {
        char sname[512];
        int rc = 0;
        snprintf(sname, sizeof(sname), "%s", t->name);
        char *dot = strstr(sname, ".weight");
        if (dot && dot[7] == '\0')
            snprintf(dot, sizeof(sname) - (size_t)(dot - sname), ".weight_scale_inv");
        else
            snprintf(sname + strlen(sname), sizeof(sname) - strlen(sname), "_scale_inv");
        const td__tensor_t *s = find(L, sname, true, &rc);
        if (!s)
            return td_err_set(rc, "%s: tensor \"%s\" is F8_E4M3 but has no \"%s\"", t->file,
                              t->name, sname);
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        int64_t want_rows = t->ndim == 3 ? t->shape[0] * sr : sr;
        int64_t have_rows = s->ndim == 3 ? s->shape[0] * s->shape[1] : s->shape[0];
        if (s->dtype != TD_DTYPE_F32 || s->ndim != t->ndim || have_rows != want_rows ||
            s->shape[s->ndim - 1] != sc) {
            char want[64];
            snprintf(want, sizeof(want), "%lld, %lld (F32)", (long long)want_rows, (long long)sc);
            return shape_err(s, want);
        }
        out->scale = (const float *)s->data + sub * sr * sc;
        out->scale_cols = sc;
    }
    return 0;
}

/* Bind the 2-D tensor `name` as a [rows][cols] matrix. Missing and not required: zero mat, 0. */
static int get_mat(loader_t *L, const char *name, int64_t rows, int64_t cols, bool required,
                   td_mat_t *out)
{
    int rc = 0;
    memset(out, 0, sizeof(*out));
    const td__tensor_t *t = find(L, name, required, &rc);
    if (!t)
        return rc;
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char want[64];
        snprintf(want, sizeof(want), "%lld, %lld", (long long)rows, (long long)cols);
        return shape_err(t, want);
    }
    return bind_view(L, t, rows, cols, 0, out);
}

/* A vector of n values converted to an fp32 copy the model owns. */
static int get_vec(loader_t *L, const char *name, int64_t n, bool required, float **out)
{
    int rc = 0;
    *out = NULL;
    const td__tensor_t *t = find(L, name, required, &rc);
    if (!t)
        return rc;
    if (t->ndim != 1 || t->shape[0] != n || t->dtype == TD_DTYPE_F8_E4M3) {
        char want[32];
        snprintf(want, sizeof(want), "%lld", (long long)n);
        return shape_err(t, want);
    }
    float *v = own(L->m, malloc((size_t)n * sizeof(float)));
    if (!v)
        return td_err_set(TD_ENOMEM, "out of memory loading \"%s\"", name);
    if (t->dtype == TD_DTYPE_Q8_0 && n % 32)
        return shape_err(t, "multiple of 32");
    convert_f32((td_dtype_t)t->dtype, t->data, n, v);
    *out = v;
    return 0;
}

/* ---------- configuration ---------- */

static json_object *jget(json_object *o, const char *k)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, k, &v) || json_object_is_type(v, json_type_null))
        return NULL;
    return v;
}

static int jint(loader_t *L, json_object *o, const char *k, int def, bool required, int *out)
{
    json_object *v = jget(o, k);
    if (!v) {
        if (required)
            return td_err_set(TD_EPARSE, "%s: missing field \"%s\"", L->cfg_path, k);
        *out = def;
        return 0;
    }
    if (json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0)
        v = json_object_array_get_idx(v, 0); /* eos_token_id may be a list: the first */
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
        json_object_get_int64(v) > (1 << 30))
        return td_err_set(TD_EPARSE, "%s: field \"%s\" is not a non-negative integer", L->cfg_path,
                          k);
    *out = (int)json_object_get_int64(v);
    return 0;
}

static int jfloat(loader_t *L, json_object *o, const char *k, double def, float *out)
{
    json_object *v = jget(o, k);
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return td_err_set(TD_EPARSE, "%s: field \"%s\" is not a number", L->cfg_path, k);
    *out = (float)json_object_get_double(v);
    return 0;
}

static bool jbool(json_object *o, const char *k, bool def)
{
    json_object *v = jget(o, k);
    return v ? json_object_get_boolean(v) : def;
}

static const char *jstr(json_object *o, const char *k)
{
    json_object *v = jget(o, k);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static int parse_rope_scaling(loader_t *L, json_object *rs, td_model_cfg_t *c)
{
    int rc;
    c->rope_scaling = TD_ROPE_NONE;
    c->rope_factor = 1.0f;
    if (!rs)
        return 0;
    const char *type = jstr(rs, "rope_type");
    if (!type)
        type = jstr(rs, "type");
    if (!type || strcmp(type, "default") == 0)
        return 0;
    if ((rc = jfloat(L, rs, "factor", 1.0, &c->rope_factor)) ||
        (rc =
             jint(L, rs, "original_max_position_embeddings", c->max_ctx, false, &c->rope_orig_ctx)))
        return rc;
    if (strcmp(type, "linear") == 0) {
        c->rope_scaling = TD_ROPE_LINEAR;
    } else if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = TD_ROPE_LLAMA3;
        if ((rc = jfloat(L, rs, "low_freq_factor", 1.0, &c->rope_low_freq_factor)) ||
            (rc = jfloat(L, rs, "high_freq_factor", 4.0, &c->rope_high_freq_factor)))
            return rc;
    } else if (strcmp(type, "yarn") == 0) {
        c->rope_scaling = TD_ROPE_YARN;
        if ((rc = jfloat(L, rs, "beta_fast", 32, &c->yarn_beta_fast)) ||
            (rc = jfloat(L, rs, "beta_slow", 1, &c->yarn_beta_slow)) ||
            (rc = jfloat(L, rs, "mscale", 1, &c->yarn_mscale)) ||
            (rc = jfloat(L, rs, "mscale_all_dim", 0, &c->yarn_mscale_all_dim)))
            return rc;
    } else {
        return td_err_set(TD_ENOTSUP, "%s: rope_scaling type \"%s\" is not supported", L->cfg_path,
                          type);
    }
    return 0;
}

static int parse_config_json(loader_t *L, const char *path)
{
    char *text;
    size_t len;
    int rc = td_file_read_all(path, &text, &len);
    if (rc)
        return rc;
    json_tokener *tok = json_tokener_new();
    json_object *o = tok ? json_tokener_parse_ex(tok, text, (int)len) : NULL;
    bool ok = tok && json_tokener_get_error(tok) == json_tokener_success;
    if (tok)
        json_tokener_free(tok);
    free(text);
    if (!o || !ok || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return td_err_set(TD_EPARSE, "%s: not a JSON object", path);
    }
    td_model_cfg_t *c = &L->m->cfg;
    const char *mt = jstr(o, "model_type");
    if (!mt) {
        rc = td_err_set(TD_EPARSE, "%s: missing field \"model_type\"", path);
        goto out;
    }
    if (strcmp(mt, "llama") == 0 || strcmp(mt, "mistral") == 0)
        c->arch = TD_ARCH_LLAMA;
    else if (strcmp(mt, "qwen2") == 0)
        c->arch = TD_ARCH_QWEN2;
    else if (strcmp(mt, "qwen3") == 0)
        c->arch = TD_ARCH_QWEN3;
    else if (strcmp(mt, "deepseek_v2") == 0)
        c->arch = TD_ARCH_DEEPSEEK_V2;
    else if (strcmp(mt, "deepseek_v3") == 0)
        c->arch = TD_ARCH_DEEPSEEK_V3;
    else {
        rc = td_err_set(TD_ENOTSUP, "%s: model_type \"%s\" is not supported", path, mt);
        goto out;
    }
    if ((rc = jint(L, o, "vocab_size", 0, true, &c->vocab_size)) ||
        (rc = jint(L, o, "hidden_size", 0, true, &c->hidden)) ||
        (rc = jint(L, o, "num_hidden_layers", 0, true, &c->n_layers)) ||
        (rc = jint(L, o, "num_attention_heads", 0, true, &c->n_heads)) ||
        (rc = jint(L, o, "num_key_value_heads", c->n_heads, false, &c->n_kv_heads)) ||
        (rc = jint(L, o, "intermediate_size", 0, true, &c->inter)) ||
        (rc = jint(L, o, "max_position_embeddings", 4096, false, &c->max_ctx)) ||
        (rc = jfloat(L, o, "rms_norm_eps", 1e-6, &c->rms_eps)) ||
        (rc = jfloat(L, o, "rope_theta", 10000.0, &c->rope_theta)) ||
        (rc = jint(L, o, "bos_token_id", -1, false, &c->bos_id)) ||
        (rc = jint(L, o, "eos_token_id", -1, false, &c->eos_id)))
        goto out;
    if (c->n_heads == 0 || c->hidden == 0 || c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads) {
        rc = td_err_set(TD_EPARSE, "%s: bad head counts", path);
        goto out;
    }
    if ((rc = jint(L, o, "head_dim", c->hidden / c->n_heads, false, &c->head_dim)))
        goto out;
    /* Mistral's sliding window applies to every layer; Qwen2's (use_sliding_window, per layer
     * from max_window_layers) is not implemented and refused rather than computed wrong */
    if (strcmp(mt, "mistral") == 0 && (rc = jint(L, o, "sliding_window", 0, false,
                                                  &c->sliding_window)))
        goto out;
    if (jbool(o, "use_sliding_window", false) && strcmp(mt, "mistral") != 0) {
        rc = td_err_set(TD_ENOTSUP, "%s: field \"use_sliding_window\": per-layer sliding-window "
                                    "attention (%s) is not supported", path, mt);
        goto out;
    }
    c->tie_embeddings = jbool(o, "tie_word_embeddings", false);
    if ((rc = parse_rope_scaling(L, jget(o, "rope_scaling"), c)))
        goto out;
    c->rope_interleaved = false;
    c->rope_dim = c->head_dim;
    if (is_mla(c->arch)) {
        c->rope_interleaved = jbool(o, "rope_interleave", true);
        if ((rc = jint(L, o, "q_lora_rank", 0, false, &c->q_lora_rank)) ||
            (rc = jint(L, o, "kv_lora_rank", 0, true, &c->kv_lora_rank)) ||
            (rc = jint(L, o, "qk_nope_head_dim", 0, true, &c->qk_nope_dim)) ||
            (rc = jint(L, o, "qk_rope_head_dim", 0, true, &c->qk_rope_dim)) ||
            (rc = jint(L, o, "v_head_dim", 0, true, &c->v_head_dim)) ||
            (rc = jint(L, o, "n_routed_experts", 0, false, &c->n_routed_experts)) ||
            (rc = jint(L, o, "n_shared_experts", 0, false, &c->n_shared_experts)) ||
            (rc = jint(L, o, "num_experts_per_tok", 0, false, &c->n_experts_per_tok)) ||
            (rc = jint(L, o, "moe_intermediate_size", 0, false, &c->moe_inter)) ||
            (rc = jint(L, o, "n_group", 1, false, &c->n_group)) ||
            (rc = jint(L, o, "topk_group", 1, false, &c->topk_group)) ||
            (rc = jint(L, o, "first_k_dense_replace", 0, false, &c->first_k_dense)) ||
            (rc = jfloat(L, o, "routed_scaling_factor", 1.0, &c->routed_scale)))
            goto out;
        c->rope_dim = c->qk_rope_dim;
        int moe_freq = 1;
        if ((rc = jint(L, o, "moe_layer_freq", 1, false, &moe_freq)))
            goto out;
        if (moe_freq != 1) { /* every released DeepSeek V2/V3 uses 1: MoE on every layer */
            rc = td_err_set(TD_ENOTSUP, "%s: field \"moe_layer_freq\" = %d (only 1 is supported)",
                            path, moe_freq);
            goto out;
        }
        const char *sf = jstr(o, "scoring_func");
        c->score_func = sf && strcmp(sf, "sigmoid") == 0 ? TD_SCORE_SIGMOID : TD_SCORE_SOFTMAX;
        if (sf && strcmp(sf, "sigmoid") != 0 && strcmp(sf, "softmax") != 0) {
            rc = td_err_set(TD_ENOTSUP, "%s: scoring_func \"%s\"", path, sf);
            goto out;
        }
        c->norm_topk_prob = jbool(o, "norm_topk_prob", false);
        const char *tm = jstr(o, "topk_method");
        if (tm && strcmp(tm, "greedy") == 0)
            c->n_group = c->topk_group = 1; /* plain top-k, no group limit */
    }
out:
    json_object_put(o);
    return rc;
}

static int gnum(loader_t *L, const char *key, bool required, double def, double *out)
{
    const td__gguf_kv_t *kv = td__gguf_find(&L->ix, key);
    if (!kv) {
        if (required)
            return td_err_set(TD_EPARSE, "%s: missing metadata \"%s\"", L->cfg_path, key);
        *out = def;
        return 0;
    }
    if (kv->type == TD__GGUF_STRING || kv->type == TD__GGUF_ARRAY)
        return td_err_set(TD_EPARSE, "%s: metadata \"%s\" is not a number", L->cfg_path, key);
    *out = kv->num;
    return 0;
}

static int gint(loader_t *L, const char *arch, const char *key, bool required, int def, int *out)
{
    char k[128];
    double v;
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    int rc = gnum(L, k, required, def, &v);
    if (rc)
        return rc;
    if (v < -1 || v > (1 << 30) || v != floor(v))
        return td_err_set(TD_EPARSE, "%s: metadata \"%s\" out of range", L->cfg_path, k);
    *out = (int)v;
    return 0;
}

static int gflt(loader_t *L, const char *arch, const char *key, double def, float *out)
{
    char k[128];
    double v = def;
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    int rc = gnum(L, k, false, def, &v);
    if (rc)
        return rc;
    *out = (float)v;
    return 0;
}

static int parse_config_gguf(loader_t *L)
{
    td_model_cfg_t *c = &L->m->cfg;
    const td__gguf_kv_t *ak = td__gguf_find(&L->ix, "general.architecture");
    if (!ak || ak->type != TD__GGUF_STRING)
        return td_err_set(TD_EPARSE, "%s: missing metadata \"general.architecture\"", L->cfg_path);
    const char *a = ak->str;
    if (strcmp(a, "llama") == 0)
        c->arch = TD_ARCH_LLAMA;
    else if (strcmp(a, "deepseek2") == 0)
        c->arch = TD_ARCH_DEEPSEEK_V3; /* refined below from the gating function */
    else
        return td_err_set(TD_ENOTSUP, "%s: GGUF architecture \"%s\" is not supported", L->cfg_path,
                          a);
    int rc;
    if ((rc = gint(L, a, "embedding_length", true, 0, &c->hidden)) ||
        (rc = gint(L, a, "block_count", true, 0, &c->n_layers)) ||
        (rc = gint(L, a, "feed_forward_length", true, 0, &c->inter)) ||
        (rc = gint(L, a, "attention.head_count", true, 0, &c->n_heads)) ||
        (rc = gint(L, a, "attention.head_count_kv", false, c->n_heads, &c->n_kv_heads)) ||
        (rc = gint(L, a, "context_length", false, 4096, &c->max_ctx)) ||
        (rc = gflt(L, a, "attention.layer_norm_rms_epsilon", 1e-5, &c->rms_eps)) ||
        (rc = gflt(L, a, "rope.freq_base", 10000.0, &c->rope_theta)))
        return rc;
    if (c->n_heads <= 0 || c->hidden <= 0 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return td_err_set(TD_EPARSE, "%s: bad head counts", L->cfg_path);
    double v;
    if ((rc = gnum(L, "tokenizer.ggml.bos_token_id", false, -1, &v)))
        return rc;
    c->bos_id = (int)v;
    if ((rc = gnum(L, "tokenizer.ggml.eos_token_id", false, -1, &v)))
        return rc;
    c->eos_id = (int)v;
    const td__tensor_t *emb = td__index_find(&L->ix, "token_embd.weight");
    if ((rc = gint(L, a, "vocab_size", false, emb && emb->ndim == 2 ? (int)emb->shape[0] : 0,
                   &c->vocab_size)))
        return rc;
    if (c->vocab_size <= 0)
        return td_err_set(TD_EPARSE, "%s: unknown vocabulary size", L->cfg_path);
    c->tie_embeddings = td__index_find(&L->ix, "output.weight") == NULL;
    c->rope_interleaved = true; /* llama.cpp's NORM rope: adjacent pairs (q/k are permuted) */
    c->rope_factor = 1.0f;
    const td__gguf_kv_t *st = td__gguf_find(&L->ix, "llama.rope.scaling.type");
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
    st = td__gguf_find(&L->ix, key);
    if (st && st->type == TD__GGUF_STRING && strcmp(st->str, "none") != 0) {
        if ((rc = gflt(L, a, "rope.scaling.factor", 1.0, &c->rope_factor)) ||
            (rc = gint(L, a, "rope.scaling.original_context_length", false, c->max_ctx,
                       &c->rope_orig_ctx)))
            return rc;
        if (strcmp(st->str, "linear") == 0) {
            c->rope_scaling = TD_ROPE_LINEAR;
        } else if (strcmp(st->str, "yarn") == 0) {
            float mul;
            c->rope_scaling = TD_ROPE_YARN;
            c->yarn_beta_fast = 32;
            c->yarn_beta_slow = 1;
            if ((rc = gflt(L, a, "rope.scaling.yarn_log_multiplier", 0, &mul)))
                return rc;
            c->yarn_mscale = c->yarn_mscale_all_dim = mul / 0.1f;
        } else {
            return td_err_set(TD_ENOTSUP, "%s: rope scaling \"%s\"", L->cfg_path, st->str);
        }
    }
    if ((rc = gint(L, a, "attention.key_length", false, c->hidden / c->n_heads, &c->head_dim)))
        return rc;
    c->rope_dim = c->head_dim;
    if (c->arch == TD_ARCH_LLAMA)
        return gint(L, a, "rope.dimension_count", false, c->head_dim, &c->rope_dim);
    /* deepseek2 */
    int key_len, gating = 1, val_len;
    bool norm;
    if ((rc = gint(L, a, "attention.q_lora_rank", false, 0, &c->q_lora_rank)) ||
        (rc = gint(L, a, "attention.kv_lora_rank", true, 0, &c->kv_lora_rank)) ||
        (rc = gint(L, a, "attention.key_length", true, 0, &key_len)) ||
        (rc = gint(L, a, "attention.value_length", true, 0, &val_len)) ||
        /* llama.cpp's MLA form: key/value_length describe the latent; these the heads */
        (rc = gint(L, a, "attention.key_length_mla", false, key_len, &key_len)) ||
        (rc = gint(L, a, "attention.value_length_mla", false, val_len, &val_len)) ||
        (rc = gint(L, a, "rope.dimension_count", true, 0, &c->qk_rope_dim)) ||
        (rc = gint(L, a, "leading_dense_block_count", false, 0, &c->first_k_dense)) ||
        (rc = gint(L, a, "expert_feed_forward_length", false, 0, &c->moe_inter)) ||
        (rc = gint(L, a, "expert_count", false, 0, &c->n_routed_experts)) ||
        (rc = gint(L, a, "expert_shared_count", false, 0, &c->n_shared_experts)) ||
        (rc = gint(L, a, "expert_used_count", false, 0, &c->n_experts_per_tok)) ||
        (rc = gint(L, a, "expert_group_count", false, 1, &c->n_group)) ||
        (rc = gint(L, a, "expert_group_used_count", false, 1, &c->topk_group)) ||
        (rc = gint(L, a, "expert_gating_func", false, 1, &gating)) ||
        (rc = gflt(L, a, "expert_weights_scale", 1.0, &c->routed_scale)))
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

/* Sanity of the hyperparameters, so the forward pass can trust them. */
static int check_config(loader_t *L)
{
    td_model_cfg_t *c = &L->m->cfg;
    const int lim = 1 << 20;
    bool ok = c->vocab_size > 0 && c->vocab_size < (1 << 24) && c->hidden > 0 && c->hidden < lim &&
              c->n_layers > 0 && c->n_layers < 4096 && c->n_heads > 0 && c->n_heads < 4096 &&
              c->head_dim > 0 && c->head_dim < 8192 && c->inter > 0 && c->inter < lim &&
              c->rms_eps > 0 && c->rope_theta > 0 && c->rope_factor > 0;
    if (ok && !is_mla(c->arch))
        ok = c->rope_dim > 0 && c->rope_dim <= c->head_dim && c->rope_dim % 2 == 0;
    if (ok && is_mla(c->arch)) {
        ok = c->kv_lora_rank > 0 && c->qk_nope_dim > 0 && c->qk_rope_dim > 0 &&
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
    }
    if (!ok)
        return td_err_set(TD_EPARSE, "%s: inconsistent or out-of-range model hyperparameters",
                          L->cfg_path);
    if (c->rope_scaling == TD_ROPE_YARN && c->rope_orig_ctx <= 0)
        return td_err_set(TD_EPARSE, "%s: YaRN needs original_max_position_embeddings",
                          L->cfg_path);
    return 0;
}

/* ---------- weights ---------- */

typedef struct names {
    const char *embd, *norm, *head;
    const char *attn_norm, *ffn_norm, *q, *k, *v, *o, *qb, *kb, *vb, *qn, *kn;
    const char *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *kv_b;
    const char *gate, *up, *down, *router, *router_bias;
    const char *sh_gate, *sh_up, *sh_down;
} names_t;

static const names_t hf_names = {
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias",
    "model.layers.%d.self_attn.q_norm.weight",
    "model.layers.%d.self_attn.k_norm.weight",
    "model.layers.%d.self_attn.q_a_proj.weight",
    "model.layers.%d.self_attn.q_a_layernorm.weight",
    "model.layers.%d.self_attn.q_b_proj.weight",
    "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.%d.self_attn.kv_a_layernorm.weight",
    "model.layers.%d.self_attn.kv_b_proj.weight",
    "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
    "model.layers.%d.mlp.gate.weight",
    "model.layers.%d.mlp.gate.e_score_correction_bias",
    "model.layers.%d.mlp.shared_experts.gate_proj.weight",
    "model.layers.%d.mlp.shared_experts.up_proj.weight",
    "model.layers.%d.mlp.shared_experts.down_proj.weight",
};

static const names_t gguf_names = {
    "token_embd.weight",
    "output_norm.weight",
    "output.weight",
    "blk.%d.attn_norm.weight",
    "blk.%d.ffn_norm.weight",
    "blk.%d.attn_q.weight",
    "blk.%d.attn_k.weight",
    "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias",
    "blk.%d.attn_k.bias",
    "blk.%d.attn_v.bias",
    "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight",
    "blk.%d.attn_q_a.weight",
    "blk.%d.attn_q_a_norm.weight",
    "blk.%d.attn_q_b.weight",
    "blk.%d.attn_kv_a_mqa.weight",
    "blk.%d.attn_kv_a_norm.weight",
    "blk.%d.attn_kv_b.weight",
    "blk.%d.ffn_gate.weight",
    "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight",
    "blk.%d.ffn_gate_inp.weight",
    "blk.%d.exp_probs_b.bias",
    "blk.%d.ffn_gate_shexp.weight",
    "blk.%d.ffn_up_shexp.weight",
    "blk.%d.ffn_down_shexp.weight",
};

static const char *nm(char *buf, size_t n, const char *fmt, int l)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(buf, n, fmt, l);
#pragma GCC diagnostic pop
    return buf;
}

/* The routed experts of layer l: per-expert names, HF's fused experts.gate_up_proj [E][2I][H]
 * (gate rows first) with experts.down_proj [E][H][I], or GGUF's stacked ffn_*_exps. */
static int bind_experts(loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    int E = c->n_routed_experts, I = c->moe_inter, H = c->hidden, rc = 0;
    char n1[256], n2[256], n3[256];
    w->exp_gate = own(L->m, td_calloc((size_t)E, sizeof(td_mat_t)));
    w->exp_up = own(L->m, td_calloc((size_t)E, sizeof(td_mat_t)));
    w->exp_down = own(L->m, td_calloc((size_t)E, sizeof(td_mat_t)));
    if (!w->exp_gate || !w->exp_up || !w->exp_down)
        return td_err_set(TD_ENOMEM, "out of memory binding experts");
    if (L->gguf) {
        const char *kind[3] = {"gate", "up", "down"};
        td_mat_t *dst[3] = {w->exp_gate, w->exp_up, w->exp_down};
        for (int k = 0; k < 3; k++) {
            snprintf(n1, sizeof(n1), "blk.%d.ffn_%s_exps.weight", l, kind[k]);
            const td__tensor_t *t = find(L, n1, true, &rc);
            if (!t)
                return rc;
            int64_t rows = k == 2 ? H : I, cols = k == 2 ? I : H;
            if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols) {
                char want[64];
                snprintf(want, sizeof(want), "%d, %lld, %lld", E, (long long)rows, (long long)cols);
                return shape_err(t, want);
            }
            for (int e = 0; e < E; e++)
                if ((rc = bind_view(L, t, rows, cols, e, &dst[k][e])))
                    return rc;
        }
        return 0;
    }
    snprintf(n1, sizeof(n1), "model.layers.%d.mlp.experts.gate_up_proj", l);
    const td__tensor_t *gu = td__index_find(&L->ix, n1);
    if (gu) {
        snprintf(n2, sizeof(n2), "model.layers.%d.mlp.experts.down_proj", l);
        const td__tensor_t *dn = find(L, n2, true, &rc);
        if (!dn)
            return rc;
        if (gu->dtype < 0 || dn->dtype < 0)
            return find(L, gu->dtype < 0 ? n1 : n2, true, &rc), rc;
        if (gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != H) {
            char want[64];
            snprintf(want, sizeof(want), "%d, %d, %d", E, 2 * I, H);
            return shape_err(gu, want);
        }
        if (dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != H || dn->shape[2] != I) {
            char want[64];
            snprintf(want, sizeof(want), "%d, %d, %d", E, H, I);
            return shape_err(dn, want);
        }
        for (int e = 0; e < E; e++) {
            td_mat_t both;
            if ((rc = bind_view(L, gu, 2 * I, H, e, &both)) ||
                (rc = bind_view(L, dn, H, I, e, &w->exp_down[e])))
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
        if ((rc = get_mat(L, n1, I, H, true, &w->exp_gate[e])) ||
            (rc = get_mat(L, n2, I, H, true, &w->exp_up[e])) ||
            (rc = get_mat(L, n3, H, I, true, &w->exp_down[e])))
            return rc;
    }
    return 0;
}

/* A 3-D tensor [d0][d1][d2] bound as the matrix [d0*d1][d2]. */
static int get_mat3(loader_t *L, const char *name, int64_t d0, int64_t d1, int64_t d2,
                    td_mat_t *out)
{
    int rc = 0;
    memset(out, 0, sizeof(*out));
    const td__tensor_t *t = find(L, name, true, &rc);
    if (!t)
        return rc;
    if (t->ndim != 3 || t->shape[0] != d0 || t->shape[1] != d1 || t->shape[2] != d2) {
        char want[64];
        snprintf(want, sizeof(want), "%lld, %lld, %lld", (long long)d0, (long long)d1,
                 (long long)d2);
        return shape_err(t, want);
    }
    return bind_view(L, t, d0 * d1, d2, 0, out);
}

/* MLA's up-projection: HF's kv_b_proj (and older GGUF attn_kv_b), or newer GGUF's split
 * attn_k_b [n_heads][kv_rank][nope] (already transposed) and attn_v_b [n_heads][v][kv_rank]. */
static int bind_kv_b(loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    char b[256];
    int64_t nh = c->n_heads, R = c->kv_lora_rank;
    const char *kv_b = L->gguf ? gguf_names.kv_b : hf_names.kv_b;
    nm(b, sizeof(b), kv_b, l);
    if (!L->gguf || td__index_find(&L->ix, b))
        return get_mat(L, b, nh * (c->qk_nope_dim + c->v_head_dim), R, true, &w->wkv_b);
    int rc = get_mat3(L, nm(b, sizeof(b), "blk.%d.attn_k_b.weight", l), nh, R, c->qk_nope_dim,
                      &w->wk_b_t);
    if (rc)
        return rc;
    return get_mat3(L, nm(b, sizeof(b), "blk.%d.attn_v_b.weight", l), nh, c->v_head_dim, R,
                    &w->wv_b);
}

static int bind_weights(loader_t *L)
{
    td_model_t *m = L->m;
    const td_model_cfg_t *c = &m->cfg;
    const names_t *N = L->gguf ? &gguf_names : &hf_names;
    int H = c->hidden, rc;
    char b[256];
    if ((rc = get_mat(L, N->embd, c->vocab_size, H, true, &m->tok_embd)) ||
        (rc = get_vec(L, N->norm, H, true, &m->out_norm)))
        return rc;
    if (L->gguf && (rc = get_vec(L, "rope_freqs.weight", c->rope_dim / 2, false, &m->rope_freqs)))
        return rc;
    if (c->tie_embeddings)
        m->lm_head = m->tok_embd;
    else if ((rc = get_mat(L, N->head, c->vocab_size, H, true, &m->lm_head)))
        return rc;
    m->layers = own(m, td_calloc((size_t)c->n_layers, sizeof(td_layer_w_t)));
    if (!m->layers)
        return td_err_set(TD_ENOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        td_layer_w_t *w = &m->layers[l];
        if ((rc = get_vec(L, nm(b, sizeof(b), N->attn_norm, l), H, true, &w->attn_norm)) ||
            (rc = get_vec(L, nm(b, sizeof(b), N->ffn_norm, l), H, true, &w->ffn_norm)))
            return rc;
        if (!is_mla(c->arch)) {
            int qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
            bool bias_req = c->arch == TD_ARCH_QWEN2, norm_req = c->arch == TD_ARCH_QWEN3;
            if ((rc = get_mat(L, nm(b, sizeof(b), N->q, l), qd, H, true, &w->wq)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->k, l), kd, H, true, &w->wk)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->v, l), kd, H, true, &w->wv)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->o, l), H, qd, true, &w->wo)) ||
                (rc = get_vec(L, nm(b, sizeof(b), N->qb, l), qd, bias_req, &w->bq)) ||
                (rc = get_vec(L, nm(b, sizeof(b), N->kb, l), kd, bias_req, &w->bk)) ||
                (rc = get_vec(L, nm(b, sizeof(b), N->vb, l), kd, bias_req, &w->bv)) ||
                (rc = get_vec(L, nm(b, sizeof(b), N->qn, l), c->head_dim, norm_req, &w->q_norm)) ||
                (rc = get_vec(L, nm(b, sizeof(b), N->kn, l), c->head_dim, norm_req, &w->k_norm)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->gate, l), c->inter, H, true, &w->w_gate)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->up, l), c->inter, H, true, &w->w_up)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->down, l), H, c->inter, true, &w->w_down)))
                return rc;
            continue;
        }
        int qk = c->qk_nope_dim + c->qk_rope_dim, nh = c->n_heads;
        if (c->q_lora_rank > 0) {
            if ((rc = get_mat(L, nm(b, sizeof(b), N->q_a, l), c->q_lora_rank, H, true, &w->wq_a)) ||
                (rc = get_vec(L, nm(b, sizeof(b), N->q_a_norm, l), c->q_lora_rank, true,
                              &w->q_a_norm)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->q_b, l), (int64_t)nh * qk, c->q_lora_rank,
                              true, &w->wq_b)))
                return rc;
        } else if ((rc = get_mat(L, nm(b, sizeof(b), N->q, l), (int64_t)nh * qk, H, true,
                                 &w->wq_b))) {
            return rc;
        }
        if ((rc = get_mat(L, nm(b, sizeof(b), N->kv_a, l), c->kv_lora_rank + c->qk_rope_dim, H,
                          true, &w->wkv_a)) ||
            (rc = get_vec(L, nm(b, sizeof(b), N->kv_a_norm, l), c->kv_lora_rank, true,
                          &w->kv_a_norm)) ||
            (rc = bind_kv_b(L, l, w)) ||
            (rc = get_mat(L, nm(b, sizeof(b), N->o, l), H, (int64_t)nh * c->v_head_dim, true,
                          &w->wo)))
            return rc;
        w->is_moe = c->n_routed_experts > 0 && l >= c->first_k_dense;
        if (!w->is_moe) {
            if ((rc = get_mat(L, nm(b, sizeof(b), N->gate, l), c->inter, H, true, &w->w_gate)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->up, l), c->inter, H, true, &w->w_up)) ||
                (rc = get_mat(L, nm(b, sizeof(b), N->down, l), H, c->inter, true, &w->w_down)))
                return rc;
            continue;
        }
        int si = c->n_shared_experts * c->moe_inter;
        if ((rc = get_mat(L, nm(b, sizeof(b), N->router, l), c->n_routed_experts, H, true,
                          &w->w_router)) ||
            (rc = get_vec(L, nm(b, sizeof(b), N->router_bias, l), c->n_routed_experts,
                          c->score_func == TD_SCORE_SIGMOID, &w->router_bias)) ||
            (rc = bind_experts(L, l, w)))
            return rc;
        if (si > 0 &&
            ((rc = get_mat(L, nm(b, sizeof(b), N->sh_gate, l), si, H, true, &w->sh_gate)) ||
             (rc = get_mat(L, nm(b, sizeof(b), N->sh_up, l), si, H, true, &w->sh_up)) ||
             (rc = get_mat(L, nm(b, sizeof(b), N->sh_down, l), H, si, true, &w->sh_down))))
            return rc;
    }
    return 0;
}

/* Digest: the hyperparameters, every tensor's name, dtype and shape, and up to three 4 KiB samples
 * of its bytes (start, middle, end). Cheap for large checkpoints, yet it tells fine-tunes of one
 * architecture apart. */
static int compute_digest(loader_t *L)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return td_err_set(TD_ENOMEM, "out of memory");
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, &L->m->cfg, sizeof(L->m->cfg));
    for (size_t i = 0; i < L->ix.n; i++) {
        const td__tensor_t *t = &L->ix.t[i];
        XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(st, t->dtype_str, sizeof(t->dtype_str));
        XXH3_128bits_update(st, t->shape, sizeof(t->shape));
        size_t s = TD_MIN(t->nbytes, (size_t)4096);
        XXH3_128bits_update(st, t->data, s);
        XXH3_128bits_update(st, t->data + t->nbytes / 2 - TD_MIN(t->nbytes / 2, s / 2), s);
        XXH3_128bits_update(st, t->data + t->nbytes - s, s);
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, h);
    memcpy(L->m->digest, canon.digest, 16);
    XXH3_freeState(st);
    return 0;
}

/* ---------- files ---------- */

static int map_file(loader_t *L, const char *path, td_mmap_t **out)
{
    td_model_t *m = L->m;
    td_mmap_t *maps = td_reallocarray(m->maps, (size_t)m->n_maps + 1, sizeof(*maps));
    if (!maps)
        return td_err_set(TD_ENOMEM, "out of memory");
    m->maps = maps;
    char *p = td_strdup(path);
    char **files = td_reallocarray(L->ix.files, (size_t)L->ix.n_files + 1, sizeof(char *));
    if (!p || !files) {
        free(p);
        if (files)
            L->ix.files = files;
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    L->ix.files = files;
    L->ix.files[L->ix.n_files++] = p;
    int rc = td_mmap_open(&maps[m->n_maps], path);
    if (rc)
        return rc;
    *out = &maps[m->n_maps++];
    return 0;
}

/* Shards named by model.safetensors.index.json's weight_map, each mapped once. */
static int open_sharded(loader_t *L, const char *dir, const char *index_path)
{
    char *text;
    size_t len;
    int rc = td_file_read_all(index_path, &text, &len);
    if (rc)
        return rc;
    json_tokener *tok = json_tokener_new();
    json_object *o = tok ? json_tokener_parse_ex(tok, text, (int)len) : NULL;
    bool ok = tok && json_tokener_get_error(tok) == json_tokener_success;
    if (tok)
        json_tokener_free(tok);
    free(text);
    json_object *wm = ok ? jget(o, "weight_map") : NULL;
    if (!wm || !json_object_is_type(wm, json_type_object)) {
        json_object_put(o);
        return td_err_set(TD_EPARSE, "%s: no \"weight_map\" object", index_path);
    }
    char **seen = NULL;
    int n_seen = 0;
    json_object_object_foreach(wm, tname, fv)
    {
        const char *f =
            json_object_is_type(fv, json_type_string) ? json_object_get_string(fv) : NULL;
        if (!f || strchr(f, '/') || strcmp(f, "..") == 0) {
            rc = td_err_set(TD_EPARSE, "%s: tensor \"%s\": bad shard file name", index_path, tname);
            break;
        }
        bool dup = false;
        for (int i = 0; i < n_seen && !dup; i++)
            dup = strcmp(seen[i], f) == 0;
        if (dup)
            continue;
        char **s2 = td_reallocarray(seen, (size_t)n_seen + 1, sizeof(char *));
        if (!s2) {
            rc = td_err_set(TD_ENOMEM, "out of memory");
            break;
        }
        seen = s2;
        seen[n_seen++] = (char *)f;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, f);
        td_mmap_t *mm;
        if ((rc = map_file(L, path, &mm)))
            break;
        rc = td__safetensors_parse(&L->ix, mm, L->ix.files[L->ix.n_files - 1]);
        if (rc)
            break;
    }
    /* every tensor the index names must be in the shard it names */
    if (!rc)
        rc = td__index_finish(&L->ix);
    if (!rc) {
        json_object_object_foreach(wm, tname2, fv2)
        {
            const td__tensor_t *t = td__index_find(&L->ix, tname2);
            const char *f = json_object_get_string(fv2);
            if (!t || !td_str_endswith(t->file, f)) {
                rc = td_err_set(TD_ENOENT, "%s: tensor \"%s\" is not in shard %s", index_path,
                                tname2, f);
                break;
            }
        }
    }
    free(seen);
    json_object_put(o);
    return rc;
}

int td_model_load(const char *path, td_model_t **out)
{
    *out = NULL;
    loader_t L = {0};
    td_model_t *m = td_calloc(1, sizeof(*m));
    if (!m || !(m->path = td_strdup(path))) {
        free(m);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    L.m = m;
    struct stat st;
    int rc;
    char cfg[4096], p2[4096];
    if (stat(path, &st) != 0) {
        rc = td_err_set(TD_ENOENT, "%s: no such file or directory", path);
        goto err;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(cfg, sizeof(cfg), "%s/config.json", path);
        L.cfg_path = cfg;
        if ((rc = parse_config_json(&L, cfg)))
            goto err;
        snprintf(p2, sizeof(p2), "%s/model.safetensors.index.json", path);
        if (access(p2, R_OK) == 0) {
            if ((rc = open_sharded(&L, path, p2)))
                goto err;
        } else {
            snprintf(p2, sizeof(p2), "%s/model.safetensors", path);
            td_mmap_t *mm;
            if ((rc = map_file(&L, p2, &mm)) ||
                (rc = td__safetensors_parse(&L.ix, mm, L.ix.files[L.ix.n_files - 1])))
                goto err;
        }
    } else {
        L.gguf = true;
        L.cfg_path = path;
        td_mmap_t *mm;
        if ((rc = map_file(&L, path, &mm)) ||
            (rc = td__gguf_parse(&L.ix, mm, L.ix.files[L.ix.n_files - 1])))
            goto err;
        if ((rc = td__index_finish(&L.ix)) || (rc = parse_config_gguf(&L)))
            goto err;
    }
    if ((rc = td__index_finish(&L.ix)) || (rc = check_config(&L)) || (rc = bind_weights(&L)) ||
        (rc = compute_digest(&L)))
        goto err;
    td__index_free(&L.ix);
    *out = m;
    return 0;
err:
    td__index_free(&L.ix);
    td_model_free(m);
    return rc;
}

void td_model_free(td_model_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_maps; i++)
        td_mmap_close(&m->maps[i]);
    free(m->maps);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->path);
    free(m);
}
