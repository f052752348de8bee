/* model_bind.c: binding weights by name: the tensor lookups with shape and dtype checks (matrices
 * as views into the mapping, vectors as fp32 copies), the HF and GGUF tensor names, and the walk
 * over the model that leaves each layer's projections to the architecture's family. */
#include "model_impl.h"
#include "td_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *td__own(td_model_t *m, void *p)
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

const td__tensor_t *td__find(td__loader_t *L, const char *name, bool required, int *rc)
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

int td__shape_err(const td__tensor_t *t, const char *want)
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
int td__bind_view(td__loader_t *L, const td__tensor_t *t, int64_t rows, int64_t cols, int64_t sub,
                  td_mat_t *out)
{
    out->dtype = (td_dtype_t)t->dtype;
    out->rows = rows;
    out->cols = cols;
    if (cols % td_dtype_block(out->dtype))
        return td_err_set(TD_EMISMATCH, "%s: tensor \"%s\": %s rows of %lld values", t->file,
                          t->name, td_dtype_name(out->dtype), (long long)cols);
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
        const td__tensor_t *s = td__find(L, sname, true, &rc);
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
            return td__shape_err(s, want);
        }
        out->scale = (const float *)s->data + sub * sr * sc;
        out->scale_cols = sc;
    }
    return 0;
}

/* Bind the 2-D tensor `name` as a [rows][cols] matrix. Missing and not required: zero mat, 0. */
int td__get_mat(td__loader_t *L, const char *name, int64_t rows, int64_t cols, bool required,
                td_mat_t *out)
{
    int rc = 0;
    memset(out, 0, sizeof(*out));
    const td__tensor_t *t = td__find(L, name, required, &rc);
    if (!t)
        return rc;
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char want[64];
        snprintf(want, sizeof(want), "%lld, %lld", (long long)rows, (long long)cols);
        return td__shape_err(t, want);
    }
    return td__bind_view(L, t, rows, cols, 0, out);
}

/* A vector of n values converted to an fp32 copy the model owns. */
int td__get_vec(td__loader_t *L, const char *name, int64_t n, bool required, float **out)
{
    int rc = 0;
    *out = NULL;
    const td__tensor_t *t = td__find(L, name, required, &rc);
    if (!t)
        return rc;
    if (t->ndim != 1 || t->shape[0] != n || t->dtype == TD_DTYPE_F8_E4M3) {
        char want[32];
        snprintf(want, sizeof(want), "%lld", (long long)n);
        return td__shape_err(t, want);
    }
    float *v = td__own(L->m, malloc((size_t)n * sizeof(float)));
    if (!v)
        return td_err_set(TD_ENOMEM, "out of memory loading \"%s\"", name);
    if (n % td_dtype_block((td_dtype_t)t->dtype))
        return td__shape_err(t, "a multiple of the block");
    td__convert_f32((td_dtype_t)t->dtype, t->data, n, v);
    *out = v;
    return 0;
}

static const td__names_t hf_names = {
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

static const td__names_t gguf_names = {
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

const char *td__nm(char *buf, size_t n, const char *fmt, int l)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(buf, n, fmt, l);
#pragma GCC diagnostic pop
    return buf;
}

int td__bind_mlp(td__loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    const td__names_t *N = L->N;
    int H = c->hidden, rc;
    char b[256];
    if ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->gate, l), c->inter, H, true, &w->w_gate)) ||
        (rc = td__get_mat(L, td__nm(b, sizeof(b), N->up, l), c->inter, H, true, &w->w_up)) ||
        (rc = td__get_mat(L, td__nm(b, sizeof(b), N->down, l), H, c->inter, true, &w->w_down)))
        return rc;
    return 0;
}

int td__bind_weights(td__loader_t *L)
{
    td_model_t *m = L->m;
    const td_model_cfg_t *c = &m->cfg;
    const td__names_t *N = L->N = L->gguf ? &gguf_names : &hf_names;
    const td__family_t *fam = td__arch_row(c->arch)->family;
    int H = c->hidden, rc;
    char b[256];
    if ((rc = td__get_mat(L, N->embd, c->vocab_size, H, true, &m->tok_embd)) ||
        (rc = td__get_vec(L, N->norm, H, true, &m->out_norm)))
        return rc;
    if (L->gguf &&
        (rc = td__get_vec(L, "rope_freqs.weight", c->rope_dim / 2, false, &m->rope_freqs)))
        return rc;
    if (c->tie_embeddings)
        m->lm_head = m->tok_embd;
    else if ((rc = td__get_mat(L, N->head, c->vocab_size, H, true, &m->lm_head)))
        return rc;
    m->layers = td__own(m, td_calloc((size_t)c->n_layers, sizeof(td_layer_w_t)));
    if (!m->layers)
        return td_err_set(TD_ENOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        td_layer_w_t *w = &m->layers[l];
        if ((rc = td__get_vec(L, td__nm(b, sizeof(b), N->attn_norm, l), H, true, &w->attn_norm)) ||
            (rc = td__get_vec(L, td__nm(b, sizeof(b), N->ffn_norm, l), H, true, &w->ffn_norm)) ||
            (rc = fam->bind_layer(L, l, w)))
            return rc;
    }
    return 0;
}
