/* cpu_fma.c: the matmul kernels for CPUs with AVX2, FMA and F16C (x86-64-v3), and for those with
 * AVX-512 too, picked at run time by cpu_backend.c's mm_rows and cpu_matmul (td__cpu_isa says
 * which this CPU has, under a cap tests set).
 *
 * Every output (weight row r, token t) has its own 8-lane accumulator, folded per 8 columns in
 * column order (one fused multiply-add, or for F32 weights a multiply then an add: the choice is
 * per weight type, td__cpu_fused), then the lanes in one fixed tree and the scalar tail in order. A
 * tile of several rows and tokens only shares the loads (each weight vector feeds every token of
 * the tile, each token vector every row): it does not change any output's sum, so a token's result
 * is bitwise the same alone (decode), in a batch or split over threads.
 *
 * With AVX-512, four tokens or more take the tiles of tile5: a 512-bit register holds two
 * outputs' 8-lane accumulators, [row r . token 2p | row r . token 2p + 1], four rows by up to six
 * pairs (24 accumulators), the row's 8 weights broadcast to both halves and each pair's 16 values
 * one aligned load from a copy of the tokens packed per matmul (td__cpu_pack_pairs); each half is
 * finished by the same finish(). Never one output over 16 lanes: that would change its sum.
 * Measured here (AMD EPYC, Zen 5; the bench llama's three matmul shapes, 128 tokens, one thread,
 * best CPU time): F32 62 GFLOP/s with the AVX2 tiles, 122-137 with these; F16 86-89 against
 * 136-152. F16 and BF16 rows are converted to fp32 per column chunk (td__cpu_row_chunk) as for
 * the AVX2 tiles, the conversion shared by every token of the block.
 *
 * One token's F32 rows are summed by one call per row (not through td__cpu_row_chunk and
 * td__cpu_tile), its F16, Q8_0, Q4_0, Q4_K and Q6_K rows straight from the stored blocks,
 * each weight the same fp32 value td__cpu_row_chunk would have stored (an exact conversion, or
 * d * q, or d * scale * q - min in the same order), in the same order: so without storing the row,
 * the same result as the tiles over the dequantised row. Several rows at once for F16 and Q8_0:
 * one row's chain of dependent additions would leave the FMA units idle while it waits. F16 rows
 * are read from the backend's grouped copy (cpu_group.c) where it made one, the three rows of a
 * group one sequential stream. */
#include "cpu_impl.h"
#include "td_error.h"
#include "td_log.h"

#include <stdlib.h>
#include <string.h>

#ifdef TD_CPU_FMA_KERNELS
#include <immintrin.h>
#include <stdatomic.h>

#define K __attribute__((target("avx2,fma,f16c")))

/* acc + w * x: one fused multiply-add, or a multiply then an add (two roundings). */
#define MAC(F, w, x, acc)                                                                          \
    ((F) ? _mm256_fmadd_ps(w, x, acc) : _mm256_add_ps(acc, _mm256_mul_ps(w, x)))
#define KI __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* The CPU's level, asked once (from any pool thread; read and written atomically), lowered to
 * the environment's TD_CPU_MAX_ISA (generic, avx2 or avx512: to measure or reproduce a lesser
 * CPU's kernels on this one; any other value is logged and ignored), under the cap
 * td__cpu_isa_cap sets. */
static _Atomic int isa_cap = TD_CPU_ISA_AVX512;

static int isa_detected(void)
{
    static _Atomic int have = -1;
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        h = TD_CPU_ISA_GENERIC;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c")) {
            h = TD_CPU_ISA_AVX2;
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vnni"))
                h = TD_CPU_ISA_AVX512;
        }
        const char *env = getenv("TD_CPU_MAX_ISA");
        if (env) {
            static const char *const names[] = {"generic", "avx2", "avx512"};
            int want = -1;
            for (int i = 0; i < 3; i++)
                if (strcmp(env, names[i]) == 0)
                    want = i;
            if (want < 0)
                TD_LOG_W("TD_CPU_MAX_ISA=%s: not generic, avx2 or avx512; ignored", env);
            else if (want < h)
                h = want;
        }
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h;
}

