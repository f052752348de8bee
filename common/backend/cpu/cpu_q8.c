/* cpu_q8.c: Q8_0 and Q4_0 weights against activations quantised to 8 bits, with integer dot
 * products: llama.cpp's scheme for its own formats, written here from its description.
 *
 * Each token's activation row is cut into blocks of 32 values; a block's step is d = amax / 127
 * (amax its largest magnitude) rounded to fp16, and each value becomes q = round(x * (127 /
 * amax)), to nearest with ties to even (0 for an all-zero block). cpu_matmul quantises every
 * token once per matmul (td__cpu_quant_act) and every thread reads that copy for all its rows.
 *
 * A weight block holds an fp16 step dw and 32 small integers w (Q8_0: int8; Q4_0: nibble - 8).
 * One output (weight row r, token t) has an 8-lane fp32 accumulator; block b, in column order,
 * goes to lane b mod 8, which adds (dw * dq) * S_b, S_b the block's exact integer sum of w[j] *
 * q[j] over its 32 values (|S_b| <= 32 * 128 * 127, exact in fp32): one fused multiply-add where
 * the CPU has x86-64-v3, a multiply then an add elsewhere. The lanes are then summed in cpu_fma.c's
 * fixed tree. A lane per block, not per group of values, leaves one conversion and one
 * multiply-add per output for every eight blocks, where the integer work is one instruction per
 * four values: the prefill tiles run on integer units (AVX-512 VNNI's vpdpbusd, or AVX2's
 * pmaddwd). The sums are integers, so any kernel gets them exactly: the decode rows, the prefill
 * tiles of either instruction set and the portable loop give one token's output bitwise the same
 * whatever shares its matmul or thread. */
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
        int32_t s = 0;
        for (int j = 0; j < QK; j++)
            s += (int32_t)w[j] * q[j];
        float p = dd * (float)s;
        acc[b % 8] = acc[b % 8] + p;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

#ifdef TD_CPU_FMA_KERNELS
#include <immintrin.h>

#define K __attribute__((target("avx2,fma,f16c")))
#define KI __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define K512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define KI512                                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"),          \
                   always_inline)) static inline

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

/* The 8 lane sums (values 4k .. 4k + 3) of w * q: the sign trick makes the weights unsigned for
 * maddubs (|w| <= 128, |q| <= 127: a pair's sum fits int16). */
KI __m256i lane_sums(__m256i w, __m256i q)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Eight blocks' lane sums v[j] to their totals, block j in lane j: pairs, then quarters within
 * each 128-bit half (hadd), then the halves. Integer additions: exact in any order. */
KI __m256i block_sums(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

KI float lanes(__m256 acc)
{
    float v[8];
    _mm256_storeu_ps(v, acc);
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* Eight 32-bit columns of v[0..8) to rows: out[k] lane j = v[j] lane k. */
KI void transpose8(const __m256i v[8], __m256i out[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        out[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        out[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* The steps of blocks b0 .. b0 + 7 of a row (bs bytes a block) as floats: one gather of each
 * block's first four bytes, their low halves packed and converted. */
KI __m256 wsteps8(const uint8_t *row, int64_t b0, int bs)
{
    const __m256i idx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bs));
    __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(row + b0 * bs), idx, 1);
    g = _mm256_and_si256(g, _mm256_set1_epi32(0xffff));
    g = _mm256_permute4x64_epi64(_mm256_packus_epi32(g, g), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(g));
}

/* Blocks b0 .. b0 + m - 1 (m < 8, the row's last) of R rows against one token: lane j adds
 * block b0 + j's (dw * dx) * S; the lanes past m take zeros with zero steps. */
KI void tail_group(td_dtype_t T, int R, const uint8_t *const *w, const int8_t *q, const float *d,
                   int64_t ldd, int64_t b0, int m, __m256 acc[4])
{
    const int bs = T == TD_DTYPE_Q8_0 ? 34 : 18;
    float dx[8] = {0};
    for (int j = 0; j < m; j++)
        dx[j] = d[(b0 + j) * ldd];
    const __m256 dxv = _mm256_loadu_ps(dx);
    for (int r = 0; r < R; r++) {
        __m256i v[8];
        float dw[8] = {0};
        for (int j = 0; j < 8; j++) {
            if (j < m) {
                const uint8_t *blk = w[r] + (b0 + j) * bs;
                v[j] = lane_sums(wvec(T, blk),
                                 _mm256_loadu_si256((const __m256i *)(q + (b0 + j) * QK)));
                dw[j] = wstep(blk);
            } else {
                v[j] = _mm256_setzero_si256();
            }
        }
        __m256 s = _mm256_cvtepi32_ps(block_sums(v));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dw), dxv), s, acc[r]);
    }
}

