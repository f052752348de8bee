/* td_backend.h: the compute backend interface: a struct of function pointers the engine's forward
 * passes call for every heavy operation. The CPU backend (common/backend/cpu/) is always built;
 * the CUDA backend (common/backend/cuda/, td_cuda.h) with the `cuda` feature.
 *
 * All activations are fp32, row-major, with an explicit leading dimension (`*_ld`, in floats) so
 * an operation can read or write a column range of a wider buffer. Weights are td_mat_t in their
 * stored dtype.
 *
 * Memory. Activation buffers (every `float *` an operation reads or writes other than a weight)
 * come from the backend's `alloc` (the engine's arena is TD_MEM_SHARED); the KV pool's memory from
 * td_backend_kv_pool_init (kind `kv_mem`). Weights (td_mat_t data, norm weights), RoPE
 * frequencies, positions and token tables are host memory: a device backend copies weights once
 * (cached by address; the model must outlive the backend) and the per-step tables on each call;
 * the CPU backend keeps its grouped copies of F16 matrices the same way (cpu/cpu_group.c).
 * Operations may run asynchronously in one queue, in call order; `sync` waits for them, after
 * which the host may touch SHARED memory they wrote. For the CPU backend every pointer is host
 * memory, operations are synchronous and sync does nothing.
 */
#ifndef TD_BACKEND_H
#define TD_BACKEND_H

#include "td_kv.h"
#include "td_model.h"

#include <stdbool.h>
#include <stdint.h>

/* Where one token of a step lives in the cache. */
typedef struct td_attn_tok {
    const int32_t *blocks; /* the block table of the token's sequence */
    int32_t pos;           /* its position: it attends to positions [start, pos] of that sequence */
    int32_t start;         /* first attended position: 0, or pos - window + 1 with a window */
} td_attn_tok_t;

typedef struct td_backend td_backend_t;

struct td_backend {
    const char *name;
    void *impl;
    void (*destroy)(td_backend_t *b);

    /* Memory. alloc: `bytes` of kind `kind`, 64-byte aligned and zeroed, or NULL (td_err_set).
     * free: what alloc returned (NULL ok). copy: `bytes` between any two of this backend's
     * memories and host memory, in order with the queued operations (host destinations are
     * written once sync returns). sync: wait for every queued operation and copy. */
    void *(*alloc)(td_backend_t *b, size_t bytes, td_mem_kind_t kind);
    void (*free)(td_backend_t *b, void *p, td_mem_kind_t kind);
    void (*copy)(td_backend_t *b, void *dst, const void *src, size_t bytes);
    void (*sync)(td_backend_t *b);
    td_mem_kind_t kv_mem; /* where this backend wants the KV pool */
    int max_head;         /* widest head_dim (attn_gqa) or kv_rank (attn_mla) it accumulates */

    /* Optional (NULL: nothing to do): called at the engine's creation for each weight matrix it
     * will multiply whole, so that a backend that keeps its own form of a matrix makes it then,
     * not in the first step (the CPU backend's grouped copies of F16 matrices, cpu_group.c). A
     * matrix not prepared is still multiplied; one prepared is cached by address as above. */
    void (*prepare)(td_backend_t *b, const td_mat_t *W);
    /* out[t][r] = sum_c W[r][c] * x[t][c] for t < T, r < W->rows (x rows hold W->cols values). */
    void (*matmul)(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                   const td_mat_t *W);
    /* The transposed product: out[t][c] = sum_{r < n_rows} x[t][r] * W[row0 + r][c], c < W->cols.
     */
    void (*matmul_t)(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                     const td_mat_t *W, int64_t row0, int64_t n_rows);
    /* RMSNorm of each of T rows of n values: out = x / sqrt(mean(x^2) + eps) * w (in place ok). */
    void (*rmsnorm)(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T, int n,
                    const float *w, float eps);
    /* Rotate the first rope_dim values of each of n_heads heads (head h at x + t*ld + h*head_ld)
     * of token t by angle pos[t] * inv_freq[i]; cos and sin are multiplied by `mscale`.
     * interleaved: pairs (2i, 2i+1); otherwise (i, i + rope_dim/2). */
    void (*rope)(td_backend_t *b, float *x, int ld, int T, int n_heads, int head_ld, int rope_dim,
                 const int32_t *pos, const float *inv_freq, float mscale, bool interleaved);
    /* g[i] = silu(g[i]) * u[i] for T rows of n values. */
    void (*silu_mul)(td_backend_t *b, float *g, int g_ld, const float *u, int u_ld, int T, int n);
    /* x[i] += y[i] for i < n (the residual connection). */
    void (*add)(td_backend_t *b, float *x, const float *y, size_t n);
    /* Write row t of src (token_floats values) into the cache slot of toks[t] at `layer`. */
    void (*kv_store)(td_backend_t *b, td_kv_pool_t *pool, int layer, const td_attn_tok_t *toks,
                     int T, const float *src, int src_ld);
    /* Grouped-query attention over the cache (token layout [K heads | V heads]):
     * out[t][h][d] = sum_{p<=pos} softmax_p(scale * q[t][h] . K[p][h/g]) V[p][h/g][d]. */
    void (*attn_gqa)(td_backend_t *b, float *out, int out_ld, const float *q, int q_ld, int T,
                     const td_attn_tok_t *toks, const td_kv_pool_t *pool, int layer, int n_heads,
                     int n_kv_heads, int head_dim, float scale);
    /* Absorbed MLA attention over the cache (token layout [latent c (kv_rank) | k_pe (rope)]):
     * s_p = scale * (q_lat[t][h] . c_p + q_pe[t][h] . k_pe_p); out[t][h] = sum_p softmax(s)_p c_p.
     * q_lat rows: [n_heads][kv_rank]; q_pe of head h at q_pe + t*q_pe_ld + h*q_pe_head_ld. */
    void (*attn_mla)(td_backend_t *b, float *out, const float *q_lat, const float *q_pe,
                     int q_pe_ld, int q_pe_head_ld, int T, const td_attn_tok_t *toks,
                     const td_kv_pool_t *pool, int layer, int n_heads, int kv_rank, int rope_dim,
                     float scale);
};

