/* td_modelgen.h: writes deterministic random-weight models for tests and benchmarks, in Hugging
 * Face layout (config.json, safetensors single or sharded, optional FP8 block-scaled weights,
 * optional fused expert tensors, a real tokenizer copied in) and the same weights as GGUF v3.
 *
 * Every tensor's values come from a splitmix64 stream seeded by (seed, the tensor's Hugging Face
 * name), turned into normals with Box-Muller and scaled so that activations stay near unit RMS:
 * linear weights N(0, 1/in_features), norm weights 1 + N(0, 0.01), embeddings and the LM head
 * N(0, 1/hidden), and the final norm's weights 3 + N(0, 0.09) so that logits spread with a
 * standard deviation of about 3 and greedy choices are well separated (also with tied
 * embeddings, where a larger embedding would make every token predict itself). So the weights do
 * not depend on the output form, and the same seed always gives byte-identical files.
 *
 * The values stored in the GGUF copy are those of the safetensors copy after its own rounding
 * (BF16/F16 rounding, FP8 quantise-dequantise), so both copies describe the same model; a Q8_0
 * GGUF re-quantises them.
 */
#ifndef TD_MODELGEN_H
#define TD_MODELGEN_H

#include <stdbool.h>
#include <stdint.h>

typedef enum td_modelgen_arch {
    TD_MODELGEN_LLAMA = 0,   /* Llama 3: GQA, llama3 rope scaling */
    TD_MODELGEN_QWEN3,       /* Qwen3: GQA, q/k norm, head_dim != hidden/heads, tied embeddings */
    TD_MODELGEN_DEEPSEEK_V2, /* MLA without q LoRA, softmax group-limited routing, 2 shared */
    TD_MODELGEN_DEEPSEEK_V3, /* MLA with q LoRA, sigmoid + bias group-limited routing */
} td_modelgen_arch_t;

typedef enum td_modelgen_preset {
    TD_MODELGEN_TINY = 0, /* hidden 64, 2-3 layers: unit and integration tests */
    TD_MODELGEN_BENCH,    /* about 100M parameters (vocabulary 32000 without a tokenizer) */
    TD_MODELGEN_LLAMA8B,  /* llama only: the shapes of Llama 3.1 8B (the GPU benchmarks) */
    TD_MODELGEN_DSV2LITE, /* deepseek_v2 only: the shapes of DeepSeek-V2-Lite (16B, MoE) */
    TD_MODELGEN_SMALL,    /* tiny, but hidden 256 and MLP widths of multiples of 256, so the
                             K-quant formats (256-value blocks) apply to most matrices */
} td_modelgen_preset_t;

typedef enum td_modelgen_dtype {
    TD_MODELGEN_F32 = 0,
    TD_MODELGEN_F16,
    TD_MODELGEN_BF16,
    TD_MODELGEN_Q8_0,   /* GGUF only, as are the rest */
    TD_MODELGEN_Q4_0,   /* rows not a multiple of 32 stay F16 */
    TD_MODELGEN_Q4_K,   /* rows not a multiple of 256 fall back to Q4_0 (then F16) */
    TD_MODELGEN_Q6_K,   /* rows not a multiple of 256 fall back to Q8_0 (then F16) */
    TD_MODELGEN_Q4_K_M, /* llama-quantize's Q4_K_M mix: Q4_K, with Q6_K for output.weight and
                           for attn_v / ffn_down in the layers it gives more bits */
} td_modelgen_dtype_t;

typedef struct td_modelgen_opts {
    td_modelgen_arch_t arch;
    td_modelgen_preset_t preset;
    uint64_t seed;
    td_modelgen_dtype_t dtype; /* safetensors dtype: F32, F16 or BF16 */
    bool fp8;                  /* DeepSeek only: linear weights as F8_E4M3 + weight_scale_inv */
    int shards;                /* > 1: model-0000i-of-0000n.safetensors + index.json */
    bool fused_experts;        /* experts.gate_up_proj [E][2I][H], experts.down_proj [E][H][I] */
    const char *tokenizer_dir; /* holds tokenizer.json + tokenizer_config.json, or NULL */
    bool gguf;                 /* also write model.gguf (llama, deepseek_v2/v3) */
    td_modelgen_dtype_t gguf_dtype; /* F32, F16, Q8_0, Q4_0, Q4_K, Q6_K or Q4_K_M for matrices
                                       (vectors and the MoE router stay F32) */
    const char *out_dir;            /* created if missing (its parent must exist) */
    int layers;                     /* > 0: this many layers instead of the preset's */
    int context;                    /* > 0: max_position_embeddings (llama, qwen3; DeepSeek: the
                                       YaRN factor is scaled to reach it); 0: the preset's */
} td_modelgen_opts_t;

/* What was written. */
typedef struct td_modelgen_info {
    int64_t n_params; /* parameters of the model (per-expert count, scales excluded) */
    int vocab_size;
    int n_files; /* safetensors files written */
} td_modelgen_info_t;

/* Parse "llama" / "qwen3" / "deepseek_v2" / "deepseek_v3", "tiny" / "bench" / "small", "f32" /
 * "f16" / "bf16" / "q8_0" / "q4_0" / "q4_k" / "q6_k" / "q4_k_m". 0 or TD_EINVAL. */
int td_modelgen_parse_arch(const char *s, td_modelgen_arch_t *out);
int td_modelgen_parse_preset(const char *s, td_modelgen_preset_t *out);
int td_modelgen_parse_dtype(const char *s, td_modelgen_dtype_t *out);

/* Write the model described by `o` into o->out_dir. `info` may be NULL. Returns 0, or TD_EINVAL
 * for a combination that makes no sense (FP8 on a llama model, Q8_0 safetensors, FP8 with fused
 * experts, GGUF for qwen3), TD_ENOENT / TD_EPARSE for a missing or malformed tokenizer, TD_EIO /
 * TD_ENOSPC when writing fails; td_err_msg names the file or option. */
int td_modelgen_write(const td_modelgen_opts_t *o, td_modelgen_info_t *info);

#endif