/* One token (pf set): the next group of rows' share of blocks b0 .. b0 + 7, one sequential
 * stream a group ahead. */
KI void prefetch_group(const char *pf, int64_t b0, int R, int bs)
{
    if (pf)
#pragma GCC unroll 8
        for (int p = 0; p < R * bs * 8; p += 64)
            _mm_prefetch(pf + (size_t)b0 * R * bs + p, _MM_HINT_T0);
}

/* Token step i of a group: d[(b0 + i) * ldd] for i < 8, one load where they are adjacent. */
KI __m256 steps8(const float *d, int64_t b0, int64_t ldd)
{
    if (ldd == 1)
        return _mm256_loadu_ps(d + b0);
    const __m256i idx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)ldd));
    return _mm256_i32gather_ps(d + b0 * ldd, idx, 4);
}

/* R rows against one token (values q, block b's step d[b * ldd]) straight from the stored
 * blocks: out[r][0], AVX2. Eight blocks at a time: each block's lane sums (maddubs), then
 * block_sums. */
KI void tile(td_dtype_t T, int R, const uint8_t *const *w, const int8_t *q, const float *d,
             int64_t ldd, int64_t nb, float out[4][8], const char *pf)
{
    const int bs = T == TD_DTYPE_Q8_0 ? 34 : 18;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        prefetch_group(pf, b0, R, bs);
        const __m256 dxv = steps8(d, b0, ldd);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256i v[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                v[j] = lane_sums(wvec(T, w[r] + (b0 + j) * bs),
                                 _mm256_loadu_si256((const __m256i *)(q + (b0 + j) * QK)));
            __m256 s = _mm256_cvtepi32_ps(block_sums(v));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(wsteps8(w[r], b0, bs), dxv), s, acc[r]);
        }
    }
    if (b0 < nb)
        tail_group(T, R, w, q, d, ldd, b0, (int)(nb - b0), acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r][0] = lanes(acc[r]);
}

/* The same with AVX-512 VNNI: two blocks per 512-bit vpdpbusd on the weights as w + 128 (the
 * token's -128 * block sums, qs, cancel the offset), then the four vectors' 64 lane sums folded
 * to the eight blocks' totals by three rounds of even + odd lanes (vpermt2d, then vpermd). */
