/* cpu_q8.c: Q8_0 and Q4_0 weights against activations quantised to 8 bits, with integer dot
 * products: llama.cpp's scheme for its own formats, written here from its description.
 *
 * Each token's activation row is cut into blocks of 32 values; a block's step is d = amax / 127
 * (amax its largest magnitude) rounded to fp16, and each value becomes q = round(x * (127 /
 * amax)), to nearest with ties to even (0 for an all-zero block). cpu_matmul quantises every
 * token once per matmul (td__cpu_quant_act) and every thread reads that copy for all its rows.
 *
 * A weight block holds an fp16 step dw and 32 small integers w (Q8_0: int8; Q4_0: nibble - 8).
 * One output (weight row r, token t) has an 8-lane fp32 accumulator; per block b, in column order,
 * lane k takes the exact integer sum s_k = sum of w[j] * q[j] over values j = 4k .. 4k + 3 and
 * adds (dw * dq) * s_k: one fused multiply-add where the CPU has x86-64-v3 (what llama.cpp's
 * AVX2 code does), a multiply then an add elsewhere. The lanes are then summed in cpu_fma.c's
 * fixed tree. The sums are integers (|s_k| <= 4 * 128 * 127) so any kernel gets them exactly:
 * the decode rows, the prefill tiles and the portable loop give one token's output bitwise the
 * same whatever shares its matmul or thread. */
#include "cpu_impl.h"
#include "td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QK 32 /* values per block, weights and activations alike */

bool td__cpu_q8_act(td_dtype_t t)
{
    return t == TD_DTYPE_Q8_0 || t == TD_DTYPE_Q4_0;
}

/* f rounded to the nearest fp16 value (ties to even), as a float: exact scaling by powers of two
 * around one rintf, so it needs no half type. Overflow gives inf. */
static float round_f16(float f)
{
    if (!(fabsf(f) < 65520.0f))
        return isnan(f) ? f : copysignf(INFINITY, f);
    if (f == 0.0f)
        return f;
    int e;
    frexpf(f, &e); /* |f| in [2^(e-1), 2^e): 11 significant bits, no finer than 2^-24 */
    int q = e - 1 - 10 < -24 ? -24 : e - 1 - 10;
    return ldexpf(rintf(ldexpf(f, -q)), q);
}

/* One block's step and 127 / amax. */
static inline void block_scale(float amax, float *d, float *id)
{
    *d = round_f16(amax / 127.0f);
    *id = amax != 0.0f ? 127.0f / amax : 0.0f;
}

static void quant_row_generic(const float *x, int64_t n, int8_t *q, float *d, int64_t ldd)
{
    for (int64_t b = 0; b < n / QK; b++, x += QK, q += QK) {
        float amax = 0, id;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        block_scale(amax, &d[b * ldd], &id);
        for (int j = 0; j < QK; j++)
            q[j] = (int8_t)rintf(x[j] * id);
    }
}

/* Weight block b of a row as 32 ints (value order), and its step. */
static inline float wblock(td_dtype_t t, const uint8_t *row, int64_t b, int8_t w[QK])
{
    if (t == TD_DTYPE_Q8_0) {
        const uint8_t *blk = row + b * 34;
        memcpy(w, blk + 2, QK);
        return td__cpu_f16(blk);
    }
    const uint8_t *blk = row + b * 18;
    for (int j = 0; j < 16; j++) {
        w[j] = (int8_t)((blk[2 + j] & 0xf) - 8);
        w[j + 16] = (int8_t)((blk[2 + j] >> 4) - 8);
    }
    return td__cpu_f16(blk);
}

