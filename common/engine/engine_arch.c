/* engine_arch.c: the engine's architecture table: which family's forward, scratch size, attention
 * scale and RoPE setup each td_arch_t runs with. Adding an architecture is a row here (a new
 * family also a file of its own defining its td__arch_t, like engine_llama.c). */
#include "engine_impl.h"

static const td__arch_t *const rows[] = {
    [TD_ARCH_LLAMA] = &td__arch_llama,          [TD_ARCH_QWEN2] = &td__arch_llama,
    [TD_ARCH_QWEN3] = &td__arch_llama,          [TD_ARCH_DEEPSEEK_V2] = &td__arch_deepseek,
    [TD_ARCH_DEEPSEEK_V3] = &td__arch_deepseek,
};

_Static_assert(TD_ARRAY_LEN(rows) == TD_ARCH_COUNT_, "one row per td_arch_t");

const td__arch_t *td__arch_find(td_arch_t a)
{
    return (unsigned)a < TD_ARRAY_LEN(rows) ? rows[a] : NULL;
}