KI512 void tile_v(td_dtype_t T, int R, const uint8_t *const *w, const int8_t *q, const float *d,
                  const int32_t *qs, int64_t ldd, int64_t nb, float out[4][8], const char *pf)
{
    const int bs = T == TD_DTYPE_Q8_0 ? 34 : 18;
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                  io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31),
                  flip = _mm512_set1_epi8((char)0x80);
    const __m256i sidx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)ldd));
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        prefetch_group(pf, b0, R, bs);
        const __m256 dxv = steps8(d, b0, ldd);
        const __m256i corr = ldd == 1
                                 ? _mm256_loadu_si256((const __m256i *)(qs + b0))
                                 : _mm256_i32gather_epi32((const int *)(qs + b0 * ldd), sidx, 4);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i v[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const uint8_t *blk = w[r] + (b0 + 2 * i) * bs;
                __m512i u =
                    _mm512_inserti64x4(_mm512_castsi256_si512(wvec(T, blk)), wvec(T, blk + bs), 1);
                v[i] =
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(u, flip),
                                        _mm512_loadu_si512((const void *)(q + (b0 + 2 * i) * QK)));
            }
            __m512i x = _mm512_add_epi32(_mm512_permutex2var_epi32(v[0], ie, v[1]),
                                         _mm512_permutex2var_epi32(v[0], io, v[1]));
            __m512i y = _mm512_add_epi32(_mm512_permutex2var_epi32(v[2], ie, v[3]),
                                         _mm512_permutex2var_epi32(v[2], io, v[3]));
            __m512i z = _mm512_add_epi32(_mm512_permutex2var_epi32(x, ie, y),
                                         _mm512_permutex2var_epi32(x, io, y));
            __m256i sb = _mm512_castsi512_si256(
                _mm512_add_epi32(_mm512_permutexvar_epi32(ie, z), _mm512_permutexvar_epi32(io, z)));
            __m256 s = _mm256_cvtepi32_ps(_mm256_add_epi32(sb, corr));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(wsteps8(w[r], b0, bs), dxv), s, acc[r]);
        }
    }
    if (b0 < nb)
        tail_group(T, R, w, q, d, ldd, b0, (int)(nb - b0), acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        out[r][0] = lanes(acc[r]);
}

typedef void (*tile_fn)(const uint8_t *const *, const int8_t *, const float *, const int32_t *,
                        int64_t, int64_t, float[4][8], const char *);
#define TILE(name, T, R)                                                                           \
    K static void name##_##R(const uint8_t *const *w, const int8_t *q, const float *d,             \
                             const int32_t *qs, int64_t ldd, int64_t nb, float out[4][8],          \
                             const char *pf)                                                       \
    {                                                                                              \
        (void)qs;                                                                                  \
        tile(T, R, w, q, d, ldd, nb, out, pf);                                                     \
    }                                                                                              \
    K512 static void name##v_##R(const uint8_t *const *w, const int8_t *q, const float *d,         \
                                 const int32_t *qs, int64_t ldd, int64_t nb, float out[4][8],      \
                                 const char *pf)                                                   \
    {                                                                                              \
        tile_v(T, R, w, q, d, qs, ldd, nb, out, pf);                                               \
    }
#define TILES(name, T) TILE(name, T, 1) TILE(name, T, 2) TILE(name, T, 3) TILE(name, T, 4)
TILES(q8, TD_DTYPE_Q8_0)
TILES(q4, TD_DTYPE_Q4_0)

/* ---------- the prefill tiles: blocks across the lanes ----------
 *
 * For four tokens or more the rows and the tokens are first laid out with eight blocks side by
 * side: a group g of blocks 8g .. 8g + 7 is eight steps k, each 32 bytes holding values 4k ..
 * 4k + 3 of every block of the group (block j's four at bytes 4j .. 4j + 3). An integer
 * multiply-add of two such steps puts block j's partial sum in lane j, so eight of them give the
 * group's eight S_b in the lanes the fp32 accumulator wants, with no horizontal additions. Blocks
 * past the row's end are zeros with a zero step (a multiply-add of 0 leaves a lane as it was).
 *
 * Tokens (td_q8_act_t's qt) come in pairs, T rounded up to even with a zero token: step k of
 * group g of pair p is the pair's first token's step then the second's. With AVX-512 (a->vnni) a
 * step is the 32 bytes, so that one 512-bit register holds both tokens and a tile computes two
 * outputs per instruction, each in its own half (its own 8 lanes: the sums are those of one
 * token alone); rows (in the thread's scratch, widened per group of four rows) are 32 bytes a
 * step as unsigned bytes w + 128 for vpdpbusd (unsigned times signed), whose sums then carry 128
 * * the token's block sum, which each token's qc (-128 * that sum, per block) cancels exactly.
 * With AVX2 a step, token's or row's, is 64 bytes: the 32 signed bytes sign-extended to 16 bits
 * by index parity, E (bytes 4j and 4j + 2) then O (4j + 1 and 4j + 3), so that pmaddwd(wE, qE) +
 * pmaddwd(wO, qO) is lane j's sum of four products with no widening in the tile. */