/* The portable kernel: one output at a time, the same lanes and block order as the x86 ones. */
static float dot_generic(td_dtype_t t, const uint8_t *row, const int8_t *q, const float *d,
                         int64_t ldd, int64_t nb)
{
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, q += QK) {
        int8_t w[QK];
        float dd = wblock(t, row, b, w) * d[b * ldd];
        for (int k = 0; k < 8; k++) {
            int32_t s = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++)
                s += (int32_t)w[j] * q[j];
            float p = dd * (float)s;
            acc[k] = acc[k] + p;
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

#ifdef TD_CPU_FMA_KERNELS
#include <immintrin.h>

#define K __attribute__((target("avx2,fma,f16c")))
#define KI __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* The same values as quant_row_generic: max of magnitudes is exact, one rounding each for
 * amax / 127, 127 / amax and x * id, rounding to nearest even for q and for the fp16 step. */
K static void quant_row_avx2(const float *x, int64_t n, int8_t *q, float *d, int64_t ldd)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / QK; b++, x += QK, q += QK) {
        __m256 v[4], m;
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h), id, dd = amax / 127.0f;
        id = amax != 0.0f ? 127.0f / amax : 0.0f;
        d[b * ldd] = _cvtsh_ss(_cvtss_sh(dd, _MM_FROUND_TO_NEAREST_INT));
        const __m256 iv = _mm256_set1_ps(id);
        __m256i i[4];
        for (int k = 0; k < 4; k++)
            i[k] = _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(v[k], iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* pack to int8 keeping value order: packs work within 128-bit lanes, then a permute */
        __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q, p);
    }
}

/* Weight block b's 32 integers in value order, Q8_0 or Q4_0 (nibble - 8). */
KI __m256i wvec(td_dtype_t t, const uint8_t *blk)
{
    if (t == TD_DTYPE_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 2));
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0xf)), _mm256_set1_epi8(8));
}

KI float wstep(const uint8_t *blk)
{
    uint16_t h;
    memcpy(&h, blk, 2);
    return _cvtsh_ss(h);
}

/* The 8 lane sums s_k (values 4k .. 4k + 3) of w * q as floats: the sign trick makes the weights
 * unsigned for maddubs (|w| <= 128, |q| <= 127: a pair's sum fits int16). */
KI __m256 lane_sums(__m256i w, __m256i q)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

KI float lanes(__m256 acc)
{
    float v[8];
    _mm256_storeu_ps(v, acc);
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* lanes() of four accumulators at once, the same additions in the same tree: the pairs, then
 * the pairs' pairs (within each 128-bit half), then the halves. */
KI __m128 lanes4(const __m256 a[4])
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* R rows against TN tokens (values q + t * ldq, block b's step d[b * ldd + t]): out[r][t]. */
KI void tile(td_dtype_t T, int R, int TN, const uint8_t *const *w, const int8_t *q, int64_t ldq,
             const float *d, int64_t ldd, int64_t nb, float out[4][8], const char *pf)
{
    const int bs = T == TD_DTYPE_Q8_0 ? 34 : 18;
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < TN; t++)
            acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (pf) /* one token: the next group of rows, one sequential stream a group ahead */
#pragma GCC unroll 4
            for (int p = 0; p < R * bs; p += 64)
                _mm_prefetch(pf + (size_t)b * R * bs + p, _MM_HINT_T0);
        __m256i wv[4], aw[4];
        float dd[4][8];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w[r] + b * bs;
            wv[r] = wvec(T, blk);
            aw[r] = _mm256_sign_epi8(wv[r], wv[r]);
            for (int t = 0; t < TN; t++)
                dd[r][t] = wstep(blk) * d[b * ldd + t];
        }
#pragma GCC unroll 8
        for (int t = 0; t < TN; t++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(q + t * ldq + b * QK));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(qv, wv[r]));
                __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[r][t]), s, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < TN; t++)
            out[r][t] = lanes(acc[r][t]);
}

typedef void (*tile_fn)(const uint8_t *const *, const int8_t *, int64_t, const float *, int64_t,
                        int64_t, float[4][8], const char *);
#define TILE(name, T, R, TN)                                                                       \
    K static void name##_##R##x##TN(const uint8_t *const *w, const int8_t *q, int64_t ldq,         \
                                    const float *d, int64_t ldd, int64_t nb, float out[4][8],      \
                                    const char *pf)                                                \
    {                                                                                              \
        tile(T, R, TN, w, q, ldq, d, ldd, nb, out, pf);                                            \
    }
#define TILES(name, T)                                                                             \
    TILE(name, T, 1, 1) TILE(name, T, 2, 1) TILE(name, T, 3, 1) TILE(name, T, 4, 1)
