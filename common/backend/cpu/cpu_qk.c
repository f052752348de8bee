/* cpu_qk.c: Q4_K and Q6_K weights (what Q4_K_M files hold) against activations quantised to 8
 * bits per 256 values, with integer dot products: llama.cpp's scheme for its K formats (its
 * Q8_K), written here from its description.
 *
 * Activations: each token's row is cut into super-blocks of 256 values; a super-block's step is
 * dx = amax / 127 in fp32 (amax its largest magnitude) and each value becomes q = round(x * (127 /
 * amax)) to nearest with ties to even, kept within [-127, 127] (0 for an all-zero super-block);
 * with it go the sums of each 16 consecutive q. cpu_matmul quantises every token once per matmul
 * (td__cpu_qk_quant) and every thread reads that copy for all its rows.
 *
 * A weight super-block is 256 small unsigned integers u with a scale per 32 values (Q4_K: u a
 * nibble, the 6-bit scale sc and min m of each 32 values, an fp16 d and dmin; value = d * sc * u -
 * dmin * m) or per 16 values (Q6_K: u 6 bits, an int8 sc per 16 values, an fp16 d; value = d * sc
 * * (u - 32)). Its product with a token's super-block is two exact integers: eight lanes
 * A[l] = sum over the super-block's 32-value groups g of sc(v) * u[v] * q[v] for the values v =
 * 32g + 4l .. 32g + 4l + 3 (sc(v) the scale of value v), and B = sum over the 16-value runs k of
 * mv[k] * bsum[k], where mv[k] is the run's min m (Q4_K) or 32 * sc (Q6_K). One output (weight row,
 * token) has eight fp32 lanes acc[l] and a sum accm; each super-block, in column order, does
 * acc[l] = acc[l] + (dx * d) * A[l] and accm = accm + (dx * dmin) * B (dmin = d for Q6_K), each
 * product and sum rounded on its own (no fused multiply-add, so every kernel and the portable loop
 * agree), and the output is ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6]
 * + acc[7])) - accm. The integer work is what the instruction sets do cheaply (pmaddubsw then
 * pmaddwd: four values a lane), the fp32 work is a handful of operations per 256 values, and any
 * kernel gets the integers exactly: one token's output is bitwise the same whatever shares its
 * matmul or thread, at every instruction-set level. |A[l]| <= 8 * 4 * 128 * 63 * 127 and |B| <= 32
 * * 16 * 128 * 2032 stay within int32. */
#include "cpu_impl.h"
#include "td_error.h"

#include <math.h>
#include <string.h>

#define QKK 256 /* values per super-block */

bool td__cpu_qk_act(td_dtype_t t)
{
    return t == TD_DTYPE_Q4_K || t == TD_DTYPE_Q6_K;
}

static size_t up64(size_t b)
{
    return (b + 63) & ~(size_t)63;
}

size_t td__cpu_qk_act_bytes(int64_t T, int64_t n)
{
    return up64((size_t)(T * (n / QKK)) * sizeof(float)) +
           up64((size_t)(T * (n / 16)) * sizeof(int16_t)) + up64((size_t)(T * n)) + 63;
}

void td__cpu_qk_act_place(td_qk_act_t *a, int64_t T, int64_t n, void *mem)
{
    uint8_t *p = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    a->T = T;
    a->n = n;
    a->d = (float *)p;
    p += up64((size_t)(T * (n / QKK)) * sizeof(float));
    a->bs = (int16_t *)p;
    p += up64((size_t)(T * (n / 16)) * sizeof(int16_t));
    a->q = (int8_t *)p;
}

/* One token's row: steps, values and sums of 16 (a loop the compiler vectorises; the same fp32
 * operations whatever it makes of them). */
TD_CPU_KERNEL TD_CPU_VECTORIZE static void quant_row(const float *x, int64_t n, int8_t *q, float *d,
                                                     int16_t *bs)
{
    for (int64_t b = 0; b < n / QKK; b++, x += QKK, q += QKK, bs += 16) {
        float amax = 0; /* comparisons, not fmaxf: they vectorise; a NaN is passed over */
        for (int j = 0; j < QKK; j++) {
            const float a = x[j] < 0 ? -x[j] : x[j];
            amax = a > amax ? a : amax;
        }
        d[b] = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < QKK; j++) { /* within [-127, 127]: a NaN goes to 127 */
            const float v = rintf(x[j] * id);
            q[j] = (int8_t)(v < 127.0f ? (v > -127.0f ? v : -127.0f) : 127.0f);
        }
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += q[16 * k + j];
            bs[k] = (int16_t)s;
        }
    }
}