/* Step bytes (a token's or a row's) in the tiles' layout. */
#define SB(vnni) ((vnni) ? 32 : 64)

/* One step s (32 signed bytes) to dst: as w + 128 where vnni and offset, as is where vnni,
 * else as its E and O halves. */
KI void store_step(uint8_t *dst, __m256i s, bool vnni, bool offset)
{
    if (vnni) {
        _mm256_store_si256((__m256i *)dst,
                           offset ? _mm256_xor_si256(s, _mm256_set1_epi8((char)0x80)) : s);
    } else {
        _mm256_store_si256((__m256i *)dst, _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8));
        _mm256_store_si256((__m256i *)(dst + 32), _mm256_srai_epi16(s, 8));
    }
}

/* The values of block b of a row as 32 ints in value order, and its step, or zeros past nb. */
KI __m256i wblock8(td_dtype_t t, const uint8_t *row, int64_t b, int64_t nb, float *dw)
{
    if (b >= nb) {
        *dw = 0.0f;
        return _mm256_setzero_si256();
    }
    const uint8_t *blk = row + b * (t == TD_DTYPE_Q8_0 ? 34 : 18);
    *dw = wstep(blk);
    return wvec(t, blk);
}

/* R rows (row i at row + i * rb) laid out by groups into wt (G * 8 steps a row) and their steps
 * into wd (G * 8 floats a row). */
K static void widen_rows(td_dtype_t t, const uint8_t *row, size_t rb, int R, int64_t nb, int64_t G,
                         bool vnni, uint8_t *wt, float *wd)
{
    for (int i = 0; i < R; i++, row += rb, wt += G * 8 * SB(vnni), wd += G * 8)
        for (int64_t g = 0; g < G; g++) {
            __m256i v[8], s[8];
            for (int j = 0; j < 8; j++)
                v[j] = wblock8(t, row, 8 * g + j, nb, &wd[8 * g + j]);
            transpose8(v, s);
            for (int k = 0; k < 8; k++)
                store_step(wt + (g * 8 + k) * SB(vnni), s[k], vnni, true);
        }
}

/* Token t's int8 values (already in a->q) laid out by groups into its half of its pair in
 * a->qt, with its blocks' -128 * sums and steps. */
K static void widen_act(const td_q8_act_t *a, int64_t t)
{
    const int64_t n = a->n, nb = n / QK, G = a->G, p = t / 2, h = t % 2;
    for (int64_t g = 0; g < G; g++) {
        __m256i v[8], s[8];
        int32_t *qc = a->qc + ((p * G + g) * 2 + h) * 8;
        float *qd = a->qd + ((p * G + g) * 2 + h) * 8;
        for (int j = 0; j < 8; j++) {
            const int64_t b = 8 * g + j;
            if (b < nb) {
                v[j] = _mm256_loadu_si256((const __m256i *)(a->q + t * n + b * QK));
                qc[j] = a->vnni ? a->qs[b * a->T + t] : 0;
                qd[j] = a->d[b * a->T + t];
            } else {
                v[j] = _mm256_setzero_si256();
                qc[j] = 0;
                qd[j] = 0.0f;
            }
        }
        transpose8(v, s);
        for (int k = 0; k < 8; k++)
            store_step((uint8_t *)a->qt + (((p * G + g) * 8 + k) * 2 + h) * SB(a->vnni), s[k],
                       a->vnni, false);
    }
}

/* -128 * each block's sum of the values q[0 .. n), to qs[b * ld]: what the weights' offset of 128
 * adds to a block's sum in the AVX-512 kernels. */
K static void block_corr(const int8_t *q, int64_t n, int32_t *qs, int64_t ld)
{
    for (int64_t b = 0; b < n / QK; b++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        __m256i s32 =
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
        __m128i x = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
        x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 1));
        qs[b * ld] = -128 * _mm_cvtsi128_si32(x);
    }
}

