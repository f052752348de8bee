/* model_llama.c: loading the Llama family (Llama 2/3, Mistral, Qwen2, Qwen3): per-head q/k/v
 * projections with grouped-query attention, optional q/k/v biases (Qwen2) and per-head q/k
 * RMSNorm (Qwen3), which the architecture table's row makes required, and a SwiGLU MLP. Its KV
 * cache holds each token's K and V heads. */
#include "model_impl.h"

int td__llama_kv_token_floats(const td_model_cfg_t *c)
{
    return 2 * c->n_kv_heads * c->head_dim;
}

/* GGUF: the rotated width, which may be less than the head (partial RoPE). */
static int parse_gguf(td__loader_t *L, const char *a)
{
    td_model_cfg_t *c = &L->m->cfg;
    return td__gint(L, a, "rope.dimension_count", false, c->head_dim, &c->rope_dim);
}

/* RoPE rotates an even number of values within the head. */
static bool check(const td_model_cfg_t *c)
{
    return c->rope_dim > 0 && c->rope_dim <= c->head_dim && c->rope_dim % 2 == 0;
}

/* Attention projections (biases and q/k norms required as the row says, else optional) and the
 * MLP of layer l. */
static int bind_layer(td__loader_t *L, int l, td_layer_w_t *w)
{
    const td_model_cfg_t *c = &L->m->cfg;
    const td__names_t *N = L->N;
    const td__arch_row_t *row = td__arch_row(c->arch);
    int H = c->hidden, rc;
    char b[256];
    int qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    bool bias_req = row->qkv_bias, norm_req = row->qk_norm;
    if ((rc = td__get_mat(L, td__nm(b, sizeof(b), N->q, l), qd, H, true, &w->wq)) ||
        (rc = td__get_mat(L, td__nm(b, sizeof(b), N->k, l), kd, H, true, &w->wk)) ||
        (rc = td__get_mat(L, td__nm(b, sizeof(b), N->v, l), kd, H, true, &w->wv)) ||
        (rc = td__get_mat(L, td__nm(b, sizeof(b), N->o, l), H, qd, true, &w->wo)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->qb, l), qd, bias_req, &w->bq)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->kb, l), kd, bias_req, &w->bk)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->vb, l), kd, bias_req, &w->bv)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->qn, l), c->head_dim, norm_req, &w->q_norm)) ||
        (rc = td__get_vec(L, td__nm(b, sizeof(b), N->kn, l), c->head_dim, norm_req, &w->k_norm)))
        return rc;
    return td__bind_mlp(L, l, w);
}

const td__family_t td__family_llama = {
    .parse_json = NULL, /* nothing beyond the common fields */
    .parse_gguf = parse_gguf,
    .check = check,
    .bind_layer = bind_layer,
};