void td__cpu_qk_quant(const float *x, int64_t x_ld, const td_qk_act_t *a, int64_t t0, int64_t t1)
{
    const int64_t nsb = a->n / QKK;
    for (int64_t t = t0; t < t1; t++)
        quant_row(x + t * x_ld, a->n, a->q + t * a->n, a->d + t * nsb, a->bs + t * (a->n / 16));
}

/* The 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K super-block's 12 scale bytes, as
 * k4_scale_min reads them one at a time: four at a time in 32-bit words. */
static inline void k4_scales(const uint8_t *s12, uint32_t out[4])
{
    uint32_t w[3];
    memcpy(w, s12, 12);
    out[0] = w[0] & 0x3f3f3f3fu;
    out[1] = (w[2] & 0x0f0f0f0fu) | ((w[0] >> 6) & 0x03030303u) << 4;
    out[2] = w[1] & 0x3f3f3f3fu;
    out[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 6) & 0x03030303u) << 4;
}

/* One super-block against one token's, as the header describes: the fp32 step. */
static inline void sb_add(float acc[8], float *accm, float dx, float d, float dmin,
                          const int32_t A[8], int32_t B)
{
    const float dd = dx * d, dm = dx * dmin;
    for (int l = 0; l < 8; l++)
        acc[l] = acc[l] + dd * (float)A[l];
    *accm = *accm + dm * (float)B;
}

static inline float finish(const float acc[8], float accm)
{
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) -
           accm;
}

/* Super-block b of a row as its 256 unsigned values (value order), each value's scale, each
 * 16-value run's mv, and d, dmin. */
static void sb_unpack(td_dtype_t t, const uint8_t *row, int64_t b, uint8_t u[QKK], int sc[QKK],
                      int mv[16], float *d, float *dmin)
{
    if (t == TD_DTYPE_Q4_K) {
        const uint8_t *blk = row + b * 144, *qs = blk + 16;
        uint32_t w[4];
        k4_scales(blk + 4, w);
        uint8_t s[16];
        memcpy(s, w, 16);
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                u[64 * i + l] = qs[32 * i + l] & 0xf;
                u[64 * i + 32 + l] = qs[32 * i + l] >> 4;
            }
        for (int v = 0; v < QKK; v++)
            sc[v] = s[v / 32];
        for (int k = 0; k < 16; k++)
            mv[k] = s[8 + k / 2];
        *d = td__cpu_f16(blk);
        *dmin = td__cpu_f16(blk + 2);
        return;
    }
    const uint8_t *blk = row + b * 210, *ql = blk, *qh = blk + 128;
    const int8_t *s = (const int8_t *)(blk + 192);
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t a = ql[64 * h + l], c = ql[64 * h + 32 + l], e = qh[32 * h + l];
            u[128 * h + l] = (uint8_t)((a & 0xf) | (e & 3) << 4);
            u[128 * h + 32 + l] = (uint8_t)((c & 0xf) | ((e >> 2) & 3) << 4);
            u[128 * h + 64 + l] = (uint8_t)((a >> 4) | ((e >> 4) & 3) << 4);
            u[128 * h + 96 + l] = (uint8_t)((c >> 4) | ((e >> 6) & 3) << 4);
        }
    for (int v = 0; v < QKK; v++)
        sc[v] = s[v / 16];
    for (int k = 0; k < 16; k++)
        mv[k] = 32 * s[k];
    *d = *dmin = td__cpu_f16(blk + 208);
}

/* The portable kernel: one output, the same lanes and order as the x86 ones. */
static float dot_generic(td_dtype_t t, const uint8_t *row, const int8_t *q, const float *dx,
                         const int16_t *bs, int64_t nsb)
{
    float acc[8] = {0}, accm = 0;
    for (int64_t b = 0; b < nsb; b++, q += QKK, bs += 16) {
        uint8_t u[QKK];
        int sc[QKK], mv[16];
        float d, dmin;
        sb_unpack(t, row, b, u, sc, mv, &d, &dmin);
        int32_t A[8] = {0}, B = 0;
        for (int v = 0; v < QKK; v++)
            A[(v % 32) / 4] += sc[v] * u[v] * q[v];
        for (int k = 0; k < 16; k++)
            B += mv[k] * bs[k];
        sb_add(acc, &accm, dx[b], d, dmin, A, B);
    }
    return finish(acc, accm);
}