/* The zero token that completes an odd count's last pair. */
static void zero_pad_token(const td_q8_act_t *a)
{
    const int64_t G = a->G, p = a->T / 2;
    for (int64_t g = 0; g < G; g++) {
        for (int k = 0; k < 8; k++)
            memset(a->qt + (((p * G + g) * 8 + k) * 2 + 1) * SB(a->vnni), 0, SB(a->vnni));
        memset(a->qc + ((p * G + g) * 2 + 1) * 8, 0, 8 * sizeof(int32_t));
        memset(a->qd + ((p * G + g) * 2 + 1) * 8, 0, 8 * sizeof(float));
    }
}

#define VP 2 /* token pairs per AVX-512 tile */

/* AVX-512: R rows (wt, wd: widen_rows' layout, offset) against P pairs of tokens (pairs p0 ..):
 * out[t * out_ld + r] for the pairs' tokens below T. Per group, each (row, pair)'s two outputs'
 * block sums start from the pair's corrections, take eight vpdpbusd, then one conversion and one
 * multiply-add; the pairs' 64 bytes are loaded once for all rows, each row's 32 broadcast to
 * both halves. */
KI512 void tile_vnni(int R, int P, const uint8_t *wt, const float *wd, int64_t G,
                     const td_q8_act_t *a, int64_t p0, float *out, int64_t out_ld)
{
    __m512 acc[4][VP];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int p = 0; p < P; p++)
            acc[r][p] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512i s[4][VP];
#pragma GCC unroll 3
        for (int p = 0; p < P; p++) {
            __m512i c = _mm512_load_si512(a->qc + ((p0 + p) * G + g) * 16);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                s[r][p] = c;
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i wv[4];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                wv[r] = _mm512_broadcast_i64x4(
                    _mm256_load_si256((const __m256i *)(wt + (r * G * 8 + g * 8 + k) * SB(true))));
#pragma GCC unroll 3
            for (int p = 0; p < P; p++) {
                __m512i qv = _mm512_load_si512(a->qt + (((p0 + p) * G + g) * 8 + k) * 2 * SB(true));
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    s[r][p] = _mm512_dpbusd_epi32(s[r][p], wv[r], qv);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 dw = _mm512_broadcast_f32x8(_mm256_load_ps(wd + r * G * 8 + g * 8));
#pragma GCC unroll 3
            for (int p = 0; p < P; p++)
                acc[r][p] = _mm512_fmadd_ps(
                    _mm512_mul_ps(dw, _mm512_load_ps(a->qd + ((p0 + p) * G + g) * 16)),
                    _mm512_cvtepi32_ps(s[r][p]), acc[r][p]);
        }
    }
#pragma GCC unroll 3
    for (int p = 0; p < P; p++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int64_t t = 2 * (p0 + p);
            out[t * out_ld + r] = lanes(_mm512_castps512_ps256(acc[r][p]));
            if (t + 1 < a->T)
                out[(t + 1) * out_ld + r] = lanes(_mm512_extractf32x8_ps(acc[r][p], 1));
        }
}

/* AVX2: R rows against P pairs of tokens (pairs p0 ..), both in the 16-bit E/O layout: per
 * group, each output's block sums take sixteen pmaddwd (no widening: rows and tokens were split
 * when laid out), then one conversion and one multiply-add. Two rows by four tokens keep the
 * block sums in eight of AVX2's sixteen registers; the eight fp32 accumulators, touched once per
 * group, are the compiler's to keep or spill. */
