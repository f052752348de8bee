/* cpu_impl.h: what the CPU backend's files share: the thread pool, the kernel attribute, the
 * 8-float vector helpers, and each file's entry points. */
#ifndef TD_CPU_IMPL_H
#define TD_CPU_IMPL_H

#include "td_model.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Hot kernels are compiled twice, for x86-64-v3 (AVX2, FMA) and the baseline, and picked at load
 * time; elsewhere they are compiled once. Not under the sanitizers: their ifunc resolvers run
 * before the sanitizer's runtime is up (ThreadSanitizer crashes in them). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TD_CPU_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TD_CPU_KERNEL
#endif

/* Ask GCC to vectorise a loop its default -O2 cost model leaves scalar (int8 -> float widening). */
#if defined(__GNUC__) && !defined(__clang__)
#define TD_CPU_VECTORIZE __attribute__((optimize("vect-cost-model=dynamic")))
#else
#define TD_CPU_VECTORIZE
#endif

/* A fixed pool of threads that share out index ranges in chunks (pool.c). The caller's thread
 * takes part. */
typedef struct td_cpu_pool td_cpu_pool_t;

/* fn(ctx, begin, end, tid) runs on thread tid for [begin, end); tid < n_threads. */
typedef void (*td_cpu_job_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads >= 1 (the caller counts as one). NULL on failure. */
td_cpu_pool_t *td_cpu_pool_create(int n_threads);
void td_cpu_pool_free(td_cpu_pool_t *p);
/* Threads including the caller; 1 for a NULL pool. */
int td_cpu_pool_threads(const td_cpu_pool_t *p);
/* Run fn over [0, n) and wait for it: chunks [k * grain, (k + 1) * grain) (the last one cut at
 * n), each to whichever thread asks next, so that which thread runs a chunk varies from run to
 * run; grain < 1 means one chunk per thread. With one thread, a NULL pool or n <= grain, one
 * call fn(ctx, 0, n, 0) on the caller. Not reentrant: one caller at a time. */
void td_cpu_pool_run(td_cpu_pool_t *p, int64_t n, int64_t grain, td_cpu_job_fn fn, void *ctx);

/* Items per chunk of a pool job over n items: about `per` chunks per thread, a multiple of
 * `align`, at least `min` (pool.c). */
int64_t td_cpu_pool_grain(const td_cpu_pool_t *p, int64_t n, int per, int64_t align, int64_t min);

/* 8-float vectors pass between inlined helpers only; the ABI note does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The 8 lanes in the one fixed tree every kernel finishes with. */
static inline float hsum8(v8f v)
{
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* The CPU backend's attention (cpu_attn.c): td_backend_t's attn_gqa and attn_mla, split across
 * pool p. */
struct td_attn_tok;
struct td_kv_pool;
void td__cpu_attn_gqa(td_cpu_pool_t *p, float *out, int out_ld, const float *q, int q_ld, int T,
                      const struct td_attn_tok *toks, const struct td_kv_pool *pool, int layer,
                      int n_heads, int n_kv_heads, int head_dim, float scale);
void td__cpu_attn_mla(td_cpu_pool_t *p, float *out, const float *q_lat, const float *q_pe,
                      int q_pe_ld, int q_pe_head_ld, int T, const struct td_attn_tok *toks,
                      const struct td_kv_pool *pool, int layer, int n_heads, int kv_rank,
                      int rope_dim, float scale);

/* Fill b's memory hooks (cpu_mem.c): host memory for every kind. */
struct td_backend;
void td__cpu_mem_hooks(struct td_backend *b);

/* Columns [c0, c0 + n) of row r of W as fp32 (cpu_dequant.c): a pointer into W's data for F32,
 * else buf[n] filled. c0 and n keep every block whole (multiples of 256 but for the row's end). */
const float *td__cpu_row_chunk(const td_mat_t *W, int64_t r, int64_t c0, int64_t n, float *buf);
/* F16 matrices copied in groups of TD_CPU_GROUP rows (cpu_group.c, which describes the layout),
 * what the backend multiplies them from. td__cpu_groupable: whether W gets a copy (F16, columns
 * a multiple of 32). td__cpu_groups_get: W's copy, made on first use; NULL where W gets none or
 * there was no memory (then W's stored rows serve). td__cpu_group_at: where row r's columns
 * [c, c + 8) are in the copy (c a multiple of 8), and in *step the bytes from there to the next
 * 8 columns of the row. */
enum { TD_CPU_GROUP = 3 };
typedef struct td_cpu_groups td_cpu_groups_t;
td_cpu_groups_t *td__cpu_groups_new(void);
void td__cpu_groups_free(td_cpu_groups_t *gs);
bool td__cpu_groupable(const td_mat_t *W);
const uint8_t *td__cpu_groups_get(td_cpu_groups_t *gs, const td_mat_t *W);
const uint8_t *td__cpu_group_at(const uint8_t *copy, const td_mat_t *W, int64_t r, int64_t c,
                                int64_t *step);
/* td__cpu_row_chunk's result for an F16 W whose grouped copy is `copy`, read from the copy. */
const float *td__cpu_row_chunk_grouped(const uint8_t *copy, const td_mat_t *W, int64_t r,
                                       int64_t c0, int64_t n, float *buf);

/* The IEEE half at p (little-endian), exactly as a float (cpu_dequant.c). */
float td__cpu_f16(const uint8_t *p);

/* Sub-block j's 6-bit scale and min in a Q4_K block's 12 scale bytes. */
static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* cpu_fma.c: the kernels for x86-64-v3 (AVX2, FMA, F16C), built with GCC on x86-64. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_CPU_FMA_KERNELS 1
#endif

/* True where this build has cpu_fma.c's kernels and the CPU runs them. When it does, every matmul
 * goes through them (and only then), so all outputs are summed the same way. */
bool td__cpu_fma(void);

/* The instruction set the kernels use: GENERIC (portable loops), AVX2 (x86-64-v3: AVX2, FMA,
 * F16C) or AVX512 (that and AVX-512 F, BW, VL, DQ and VNNI). Every level at or above AVX2 gives
 * bitwise the same outputs (the wider kernels keep the summation order), so the level only
 * changes speed. td__cpu_isa_cap(level) caps it for the whole process (tests compare levels on
 * one machine); the CPU's own level is the ceiling. */
enum { TD_CPU_ISA_GENERIC = 0, TD_CPU_ISA_AVX2 = 1, TD_CPU_ISA_AVX512 = 2 };
int td__cpu_isa(void);
void td__cpu_isa_cap(int max);

/* out[r][t] = w[r][0..n) . x[t * ld .. t * ld + n) for R rows against TN tokens, TN 1 (R <= 4)
 * or 4 (R <= 3); each output's sum in the one fixed order whatever R and TN are. */
/* Whether W's products use fused multiply-adds (per weight type; fixed for the process), and
 * how many rows at a time one token's kernel takes. */
bool td__cpu_fused(td_dtype_t t);
int td__cpu_decode_rows(td_dtype_t t);

void td__cpu_tile(bool fused, int R, int TN, const float *const *w, const float *x, int64_t ld, int64_t n,
                  float out[4][4]);

/* AVX-512 (td__cpu_isa() >= TD_CPU_ISA_AVX512): up to TD_CPU_PAIR_TOKENS tokens at a time in
 * pairs. td__cpu_pack_pairs lays nt <= TD_CPU_PAIR_TOKENS tokens (x + t * ld, n columns) out for
 * the tile: P = ceil(nt / 2) pairs, dst[(k * P + p) * 16 + h * 8 + l] = token 2p + h's column
 * 8k + l (k < n / 8; zeros for a missing last token); dst 64-byte aligned. td__cpu_tile_pairs:
 * out[r][t] for R <= 4 rows and those nt tokens, xp the packed copy at the first of the n columns
 * (a multiple of 8 columns in), x the tokens there (for the scalar tail): bitwise what
 * td__cpu_tile gives. */
#define TD_CPU_PAIR_TOKENS 12
void td__cpu_pack_pairs(const float *x, int64_t ld, int nt, int64_t n, float *dst);
void td__cpu_tile_pairs(bool fused, int R, const float *const *w, const float *xp, const float *x,
                        int64_t ld, int nt, int64_t n, float out[4][TD_CPU_PAIR_TOKENS]);

/* out[i] (i < r1 - r0) = columns [c0, c0 + n) of row r0 + i of W . x[n], or out[i] plus it with
 * add, td__cpu_decode_rows rows at a time, summed straight from the stored F32 values or F16,
 * Q8_0, Q4_0, Q4_K or Q6_K blocks, bitwise what td__cpu_tile gives over the values
 * td__cpu_row_chunk stores. False (nothing done) for other types or a partial block. */
bool td__cpu_dot_rows(const td_mat_t *W, int64_t r0, int64_t r1, int64_t c0, int64_t n,
                      const float *x, float *out, bool add);
/* The same for an F16 W read from its grouped copy (td__cpu_groups_get): bitwise the same
 * outputs. c0 and n multiples of 32. */
void td__cpu_dot_rows_grouped(const uint8_t *copy, const td_mat_t *W, int64_t r0, int64_t r1,
                              int64_t c0, int64_t n, const float *x, float *out, bool add);

/* cpu_q8.c: Q8_0 / Q4_0 weights against activations quantised to 8 bits (llama.cpp's Q8_0). */
/* Whether weights of type t take 8-bit activations (Q8_0, Q4_0). */
bool td__cpu_q8_act(td_dtype_t t);
/* A group of T tokens quantised for Q8_0 / Q4_0 weights: q[T][n] (n a multiple of 32) and the
 * blocks' steps d[b * T + t] (fp16 values, as floats; block-major, so that one token's kernel
 * reads a group's steps T apart), on x86-64-v3 with qs[b * T + t] = -128 * the block's sum of
 * values (what the AVX-512 kernels' unsigned weights w + 128 add to it; written only where vnni,
 * the AVX-512 level, whose kernels alone read it); where qt is set (td__cpu_q8_wide), also the prefill tiles'
 * copy (cpu_q8.c): G = ceil(n / 256) groups of eight blocks, tokens in pairs ((T + 1) / 2 of
 * them, an odd count's last completed by zeros): qt[pair][G][8 steps][2 tokens][step] (a step
 * 32 int8 with AVX-512, their 16-bit halves with AVX2),
 * qc[pair][G][2][8] (-128 * each block's sum of values) and qd[pair][G][2][8] (the steps; 0 past
 * the row's end), each 64-byte aligned. */
typedef struct td_q8_act {
    int64_t T, n;
    int8_t *q;
    float *d;
    int32_t *qs;
    int64_t G;
    bool vnni; /* qt's layout: AVX-512's (int8) or AVX2's (16-bit halves) */
    int8_t *qt;
    int32_t *qc;
    float *qd;
} td_q8_act_t;
/* Whether a group of T tokens takes the prefill tiles' copy (x86-64-v3 and T >= 4). */
bool td__cpu_q8_wide(int64_t T);
/* Bytes the prefill tiles' copy of T tokens of n values needs, its alignment included; and a's
 * qt, qc and qd placed in mem (that many bytes; a->T and a->G set). */
size_t td__cpu_q8_wide_bytes(int64_t T, int64_t n);
void td__cpu_q8_wide_place(td_q8_act_t *a, void *mem);
/* Tokens [t0, t1) of a (rows x + t * x_ld) quantised into a, each on its own. */
void td__cpu_quant_act(const float *x, int64_t x_ld, const td_q8_act_t *a, int64_t t0, int64_t t1);
/* out[t * out_ld + r] for rows [r0, r1) of W (Q8_0 or Q4_0) and a's tokens; scratch (32-byte
 * aligned, scratch_bytes) holds the prefill tiles' copies of the rows where it is large enough. */
void td__cpu_q8_rows(const td_mat_t *W, int64_t r0, int64_t r1, const td_q8_act_t *a, float *out,
                     int64_t out_ld, void *scratch, size_t scratch_bytes);

/* cpu_qk.c: Q4_K / Q6_K weights against activations quantised to 8 bits per 256 values (llama.cpp's
 * Q8_K). Whether weights of type t take them: */
bool td__cpu_qk_act(td_dtype_t t);
/* A group of T tokens quantised for Q4_K / Q6_K weights (n a multiple of 256): q[T][n], the
 * super-blocks' steps d[T][n / 256] and the sums of each 16 values bs[T][n / 16], each 64-byte
 * aligned. */
typedef struct td_qk_act {
    int64_t T, n;
    int8_t *q;
    float *d;
    int16_t *bs;
} td_qk_act_t;
/* Bytes a group of T tokens of n values needs, alignment included; and a placed in mem (that
 * many bytes). */
size_t td__cpu_qk_act_bytes(int64_t T, int64_t n);
void td__cpu_qk_act_place(td_qk_act_t *a, int64_t T, int64_t n, void *mem);
/* Tokens [t0, t1) of a (rows x + t * x_ld) quantised into a, each on its own. */
void td__cpu_qk_quant(const float *x, int64_t x_ld, const td_qk_act_t *a, int64_t t0, int64_t t1);
/* out[t * out_ld + r] for rows [r0, r1) of W (Q4_K or Q6_K) and a's tokens; scratch
 * (scratch_bytes) holds the prefill tiles' layout of four rows where it is large enough. */
void td__cpu_qk_rows(const td_mat_t *W, int64_t r0, int64_t r1, const td_qk_act_t *a, float *out,
                     int64_t out_ld, void *scratch, size_t scratch_bytes);

#endif