TILES(q8, TD_DTYPE_Q8_0)
TILES(q4, TD_DTYPE_Q4_0)

/* The kernel for four or more tokens: 16-bit integers and pmaddwd instead of
 * maddubs. x86-64-v3 runs the integer multiplies (pmaddwd, pmaddubsw, psignb) and the fused
 * multiply-adds on the same two pipes; with maddubs an output's block takes four of them there
 * (sign, maddubs, madd, fmadd), with 16-bit operands three (two pmaddwd, fmadd: the add and the
 * conversion run elsewhere). The 32 values of a block are split by index mod 4: E holds values
 * 4k and 4k + 2 in lane k's two halves, O values 4k + 1 and 4k + 3, each sign-extended to 16
 * bits, so pmaddwd(wE, qE) + pmaddwd(wO, qO) is lane k's exact sum s_k over 4k .. 4k + 3, the
 * same integer as lane_sums(): the outputs are bitwise those of the other kernels. */
KI void split16(__m256i v, int16_t *dst)
{
    _mm256_storeu_si256((__m256i *)dst, _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8));
    _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_srai_epi16(v, 8));
}

#define KC 24 /* blocks per pass of tile16: one pass's operands stay in L1 */

/* R rows (w16 + r * lw: per block E then O, 32 int16; row r's step ws[8 * b + 4 * r .. + 3],
 * four copies) against TN tokens (the same layout, token t's block b at q16 + t * lq + b * TN *
 * 32: a group of four tokens interleaved block by block, one sequential stream; block b's step
 * d[b * ldd + t]), blocks [b0, b1) of nb. The accumulators start at zero where b0 is 0, else
 * from acc_io[r][t]; they go back to acc_io where b1 < nb, else their lane trees to
 * out[t * out_ld + r]. A row longer than KC blocks takes several passes, so that one pass's
 * blocks of the tokens and rows stay in L1 (the values are those of one pass: the same fused
 * multiply-adds in the same order). The steps' products dw * dx go to a table first, read back
 * by broadcasts: computed block by block they were stored and reloaded at once, and the stores'
 * forwarding stalled the loop. */
KI void tile16(int R, int TN, const int16_t *w16, int64_t lw, const float *ws, const int16_t *q16,
               int64_t lq, const float *d, int64_t ldd, int64_t nb, int64_t b0, int64_t b1,
               __m256 acc_io[2][4], float *out, int64_t out_ld)
{
    float dd[KC][2][4];
    for (int64_t b = b0; b < b1; b++) {
        if (TN == 4 && R == 2) /* both rows' four products in one multiply */
            _mm256_storeu_ps(dd[b - b0][0],
                             _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * b),
                                           _mm256_broadcast_ps((const __m128 *)(d + b * ldd))));
        else if (TN == 4)
            _mm_storeu_ps(dd[b - b0][0],
                          _mm_mul_ps(_mm_loadu_ps(ws + 8 * b), _mm_loadu_ps(d + b * ldd)));
        else
            for (int r = 0; r < R; r++)
                for (int t = 0; t < TN; t++)
                    dd[b - b0][r][t] = ws[8 * b + 4 * r] * d[b * ldd + t];
    }
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < TN; t++)
            acc[r][t] = b0 == 0 ? _mm256_setzero_ps() : acc_io[r][t];
    for (int64_t b = b0; b < b1; b++) {
        __m256i we[2], wo[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            we[r] = _mm256_loadu_si256((const __m256i *)(w16 + r * lw + b * QK));
            wo[r] = _mm256_loadu_si256((const __m256i *)(w16 + r * lw + b * QK + 16));
            __asm__("" : "+x"(we[r]), "+x"(wo[r])); /* held in registers, not re-read */
        }
#pragma GCC unroll 4
        for (int t = 0; t < TN; t++) {
            const int16_t *qb = q16 + t * lq + b * TN * QK;
            __m256i qe = _mm256_loadu_si256((const __m256i *)qb);
            __m256i qo = _mm256_loadu_si256((const __m256i *)(qb + 16));
            __asm__("" : "+x"(qe), "+x"(qo));
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i s =
                    _mm256_add_epi32(_mm256_madd_epi16(we[r], qe), _mm256_madd_epi16(wo[r], qo));
                acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[b - b0][r][t]),
                                            _mm256_cvtepi32_ps(s), acc[r][t]);
            }
        }
    }
    if (b1 < nb) {
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < TN; t++)
                acc_io[r][t] = acc[r][t];
    } else if (TN == 4) { /* out[t * out_ld + r]: each token's two rows in one store */
        __m128 x0 = lanes4(acc[0]), x1 = R == 2 ? lanes4(acc[1]) : x0;
        __m128 lo = _mm_unpacklo_ps(x0, x1), hi = _mm_unpackhi_ps(x0, x1);
        if (R == 2) {
            _mm_storel_pi((__m64 *)out, lo);
            _mm_storeh_pi((__m64 *)(out + out_ld), lo);
            _mm_storel_pi((__m64 *)(out + 2 * out_ld), hi);
            _mm_storeh_pi((__m64 *)(out + 3 * out_ld), hi);
        } else {
            float v[4];
            _mm_storeu_ps(v, x0);
            for (int t = 0; t < 4; t++)
                out[t * out_ld] = v[t];
        }
    } else
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
            out[r] = lanes(acc[r][0]);
}