KI void tile_avx2(int R, int P, const uint8_t *wt, const float *wd, int64_t G, const td_q8_act_t *a,
                  int64_t p0, float *out, int64_t out_ld)
{
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int i = 0; i < 2 * P; i++)
            acc[r][i] = _mm256_setzero_ps();
    const uint8_t *qt = (const uint8_t *)a->qt;
    for (int64_t g = 0; g < G; g++) {
        __m256i s[2][4];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int i = 0; i < 2 * P; i++)
                s[r][i] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int k = 0; k < 8; k++) {
            __m256i we[2], wo[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const uint8_t *ws = wt + (r * G * 8 + g * 8 + k) * SB(false);
                we[r] = _mm256_load_si256((const __m256i *)ws);
                wo[r] = _mm256_load_si256((const __m256i *)(ws + 32));
            }
#pragma GCC unroll 4
            for (int i = 0; i < 2 * P; i++) {
                const uint8_t *qs = qt + ((((p0 + i / 2) * G + g) * 8 + k) * 2 + i % 2) * SB(false);
                __m256i qe = _mm256_load_si256((const __m256i *)qs);
                __m256i qo = _mm256_load_si256((const __m256i *)(qs + 32));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++)
                    s[r][i] =
                        _mm256_add_epi32(_mm256_add_epi32(s[r][i], _mm256_madd_epi16(we[r], qe)),
                                         _mm256_madd_epi16(wo[r], qo));
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m256 dw = _mm256_load_ps(wd + r * G * 8 + g * 8);
#pragma GCC unroll 4
            for (int i = 0; i < 2 * P; i++)
                acc[r][i] = _mm256_fmadd_ps(
                    _mm256_mul_ps(dw,
                                  _mm256_load_ps(a->qd + (((p0 + i / 2) * G + g) * 2 + i % 2) * 8)),
                    _mm256_cvtepi32_ps(s[r][i]), acc[r][i]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 2 * P && 2 * p0 + i < a->T; i++)
            out[(2 * p0 + i) * out_ld + r] = lanes(acc[r][i]);
}

typedef void (*tile_t_fn)(const uint8_t *, const float *, int64_t, const td_q8_act_t *, int64_t,
                          float *, int64_t);
#define TILEV(R, P)                                                                                \
    K512 static void tv_##R##x##P(const uint8_t *wt, const float *wd, int64_t G,                   \
                                  const td_q8_act_t *a, int64_t p0, float *out, int64_t out_ld)    \
    {                                                                                              \
        tile_vnni(R, P, wt, wd, G, a, p0, out, out_ld);                                            \
    }
#define TILEA(R, P)                                                                                \
    K static void ta_##R##x##P(const uint8_t *wt, const float *wd, int64_t G,                      \
                               const td_q8_act_t *a, int64_t p0, float *out, int64_t out_ld)       \
    {                                                                                              \
        tile_avx2(R, P, wt, wd, G, a, p0, out, out_ld);                                            \
    }
/* The instances (no semicolons: clang-format would take them for one statement) and tables. */
/* clang-format off */
TILEV(1, 1) TILEV(2, 1) TILEV(3, 1) TILEV(4, 1)
TILEV(1, 2) TILEV(2, 2) TILEV(3, 2) TILEV(4, 2)
TILEA(1, 1) TILEA(2, 1) TILEA(1, 2) TILEA(2, 2)
static const tile_t_fn tiles_v[VP][4] = {{tv_1x1, tv_2x1, tv_3x1, tv_4x1},
                                         {tv_1x2, tv_2x2, tv_3x2, tv_4x2}},
                       tiles_a[2][2] = {{ta_1x1, ta_2x1}, {ta_1x2, ta_2x2}};
/* clang-format on */

/* Rows [r0, r1) against a's T >= 4 tokens: groups of rows (four for AVX-512, two for AVX2)
 * widened into scratch (or memory of their own where scratch is too small), then every tile of
 * pairs of tokens against them. False (nothing done) where that memory cannot be had. */
