/* modelgen_config.c: the tokenizer (a real one read from a directory, or a synthetic byte-level
 * one) and config.json. */
#include "modelgen_impl.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                   */
/* ------------------------------------------------------------------------------------------ */

void td__mg_tok_free(mg_tok_t *t)
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

int td__mg_tok_load(mg_tok_t *t, const char *dir)
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
        td__mg_tok_free(t);
    return err;
}

/* Without a tokenizer: GPT-2 byte-level tokens for ids 0..255, <s> 256, </s> 257, then
 * <|extra_N|> control tokens; no merges (so every text tokenizes to bytes). */
int td__mg_tok_synthetic(mg_tok_t *t, int vocab)
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
    td__mg_tok_free(t);
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

int td__mg_write_config(const mg_ctx_t *c, const mg_tok_t *tok)
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
    if (!td__mg_is_deepseek(arch))
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
    int err = e ? TD_ENOMEM : td__mg_write_text(c->o->out_dir, "config.json", &b);
    td_buf_free(&b);
    return err;
}