int td__cpu_isa(void)
{
    int h = isa_detected(), cap = atomic_load_explicit(&isa_cap, memory_order_relaxed);
    return h < cap ? h : cap;
}

void td__cpu_isa_cap(int max)
{
    atomic_store_explicit(&isa_cap, max, memory_order_relaxed);
}

bool td__cpu_fma(void)
{
    return td__cpu_isa() >= TD_CPU_ISA_AVX2;
}

/* Per weight type: fused multiply-adds or separate ones, and how many rows one token's kernel
 * takes at a time. Measured here (AMD EPYC, rows from memory, one thread's CPU time): one F32 row
 * at a time with a separate multiply and add streams at the read bandwidth (~21 GB/s), where one
 * FMA chain's longer latency holds it to ~18 and two or more F32 rows at once ran at 8-13 (the
 * hardware prefetcher follows one stream better than several); F16 streams three rows at once
 * at ~31 GB/s for 768-column rows and ~22 for 2304 (two rows: ~25 and ~22, held by their two
 * FMA chains, 4 cycles per 8 columns each; four: 17-29, erratic), Q8_0 four rows at ~13 GB/s
 * (one: 8), both with FMA and a software prefetch of the next group of rows (F16's in two
 * levels, see prefetch_next; in bench_engine 3-5% faster than into L1 alone). With
 * 128 tokens the FMA tiles reach ~64 GFLOP/s, the separate multiply and add ~43, the kernels
 * before this file ~37: F32 keeps the separate ones for its decode's sake. */
bool td__cpu_fused(td_dtype_t t)
{
    return t != TD_DTYPE_F32;
}

int td__cpu_decode_rows(td_dtype_t t)
{
    return t == TD_DTYPE_F16 ? 3 : t == TD_DTYPE_Q8_0 ? 4 : 1;
}

/* The lanes in the fixed tree, then the scalar tail w[i..n) . x[i..n) in order. */
KI float finish(__m256 acc, const float *w, const float *x, int64_t i, int64_t n)
{
    float v[8];
    _mm256_storeu_ps(v, acc);
    float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    for (; i < n; i++)
        s += w[i] * x[i];
    return s;
}

/* R rows w[0..R) against TN tokens (x, x + ld, ...): out[r][t]. R * TN accumulators. */
KI void tile(bool F, int R, int TN, const float *const *w, const float *x, int64_t ld, int64_t n,
             float out[4][4])
{
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TN; t++)
            acc[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm256_loadu_ps(w[r] + i);
#pragma GCC unroll 4
        for (int t = 0; t < TN; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * ld + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][t] = MAC(F, wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TN; t++)
            out[r][t] = finish(acc[r][t], w[r], x + t * ld, i, n);
}

#define TILE(F, R, TN)                                                                             \
    K static void tile##F##_##R##x##TN(const float *const *w, const float *x, int64_t ld,          \
                                       int64_t n, float out[4][4])                                 \
    {                                                                                              \
        tile(F, R, TN, w, x, ld, n, out);                                                          \
    }
#define TILES(F)                                                                                   \
    TILE(F, 1, 1)                                                                                  \
    TILE(F, 2, 1)                                                                                  \
    TILE(F, 3, 1)                                                                                  \
    TILE(F, 4, 1)                                                                                  \
    TILE(F, 1, 4)                                                                                  \
    TILE(F, 2, 4)                                                                                  \
    TILE(F, 3, 4)
TILES(0)
TILES(1)