#ifdef TD_CPU_FMA_KERNELS
#include <immintrin.h>

#define K __attribute__((target("avx2,fma,f16c")))
#define KI __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define K512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* A super-block of a row laid out once for the prefill tiles, which then read it for every
 * token: its values (value order), the scale of each pair of values, the runs' mv, d and dmin. */
typedef struct kblk {
    uint8_t u[QKK];
    int16_t s16[QKK / 2];
    int16_t mv[16];
    float d, dmin;
    uint8_t pad[24];
} kblk_t;

K static void kblk_fill(td_dtype_t t, const uint8_t *blk, kblk_t *k)
{
    uint16_t h[2];
    if (t == TD_DTYPE_Q4_K) {
        uint32_t w[4];
        k4_scales(blk + 4, w);
        const uint8_t *sm = (const uint8_t *)w;
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        for (int i = 0; i < 4; i++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i));
            _mm256_store_si256((__m256i *)(k->u + 64 * i), _mm256_and_si256(v, m4));
            _mm256_store_si256((__m256i *)(k->u + 64 * i + 32),
                               _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        }
        for (int g = 0; g < 8; g++)
            _mm256_store_si256((__m256i *)(k->s16 + 16 * g), _mm256_set1_epi16(sm[g]));
        for (int r = 0; r < 16; r++)
            k->mv[r] = sm[8 + r / 2];
        memcpy(h, blk, 4);
        k->d = _cvtsh_ss(h[0]);
        k->dmin = _cvtsh_ss(h[1]);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int hf = 0; hf < 2; hf++) {
        const uint8_t *ql = blk + 64 * hf, *qh = blk + 128 + 32 * hf;
        const __m256i a = _mm256_loadu_si256((const __m256i *)ql),
                      c = _mm256_loadu_si256((const __m256i *)(ql + 32)),
                      e = _mm256_loadu_si256((const __m256i *)qh);
        uint8_t *u = k->u + 128 * hf;
        _mm256_store_si256((__m256i *)u,
                           _mm256_or_si256(_mm256_and_si256(a, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(e, 4), m30)));
        _mm256_store_si256((__m256i *)(u + 32),
                           _mm256_or_si256(_mm256_and_si256(c, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(e, 2), m30)));
        _mm256_store_si256((__m256i *)(u + 64),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                                           _mm256_and_si256(e, m30)));
        _mm256_store_si256((__m256i *)(u + 96),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(e, 2), m30)));
    }
    const int8_t *sc = (const int8_t *)(blk + 192);
    for (int g = 0; g < 8; g++)
        _mm256_store_si256(
            (__m256i *)(k->s16 + 16 * g),
            _mm256_setr_m128i(_mm_set1_epi16(sc[2 * g]), _mm_set1_epi16(sc[2 * g + 1])));
    for (int r = 0; r < 16; r++)
        k->mv[r] = (int16_t)(32 * sc[r]);
    memcpy(h, blk + 208, 2);
    k->d = k->dmin = _cvtsh_ss(h[0]);
}

/* The fp32 step on eight integer lanes: the same multiply then add as sb_add. */
KI __m256 lanes_add(__m256 acc, float dd, __m256i A)
{
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(A)));
}

KI int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

KI float finish_v(__m256 acc, float accm)
{
    float a[8];
    _mm256_storeu_ps(a, acc);
    return finish(a, accm);
}

/* pshufb indices that broadcast int16 lane j of a 128-bit vector to a whole 256-bit one. */
#define BCAST16(j) _mm256_set1_epi16((short)((2 * (j)) | (2 * (j) + 1) << 8))

/* One Q4_K super-block against one token's: A's lanes and B. */
KI void q4k_sb(const uint8_t *blk, const int8_t *q, const int16_t *bs, __m256i *A, int32_t *B)
{
    uint32_t w[4];
    k4_scales(blk + 4, w);
    const __m128i s8 = _mm_loadu_si128((const __m128i *)w);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(s8)); /* sc0..7 twice */
    /* each min twice (runs 2j and 2j + 1), against the 16 run sums */
    const __m256i mv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        s8, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    *B = hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), mv));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const uint8_t *qs = blk + 16;
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
        const __m256i lo = _mm256_and_si256(v, m4),
                      hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m256i p0 =
            _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q + 64 * i)));
        const __m256i p1 =
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 64 * i + 32)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, BCAST16(2 * i))));
        acc = _mm256_add_epi32(acc,
                               _mm256_madd_epi16(p1, _mm256_shuffle_epi8(sc, BCAST16(2 * i + 1))));
    }
    *A = acc;
}