/* A KV pool whose memory comes from `b` (kind b->kv_mem, zeroed). 0, TD_EINVAL or TD_ENOMEM. */
int td_backend_kv_pool_init(td_backend_t *b, td_kv_pool_t *p, const td_kv_layout_t *l,
                            int n_blocks);
/* Free a pool made by td_backend_kv_pool_init, its memory included. */
void td_backend_kv_pool_free(td_backend_t *b, td_kv_pool_t *p);
/* Stage block `id` of `p` out to host memory `dst` (to_host) or in from host memory `src`
 * (block_bytes bytes; PINNED memory from b->alloc, registered with the data plane, transfers at
 * full speed), in order with the queued operations, and wait for it. */
void td_backend_kv_block_out(td_backend_t *b, const td_kv_pool_t *p, int32_t id, void *dst);
void td_backend_kv_block_in(td_backend_t *b, td_kv_pool_t *p, int32_t id, const void *src);

/* What a device backend uploads for a step's cache locations: `words` holds, for each of T
 * tokens, {pos, start, offset of its block table in the block ids, 0}, then the block ids: each
 * distinct block table once (tokens of one sequence share it), up to the furthest block any of its
 * tokens reaches. So token t's position p lives in block words[4T + words[4t + 2] + p / B]. */
typedef struct td_tok_tables {
    int32_t *words;
    size_t n_words;
    /* private */
    size_t cap;
    const int32_t **seq; /* [seq_cap] distinct block tables */
    int32_t *len, *off;  /* [seq_cap] blocks taken from each, and where they start in the ids */
    int32_t *tok_seq;    /* [seq_cap] which of them each token uses */
    size_t seq_cap;
} td_tok_tables_t;

/* Fill tt from toks (T >= 0, block size B); tt starts zeroed and is reused across calls. 0 or
 * TD_ENOMEM. */
int td_tok_tables_build(td_tok_tables_t *tt, const td_attn_tok_t *toks, int T, int B);
void td_tok_tables_free(td_tok_tables_t *tt);

/* out[i] = in[i] rounded to BF16 (nearest, ties to even; NaN stays NaN), as raw bits. in and out
 * may overlap when out starts at or before in (in-place packing of a float buffer). */
void td_bf16_round(const float *in, uint16_t *out, size_t n);

/* The widest head (attn_gqa's head_dim) or latent (attn_mla's kv_rank) the CPU backend's attention
 * accumulates, in floats. */
#define TD_CPU_MAX_HEAD 4096

/* The CPU backend with `n_threads` threads (>= 1, the caller's thread included). NULL on OOM. */
td_backend_t *td_cpu_backend_create(int n_threads);

typedef struct td_cpu_opts {
    int n_threads; /* >= 1, the caller's thread included (less: 1) */
    /* Q8_0, Q4_0, Q4_K and Q6_K weights against the fp32 activations (each weight dequantised),
     * where the default quantises each token's activations to 8 bits for integer dot products as
     * llama.cpp does (cpu_q8.c, cpu_qk.c, docs/architecture.md); for comparisons with backends
     * that keep fp32. */
    bool f32_activations;
    /* F16 matrices multiplied where they are stored, where the default multiplies them from a
     * copy in groups of three rows (the same bytes again, in anonymous memory) that one token's
     * kernel streams faster (cpu_group.c); for memory that cannot hold the copy. */
    bool stored_rows;
} td_cpu_opts_t;

/* The CPU backend with options o. NULL on OOM. */
td_backend_t *td_cpu_backend_create_opts(const td_cpu_opts_t *o);

#endif