void td__cpu_tile(bool fused, int R, int TN, const float *const *w, const float *x, int64_t ld,
                  int64_t n, float out[4][4])
{
    typedef void (*fn)(const float *const *, const float *, int64_t, int64_t, float[4][4]);
    static const fn one[2][4] = {{tile0_1x1, tile0_2x1, tile0_3x1, tile0_4x1},
                                 {tile1_1x1, tile1_2x1, tile1_3x1, tile1_4x1}};
    static const fn four[2][3] = {{tile0_1x4, tile0_2x4, tile0_3x4},
                                  {tile1_1x4, tile1_2x4, tile1_3x4}};
    TD_ASSERT(R >= 1 && R <= (TN == 4 ? 3 : 4) && (TN == 1 || TN == 4));
    (TN == 1 ? one[fused] : four[fused])[R - 1](w, x, ld, n, out);
}

/* ---------- AVX-512: two outputs per 512-bit register ----------
 *
 * A 512-bit accumulator holds two outputs' 8-lane accumulators side by side: [row r . token 2p |
 * row r . token 2p + 1]. The row's 8 weights are broadcast to both halves; the pair's 16 values
 * come in one load from a copy of the tokens laid out for it (td__cpu_pack_pairs). Each half is
 * then exactly the AVX2 tile's accumulator for its output (the same multiply-add or multiply then
 * add per 8 columns, in column order) and goes through the same finish(): bitwise the same sums,
 * twice the products per instruction. */

#define K5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2")))
#define KI5                                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2"),                     \
                   always_inline)) static inline
#define MAC5(F, w, x, acc)                                                                         \
    ((F) ? _mm512_fmadd_ps(w, x, acc) : _mm512_add_ps(acc, _mm512_mul_ps(w, x)))

void td__cpu_pack_pairs(const float *x, int64_t ld, int nt, int64_t n, float *dst)
{
    const int P = (nt + 1) / 2;
    for (int64_t k = 0; k < n / 8; k++)
        for (int t = 0; t < 2 * P; t++) {
            float *d = dst + (k * P + t / 2) * 16 + (t % 2) * 8;
            if (t < nt)
                memcpy(d, x + t * ld + 8 * k, 8 * sizeof(float));
            else
                memset(d, 0, 8 * sizeof(float));
        }
}

/* Each half of v[r][p] (the accumulators of row r with tokens 2p and 2p + 1) through finish(),
 * for the nt tokens there are: out of line, where the tiles would carry a copy of the scalar tail
 * per output. */
__attribute__((target("avx2,fma,f16c"), noinline)) static void
finish_pairs(int R, int P, float v[4][TD_CPU_PAIR_TOKENS / 2][16], const float *const *w,
             const float *x, int64_t ld, int nt, int64_t i, int64_t n,
             float out[4][TD_CPU_PAIR_TOKENS])
{
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nt && t < 2 * P; t++)
            out[r][t] = finish(_mm256_loadu_ps(&v[r][t / 2][8 * (t % 2)]), w[r], x + t * ld, i, n);
}

/* R rows w[0..R) against P pairs of tokens packed at xp (td__cpu_pack_pairs, at the chunk's
 * first column), nt <= 2P of them (x + t * ld: the tokens themselves, for the scalar tail). */
KI5 void tile5(bool F, int R, int P, const float *const *w, const float *xp, const float *x,
               int64_t ld, int nt, int64_t n, float out[4][TD_CPU_PAIR_TOKENS])
{
    __m512 acc[4][TD_CPU_PAIR_TOKENS / 2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++)
            acc[r][p] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8, xp += 16 * P) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm512_broadcast_f32x8(_mm256_loadu_ps(w[r] + i));
#pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            __m512 xv = _mm512_load_ps(xp + 16 * p);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][p] = MAC5(F, wv[r], xv, acc[r][p]);
        }
    }
    float v[4][TD_CPU_PAIR_TOKENS / 2][16];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int p = 0; p < P; p++)
            _mm512_storeu_ps(v[r][p], acc[r][p]);
    finish_pairs(R, P, v, w, x, ld, nt, i, n, out);
}

