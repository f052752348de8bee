/* cpu_backend.c: the CPU reference backend: fp32 math, weights dequantised row by row on the fly,
 * matmuls split over output rows (and attention, cpu_attn.c, over (token, group of heads that
 * read the same keys)) across a small pthread pool. Kernels are plain loops over GCC vector types the compiler
 * maps to SIMD. */
#include "cpu_impl.h"
#include "td_backend.h"
#include "td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SCRATCH_FLOATS                                                                             \
    65536 /* per-thread dequantisation buffer: rows are converted in chunks;                       \
            a multiple of 2 x 256 so chunks keep every block format's blocks whole */
#define XQ_BYTES (4 << 20)       /* activations quantised for Q8_0 / Q4_0 / Q4_K / Q6_K weights */

typedef struct cpu {
    td_cpu_pool_t *pool;
    float **scratch; /* [n_threads][SCRATCH_FLOATS] */
    int n_threads;
    bool f32_act; /* Q8_0, Q4_0, Q4_K and Q6_K weights against fp32 activations (td_cpu_opts_t) */
    void *xq;     /* [XQ_BYTES]: a group of tokens' 8-bit activations: td_q8_act_t (steps, int8
                     values, then where wide the prefill tiles' copy) or td_qk_act_t */
    /* [xp_floats], 64-byte aligned: the AVX-512 tiles' copy of a block of tokens (mm_pack) */
    float *xp;
    size_t xp_floats;
    td_cpu_groups_t *groups; /* F16 matrices' grouped copies (cpu_group.c); NULL: not made */
} cpu_t;

/* Matmul kernels. Every output (row r, token t) is summed in the same order whichever kernel
 * computes it: one 8-lane accumulator over 8-value steps, a fixed tree for the lanes, then the
 * scalar tail. So a token's result does not depend on which other tokens share its step (or how
 * the rows are split across threads): batching and chunking are bitwise invariant. */
static inline float finish(v8f acc, const float *w, const float *x, int64_t i, int64_t n)
{
    float s = hsum8(acc);
    for (; i < n; i++)
        s += w[i] * x[i];
    return s;
}

/* Where the CPU lacks AVX2/FMA/F16C (cpu_fma.c has the kernels for those that have them): two
 * weight rows against four tokens (8 accumulators: each loaded value feeds two or four products),
 * one row against four tokens, one row against one token. */
TD_CPU_KERNEL static void kern_2x4(const float *w0, const float *w1, const float *x, int64_t ld,
                                   int64_t n, float out[2][4])
{
    v8f a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f u = load8(w0 + i), v = load8(w1 + i), xv;
        xv = load8(x + i);
        a00 += u * xv;
        a10 += v * xv;
        xv = load8(x + ld + i);
        a01 += u * xv;
        a11 += v * xv;
        xv = load8(x + 2 * ld + i);
        a02 += u * xv;
        a12 += v * xv;
        xv = load8(x + 3 * ld + i);
        a03 += u * xv;
        a13 += v * xv;
    }
    out[0][0] = finish(a00, w0, x, i, n);
    out[0][1] = finish(a01, w0, x + ld, i, n);
    out[0][2] = finish(a02, w0, x + 2 * ld, i, n);
    out[0][3] = finish(a03, w0, x + 3 * ld, i, n);
    out[1][0] = finish(a10, w1, x, i, n);
    out[1][1] = finish(a11, w1, x + ld, i, n);
    out[1][2] = finish(a12, w1, x + 2 * ld, i, n);
    out[1][3] = finish(a13, w1, x + 3 * ld, i, n);
}

TD_CPU_KERNEL static void kern_1x4(const float *w, const float *x, int64_t ld, int64_t n,
                                   float out[4])
{
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f u = load8(w + i);
        a0 += u * load8(x + i);
        a1 += u * load8(x + ld + i);
        a2 += u * load8(x + 2 * ld + i);
        a3 += u * load8(x + 3 * ld + i);
    }
    out[0] = finish(a0, w, x, i, n);
    out[1] = finish(a1, w, x + ld, i, n);
    out[2] = finish(a2, w, x + 2 * ld, i, n);
    out[3] = finish(a3, w, x + 3 * ld, i, n);
}

