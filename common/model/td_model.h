/* td_model.h: loading a model: configuration and weights from a Hugging Face directory
 * (config.json + safetensors, single or sharded) or a GGUF v3 file.
 *
 * Weights are mmapped, never copied, except small vectors (norm weights, biases, router bias),
 * which are converted to fp32 at load. Matrices keep their stored dtype (F32, F16, BF16, F8_E4M3
 * with 128x128 block scales, and llama.cpp's Q8_0, Q4_0, Q4_K and Q6_K blocks) and are
 * dequantised row by row on the fly by the backend's matmul. The model owns its mappings; every td_mat_t points into them and stays valid until
 * td_model_free.
 */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum td_dtype {
    TD_DTYPE_F32 = 0,
    TD_DTYPE_F16,
    TD_DTYPE_BF16,
    TD_DTYPE_F8_E4M3, /* with a [ceil(rows/128)][ceil(cols/128)] fp32 scale (weight_scale_inv) */
    TD_DTYPE_Q8_0,    /* GGUF: blocks of 32 values: fp16 scale + 32 int8 (34 bytes) */
    TD_DTYPE_Q4_0,    /* GGUF: blocks of 32: fp16 scale + 16 bytes of 4-bit values (18 bytes) */
    TD_DTYPE_Q4_K,    /* GGUF: super-blocks of 256: fp16 d, dmin, 12 bytes of 6-bit scales and
                         mins for 8 sub-blocks of 32, 128 bytes of 4-bit values (144 bytes) */
    TD_DTYPE_Q6_K,    /* GGUF: super-blocks of 256: 128 bytes low 4 bits, 64 bytes high 2 bits,
                         16 int8 scales of sub-blocks of 16, fp16 d (210 bytes) */
    TD_DTYPE_COUNT_
} td_dtype_t;

/* "F32", "F16", ... Never NULL. */
const char *td_dtype_name(td_dtype_t t);

/* A weight matrix W [rows][cols] (row-major, y = W x). Points into a mapping owned by the model. */
typedef struct td_mat {
    td_dtype_t dtype;
    int64_t rows;
    int64_t cols;
    const void *data;   /* rows * row bytes of `dtype` */
    const float *scale; /* F8_E4M3 only: [ceil((scale_row0+rows)/128)][scale_cols] block scales */
    int64_t scale_cols; /* ceil(cols/128) for F8_E4M3 */
    int64_t scale_row0; /* row r of this view uses scale row (scale_row0 + r) / 128 */
} td_mat_t;

/* Bytes of one row of `cols` values of `t` (block formats: cols a multiple of the block). */
size_t td_dtype_row_bytes(td_dtype_t t, int64_t cols);

/* Values per block of `t`: 32 (Q8_0, Q4_0), 256 (Q4_K, Q6_K), 1 for the element formats. */
int td_dtype_block(td_dtype_t t);

/* Dequantise row `r` of `m` into out[m->cols] (fp32). */
void td_mat_row_f32(const td_mat_t *m, int64_t r, float *out);

typedef enum td_arch {
    TD_ARCH_LLAMA = 0,   /* Llama 2/3, Mistral */
    TD_ARCH_QWEN2,       /* llama + q/k/v bias */
    TD_ARCH_QWEN3,       /* llama + per-head q/k RMSNorm */
    TD_ARCH_DEEPSEEK_V2, /* MLA + DeepSeekMoE */
    TD_ARCH_DEEPSEEK_V3, /* MLA + DeepSeekMoE (GGUF: told from V2 by the gating function) */
    TD_ARCH_COUNT_
} td_arch_t;

typedef enum td_rope_scaling {
    TD_ROPE_NONE = 0,
    TD_ROPE_LINEAR, /* positions divided by factor */
    TD_ROPE_LLAMA3, /* Llama 3.1 frequency-dependent scaling */
    TD_ROPE_YARN,   /* YaRN (DeepSeek) */
} td_rope_scaling_t;

typedef enum td_score_func {
    TD_SCORE_SOFTMAX = 0,
    TD_SCORE_SIGMOID,
} td_score_func_t;

/* The model's hyperparameters, from config.json or GGUF metadata. */
typedef struct td_model_cfg {
    td_arch_t arch;
    int vocab_size;
    int hidden; /* model dimension */
    int n_layers;
    int n_heads;    /* query heads */
    int n_kv_heads; /* GQA key/value heads (llama family) */
    int head_dim;   /* llama family: per-head q/k/v width */
    int inter;      /* dense MLP intermediate width */
    float rms_eps;
    bool tie_embeddings;
    /* RoPE */
    float rope_theta;
    bool rope_interleaved; /* true: rotate adjacent pairs (x[2i], x[2i+1]) (GGUF, DeepSeek);
                              false: rotate halves (x[i], x[i + d/2]) (HF llama/qwen) */
    int rope_dim;          /* rotated width per head (llama: head_dim; MLA: qk_rope_head_dim) */
    td_rope_scaling_t rope_scaling;
    float rope_factor;
    int rope_orig_ctx;                                 /* original_max_position_embeddings */
    float rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    float yarn_beta_fast, yarn_beta_slow;
    float yarn_mscale, yarn_mscale_all_dim;
    /* MLA (DeepSeek) */
    int q_lora_rank; /* 0: no q LoRA (q_proj) */
    int kv_lora_rank;
    int qk_nope_dim;
    int qk_rope_dim;
    int v_head_dim;
    /* MoE (DeepSeek) */
    int n_routed_experts; /* 0: dense model */
    int n_shared_experts;
    int n_experts_per_tok;
    int moe_inter;
    int n_group, topk_group;
    int first_k_dense; /* layers [0, first_k_dense) are dense */
    td_score_func_t score_func;
    bool norm_topk_prob;
    float routed_scale;
    /* tokens */
    int bos_id, eos_id; /* -1 when unknown */
    int max_ctx;
    int sliding_window; /* > 0: each token attends to the last sliding_window positions
                         * (Mistral's sliding-window attention, every layer); 0: all */
} td_model_cfg_t;