typedef void (*tile16_fn)(const int16_t *, int64_t, const float *, const int16_t *, int64_t,
                          const float *, int64_t, int64_t, int64_t, int64_t, __m256[2][4], float *,
                          int64_t);
#define TILE16(R, TN)                                                                              \
    K static void t16_##R##x##TN(const int16_t *w16, int64_t lw, const float *ws,                  \
                                 const int16_t *q16, int64_t lq, const float *d, int64_t ldd,      \
                                 int64_t nb, int64_t b0, int64_t b1, __m256 acc[2][4], float *out, \
                                 int64_t out_ld)                                                   \
    {                                                                                              \
        tile16(R, TN, w16, lw, ws, q16, lq, d, ldd, nb, b0, b1, acc, out, out_ld);                 \
    }
TILE16(1, 1)
TILE16(2, 1)
TILE16(1, 4)
TILE16(2, 4)

/* Blocks [b0, b1) of R rows from row into w16 (E/O halves, row stride n) and ws (8 a block). */
KI void widen(td_dtype_t t, const uint8_t *row, size_t rb, int R, int64_t n, int64_t b0, int64_t b1,
              int16_t *w16, float *ws)
{
    const int bs = t == TD_DTYPE_Q8_0 ? 34 : 18;
    for (int i = 0; i < R; i++)
        for (int64_t b = b0; b < b1; b++) {
            const uint8_t *blk = row + (size_t)i * rb + b * bs;
            split16(wvec(t, blk), w16 + i * n + b * QK);
            ws[8 * b + 4 * i] = ws[8 * b + 4 * i + 1] = ws[8 * b + 4 * i + 2] =
                ws[8 * b + 4 * i + 3] = wstep(blk);
        }
}

/* A token's 16-bit E/O halves (rows16's layout) from its int8 values, and, in a full group of
 * four, its steps into the group's [b][4] table (they were 4 of T apart: a tile read them from as
 * many lines as blocks). */
K static void widen_act(const td_q8_act_t *a, int64_t t)
{
    const int64_t n = a->n, nb = n / QK;
    const bool grouped = t < a->T / 4 * 4;
    int16_t *dst = a->q16 + (grouped ? t / 4 * 4 * n + t % 4 * QK : t * n);
    for (int64_t b = 0; b < nb; b++)
        split16(_mm256_loadu_si256((const __m256i *)(a->q + t * n + b * QK)),
                dst + b * (grouped ? 4 : 1) * QK);
    if (grouped)
        for (int64_t b = 0; b < nb; b++)
            a->d4[t / 4 * 4 * nb + 4 * b + t % 4] = a->d[b * a->T + t];
}

/* Rows [r0, r1) against T >= 4 tokens with tile16, two rows at a time against every group of
 * four tokens, the tokens' 16-bit copies shared (a->q16, a->d4); the rows' copies in scratch
 * where it is large enough, else in memory of their own; false (nothing done) where that cannot
 * be allocated. */