TD_CPU_KERNEL static float kern_1x1(const float *w, const float *x, int64_t n)
{
    v8f a = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        a += load8(w + i) * load8(x + i);
    return finish(a, w, x, i, n);
}

TD_CPU_KERNEL static void axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* ---------- matmul ---------- */

typedef struct mm_job {
    cpu_t *c;
    float *out;
    int out_ld;
    const float *x;
    int x_ld;
    int T;
    const td_mat_t *W;
    const float *xp; /* the tokens packed in groups of TD_CPU_PAIR_TOKENS (AVX-512), or NULL */
    const uint8_t *grouped; /* W's grouped copy (cpu_group.c), or NULL: W's stored rows */
} mm_job_t;

/* Columns [c0, c0 + n) of row r of the job's W as fp32, from its grouped copy where it has one. */
static inline const float *row_chunk(const mm_job_t *j, int64_t r, int64_t c0, int64_t n,
                                     float *buf)
{
    return j->grouped ? td__cpu_row_chunk_grouped(j->grouped, j->W, r, c0, n, buf)
                      : td__cpu_row_chunk(j->W, r, c0, n, buf);
}

/* Add o to out[t][r], or store it for the first column chunk. */
static inline void put(const mm_job_t *j, int64_t t, int64_t r, int64_t c0, float o)
{
    float *dst = &j->out[(size_t)t * j->out_ld + r];
    *dst = c0 ? *dst + o : o;
}

#ifdef TD_CPU_FMA_KERNELS
/* Rows [r0, r1) of the product with cpu_fma.c's kernels: three rows against four tokens at a time
 * (one token at a time for the rest); for a single token, the whole range in one call summed
 * straight from the stored blocks where a kernel exists (td__cpu_dot_rows). Long rows go in column
 * chunks of a quarter of the scratch buffer (one quarter per row of a tile); each output takes
 * its chunks' sums in column order either way. */
static void mm_rows_fma(const mm_job_t *j, int64_t r0, int64_t r1, float *buf)
{
    const td_mat_t *W = j->W;
    const int64_t ld = j->x_ld, chunk = SCRATCH_FLOATS / 4;
    const bool fused = td__cpu_fused(W->dtype);
    for (int64_t c0 = 0; c0 < W->cols; c0 += chunk) {
        const int64_t n = TD_MIN(chunk, W->cols - c0);
        if (j->T == 1 && j->grouped) {
            td__cpu_dot_rows_grouped(j->grouped, W, r0, r1, c0, n, j->x + c0, j->out + r0, c0 > 0);
            continue;
        }
        if (j->T == 1 && td__cpu_dot_rows(W, r0, r1, c0, n, j->x + c0, j->out + r0, c0 > 0))
            continue;
        if (j->xp) { /* AVX-512: four rows against groups of up to 12 tokens in pairs */
            const int64_t gstride = W->cols / 8 * TD_CPU_PAIR_TOKENS * 8;
            for (int64_t r = r0; r < r1; r += 4) {
                const int R = (int)TD_MIN(4, r1 - r);
                const float *w[4];
                float o[4][TD_CPU_PAIR_TOKENS];
                for (int i = 0; i < R; i++)
                    w[i] = row_chunk(j, r + i, c0, n, buf + i * chunk);
                for (int64_t t = 0, g = 0; t < j->T; t += TD_CPU_PAIR_TOKENS, g++) {
                    const int nt = (int)TD_MIN(TD_CPU_PAIR_TOKENS, j->T - t);
                    const float *xp = j->xp + g * gstride + c0 / 8 * ((nt + 1) / 2) * 16;
                    td__cpu_tile_pairs(fused, R, w, xp, j->x + (size_t)t * ld + c0, ld, nt, n, o);
                    for (int i = 0; i < R; i++)
                        for (int k = 0; k < nt; k++)
                            put(j, t + k, r + i, c0, o[i][k]);
                }
            }
            continue;
        }
        for (int64_t r = r0; r < r1; r += 3) {
            int R = (int)TD_MIN(3, r1 - r);
            int64_t t = 0;
            float o[4][4];
            const float *w[4];
            for (int i = 0; i < R; i++)
                w[i] = row_chunk(j, r + i, c0, n, buf + i * chunk);
            for (; t + 4 <= j->T; t += 4) {
                td__cpu_tile(fused, R, 4, w, j->x + (size_t)t * ld + c0, ld, n, o);
                for (int i = 0; i < R; i++)
                    for (int k = 0; k < 4; k++)
                        put(j, t + k, r + i, c0, o[i][k]);
            }
            for (; t < j->T; t++) {
                td__cpu_tile(fused, R, 1, w, j->x + (size_t)t * ld + c0, ld, n, o);
                for (int i = 0; i < R; i++)
                    put(j, t, r + i, c0, o[i][0]);
            }
        }
    }
}
#endif