/* One Q6_K super-block against one token's. */
KI void q6k_sb(const uint8_t *blk, const int8_t *q, const int16_t *bs, __m256i *A, int32_t *B)
{
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    *B = hsum_i32(
        _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), _mm256_slli_epi16(s16, 5)));
    /* group g's scales: sc[2g] in the low eight int16 lanes, sc[2g + 1] in the high eight */
    const __m256i slo = _mm256_permute2x128_si256(s16, s16, 0x00),
                  shi = _mm256_permute2x128_si256(s16, s16, 0x11);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        const __m256i a = _mm256_loadu_si256((const __m256i *)ql),
                      c = _mm256_loadu_si256((const __m256i *)(ql + 32)),
                      e = _mm256_loadu_si256((const __m256i *)qh);
        __m256i u[4];
        u[0] = _mm256_or_si256(_mm256_and_si256(a, m4),
                               _mm256_and_si256(_mm256_slli_epi16(e, 4), m30));
        u[1] = _mm256_or_si256(_mm256_and_si256(c, m4),
                               _mm256_and_si256(_mm256_slli_epi16(e, 2), m30));
        u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                               _mm256_and_si256(e, m30));
        u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(e, 2), m30));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const int g = 4 * h + k; /* scales 2g, 2g + 1: in slo for g < 4, else shi */
            const __m256i src = g < 4 ? slo : shi;
            const int j = (2 * g) % 8;
            const __m256i sg = _mm256_shuffle_epi8(
                src,
                _mm256_setr_epi8(2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j,
                                 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1, 2 * j, 2 * j + 1,
                                 2 * j, 2 * j + 1, 2 * j + 2, 2 * j + 3, 2 * j + 2, 2 * j + 3,
                                 2 * j + 2, 2 * j + 3, 2 * j + 2, 2 * j + 3, 2 * j + 2, 2 * j + 3,
                                 2 * j + 2, 2 * j + 3, 2 * j + 2, 2 * j + 3, 2 * j + 2, 2 * j + 3));
            const __m256i p = _mm256_maddubs_epi16(
                u[k], _mm256_loadu_si256((const __m256i *)(q + 128 * h + 32 * k)));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sg));
        }
    }
    *A = acc;
}

/* One Q4_K row against one token with 512-bit registers: a register holds two groups of 32
 * (a 32-byte run of nibbles broadcast to both halves, shifted by 0 and 4), the scales picked
 * with vpermw; the two halves' lanes folded into the same eight integers as q4k_sb's. */
K512 static float dot_q4k_512(const uint8_t *row, const int8_t *q, const float *dx,
                              const int16_t *bs, int64_t nsb)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i pick[4];
    for (int i = 0; i < 4; i++)
        pick[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * i))),
                                     _mm256_set1_epi16((short)(2 * i + 1)), 1);
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t b = 0; b < nsb; b++, q += QKK, bs += 16) {
        const uint8_t *blk = row + b * 144;
        uint32_t w[4];
        k4_scales(blk + 4, w);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)w);
        const __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(s8)); /* sc0..7 */
        const __m256i mv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
            s8, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
        const int32_t B = hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs), mv));
        __m512i sum = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {
            const __m512i v =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i)));
            const __m512i u = _mm512_and_si512(_mm512_srlv_epi16(v, shift), m4);
            const __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(q + 64 * i));
            sum =
                _mm512_add_epi32(sum, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(pick[i], sc)));
        }
        const __m256i A =
            _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
        uint16_t h[2];
        memcpy(h, blk, 4);
        acc = lanes_add(acc, dx[b] * _cvtsh_ss(h[0]), A);
        accm = accm + (dx[b] * _cvtsh_ss(h[1])) * (float)B;
    }
    return finish_v(acc, accm);
}