typedef void (*tile5_fn)(const float *const *, const float *, const float *, int64_t, int, int64_t,
                         float[4][TD_CPU_PAIR_TOKENS]);
#define TILE5(F, R, P)                                                                             \
    K5 static void tile5_##F##_##R##x##P(const float *const *w, const float *xp, const float *x,   \
                                         int64_t ld, int nt, int64_t n,                            \
                                         float out[4][TD_CPU_PAIR_TOKENS])                         \
    {                                                                                              \
        tile5(F, R, P, w, xp, x, ld, nt, n, out);                                                  \
    }
#define TILE5_P(F, R)                                                                              \
    TILE5(F, R, 1) TILE5(F, R, 2) TILE5(F, R, 3) TILE5(F, R, 4) TILE5(F, R, 5) TILE5(F, R, 6)
#define TILE5_RP(F) TILE5_P(F, 1) TILE5_P(F, 2) TILE5_P(F, 3) TILE5_P(F, 4)
TILE5_RP(0)
TILE5_RP(1)
#define TILE5_ROW(F, R)                                                                            \
    {                                                                                              \
        tile5_##F##_##R##x1, tile5_##F##_##R##x2, tile5_##F##_##R##x3, tile5_##F##_##R##x4,        \
            tile5_##F##_##R##x5, tile5_##F##_##R##x6                                               \
    }

void td__cpu_tile_pairs(bool fused, int R, const float *const *w, const float *xp, const float *x,
                        int64_t ld, int nt, int64_t n, float out[4][TD_CPU_PAIR_TOKENS])
{
    static const tile5_fn fns[2][4][TD_CPU_PAIR_TOKENS / 2] = {
        {TILE5_ROW(0, 1), TILE5_ROW(0, 2), TILE5_ROW(0, 3), TILE5_ROW(0, 4)},
        {TILE5_ROW(1, 1), TILE5_ROW(1, 2), TILE5_ROW(1, 3), TILE5_ROW(1, 4)}};
    TD_ASSERT(R >= 1 && R <= 4 && nt >= 1 && nt <= TD_CPU_PAIR_TOKENS);
    fns[fused][R - 1][(nt + 1) / 2 - 1](w, xp, x, ld, nt, n, out);
}

/* ---------- one token, straight from the stored blocks (n a multiple of 32) ---------- */

KI float lanes(__m256 acc)
{
    return finish(acc, NULL, NULL, 0, 0);
}

/* Prefetch the part of the next group of rows [pf, ...) that matches iteration it, `step` bytes per
 * row per iteration: R rows read at R places at once are R streams, which the hardware prefetcher
 * follows worse (measured here: R = 4 rows from memory ran at half the speed of one) than this
 * one sequential stream a group ahead (a prefetch per row, a fixed distance ahead of each, ran at
 * a third of this one's speed). far 0: into every level (PREFETCHT0). far > 0: PREFETCHNTA a
 * group ahead and PREFETCHT1 (into L2) `far` bytes further. Measured here (F16, three rows, one
 * thread, best of 30-40 passes over 160 MiB): with only the first, 2304-column rows streamed at
 * 12-15 GB/s on a loaded machine where the pair reaches 17-22; 768-column rows 31-32 quiet with
 * the first alone, 14-27 under load against the pair's 18-23. */
KI void prefetch_next(int R, int step, const char *pf, int64_t it, size_t far)
{
#pragma GCC unroll 8
    for (int p = 0; p < R * step; p += 64) {
        const char *a = pf + (size_t)it * R * step + p;
        if (far) {
            _mm_prefetch(a, _MM_HINT_NTA);
            _mm_prefetch(a + far, _MM_HINT_T1);
        } else {
            _mm_prefetch(a, _MM_HINT_T0);
        }
    }
}

/* One F32 row: the sum tile(false, 1, 1, ...) forms (a multiply then an add per 8 columns; n a
 * multiple of 8, so no scalar tail), without td__cpu_row_chunk and the tile dispatch per row. No
 * software prefetch and one row at a time: the hardware prefetcher follows this one stream best
 * (measured: two or four F32 rows with prefetch_next ran at 60-85% of this one's speed). */