/* Rows [r0, r1) of the product. With four or more tokens: pairs of rows against groups of four
 * tokens (kern_2x4), the rest one by one; otherwise one row at a time. Long rows are dequantised
 * in column chunks of the scratch buffer (half of it per row of a pair). */
static void mm_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    mm_job_t *j = arg;
    const td_mat_t *W = j->W;
    const int64_t ld = j->x_ld, step = j->T >= 4 ? 2 : 1, chunk = SCRATCH_FLOATS / 2;
    float *buf = j->c->scratch[tid];
#ifdef TD_CPU_FMA_KERNELS
    if (td__cpu_fma()) {
        mm_rows_fma(j, r0, r1, buf);
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r += step) {
        bool pair = step == 2 && r + 1 < r1;
        for (int64_t c0 = 0; c0 < W->cols; c0 += chunk) {
            int64_t n = TD_MIN(chunk, W->cols - c0), t = 0;
            const float *w0 = row_chunk(j, r, c0, n, buf);
            const float *w1 = pair ? row_chunk(j, r + 1, c0, n, buf + chunk) : NULL;
            for (; t + 4 <= j->T; t += 4) {
                const float *x = j->x + (size_t)t * ld + c0;
                float o[2][4];
                if (pair)
                    kern_2x4(w0, w1, x, ld, n, o);
                else
                    kern_1x4(w0, x, ld, n, o[0]);
                for (int k = 0; k < 4; k++) {
                    put(j, t + k, r, c0, o[0][k]);
                    if (pair)
                        put(j, t + k, r + 1, c0, o[1][k]);
                }
            }
            for (; t < j->T; t++) {
                const float *x = j->x + (size_t)t * ld + c0;
                put(j, t, r, c0, kern_1x1(w0, x, n));
                if (pair)
                    put(j, t, r + 1, c0, kern_1x1(w1, x, n));
            }
        }
    }
}

/* Weights against 8-bit activations (Q8_0 / Q4_0: cpu_q8.c; Q4_K / Q6_K: cpu_qk.c): the tokens
 * of a group quantised once, then every thread's chunks of rows against all of them. a is the
 * group's td_q8_act_t or td_qk_act_t, as the weights' type says. */
typedef struct mma_job {
    cpu_t *c;
    const td_mat_t *W;
    const void *a;
    const float *x;
    int x_ld;
    float *out;
    int out_ld;
} mma_job_t;

static void mma_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    const mma_job_t *j = arg;
    void *scratch = j->c->scratch[tid];
    const size_t bytes = SCRATCH_FLOATS * sizeof(float);
    if (td__cpu_qk_act(j->W->dtype))
        td__cpu_qk_rows(j->W, r0, r1, j->a, j->out, j->out_ld, scratch, bytes);
    else
        td__cpu_q8_rows(j->W, r0, r1, j->a, j->out, j->out_ld, scratch, bytes);
}

/* Tokens [t0, t1) of a group quantised (each on its own: the split does not change a value). */
static void mma_quant(void *arg, int64_t t0, int64_t t1, int tid)
{
    const mma_job_t *j = arg;
    (void)tid;
    if (td__cpu_qk_act(j->W->dtype))
        td__cpu_qk_quant(j->x, j->x_ld, j->a, t0, t1);
    else
        td__cpu_quant_act(j->x, j->x_ld, j->a, t0, t1);
}

