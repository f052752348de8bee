/* model_arch.c: the architecture table: one row per td_arch_t with its name, what the KV cache
 * holds, the config.json model_type and GGUF architecture names it loads from, and the family
 * file that parses and binds it (model_llama.c, model_deepseek.c). Adding an architecture is a
 * row here (a new family also a file of its own). */
#include "model_impl.h"

#include <string.h>

static const td__arch_row_t rows[] = {
    [TD_ARCH_LLAMA] =
        {
            .desc = {"llama", false, td__llama_kv_token_floats},
            .family = &td__family_llama,
            .hf_types = {"llama", "mistral"},
            .gguf_arch = "llama",
        },
    [TD_ARCH_QWEN2] =
        {
            .desc = {"qwen2", false, td__llama_kv_token_floats},
            .family = &td__family_llama,
            .hf_types = {"qwen2"},
            .qkv_bias = true,
        },
    [TD_ARCH_QWEN3] =
        {
            .desc = {"qwen3", false, td__llama_kv_token_floats},
            .family = &td__family_llama,
            .hf_types = {"qwen3"},
            .qk_norm = true,
        },
    /* GGUF's "deepseek2" is either: the family tells them apart by the gating function */
    [TD_ARCH_DEEPSEEK_V2] =
        {
            .desc = {"deepseek_v2", true, td__deepseek_kv_token_floats},
            .family = &td__family_deepseek,
            .hf_types = {"deepseek_v2"},
            .gguf_arch = "deepseek2",
        },
    [TD_ARCH_DEEPSEEK_V3] =
        {
            .desc = {"deepseek_v3", true, td__deepseek_kv_token_floats},
            .family = &td__family_deepseek,
            .hf_types = {"deepseek_v3"},
            .gguf_arch = "deepseek2",
        },
};

_Static_assert(TD_ARRAY_LEN(rows) == TD_ARCH_COUNT_, "one row per td_arch_t");

const td__arch_row_t *td__arch_row(td_arch_t a)
{
    return (unsigned)a < TD_ARRAY_LEN(rows) && rows[a].family ? &rows[a] : NULL;
}

const td_arch_desc_t *td_arch_desc(td_arch_t a)
{
    const td__arch_row_t *r = td__arch_row(a);
    return r ? &r->desc : NULL;
}

const char *td_arch_name(td_arch_t a)
{
    const td__arch_row_t *r = td__arch_row(a);
    return r ? r->desc.name : "unknown";
}

int td__arch_from_hf(const char *mt)
{
    for (size_t a = 0; a < TD_ARRAY_LEN(rows); a++)
        for (size_t i = 0; i < TD_ARRAY_LEN(rows[a].hf_types) && rows[a].hf_types[i]; i++)
            if (strcmp(rows[a].hf_types[i], mt) == 0)
                return (int)a;
    return -1;
}

int td__arch_from_gguf(const char *ga)
{
    for (size_t a = 0; a < TD_ARRAY_LEN(rows); a++)
        if (rows[a].gguf_arch && strcmp(rows[a].gguf_arch, ga) == 0)
            return (int)a;
    return -1;
}