K static void f32_row(const uint8_t *w, const float *x, int64_t n, float *out)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
        acc = MAC(false, _mm256_loadu_ps((const float *)w + i), _mm256_loadu_ps(x + i), acc);
    *out = lanes(acc);
}

/* R F16 rows: row r's columns [i, i + 8) at w[r] + i / 8 * step. Stored rows (step 16) with
 * prefetch_next; grouped ones (cpu_group.c: one sequential stream, the hardware prefetcher's
 * best case) with none, pf NULL: measured, any software prefetch slowed them. */
KI void f16_rows(bool F, int R, const uint8_t *const *w, int64_t step, const float *x, int64_t n,
                 float *out, const char *pf)
{
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0, k = 0; i < n; i += 8, k += step) {
        __m256 xv = _mm256_loadu_ps(x + i);
        if (pf)
            prefetch_next(R, 16, pf, i / 8, (size_t)R * 2 * n); /* one group further */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[r] =
                MAC(F, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w[r] + k))), xv, acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r] = lanes(acc[r]);
}

KI void q8_0_rows(bool F, int R, const uint8_t *const *w, const float *x, int64_t n, float *out,
                  const char *pf)
{
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        prefetch_next(R, 34, pf, b, 0);
        __m256 xv[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            xv[k] = _mm256_loadu_ps(x + 8 * k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w[r] + b * 34;
            uint16_t h;
            memcpy(&h, blk, 2);
            __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256 q = _mm256_cvtepi32_ps(
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * k))));
                acc[r] = MAC(F, _mm256_mul_ps(d, q), xv[k], acc[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r] = lanes(acc[r]);
}

#define ROWS(kind, F, R)                                                                           \
    K static void kind##F##_##R(const uint8_t *const *w, const float *x, int64_t n, float *out,    \
                                const char *pf)                                                    \
    {                                                                                              \
        kind##_rows(F, R, w, x, n, out, pf);                                                       \
    }
#define ROWS4(kind, F) ROWS(kind, F, 1) ROWS(kind, F, 2) ROWS(kind, F, 3) ROWS(kind, F, 4)
#define F16ROWS(F, R)                                                                              \
    K static void f16##F##_##R(const uint8_t *const *w, const float *x, int64_t n, float *out,     \
                               const char *pf)                                                     \
    {                                                                                              \
        f16_rows(F, R, w, 16, x, n, out, pf);                                                      \
    }
#define F16GROUPED(F, R)                                                                           \
    K static void f16g##F##_##R(const uint8_t *const *w, int64_t step, const float *x, int64_t n,  \
                                float *out)                                                        \
    {                                                                                              \
        f16_rows(F, R, w, step, x, n, out, NULL);                                                  \
    }
/* clang-format off */
F16ROWS(0, 1) F16ROWS(0, 2) F16ROWS(0, 3) F16ROWS(0, 4)
F16ROWS(1, 1) F16ROWS(1, 2) F16ROWS(1, 3) F16ROWS(1, 4)
F16GROUPED(0, 1) F16GROUPED(0, 2) F16GROUPED(0, 3)
F16GROUPED(1, 1) F16GROUPED(1, 2) F16GROUPED(1, 3)
ROWS4(q8_0, 0)
ROWS4(q8_0, 1)
/* clang-format on */