/* Under four tokens, a product over fewer weight bytes than this runs on the caller's thread
 * alone: waking another thread for it cost more than it saved. Measured here (Q8_0 ~100M llama,
 * two threads, decode, 7 alternating rounds): its 0.6 MiB attention projections alone, the
 * 1.9 MiB MLP and larger ones split, 1.00-1.27x (median 1.14x) the tokens/s of splitting every
 * product (BENCHMARKS.md). The 8-bit formats only: F32 and F16 rows of the same shapes are 2-4x
 * the bytes. */
enum { SPLIT_BYTES = 1 << 20 };

/* One group of Tg tokens: quantised, then the rows against them. */
static void mma_run(cpu_t *c, mma_job_t *j, int64_t Tg)
{
    td_cpu_pool_run(Tg < 8 ? NULL : c->pool, Tg, 0, mma_quant, j);
    const bool alone =
        Tg < 4 && (int64_t)td_dtype_row_bytes(j->W->dtype, j->W->cols) * j->W->rows < SPLIT_BYTES;
    int64_t work =
        j->W->rows * j->W->cols * Tg; /* small products are not worth waking the others */
    /* several chunks per thread, in the prefill tiles' groups of four rows (under four tokens,
     * one range per thread: its rows are one sequential stream the decode kernels read along) */
    td_cpu_pool_run(work < 32768 || alone ? NULL : c->pool, j->W->rows,
                    Tg >= 4 ? td_cpu_pool_grain(c->pool, j->W->rows, 8, 4, 16) : 0, mma_rows, j);
}

static void matmul_q8(cpu_t *c, float *out, int out_ld, const float *x, int x_ld, int T,
                      const td_mat_t *W)
{
    const int64_t n = W->cols, nb = n / 32, G = (nb + 7) / 8;
    /* per token: int8 values, steps and block sums; wide, a token's share of the tiles' copy
     * (the bytes of one pair more kept aside: an odd count's pad and the alignment) */
    const bool wide = td__cpu_q8_wide(T);
    const int64_t pair = wide ? (int64_t)td__cpu_q8_wide_bytes(2, n) : 0;
    const int64_t per_tok = n + 8 * nb + pair / 2;
    const int64_t group = (XQ_BYTES - pair) / per_tok;
    TD_ASSERT(group >= 4);
    for (int64_t t0 = 0; t0 < T; t0 += group) {
        int64_t Tg = TD_MIN(group, T - t0);
        float *d = c->xq;
        int32_t *qs = (int32_t *)(d + Tg * nb);
        int8_t *q = (int8_t *)(qs + Tg * nb);
        td_q8_act_t a = {Tg, n, q, d, qs, G, td__cpu_isa() >= TD_CPU_ISA_AVX512, NULL, NULL, NULL};
        if (td__cpu_q8_wide(Tg)) { /* the tiles' copy after the int8 values */
            TD_ASSERT((uint8_t *)(q + Tg * n) + td__cpu_q8_wide_bytes(Tg, n) <=
                      (uint8_t *)c->xq + XQ_BYTES);
            td__cpu_q8_wide_place(&a, q + Tg * n);
        }
        mma_job_t j = {c, W, &a, x + t0 * x_ld, x_ld, out + t0 * out_ld, out_ld};
        mma_run(c, &j, Tg);
    }
}

static void matmul_qk(cpu_t *c, float *out, int out_ld, const float *x, int x_ld, int T,
                      const td_mat_t *W)
{
    const int64_t n = W->cols;
    int64_t group = T;
    while (group > 4 && td__cpu_qk_act_bytes(group, n) > XQ_BYTES)
        group = (group + 1) / 2;
    TD_ASSERT(td__cpu_qk_act_bytes(group, n) <= XQ_BYTES);
    for (int64_t t0 = 0; t0 < T; t0 += group) {
        const int64_t Tg = TD_MIN(group, T - t0);
        td_qk_act_t a;
        td__cpu_qk_act_place(&a, Tg, n, c->xq);
        mma_job_t j = {c, W, &a, x + t0 * x_ld, x_ld, out + t0 * out_ld, out_ld};
        mma_run(c, &j, Tg);
    }
}

