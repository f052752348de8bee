/* model_config.c: the hyperparameters: config.json (Hugging Face) or GGUF metadata, the fields
 * every architecture has here and the rest through the architecture family's hooks, then their
 * sanity check. */
#include "model_impl.h"
#include "td_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_object *td__jget(json_object *o, const char *k)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, k, &v) || json_object_is_type(v, json_type_null))
        return NULL;
    return v;
}

int td__jint(td__loader_t *L, json_object *o, const char *k, int def, bool required, int *out)
{
    json_object *v = td__jget(o, k);
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

int td__jfloat(td__loader_t *L, json_object *o, const char *k, double def, float *out)
{
    json_object *v = td__jget(o, k);
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return td_err_set(TD_EPARSE, "%s: field \"%s\" is not a number", L->cfg_path, k);
    *out = (float)json_object_get_double(v);
    return 0;
}

bool td__jbool(json_object *o, const char *k, bool def)
{
    json_object *v = td__jget(o, k);
    return v ? json_object_get_boolean(v) : def;
}

const char *td__jstr(json_object *o, const char *k)
{
    json_object *v = td__jget(o, k);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static int parse_rope_scaling(td__loader_t *L, json_object *rs, td_model_cfg_t *c)
{
    int rc;
    c->rope_scaling = TD_ROPE_NONE;
    c->rope_factor = 1.0f;
    if (!rs)
        return 0;
    const char *type = td__jstr(rs, "rope_type");
    if (!type)
        type = td__jstr(rs, "type");
    if (!type || strcmp(type, "default") == 0)
        return 0;
    if ((rc = td__jfloat(L, rs, "factor", 1.0, &c->rope_factor)) ||
        (rc = td__jint(L, rs, "original_max_position_embeddings", c->max_ctx, false,
                       &c->rope_orig_ctx)))
        return rc;
    if (strcmp(type, "linear") == 0) {
        c->rope_scaling = TD_ROPE_LINEAR;
    } else if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = TD_ROPE_LLAMA3;
        if ((rc = td__jfloat(L, rs, "low_freq_factor", 1.0, &c->rope_low_freq_factor)) ||
            (rc = td__jfloat(L, rs, "high_freq_factor", 4.0, &c->rope_high_freq_factor)))
            return rc;
    } else if (strcmp(type, "yarn") == 0) {
        c->rope_scaling = TD_ROPE_YARN;
        if ((rc = td__jfloat(L, rs, "beta_fast", 32, &c->yarn_beta_fast)) ||
            (rc = td__jfloat(L, rs, "beta_slow", 1, &c->yarn_beta_slow)) ||
            (rc = td__jfloat(L, rs, "mscale", 1, &c->yarn_mscale)) ||
            (rc = td__jfloat(L, rs, "mscale_all_dim", 0, &c->yarn_mscale_all_dim)))
            return rc;
    } else {
        return td_err_set(TD_ENOTSUP, "%s: rope_scaling type \"%s\" is not supported", L->cfg_path,
                          type);
    }
    return 0;
}

int td__json_read(const char *path, json_object **out)
{
    char *text;
    size_t len;
    *out = NULL;
    int rc = td_file_read_all(path, &text, &len);
    if (rc)
        return rc;
    json_tokener *tok = json_tokener_new();
    json_object *o = tok ? json_tokener_parse_ex(tok, text, (int)len) : NULL;
    bool ok = tok && json_tokener_get_error(tok) == json_tokener_success;
    if (tok)
        json_tokener_free(tok);
    free(text);
    if (!ok) {
        json_object_put(o);
        o = NULL;
    }
    *out = o;
    return 0;
}

int td__config_json(td__loader_t *L, const char *path)
{
    json_object *o;
    int rc = td__json_read(path, &o);
    if (rc)
        return rc;
    if (!o || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return td_err_set(TD_EPARSE, "%s: not a JSON object", path);
    }
    td_model_cfg_t *c = &L->m->cfg;
    const char *mt = td__jstr(o, "model_type");
    if (!mt) {
        rc = td_err_set(TD_EPARSE, "%s: missing field \"model_type\"", path);
        goto out;
    }
    int a = td__arch_from_hf(mt);
    if (a < 0) {
        rc = td_err_set(TD_ENOTSUP, "%s: model_type \"%s\" is not supported", path, mt);
        goto out;
    }
    c->arch = (td_arch_t)a;
    if ((rc = td__jint(L, o, "vocab_size", 0, true, &c->vocab_size)) ||
        (rc = td__jint(L, o, "hidden_size", 0, true, &c->hidden)) ||
        (rc = td__jint(L, o, "num_hidden_layers", 0, true, &c->n_layers)) ||
        (rc = td__jint(L, o, "num_attention_heads", 0, true, &c->n_heads)) ||
        (rc = td__jint(L, o, "num_key_value_heads", c->n_heads, false, &c->n_kv_heads)) ||
        (rc = td__jint(L, o, "intermediate_size", 0, true, &c->inter)) ||
        (rc = td__jint(L, o, "max_position_embeddings", 4096, false, &c->max_ctx)) ||
        (rc = td__jfloat(L, o, "rms_norm_eps", 1e-6, &c->rms_eps)) ||
        (rc = td__jfloat(L, o, "rope_theta", 10000.0, &c->rope_theta)) ||
        (rc = td__jint(L, o, "bos_token_id", -1, false, &c->bos_id)) ||
        (rc = td__jint(L, o, "eos_token_id", -1, false, &c->eos_id)))
        goto out;
    if (c->n_heads == 0 || c->hidden == 0 || c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads) {
        rc = td_err_set(TD_EPARSE, "%s: bad head counts", path);
        goto out;
    }
    if ((rc = td__jint(L, o, "head_dim", c->hidden / c->n_heads, false, &c->head_dim)))
        goto out;
    /* Mistral's sliding window applies to every layer; Qwen2's (use_sliding_window, per layer
     * from max_window_layers) is not implemented and refused rather than computed wrong */
    if (strcmp(mt, "mistral") == 0 &&
        (rc = td__jint(L, o, "sliding_window", 0, false, &c->sliding_window)))
        goto out;
    if (td__jbool(o, "use_sliding_window", false) && strcmp(mt, "mistral") != 0) {
        rc = td_err_set(TD_ENOTSUP,
                        "%s: field \"use_sliding_window\": per-layer sliding-window "
                        "attention (%s) is not supported",
                        path, mt);
        goto out;
    }
    c->tie_embeddings = td__jbool(o, "tie_word_embeddings", false);
    if ((rc = parse_rope_scaling(L, td__jget(o, "rope_scaling"), c)))
        goto out;
    c->rope_interleaved = false;
    c->rope_dim = c->head_dim;
    const td__family_t *fam = td__arch_row(c->arch)->family;
    if (fam->parse_json)
        rc = fam->parse_json(L, o);
out:
    json_object_put(o);
    return rc;
}

static int gnum(td__loader_t *L, const char *key, bool required, double def, double *out)
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

int td__gint(td__loader_t *L, const char *arch, const char *key, bool required, int def, int *out)
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

int td__gflt(td__loader_t *L, const char *arch, const char *key, double def, float *out)
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

int td__config_gguf(td__loader_t *L)
{
    td_model_cfg_t *c = &L->m->cfg;
    const td__gguf_kv_t *ak = td__gguf_find(&L->ix, "general.architecture");
    if (!ak || ak->type != TD__GGUF_STRING)
        return td_err_set(TD_EPARSE, "%s: missing metadata \"general.architecture\"", L->cfg_path);
    const char *a = ak->str;
    int arch = td__arch_from_gguf(a);
    if (arch < 0)
        return td_err_set(TD_ENOTSUP, "%s: GGUF architecture \"%s\" is not supported", L->cfg_path,
                          a);
    c->arch = (td_arch_t)arch;
    int rc;
    if ((rc = td__gint(L, a, "embedding_length", true, 0, &c->hidden)) ||
        (rc = td__gint(L, a, "block_count", true, 0, &c->n_layers)) ||
        (rc = td__gint(L, a, "feed_forward_length", true, 0, &c->inter)) ||
        (rc = td__gint(L, a, "attention.head_count", true, 0, &c->n_heads)) ||
        (rc = td__gint(L, a, "attention.head_count_kv", false, c->n_heads, &c->n_kv_heads)) ||
        (rc = td__gint(L, a, "context_length", false, 4096, &c->max_ctx)) ||
        (rc = td__gflt(L, a, "attention.layer_norm_rms_epsilon", 1e-5, &c->rms_eps)) ||
        (rc = td__gflt(L, a, "rope.freq_base", 10000.0, &c->rope_theta)))
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
    if ((rc = td__gint(L, a, "vocab_size", false, emb && emb->ndim == 2 ? (int)emb->shape[0] : 0,
                       &c->vocab_size)))
        return rc;
    if (c->vocab_size <= 0)
        return td_err_set(TD_EPARSE, "%s: unknown vocabulary size", L->cfg_path);
    c->tie_embeddings = td__index_find(&L->ix, "output.weight") == NULL;
    c->rope_interleaved = true; /* llama.cpp's NORM rope: adjacent pairs (q/k are permuted) */
    c->rope_factor = 1.0f;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", a);
    const td__gguf_kv_t *st = td__gguf_find(&L->ix, key);
    if (st && st->type == TD__GGUF_STRING && strcmp(st->str, "none") != 0) {
        if ((rc = td__gflt(L, a, "rope.scaling.factor", 1.0, &c->rope_factor)) ||
            (rc = td__gint(L, a, "rope.scaling.original_context_length", false, c->max_ctx,
                           &c->rope_orig_ctx)))
            return rc;
        if (strcmp(st->str, "linear") == 0) {
            c->rope_scaling = TD_ROPE_LINEAR;
        } else if (strcmp(st->str, "yarn") == 0) {
            float mul;
            c->rope_scaling = TD_ROPE_YARN;
            c->yarn_beta_fast = 32;
            c->yarn_beta_slow = 1;
            if ((rc = td__gflt(L, a, "rope.scaling.yarn_log_multiplier", 0, &mul)))
                return rc;
            c->yarn_mscale = c->yarn_mscale_all_dim = mul / 0.1f;
        } else {
            return td_err_set(TD_ENOTSUP, "%s: rope scaling \"%s\"", L->cfg_path, st->str);
        }
    }
    if ((rc = td__gint(L, a, "attention.key_length", false, c->hidden / c->n_heads, &c->head_dim)))
        return rc;
    c->rope_dim = c->head_dim;
    return td__arch_row(c->arch)->family->parse_gguf(L, a);
}

int td__config_check(td__loader_t *L)
{
    td_model_cfg_t *c = &L->m->cfg;
    const int lim = 1 << 20;
    bool ok = c->vocab_size > 0 && c->vocab_size < (1 << 24) && c->hidden > 0 && c->hidden < lim &&
              c->n_layers > 0 && c->n_layers < 4096 && c->n_heads > 0 && c->n_heads < 4096 &&
              c->head_dim > 0 && c->head_dim < 8192 && c->inter > 0 && c->inter < lim &&
              c->rms_eps > 0 && c->rope_theta > 0 && c->rope_factor > 0;
    if (ok)
        ok = td__arch_row(c->arch)->family->check(c);
    if (!ok)
        return td_err_set(TD_EPARSE, "%s: inconsistent or out-of-range model hyperparameters",
                          L->cfg_path);
    if (c->rope_scaling == TD_ROPE_YARN && c->rope_orig_ctx <= 0)
        return td_err_set(TD_EPARSE, "%s: YaRN needs original_max_position_embeddings",
                          L->cfg_path);
    return 0;
}