K static bool rows16(const td_mat_t *W, int64_t r0, int64_t r1, const td_q8_act_t *a, float *out,
                     int64_t out_ld, void *scratch, size_t scratch_bytes)
{
    const int64_t n = W->cols, nb = n / QK, T = a->T, ntile = (T + 3) / 4;
    const size_t rb = td_dtype_row_bytes(W->dtype, W->cols);
    const int bs = W->dtype == TD_DTYPE_Q8_0 ? 34 : 18;
    /* two pairs of rows' 16-bit values (the one computed, the next being widened) and their
     * steps; with several passes, each tile's accumulators between them */
    const size_t accb = nb > KC ? (size_t)ntile * sizeof(__m256[2][4]) : 0;
    const size_t need = accb + (size_t)4 * n * sizeof(int16_t) + (size_t)16 * nb * sizeof(float);
    uint8_t *mem = scratch, *own = NULL;
    if (need > scratch_bytes || (uintptr_t)scratch % 32) {
        if (!(mem = own = aligned_alloc(32, (need + 31) / 32 * 32)))
            return false;
    }
    __m256(*acc)[2][4] = (__m256(*)[2][4])mem;
    int16_t *w16[2] = {(int16_t *)(mem + accb), (int16_t *)(mem + accb) + 2 * n};
    float *ws[2] = {(float *)(w16[0] + 4 * n), (float *)(w16[0] + 4 * n) + 8 * nb};
    const int16_t *q16 = a->q16;
    const float *d = a->d, *d4 = a->d4;
    const uint8_t *data = W->data;
    widen(W->dtype, data + (size_t)r0 * rb, rb, (int)TD_MIN(2, r1 - r0), n, 0, nb, w16[0], ws[0]);
    /* the next pair is widened a few blocks per tile of this one, its rows prefetched ahead
     * (widened in a loop of their own, their loads waited on memory for most of rows16's 5-9%
     * of a prefill's time) */
    const int64_t per = (nb + ntile - 1) / ntile;
    for (int64_t r = r0, cur = 0; r < r1; r += 2, cur ^= 1) {
        const int R = (int)TD_MIN(2, r1 - r), Rn = (int)TD_MAX(0, TD_MIN(2, r1 - r - 2));
        const uint8_t *nx = data + (size_t)(r + 2) * rb;
        int64_t done = 0; /* blocks of the next pair widened */
        const tile16_fn f4 = R == 2 ? t16_2x4 : t16_1x4, f1 = R == 2 ? t16_2x1 : t16_1x1;
        const int16_t *w = w16[cur];
        const float *s = ws[cur];
        for (int64_t b0 = 0; b0 < nb; b0 += KC) {
            const int64_t b1 = TD_MIN(nb, b0 + KC);
            __m256 a1[2][4]; /* one pass: neither read nor written */
            int64_t t = 0;
            for (; t + 4 <= T; t += 4) {
                if (Rn && done < nb) {
                    int64_t e = TD_MIN(nb, done + per);
                    widen(W->dtype, nx, rb, Rn, n, done, e, w16[cur ^ 1], ws[cur ^ 1]);
                    /* and the same blocks of the pair after it towards L2 (to L1 they would
                     * be evicted by the tokens before their turn) */
                    for (int i = 0; r + 4 + i < r1 && i < 2; i++)
                        for (int64_t p = done * bs; p < e * bs + 63; p += 64)
                            _mm_prefetch((const char *)nx + (size_t)(2 + i) * rb + p, _MM_HINT_T1);
                    /* and this pair's next blocks to L1, two tiles ahead */
                    for (int i = 0; i < Rn; i++)
                        for (int64_t p = e * bs; p < TD_MIN(nb, e + 2 * per) * bs; p += 64)
                            _mm_prefetch((const char *)nx + (size_t)i * rb + p, _MM_HINT_T0);
                    done = e;
                }
                f4(w, n, s, q16 + t * n, QK, d4 + t * nb, 4, nb, b0, b1, accb ? acc[t / 4] : a1,
                   out + t * out_ld + r, out_ld);
            }
            for (; t < T; t++) { /* the last tile's accumulators: one token each */
                if (accb) {
                    __m256 *at = &acc[t / 4][0][t % 4];
                    __m256 ta[2][4] = {{at[0]}, {at[4]}};
                    f1(w, n, s, q16 + t * n, n, d + t, T, nb, b0, b1, ta, out + t * out_ld + r,
                       out_ld);
                    at[0] = ta[0][0];
                    at[4] = ta[1][0];
                } else
                    f1(w, n, s, q16 + t * n, n, d + t, T, nb, b0, b1, a1, out + t * out_ld + r,
                       out_ld);
            }
        }
        if (Rn && done < nb)
            widen(W->dtype, nx, rb, Rn, n, done, nb, w16[cur ^ 1], ws[cur ^ 1]);
    }
    free(own);
    return true;
}