#ifdef TD_CPU_FMA_KERNELS
/* Groups [g0, g1) of a block of tokens packed for the AVX-512 tiles. */
static void mm_pack(void *arg, int64_t g0, int64_t g1, int tid)
{
    const mm_job_t *j = arg;
    (void)tid;
    const int64_t gstride = j->W->cols / 8 * TD_CPU_PAIR_TOKENS * 8;
    for (int64_t g = g0; g < g1; g++) {
        const int64_t t = g * TD_CPU_PAIR_TOKENS;
        td__cpu_pack_pairs(j->x + (size_t)t * j->x_ld, j->x_ld,
                           (int)TD_MIN(TD_CPU_PAIR_TOKENS, j->T - t), j->W->cols,
                           (float *)j->xp + g * gstride);
    }
}
#endif

/* At most this many bytes of tokens packed at a time for the AVX-512 tiles (at least one group),
 * so that a block stays in L2 while every row passes over it. Measured here (matmuls of the bench
 * llama's shapes, 128 tokens, one thread's CPU time): 768 x 2304 F32 ran at 113 GFLOP/s with all
 * 128 tokens packed at once (1.2 MB), 140-150 with 512 KB or 1 MB blocks; F16 129 against 150. */
#define XP_BYTES (512 << 10)

/* F16 matrices get their grouped copy here, at the engine's creation, rather than in the first
 * step that multiplies them. */
static void cpu_prepare(td_backend_t *b, const td_mat_t *W)
{
    cpu_t *c = b->impl;
    td__cpu_groups_get(c->groups, W);
}

static void cpu_matmul(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                       const td_mat_t *W)
{
    cpu_t *c = b->impl;
    if (!c->f32_act && td__cpu_q8_act(W->dtype)) {
        matmul_q8(c, out, out_ld, x, x_ld, T, W);
        return;
    }
    if (!c->f32_act && td__cpu_qk_act(W->dtype) && W->cols % 256 == 0) {
        matmul_qk(c, out, out_ld, x, x_ld, T, W);
        return;
    }
    /* small products are not worth waking the other threads */
    const int64_t work = W->rows * W->cols * (int64_t)T;
    td_cpu_pool_t *pool = work < 32768 ? NULL : c->pool;
    /* four tokens or more: about eight chunks of rows per thread (multiples of 12 rows: of the
     * AVX-512 tiles' four and the AVX2 tiles' three), so that a thread slowed by other work leaves
     * its share to the others; under four, one range per thread (one token's kernel streams its
     * rows) */
    const int64_t gr = T >= 4 ? td_cpu_pool_grain(c->pool, W->rows, 8, 12, 12) : 0;
    const uint8_t *grouped = td__cpu_groups_get(c->groups, W);
#ifdef TD_CPU_FMA_KERNELS
    if (T >= 4 && W->cols >= 8 && td__cpu_isa() >= TD_CPU_ISA_AVX512) {
        /* blocks of tokens, each packed once into pairs for the tiles (XP_BYTES at most) */
        const int64_t gfl = W->cols / 8 * TD_CPU_PAIR_TOKENS * 8;
        const int64_t groups = (T + TD_CPU_PAIR_TOKENS - 1) / TD_CPU_PAIR_TOKENS;
        const int64_t most = TD_MAX(1, (int64_t)(XP_BYTES / sizeof(float)) / gfl);
        const int64_t per =
            (groups + (groups + most - 1) / most - 1) / ((groups + most - 1) / most);
        const int64_t blk = per * TD_CPU_PAIR_TOKENS; /* the blocks as even as whole groups allow */
        const size_t need = (size_t)per * (size_t)gfl;
        if (need > c->xp_floats) {
            free(c->xp);
            c->xp = aligned_alloc(64, need * sizeof(float));
            c->xp_floats = c->xp ? need : 0;
        }
        if (c->xp) {
            for (int64_t t0 = 0; t0 < T; t0 += blk) {
                const int Tb = (int)TD_MIN(blk, T - t0);
                mm_job_t j = {
                    c, out + t0 * out_ld, out_ld, x + t0 * x_ld, x_ld, Tb, W, c->xp, grouped};
                td_cpu_pool_run(Tb > TD_CPU_PAIR_TOKENS ? pool : NULL,
                                (Tb + TD_CPU_PAIR_TOKENS - 1) / TD_CPU_PAIR_TOKENS, 1, mm_pack, &j);
                td_cpu_pool_run(pool, W->rows, gr, mm_rows, &j);
            }
            return;
        }
    }
#endif
    mm_job_t j = {c, out, out_ld, x, x_ld, T, W, NULL, grouped};
    td_cpu_pool_run(pool, W->rows, gr, mm_rows, &j);
}