static bool rows_t(const td_mat_t *W, int64_t r0, int64_t r1, const td_q8_act_t *a, float *out,
                   int64_t out_ld, void *scratch, size_t scratch_bytes, bool vnni)
{
    const int64_t nb = W->cols / QK, G = a->G, pairs = (a->T + 1) / 2;
    const size_t rb = td_dtype_row_bytes(W->dtype, W->cols);
    const int RG = vnni ? 4 : 2;
    const size_t need = (size_t)RG * G * 8 * (SB(vnni) + sizeof(float));
    uint8_t *mem = scratch, *own = NULL;
    if (need > scratch_bytes || (uintptr_t)scratch % 64) {
        if (!(mem = own = aligned_alloc(64, (need + 63) / 64 * 64)))
            return false;
    }
    uint8_t *wt = mem;
    float *wd = (float *)(mem + (size_t)RG * G * 8 * SB(vnni));
    const uint8_t *data = W->data;
    for (int64_t r = r0; r < r1; r += RG) {
        const int R = (int)TD_MIN(RG, r1 - r);
        widen_rows(W->dtype, data + (size_t)r * rb, rb, R, nb, G, vnni, wt, wd);
        if (vnni) {
            for (int64_t p = 0; p < pairs; p += VP) {
                const int P = (int)TD_MIN(VP, pairs - p);
                tiles_v[P - 1][R - 1](wt, wd, G, a, p, out + r, out_ld);
            }
        } else {
            for (int64_t p = 0; p < pairs; p += 2) {
                const int P = (int)TD_MIN(2, pairs - p);
                tiles_a[P - 1][R - 1](wt, wd, G, a, p, out + r, out_ld);
            }
        }
    }
    free(own);
    return true;
}

/* [AVX2, AVX-512][Q8_0, Q4_0][R - 1] for one token */
static const tile_fn tiles1[2][2][4] = {
    {{q8_1, q8_2, q8_3, q8_4}, {q4_1, q4_2, q4_3, q4_4}},
    {{q8v_1, q8v_2, q8v_3, q8v_4}, {q4v_1, q4v_2, q4v_3, q4v_4}}};
#endif

/* The prefill tiles' copy, per pair of tokens and group of eight blocks: eight steps of two
 * tokens (at most AVX2's 64 bytes a step), then the two tokens' eight block sums and steps. */
#define PAIR_GROUP_BYTES (8 * 2 * 64 + 2 * 8 * 4 + 2 * 8 * 4)

size_t td__cpu_q8_wide_bytes(int64_t T, int64_t n)
{
    return (size_t)((T + 1) / 2) * (size_t)((n / QK + 7) / 8) * PAIR_GROUP_BYTES + 63;
}

void td__cpu_q8_wide_place(td_q8_act_t *a, void *mem)
{
    const size_t pg = (size_t)((a->T + 1) / 2) * (size_t)a->G;
    a->qt = (int8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    a->qc = (int32_t *)(a->qt + pg * 8 * 2 * 64);
    a->qd = (float *)(a->qc + pg * 16);
}

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
            if (a->vnni)
                block_corr(qr, a->n, a->qs + t, a->T);
            if (a->qt) {
                widen_act(a, t);
                if (t == a->T - 1 && a->T % 2)
                    zero_pad_token(a);
            }
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
        /* four tokens or more: the tiles over blocks laid out across the lanes (measured here,
         * see BENCHMARKS.md); fewer (or no memory for the rows' copies): up to four rows at a
         * time against one token, from the stored blocks */
        if (T >= 4 && a->qt && rows_t(W, r0, r1, a, out, out_ld, scratch, scratch_bytes, a->vnni))
            return;
        const int k = W->dtype == TD_DTYPE_Q8_0 ? 0 : 1, v = a->vnni;
        for (int64_t r = r0; r < r1; r += 4) {
            int R = (int)TD_MIN(4, r1 - r);
            const uint8_t *w[4];
            for (int i = 0; i < R; i++)
                w[i] = data + (size_t)(r + i) * rb;
            float o[4][8];
            for (int64_t t = 0; t < T; t++) {
                const char *pf = T == 1 ? (const char *)(w[0] + (size_t)R * rb) : NULL;
                tiles1[v][k][R - 1](w, q + t * n, d + t, a->qs + t, T, nb, o, pf);
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