/* One layer's weights. Unused fields are zero (mat.data == NULL, vectors NULL). */
typedef struct td_layer_w {
    float *attn_norm; /* [hidden] */
    float *ffn_norm;  /* [hidden] */
    /* llama family */
    td_mat_t wq, wk, wv;    /* [n_heads*head_dim][hidden], [n_kv*head_dim][hidden] x2 */
    float *bq, *bk, *bv;    /* qwen2: [n_heads*head_dim], [n_kv*head_dim] x2 */
    float *q_norm, *k_norm; /* qwen3: [head_dim] */
    td_mat_t wo;            /* [hidden][n_heads*v_dim] */
    /* MLA */
    td_mat_t wq_a;    /* [q_lora_rank][hidden] */
    float *q_a_norm;  /* [q_lora_rank] */
    td_mat_t wq_b;    /* [n_heads*(nope+rope)][q_lora_rank] (or wq [..][hidden] without LoRA) */
    td_mat_t wkv_a;   /* [kv_lora_rank + rope][hidden] */
    float *kv_a_norm; /* [kv_lora_rank] */
    td_mat_t wkv_b;   /* [n_heads*(nope+v)][kv_lora_rank]: per head nope rows then v rows */
    td_mat_t wk_b_t;  /* GGUF split form instead of wkv_b: [n_heads*kv_lora_rank][nope], per head
                         the transpose of wkv_b's nope rows */
    td_mat_t wv_b;    /* GGUF split form: [n_heads*v][kv_lora_rank], per head wkv_b's v rows */
    /* dense MLP (or the shared experts, which are one MLP of n_shared*moe_inter) */
    td_mat_t w_gate, w_up; /* [inter][hidden] */
    td_mat_t w_down;       /* [hidden][inter] */
    /* MoE */
    td_mat_t w_router;       /* [n_routed][hidden] */
    float *router_bias;      /* [n_routed] e_score_correction_bias or NULL */
    td_mat_t *exp_gate;      /* [n_routed] each [moe_inter][hidden] */
    td_mat_t *exp_up;        /* [n_routed] each [moe_inter][hidden] */
    td_mat_t *exp_down;      /* [n_routed] each [hidden][moe_inter] */
    td_mat_t sh_gate, sh_up; /* [n_shared*moe_inter][hidden] */
    td_mat_t sh_down;        /* [hidden][n_shared*moe_inter] */
    bool is_moe;
} td_layer_w_t;

typedef struct td_model td_model_t;

struct td_model {
    td_model_cfg_t cfg;
    td_mat_t tok_embd;    /* [vocab][hidden] */
    float *out_norm;      /* [hidden] */
    td_mat_t lm_head;     /* [vocab][hidden] (== tok_embd when tied) */
    td_layer_w_t *layers; /* [n_layers] */
    float *rope_freqs;    /* [rope_dim/2] GGUF rope_freqs.weight: each frequency is divided by it
                             (llama.cpp's form of Llama 3 rope scaling), or NULL */
    uint8_t digest[16];   /* XXH3-128 of the configuration, the tensor index and sampled weights */
    char *path;           /* what was opened */
    /* private to the loader */
    td_mmap_t *maps; /* [n_maps] the weight files, mapped read-only */
    int n_maps;
    void **owned; /* [n_owned] allocations freed with the model (fp32 vectors, expert arrays) */
    int n_owned, cap_owned;
};

/* Open a model: a directory holding config.json and model.safetensors (or sharded with
 * model.safetensors.index.json), or a .gguf file. On error returns TD_ENOENT / TD_EPARSE /
 * TD_ENOTSUP / TD_EMISMATCH / TD_ENOMEM, *out is NULL and td_err_msg names the file and the
 * tensor or field. */
int td_model_load(const char *path, td_model_t **out);

/* Move the weight files' mappings to anonymous memory on transparent huge pages (td_mmap_to_anon):
 * for the CPU backend, which reads every weight of every decode step from these pages, a stream
 * over 2 MiB pages reads faster than over the page cache's mix of page sizes (BENCHMARKS.md). It
 * costs a copy of the weights at load and memory no other process shares. Call it before any
 * engine runs on the model. 0 or TD_ENOMEM / TD_EIO (the mappings stay usable either way). */
int td_model_weights_to_anon(td_model_t *m);

/* Release the model and its mappings. NULL is allowed. */
void td_model_free(td_model_t *m);

/* "llama", "qwen2", ... Never NULL ("unknown" for a value outside td_arch_t). */
const char *td_arch_name(td_arch_t a);

/* What modules other than the loader need to know of an architecture, so that they never test
 * td_arch_t values themselves. One row per td_arch_t (common/model/model_arch.c). */
typedef struct td_arch_desc {
    const char *name; /* as td_arch_name */
    bool kv_latent;   /* the KV cache holds MLA's compressed latent per token,
                         [kv_lora_rank | qk_rope_dim], instead of [K heads | V heads] */
    /* Values (fp32) per token per layer in the KV cache: 2 * n_kv_heads * head_dim, or
     * kv_lora_rank + qk_rope_dim for an MLA latent. */
    int (*kv_token_floats)(const td_model_cfg_t *c);
} td_arch_desc_t;

/* The description of `a`, or NULL when a is not a td_arch_t value (a loaded model's never is). */
const td_arch_desc_t *td_arch_desc(td_arch_t a);

#endif
