/* cuda_kernels.h: the CUDA backend's kernels (cuda_kernels.cu, compiled by nvcc) as plain C
 * launchers, so the host side (cuda_backend.c) is C11 and includes no CUDA C++ header. Every
 * launcher queues on `stream` (a cudaStream_t) and returns 0 or a cudaError_t. Pointers are
 * device (or managed) memory unless named host_. */
#ifndef TD_CUDA_KERNELS_H
#define TD_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where one token of a step lives in the cache, flattened for the device: its position, first
 * attended position and the offset of its sequence's block table in the step's block array. */
typedef struct tdk_tok {
    int32_t pos, start, boff, pad_;
} tdk_tok_t;

/* The cache as kernels see it: block-major floats. */
typedef struct tdk_pool {
    float *mem;
    int64_t block_floats, layer_floats;
    int32_t token_floats, block_size;
} tdk_pool_t;

/* out[t][i] = bf16(x[t * ld + i]) (dense [T][n], bf16 as uint16 bits, round to nearest even),
 * or a dense fp32 copy when `bf16` is 0. */
int tdk_pack(void *stream, void *out, int bf16, const float *x, int ld, int T, int n);
int tdk_rmsnorm(void *stream, float *out, int out_ld, const float *x, int x_ld, int T, int n,
                const float *w, float eps);
int tdk_rope(void *stream, float *x, int ld, int T, int n_heads, int head_ld, int rope_dim,
             const int32_t *pos, const float *inv_freq, float mscale, int interleaved);
int tdk_silu_mul(void *stream, float *g, int g_ld, const float *u, int u_ld, int T, int n);
int tdk_add(void *stream, float *x, const float *y, size_t n);
int tdk_kv_store(void *stream, tdk_pool_t pool, int layer, const tdk_tok_t *toks,
                 const int32_t *blocks, int T, const float *src, int src_ld);

/* One attention over the cache for every (token, head): score_p = scale * (q1 . K1_p + q2 . K2_p),
 * out = sum_p softmax(score)_p V_p. Query rows: q1 + t*q1_ld + h*q1_head_ld (n1 values), q2 the
 * same (n2 values, 0 for none). Cache rows: K1 at kv + (h / group) * k1_head + k1_off within a
 * token's values, K2 at kv + k2_off, V (nv values) at kv + (h / group) * v_head + v_off. */
typedef struct tdk_attn {
    float *out;
    int out_ld, out_head_ld;
    const float *q1, *q2;
    int q1_ld, q1_head_ld, q2_ld, q2_head_ld;
    int n1, n2, nv;
    int k1_off, k1_head, k2_off, v_off, v_head;
    int n_heads, group, layer;
    float scale;
} tdk_attn_t;

/* The widest n1, n2 and nv the attention kernel takes. */
#define TDK_MAX_HEAD 1024
#define TDK_MAX_Q2 256

int tdk_attn(void *stream, const tdk_attn_t *a, int T, tdk_pool_t pool, const tdk_tok_t *toks,
             const int32_t *blocks);

#ifdef __cplusplus
}
#endif

#endif