/* [Q8_0, Q4_0][R - 1] for one token */
static const tile_fn tiles1[2][4] = {{q8_1x1, q8_2x1, q8_3x1, q8_4x1},
                                     {q4_1x1, q4_2x1, q4_3x1, q4_4x1}};
#endif

bool td__cpu_q8_wide(int64_t T)
{
#ifdef TD_CPU_FMA_KERNELS
    return T >= 4 && td__cpu_fma();
#else
    (void)T;
    return false;
#endif
}

void td__cpu_quant_act(const float *x, int64_t x_ld, const td_q8_act_t *a, int64_t t0, int64_t t1)
{
    for (int64_t t = t0; t < t1; t++) {
        const float *xr = x + t * x_ld;
        int8_t *qr = a->q + t * a->n;
        float *dr = a->d + t;
#ifdef TD_CPU_FMA_KERNELS
        if (td__cpu_fma()) {
            quant_row_avx2(xr, a->n, qr, dr, a->T);
            if (a->q16)
                widen_act(a, t);
            continue;
        }
#endif
        quant_row_generic(xr, a->n, qr, dr, a->T);
    }
}

void td__cpu_q8_rows(const td_mat_t *W, int64_t r0, int64_t r1, const td_q8_act_t *a, float *out,
                     int64_t out_ld, void *scratch, size_t scratch_bytes)
{
    const int64_t n = W->cols, nb = n / QK, T = a->T;
    const int8_t *q = a->q;
    const float *d = a->d;
    const size_t rb = td_dtype_row_bytes(W->dtype, W->cols);
    const uint8_t *data = W->data;
#ifdef TD_CPU_FMA_KERNELS
    if (td__cpu_fma()) {
        /* four tokens or more: rows16, two rows against four tokens (measured here, one
         * thread's CPU time on 2304x768 Q8_0 against 120 tokens, a standalone copy of each loop:
         * 74 GFLOP/s at 768 values a row; the 8-bit maddubs tiles it replaced 66-67 at 2x8,
         * 64-66 at 3x4, 63 at 4x3, 64 at 2x6; 16-bit 4x3 or 3x3 with the rows' halves reloaded
         * from L1 63-64, the tokens widened inside the tile 68-71; in the engine, the ~100M
         * llama's 128-token Q8_0 prefill takes 0.23-0.25 s of CPU where the 2x8 tiles took
         * 0.27-0.29). Fewer tokens (or no memory for rows16's copies): four rows at a time, one
         * token each */
        if (T >= 4 && a->q16 && rows16(W, r0, r1, a, out, out_ld, scratch, scratch_bytes))
            return;
        const int k = W->dtype == TD_DTYPE_Q8_0 ? 0 : 1;
        for (int64_t r = r0; r < r1; r += 4) {
            int R = (int)TD_MIN(4, r1 - r);
            const uint8_t *w[4];
            for (int i = 0; i < R; i++)
                w[i] = data + (size_t)(r + i) * rb;
            float o[4][8];
            for (int64_t t = 0; t < T; t++) {
                const char *pf = T == 1 ? (const char *)(w[0] + (size_t)R * rb) : NULL;
                tiles1[k][R - 1](w, q + t * n, n, d + t, T, nb, o, pf);
                for (int i = 0; i < R; i++)
                    out[t * out_ld + r + i] = o[i][0];
            }
        }
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++)
            out[t * out_ld + r] =
                dot_generic(W->dtype, data + (size_t)r * rb, q + t * n, d + t, T, nb);
}