typedef struct mmt_job {
    cpu_t *c;
    float *out;
    int out_ld;
    const float *x;
    int x_ld;
    const td_mat_t *W;
    int64_t row0, n_rows;
} mmt_job_t;

/* Tokens [t0, t1): out[t] = sum_r x[t][r] W[row0 + r]. */
static void mmt_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    mmt_job_t *j = arg;
    float *buf = j->c->scratch[tid];
    int64_t cols = j->W->cols;
    for (int64_t t = t0; t < t1; t++)
        memset(j->out + t * j->out_ld, 0, (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < j->n_rows; r++) {
        const float *w = td__cpu_row_chunk(j->W, j->row0 + r, 0, cols, buf);
        for (int64_t t = t0; t < t1; t++)
            axpy(j->out + t * j->out_ld, j->x[t * j->x_ld + r], w, cols);
    }
}

static void cpu_matmul_t(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                         const td_mat_t *W, int64_t row0, int64_t n_rows)
{
    cpu_t *c = b->impl;
    TD_ASSERT(W->cols <= SCRATCH_FLOATS);
    mmt_job_t j = {c, out, out_ld, x, x_ld, W, row0, n_rows};
    td_cpu_pool_run(T < 2 ? NULL : c->pool, T, 0, mmt_tokens, &j);
}

/* ---------- elementwise ---------- */

static void cpu_rmsnorm(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                        int n, const float *w, float eps)
{
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * x_ld;
        float *o = out + (size_t)t * out_ld;
        double ss = 0;
        for (int i = 0; i < n; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++)
            o[i] = xr[i] * inv * w[i];
    }
}

static void cpu_rope(td_backend_t *b, float *x, int ld, int T, int n_heads, int head_ld,
                     int rope_dim, const int32_t *pos, const float *inv_freq, float mscale,
                     bool interleaved)
{
    int half = rope_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i]; /* fp32 like the references */
            float cs = (float)cos(angle) * mscale, sn = (float)sin(angle) * mscale;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (size_t)t * ld + (size_t)h * head_ld;
                int a = interleaved ? 2 * i : i, c = interleaved ? 2 * i + 1 : i + half;
                float x0 = v[a], x1 = v[c];
                v[a] = x0 * cs - x1 * sn;
                v[c] = x0 * sn + x1 * cs;
            }
        }
    }
}

typedef struct silu_job {
    float *g;
    int g_ld;
    const float *u;
    int u_ld, n;
} silu_job_t;

static void silu_tokens(void *arg, int64_t t0, int64_t t1, int tid)
{
    const silu_job_t *j = arg;
    (void)tid;
    for (int64_t t = t0; t < t1; t++) {
        float *gr = j->g + (size_t)t * j->g_ld;
        const float *ur = j->u + (size_t)t * j->u_ld;
        for (int i = 0; i < j->n; i++)
            gr[i] = gr[i] / (1.0f + expf(-gr[i])) * ur[i];
    }
}

/* Split over tokens (each value on its own: the split changes none): at 128 tokens of the
 * ~100M llama its expf calls were a twentieth of a prefill's time on the caller alone. */
static void cpu_silu_mul(td_backend_t *b, float *g, int g_ld, const float *u, int u_ld, int T,
                         int n)
{
    cpu_t *c = b->impl;
    silu_job_t j = {g, g_ld, u, u_ld, n};
    td_cpu_pool_run((int64_t)T * n < 32768 ? NULL : c->pool, T, 0, silu_tokens, &j);
}