/* One row against one token: every super-block in column order. */
K static float dot_qk(td_dtype_t t, const uint8_t *row, const int8_t *q, const float *dx,
                      const int16_t *bs, int64_t nsb)
{
    const bool k4 = t == TD_DTYPE_Q4_K;
    const size_t bb = k4 ? 144 : 210;
    __m256 acc = _mm256_setzero_ps();
    float accm = 0;
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = row + b * bb;
        __m256i A;
        int32_t B;
        uint16_t h[2];
        if (k4) {
            q4k_sb(blk, q + b * QKK, bs + b * 16, &A, &B);
            memcpy(h, blk, 4);
        } else {
            q6k_sb(blk, q + b * QKK, bs + b * 16, &A, &B);
            memcpy(h, blk + 208, 2);
            h[1] = h[0]; /* dmin = d */
        }
        acc = lanes_add(acc, dx[b] * _cvtsh_ss(h[0]), A);
        accm = accm + (dx[b] * _cvtsh_ss(h[1])) * (float)B;
    }
    return finish_v(acc, accm);
}
/* Four rows of B's: their sums as four int32 (row i in element i). */
KI __m128i hsum4_i32(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The prefill tile, one token: R <= 4 rows (laid out, k[i][b]) against token x, every
 * super-block in column order; out[i]. With AVX-512 it takes only an odd count's last token. */
K static void tile_avx2(const kblk_t *const *k, int R, const int8_t *x, const float *dx,
                        const int16_t *bs, int64_t nsb, float out[4])
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, x += QKK, bs += 16) {
        __m256i Bv[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                         _mm256_setzero_si256()};
        const __m256i bsv = _mm256_load_si256((const __m256i *)bs);
        float dm[4] = {0, 0, 0, 0};
        for (int i = 0; i < R; i++) {
            const kblk_t *kb = &k[i][b];
            __m256i A = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i p =
                    _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(kb->u + 32 * g)),
                                         _mm256_load_si256((const __m256i *)(x + 32 * g)));
                A = _mm256_add_epi32(
                    A,
                    _mm256_madd_epi16(p, _mm256_load_si256((const __m256i *)(kb->s16 + 16 * g))));
            }
            acc[i] = lanes_add(acc[i], dx[b] * kb->d, A);
            Bv[i] = _mm256_madd_epi16(bsv, _mm256_load_si256((const __m256i *)kb->mv));
            dm[i] = dx[b] * kb->dmin;
        }
        accm = _mm_add_ps(accm, _mm_mul_ps(_mm_loadu_ps(dm),
                                           _mm_cvtepi32_ps(hsum4_i32(Bv[0], Bv[1], Bv[2], Bv[3]))));
    }
    float m[4];
    _mm_storeu_ps(m, accm);
    for (int i = 0; i < R; i++)
        out[i] = finish_v(acc[i], m[i]);
}

/* AVX-512, two tokens at a time: four rows (a short group repeats its last row) against tokens
 * x[0] and x[1], each row's values and scales loaded once for both; kd[b] holds the four rows'
 * d then dmin for super-block b. out[token][row]. */
K512 static void tile2_avx512(const kblk_t *const *k, const float (*kd)[8], const int8_t *const *x,
                              const float *const *dx, const int16_t *const *bs, int64_t nsb,
                              float out[2][4])
{
    __m256 acc[2][4];
    __m128 accm[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 4; i++)
            acc[t][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        __m512i sum[2][4];
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 4; i++)
                sum[t][i] = _mm512_setzero_si512();
        for (int g = 0; g < 4; g++) {
            const __m512i x0 = _mm512_load_si512(x[0] + b * QKK + 64 * g),
                          x1 = _mm512_load_si512(x[1] + b * QKK + 64 * g);
            for (int i = 0; i < 4; i++) {
                const __m512i u = _mm512_load_si512(k[i][b].u + 64 * g),
                              sc = _mm512_load_si512(k[i][b].s16 + 32 * g);
                sum[0][i] =
                    _mm512_add_epi32(sum[0][i], _mm512_madd_epi16(_mm512_maddubs_epi16(u, x0), sc));
                sum[1][i] =
                    _mm512_add_epi32(sum[1][i], _mm512_madd_epi16(_mm512_maddubs_epi16(u, x1), sc));
            }
        }
        const __m128 d4 = _mm_load_ps(kd[b]), dmin4 = _mm_load_ps(kd[b] + 4);
        __m256i mv[4];
        for (int i = 0; i < 4; i++)
            mv[i] = _mm256_load_si256((const __m256i *)k[i][b].mv);
        for (int t = 0; t < 2; t++) {
            const __m128 dxv = _mm_set1_ps(dx[t][b]);
            /* dx * d and dx * dmin of each row: the products sb_add rounds */
            const __m256 dd = _mm256_castps128_ps256(_mm_mul_ps(dxv, d4));
            const __m256i bsv = _mm256_load_si256((const __m256i *)(bs[t] + 16 * b));
            for (int i = 0; i < 4; i++) {
                const __m256i A = _mm256_add_epi32(_mm512_castsi512_si256(sum[t][i]),
                                                   _mm512_extracti64x4_epi64(sum[t][i], 1));
                const __m256 ddi = _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(i));
                acc[t][i] = _mm256_add_ps(acc[t][i], _mm256_mul_ps(ddi, _mm256_cvtepi32_ps(A)));
            }
            const __m128i B =
                hsum4_i32(_mm256_madd_epi16(bsv, mv[0]), _mm256_madd_epi16(bsv, mv[1]),
                          _mm256_madd_epi16(bsv, mv[2]), _mm256_madd_epi16(bsv, mv[3]));
            accm[t] = _mm_add_ps(accm[t], _mm_mul_ps(_mm_mul_ps(dxv, dmin4), _mm_cvtepi32_ps(B)));
        }
    }
    for (int t = 0; t < 2; t++) {
        float m[4];
        _mm_storeu_ps(m, accm[t]);
        for (int i = 0; i < 4; i++)
            out[t][i] = finish_v(acc[t][i], m[i]);
    }
}
#endif

