/* modelgen_impl.h: what the model generator's files share: the model being written as data
 * (hyperparameters, tensor list, tokenizer) and the functions each file offers the others. */
#ifndef TD_MODELGEN_IMPL_H
#define TD_MODELGEN_IMPL_H

#include "td_error.h"
#include "td_modelgen.h"
#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The hyperparameters of one architecture and preset (modelgen_arch.c). */
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

/* What a tensor is, which decides the scale of its values (modelgen_values.c). */
enum { K_EMBED, K_LINEAR, K_NORM, K_FINAL_NORM, K_ROUTER, K_BIAS };

/* One tensor of the model in Hugging Face naming, per-expert form. */
typedef struct mg_tensor {
    char name[96];
    int64_t rows; /* 1-D tensors: rows = length, cols = 0 */
    int64_t cols;
    int kind;
    bool fp8_ok; /* a linear weight DeepSeek's checkpoints store as F8_E4M3 */
} mg_tensor_t;

/* The model's tensors in file order. */
typedef struct mg_list {
    mg_tensor_t *t; /* [n] */
    int n, cap;
} mg_list_t;

/* Side of DeepSeek's FP8 weight-scale blocks (rows and columns). */
#define FP8_BLOCK 128

/* One model being written: the options, its hyperparameters and tensors. */
typedef struct mg_ctx {
    const td_modelgen_opts_t *o;
    mg_hp_t hp;
    mg_list_t list;
    bool use_fp8;
} mg_ctx_t;

/* An output file being written; path for messages (owned). */
typedef struct mg_file {
    FILE *f;
    char *path;
} mg_file_t;

/* The tokenizer the model is written with (modelgen_config.c); everything owned. */
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

/* ---- modelgen_arch.c */

/* DeepSeek V2 or V3 (MLA + MoE). */
bool td__mg_is_deepseek(td_modelgen_arch_t a);
/* The hyperparameters of `arch` at `preset`. */
void td__mg_hp_init(mg_hp_t *h, td_modelgen_arch_t arch, td_modelgen_preset_t preset);
/* Fill l (empty on entry; caller frees l->t) with the tensors of the model. 0 or TD_ENOMEM. */
int td__mg_build_list(const mg_hp_t *h, td_modelgen_arch_t arch, mg_list_t *l);
/* The tensor called `name`, NULL when the list has none. */
const mg_tensor_t *td__mg_list_find(const mg_list_t *l, const char *name);
/* Whether layer i has routed experts (DeepSeek past first_k_dense_replace). */
bool td__mg_layer_is_moe(const mg_hp_t *h, td_modelgen_arch_t arch, int i);
/* The number of elements of t. */
int64_t td__mg_numel(const mg_tensor_t *t);

/* ---- modelgen_values.c */

/* Raw fp32 values of tensor `t`, out[numel]: a normal stream from (seed, name), scaled by kind. */
void td__mg_gen_raw(uint64_t seed, const mg_tensor_t *t, int hidden, float *out);
/* IEEE half of f, rounded to nearest even, and back. */
uint16_t td__mg_f32_to_f16(float f);
float td__mg_f16_to_f32(uint16_t h);
/* DeepSeek's block quantisation of w [rows][cols]: per 128x128 block, scale = amax / 448,
 * q = e4m3(w / scale). q [rows][cols], scale [ceil(rows/128)][ceil(cols/128)]. */
void td__mg_fp8_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale);
/* Whether t is stored as FP8 in this model. */
bool td__mg_tensor_fp8(const mg_ctx_t *c, const mg_tensor_t *t);
/* The values the safetensors copy holds for `t` (after its dtype's rounding, or FP8 quantise +
 * dequantise), out[numel]. 0 or TD_ENOMEM. */
int td__mg_canonical(const mg_ctx_t *c, const mg_tensor_t *t, float *out);
/* td__mg_canonical of the tensor called `name`, which must exist. */
int td__mg_canonical_by_name(const mg_ctx_t *c, const char *name, float *out);
/* v[n] as dtype d (F32, F16 or BF16), little-endian, into out[n * element size]. */
void td__mg_encode(td_modelgen_dtype_t d, const float *v, int64_t n, uint8_t *out);

/* ---- modelgen_quant.c: ggml's block formats (GGML type numbers) */

enum { MG_GGML_F32 = 0, MG_GGML_F16 = 1, MG_GGML_Q4_0 = 2, MG_GGML_Q8_0 = 8, MG_GGML_Q4_K = 12,
       MG_GGML_Q6_K = 14 };

/* Quantise v[n] (a multiple of the block: 32 for Q8_0 / Q4_0, 256 for Q4_K / Q6_K) into out as
 * ggml's reference quantizer of that type does. */
void td__mg_quantize(int ggml_type, const float *v, int64_t n, uint8_t *out);

/* ---- modelgen.c: output files. Errors name the file. */

/* Create dir/name for writing. 0, TD_ENOMEM or the errno's TD_E* code. */
int td__mg_file_open(mg_file_t *mf, const char *dir, const char *name);
/* Write n bytes. 0, TD_ENOSPC or TD_EIO. */
int td__mg_file_write(mg_file_t *mf, const void *p, size_t n);
/* Write n (at most 64) zero bytes. */
int td__mg_file_pad(mg_file_t *mf, size_t n);
/* Close mf; when err (the writer's status) or the close fails, remove the file. Returns err, or
 * the close's error when err was 0. */
int td__mg_file_close(mg_file_t *mf, int err);
/* Write b as the whole of dir/name. */
int td__mg_write_text(const char *dir, const char *name, const td_buf_t *b);
/* Remove dir/name if it exists, so that a rewritten directory holds no stale weight files that a
 * loader would prefer (an index next to a single file). */
void td__mg_remove_stale(const char *dir, const char *name);

/* ---- modelgen_config.c */

/* Read dir/tokenizer.json and tokenizer_config.json into t. 0, TD_ENOMEM, or TD_ENOENT / TD_EPARSE
 * naming the file; t is freed on error. */
int td__mg_tok_load(mg_tok_t *t, const char *dir);
/* Without a tokenizer: GPT-2 byte-level tokens for ids 0..255, <s> 256, </s> 257, then
 * <|extra_N|> control tokens; no merges (so every text tokenizes to bytes). 0 or TD_ENOMEM. */
int td__mg_tok_synthetic(mg_tok_t *t, int vocab);
/* Free what t holds; t may be zeroed or partly filled. */
void td__mg_tok_free(mg_tok_t *t);
/* Write c->o->out_dir/config.json. */
int td__mg_write_config(const mg_ctx_t *c, const mg_tok_t *tok);

/* ---- modelgen_safetensors.c, modelgen_gguf.c */

/* Write the safetensors file(s) (and index.json when sharded); *n_files gets how many. */
int td__mg_write_safetensors(const mg_ctx_t *c, int *n_files);
/* Write model.gguf with the safetensors copy's values and the tokenizer in its metadata. */
int td__mg_write_gguf(const mg_ctx_t *c, const mg_tok_t *tok);

#endif