K static float dot_q4_0(const uint8_t *w, const float *x, int64_t n)
{
    const __m128i lo = _mm_set1_epi8(0xf);
    const __m256 eight = _mm256_set1_ps(8.0f);
    __m256 a = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, w += 18, x += 32) {
        uint16_t h;
        memcpy(&h, w, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));
        __m128i nib[2] = {_mm_and_si128(q, lo), _mm_and_si128(_mm_srli_epi16(q, 4), lo)};
        for (int k = 0; k < 4; k++) { /* values 8k..8k+7: low nibbles, then the high ones */
            __m128i src = k < 2 ? nib[0] : nib[1];
            if (k & 1)
                src = _mm_srli_si128(src, 8);
            /* (q - 8) is exact in fp32, as is the int (q & 0xf) - 8 the row converter takes */
            __m256 v = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(src)), eight);
            a = _mm256_fmadd_ps(_mm256_mul_ps(v, d), _mm256_loadu_ps(x + 8 * k), a);
        }
    }
    return lanes(a);
}

K static float dot_q4_k(const uint8_t *w, const float *x, int64_t n)
{
    __m256 a = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; b++, w += 144) {
        uint16_t hd, hm;
        memcpy(&hd, w, 2);
        memcpy(&hm, w + 2, 2);
        float d = _cvtsh_ss(hd), dmin = _cvtsh_ss(hm);
        const uint8_t *sc = w + 4, *q = w + 16;
        for (int i = 0; i < 4; i++) {
            for (int half = 0; half < 2; half++, x += 32) {
                int s, m;
                k4_scale_min(2 * i + half, sc, &s, &m);
                __m256 dv = _mm256_set1_ps(d * (float)s), mv = _mm256_set1_ps(dmin * (float)m);
                for (int k = 0; k < 4; k++) {
                    __m128i raw = _mm_loadl_epi64((const __m128i *)(q + 32 * i + 8 * k));
                    raw = half ? _mm_srli_epi16(raw, 4) : raw;
                    raw = _mm_and_si128(raw, _mm_set1_epi8(0xf));
                    __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(raw));
                    __m256 wv = _mm256_sub_ps(_mm256_mul_ps(dv, qf), mv);
                    a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 8 * k), a);
                }
            }
        }
    }
    return lanes(a);
}

K static float dot_q6_k(const uint8_t *w, const float *x, int64_t n)
{
    __m256 a = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi32(0xf), m2 = _mm256_set1_epi32(3),
                  k32 = _mm256_set1_epi32(32);
    for (int64_t b = 0; b < n / 256; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        uint16_t hd;
        memcpy(&hd, w + 208, 2);
        float d = _cvtsh_ss(hd);
        for (int hf = 0; hf < 2; hf++, ql += 64, qh += 32, sc += 8) {
            for (int k = 0; k < 4; k++) { /* values 32k..32k+31 of this half, in order */
                const uint8_t *lp = ql + 32 * (k % 2);
                for (int g = 0; g < 2; g++) {
                    __m256 sv = _mm256_set1_ps(d * (float)sc[g + 2 * k]);
                    for (int e = 0; e < 2; e++, x += 8) {
                        int l = 16 * g + 8 * e;
                        __m256i lo =
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(lp + l)));
                        __m256i hi =
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + l)));
                        lo = _mm256_and_si256(k < 2 ? lo : _mm256_srli_epi32(lo, 4), m4);
                        hi = _mm256_and_si256(_mm256_srli_epi32(hi, 2 * k), m2);
                        __m256i qi =
                            _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), k32);
                        __m256 wv = _mm256_mul_ps(sv, _mm256_cvtepi32_ps(qi));
                        a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), a);
                    }
                }
            }
        }
    }
    return lanes(a);
}