void td__cpu_qk_rows(const td_mat_t *W, int64_t r0, int64_t r1, const td_qk_act_t *a, float *out,
                     int64_t out_ld, void *scratch, size_t scratch_bytes)
{
    const int64_t n = W->cols, nsb = n / QKK, T = a->T;
    const size_t rb = td_dtype_row_bytes(W->dtype, W->cols);
    const uint8_t *data = W->data;
#ifdef TD_CPU_FMA_KERNELS
    kblk_t *kb = (kblk_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float(*kd)[8] = (float(*)[8])(kb + 4 * nsb); /* per super-block: the four rows' d, dmin */
    if (td__cpu_fma() && T >= 4 &&
        4 * (size_t)nsb * sizeof(kblk_t) + (size_t)nsb * sizeof(*kd) + 63 <= scratch_bytes) {
        /* four rows at a time laid out once, then against every token */
        for (int64_t r = r0; r < r1; r += 4) {
            const int R = (int)TD_MIN(4, r1 - r);
            const kblk_t *k[4];
            for (int i = 0; i < 4; i++)
                k[i] = kb + (size_t)TD_MIN(i, R - 1) * (size_t)nsb;
            const size_t bb = W->dtype == TD_DTYPE_Q4_K ? 144 : 210;
            for (int i = 0; i < R; i++)
                for (int64_t b = 0; b < nsb; b++)
                    kblk_fill(W->dtype, data + (size_t)(r + i) * rb + (size_t)b * bb,
                              kb + (size_t)i * nsb + b);
            for (int64_t b = 0; b < nsb; b++)
                for (int i = 0; i < 4; i++) {
                    kd[b][i] = k[i][b].d;
                    kd[b][4 + i] = k[i][b].dmin;
                }
            int64_t t = 0;
            if (td__cpu_isa() >= TD_CPU_ISA_AVX512)
                for (; t + 2 <= T; t += 2) {
                    const int8_t *x[2] = {a->q + t * n, a->q + (t + 1) * n};
                    const float *dx[2] = {a->d + t * nsb, a->d + (t + 1) * nsb};
                    const int16_t *bs[2] = {a->bs + t * (n / 16), a->bs + (t + 1) * (n / 16)};
                    float o[2][4];
                    tile2_avx512(k, (const float(*)[8])kd, x, dx, bs, nsb, o);
                    for (int i = 0; i < R; i++) {
                        out[t * out_ld + r + i] = o[0][i];
                        out[(t + 1) * out_ld + r + i] = o[1][i];
                    }
                }
            for (; t < T; t++) {
                float o[4];
                tile_avx2(k, R, a->q + t * n, a->d + t * nsb, a->bs + t * (n / 16), nsb, o);
                for (int i = 0; i < R; i++)
                    out[t * out_ld + r + i] = o[i];
            }
        }
        return;
    }
    if (td__cpu_fma()) {
        const bool k512 = W->dtype == TD_DTYPE_Q4_K && td__cpu_isa() >= TD_CPU_ISA_AVX512;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = data + (size_t)r * rb;
            for (int64_t t = 0; t < T; t++)
                out[t * out_ld + r] =
                    k512 ? dot_q4k_512(row, a->q + t * n, a->d + t * nsb, a->bs + t * (n / 16), nsb)
                         : dot_qk(W->dtype, row, a->q + t * n, a->d + t * nsb, a->bs + t * (n / 16),
                                  nsb);
        }
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++)
            out[t * out_ld + r] = dot_generic(W->dtype, data + (size_t)r * rb, a->q + t * n,
                                              a->d + t * nsb, a->bs + t * (n / 16), nsb);
}