static void cpu_add(td_backend_t *b, float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void cpu_kv_store(td_backend_t *b, td_kv_pool_t *pool, int layer, const td_attn_tok_t *toks,
                         int T, const float *src, int src_ld)
{
    int B = pool->layout.block_size, n = pool->layout.token_floats;
    for (int t = 0; t < T; t++) {
        float *dst = td_kv_slot(pool, toks[t].blocks[toks[t].pos / B], layer, toks[t].pos % B);
        memcpy(dst, src + (size_t)t * src_ld, (size_t)n * sizeof(float));
    }
}

/* ---------- attention (cpu_attn.c) ---------- */

static void cpu_attn_gqa(td_backend_t *b, float *out, int out_ld, const float *q, int q_ld, int T,
                         const td_attn_tok_t *toks, const td_kv_pool_t *pool, int layer,
                         int n_heads, int n_kv_heads, int head_dim, float scale)
{
    cpu_t *c = b->impl;
    td__cpu_attn_gqa(c->pool, out, out_ld, q, q_ld, T, toks, pool, layer, n_heads, n_kv_heads,
                     head_dim, scale);
}

static void cpu_attn_mla(td_backend_t *b, float *out, const float *q_lat, const float *q_pe,
                         int q_pe_ld, int q_pe_head_ld, int T, const td_attn_tok_t *toks,
                         const td_kv_pool_t *pool, int layer, int n_heads, int kv_rank,
                         int rope_dim, float scale)
{
    cpu_t *c = b->impl;
    td__cpu_attn_mla(c->pool, out, q_lat, q_pe, q_pe_ld, q_pe_head_ld, T, toks, pool, layer,
                     n_heads, kv_rank, rope_dim, scale);
}

/* ---------- lifecycle ---------- */

static void cpu_destroy(td_backend_t *b)
{
    if (!b)
        return;
    cpu_t *c = b->impl;
    if (c) {
        td_cpu_pool_free(c->pool);
        for (int i = 0; c->scratch && i < c->n_threads; i++)
            free(c->scratch[i]);
        free(c->scratch);
        free(c->xq);
        free(c->xp);
        td__cpu_groups_free(c->groups);
        free(c);
    }
    free(b);
}

td_backend_t *td_cpu_backend_create(int n_threads)
{
    td_cpu_opts_t o = {.n_threads = n_threads};
    return td_cpu_backend_create_opts(&o);
}

td_backend_t *td_cpu_backend_create_opts(const td_cpu_opts_t *o)
{
    int n_threads = o->n_threads < 1 ? 1 : o->n_threads;
    td_backend_t *b = td_calloc(1, sizeof(*b));
    cpu_t *c = td_calloc(1, sizeof(*c));
    if (!b || !c) {
        free(b);
        free(c);
        return NULL;
    }
    b->impl = c;
    b->name = "cpu";
    b->destroy = cpu_destroy;
    b->prepare = cpu_prepare;
    b->matmul = cpu_matmul;
    b->matmul_t = cpu_matmul_t;
    b->rmsnorm = cpu_rmsnorm;
    b->rope = cpu_rope;
    b->silu_mul = cpu_silu_mul;
    b->add = cpu_add;
    b->kv_store = cpu_kv_store;
    b->attn_gqa = cpu_attn_gqa;
    b->attn_mla = cpu_attn_mla;
    td__cpu_mem_hooks(b);
    c->n_threads = n_threads;
    c->f32_act = o->f32_activations;
    if (!o->stored_rows && !(c->groups = td__cpu_groups_new()))
        goto err;
    if (!(c->xq = malloc(XQ_BYTES)))
        goto err;
    c->scratch = td_calloc((size_t)n_threads, sizeof(float *));
    if (!c->scratch)
        goto err;
    for (int i = 0; i < n_threads; i++)
        if (!(c->scratch[i] = aligned_alloc(64, SCRATCH_FLOATS * sizeof(float))))
            goto err;
    if (!(c->pool = td_cpu_pool_create(n_threads)))
        goto err;
    return b;
err:
    cpu_destroy(b);
    return NULL;
}