bool td__cpu_dot_rows(const td_mat_t *W, int64_t r0, int64_t r1, int64_t c0, int64_t n,
                      const float *x, float *out, bool add)
{
    typedef void (*fn)(const uint8_t *const *, const float *, int64_t, float *, const char *);
    static const fn f16[2][4] = {{f160_1, f160_2, f160_3, f160_4},
                                 {f161_1, f161_2, f161_3, f161_4}},
                    q8[2][4] = {{q8_00_1, q8_00_2, q8_00_3, q8_00_4},
                                {q8_01_1, q8_01_2, q8_01_3, q8_01_4}};
    const td_dtype_t dt = W->dtype;
    const bool F = td__cpu_fused(dt);
    if (n % 32 || n % td_dtype_block(dt))
        return false;
    if (dt != TD_DTYPE_F32 && dt != TD_DTYPE_F16 && dt != TD_DTYPE_Q8_0 &&
        !(F && (dt == TD_DTYPE_Q4_0 || dt == TD_DTYPE_Q4_K || dt == TD_DTYPE_Q6_K)))
        return false;
    const size_t rb = td_dtype_row_bytes(dt, W->cols);
    const uint8_t *base = (const uint8_t *)W->data + td_dtype_row_bytes(dt, c0);
    const int step = td__cpu_decode_rows(dt);
    for (int64_t r = r0; r < r1; r += step) {
        const int R = (int)TD_MIN(step, r1 - r);
        const uint8_t *rows[4];
        float o[4];
        for (int i = 0; i < R; i++)
            rows[i] = base + (size_t)(r + i) * rb;
        const char *next = (const char *)rows[0] + (size_t)R * rb; /* the next group's first row */
        switch (dt) {
        case TD_DTYPE_F32: /* td__cpu_fused: never fused; td__cpu_decode_rows: one row at a time */
            for (int i = 0; i < R; i++)
                f32_row(rows[i], x, n, &o[i]);
            break;
        case TD_DTYPE_F16:
            f16[F][R - 1](rows, x, n, o, next);
            break;
        case TD_DTYPE_Q8_0:
            q8[F][R - 1](rows, x, n, o, next);
            break;
        default: /* Q4_0, Q4_K, Q6_K (fused) */
            for (int i = 0; i < R; i++)
                o[i] = dt == TD_DTYPE_Q4_0   ? dot_q4_0(rows[i], x, n)
                       : dt == TD_DTYPE_Q4_K ? dot_q4_k(rows[i], x, n)
                                             : dot_q6_k(rows[i], x, n);
            break;
        }
        float *dst = out + (r - r0);
        for (int i = 0; i < R; i++)
            dst[i] = add ? dst[i] + o[i] : o[i];
    }
    return true;
}

void td__cpu_dot_rows_grouped(const uint8_t *copy, const td_mat_t *W, int64_t r0, int64_t r1,
                              int64_t c0, int64_t n, const float *x, float *out, bool add)
{
    typedef void (*fn)(const uint8_t *const *, int64_t, const float *, int64_t, float *);
    static const fn g[2][3] = {{f16g0_1, f16g0_2, f16g0_3}, {f16g1_1, f16g1_2, f16g1_3}};
    const bool F = td__cpu_fused(TD_DTYPE_F16);
    TD_ASSERT(W->dtype == TD_DTYPE_F16 && c0 % 32 == 0 && n % 32 == 0);
    for (int64_t r = r0; r < r1;) {
        /* the rows of r's group from r on, at most to r1: one step apart in the copy */
        int64_t step;
        const uint8_t *at = td__cpu_group_at(copy, W, r, c0, &step);
        const int R = (int)TD_MIN(step / 16 - r % TD_CPU_GROUP, r1 - r);
        const uint8_t *rows[TD_CPU_GROUP];
        float o[TD_CPU_GROUP];
        for (int i = 0; i < R; i++)
            rows[i] = at + 16 * i;
        g[F][R - 1](rows, step, x, n, o);
        float *dst = out + (r - r0);
        for (int i = 0; i < R; i++)
            dst[i] = add ? dst[i] + o[i] : o[i];
        r += R;
    }
}

#else /* no x86-64-v3 kernels in this build */

int td__cpu_isa(void)
{
    return TD_CPU_ISA_GENERIC;
}

void td__cpu_isa_cap(int max)
{
    (void)max;
}

bool td__cpu_fma(void)
{
    return false;
}

bool td__cpu_fused(td_dtype_t t)
{
    (void)t;
    return false;
}

int td__cpu_decode_rows(td_dtype_t t)
{
    (void)t;
    return 1;
}

#endif
