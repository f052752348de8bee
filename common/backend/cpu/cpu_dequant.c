/* cpu_dequant.c: rows of stored weights as fp32 for the matmul kernels: F32 in place, the rest
 * converted into the caller's buffer by vectorised loops (BF16, F16 through F16C where the CPU
 * has it, Q8_0, and llama.cpp's Q4_0, Q4_K and Q6_K blocks). Every value is the same fp32
 * expression td_mat_row_f32 computes (an exact conversion, or d * q, or d * scale * q - min in
 * the same order), so the two agree bit for bit and the matmul's summation order alone decides
 * its result. For one token, td__cpu_dot_row sums a row straight from the stored blocks in the
 * same order, without storing it. */
#include "cpu_impl.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TD_CPU_F16C 1
#endif

#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8f __attribute__((vector_size(32)));

typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef _Float16 v8hf __attribute__((vector_size(16)));

TD_CPU_KERNEL static void bf16_row(const uint8_t *src, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8u16 h;
        memcpy(&h, src + 2 * i, sizeof(h));
        v8u32 u = __builtin_convertvector(h, v8u32) << 16;
        memcpy(out + i, &u, sizeof(u));
    }
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(out + i, &u, 4);
    }
}

TD_CPU_KERNEL static void f16_row_generic(const uint8_t *src, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8hf h;
        memcpy(&h, src + 2 * i, sizeof(h));
        v8f f = __builtin_convertvector(h, v8f);
        memcpy(out + i, &f, sizeof(f));
    }
    for (; i < n; i++) {
        _Float16 h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = (float)h;
    }
}

TD_CPU_KERNEL TD_CPU_VECTORIZE static void q8_0_row(const uint8_t *src, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + b * 34;
        const int8_t *q = (const int8_t *)(blk + 2);
        _Float16 h;
        memcpy(&h, blk, 2);
        float d = (float)h, *o = out + b * 32;
        for (int j = 0; j < 32; j++) /* a fixed-length loop the compiler vectorises */
            o[j] = d * (float)q[j];
    }
}

#ifdef TD_CPU_F16C
__attribute__((target("avx,f16c"))) static void f16_row_f16c(const uint8_t *src, int64_t n,
                                                              float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = _cvtsh_ss(h);
    }
}
#endif

/* GCC turns the generic vector conversion into one scalar conversion per value; F16C does 8. */
static void f16_row(const uint8_t *src, int64_t n, float *out)
{
#ifdef TD_CPU_F16C
    if (__builtin_cpu_supports("f16c")) {
        f16_row_f16c(src, n, out);
        return;
    }
#endif
    f16_row_generic(src, n, out);
}

static inline float f16_at(const uint8_t *p)
{
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

TD_CPU_KERNEL TD_CPU_VECTORIZE static void q4_0_row(const uint8_t *src, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *q = src + b * 18 + 2;
        float d = f16_at(src + b * 18), *o = out + b * 32;
        for (int j = 0; j < 16; j++) {
            o[j] = (float)((q[j] & 0xf) - 8) * d;
            o[j + 16] = (float)((q[j] >> 4) - 8) * d;
        }
    }
}

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

TD_CPU_KERNEL TD_CPU_VECTORIZE static void q4_k_row(const uint8_t *src, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / 256; b++, src += 144, out += 256) {
        float d = f16_at(src), dmin = f16_at(src + 2);
        const uint8_t *sc = src + 4, *q = src + 16;
        for (int i = 0; i < 4; i++) {
            int s0, m0, s1, m1;
            k4_scale_min(2 * i, sc, &s0, &m0);
            k4_scale_min(2 * i + 1, sc, &s1, &m1);
            float d0 = d * (float)s0, mm0 = dmin * (float)m0, d1 = d * (float)s1,
                  mm1 = dmin * (float)m1;
            const uint8_t *qq = q + 32 * i;
            float *o = out + 64 * i;
            for (int l = 0; l < 32; l++) {
                o[l] = d0 * (float)(qq[l] & 0xf) - mm0;
                o[32 + l] = d1 * (float)(qq[l] >> 4) - mm1;
            }
        }
    }
}

TD_CPU_KERNEL TD_CPU_VECTORIZE static void q6_k_row(const uint8_t *src, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / 256; b++, src += 210) {
        const uint8_t *ql = src, *qh = src + 128;
        const int8_t *sc = (const int8_t *)(src + 192);
        float d = f16_at(src + 208);
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, out += 128) {
            for (int g = 0; g < 2; g++) { /* 16 values per scale */
                float s0 = d * (float)sc[g], s2 = d * (float)sc[g + 2], s4 = d * (float)sc[g + 4],
                      s6 = d * (float)sc[g + 6];
                for (int k = 0; k < 16; k++) {
                    int l = 16 * g + k;
                    out[l] = s0 * (float)(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    out[l + 32] =
                        s2 * (float)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    out[l + 64] = s4 * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    out[l + 96] =
                        s6 * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
    }
}

/* Columns [c0, c0 + n) of row r as fp32: straight from F32 data, else dequantised into buf. */
const float *td__cpu_row_chunk(const td_mat_t *W, int64_t r, int64_t c0, int64_t n, float *buf)
{
    const uint8_t *row =
        (const uint8_t *)W->data + (size_t)r * td_dtype_row_bytes(W->dtype, W->cols);
    /* chunks keep every block whole (Q8_0, Q4_0: 32; FP8: 128; Q4_K, Q6_K: 256): the chunk
     * length is a multiple of 256 */
    const uint8_t *at = row + td_dtype_row_bytes(W->dtype, c0);
    switch (W->dtype) {
    case TD_DTYPE_F32:
        return (const float *)at;
    case TD_DTYPE_BF16:
        bf16_row(at, n, buf);
        return buf;
    case TD_DTYPE_F16:
        f16_row(at, n, buf);
        return buf;
    case TD_DTYPE_Q8_0:
        q8_0_row(at, n, buf);
        return buf;
    case TD_DTYPE_Q4_0:
        q4_0_row(at, n, buf);
        return buf;
    case TD_DTYPE_Q4_K:
        q4_k_row(at, n, buf);
        return buf;
    case TD_DTYPE_Q6_K:
        q6_k_row(at, n, buf);
        return buf;
    default: {
        td_mat_t sub = *W; /* F8: the model's converter with this chunk's scales */
        sub.cols = n;
        sub.data = at;
        sub.scale_row0 = W->scale_row0 + r;
        sub.scale = W->scale + c0 / 128;
        td_mat_row_f32(&sub, 0, buf);
        return buf;
    }
    }
}


/* ---------- one row against one token, straight from the stored blocks ---------- */

/* The same sum as the matmul's one-row kernel over the dequantised row: one 8-lane accumulator
 * over 8-value steps, then the lanes in kern_1x1's fixed tree (n is a multiple of 32, so no
 * scalar tail), each weight the same fp32 value td__cpu_row_chunk would have stored. */
static inline float lanes(const float v[8])
{
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

#ifdef TD_CPU_F16C
/* AVX2 widening by hand: GCC turns the generic int8 -> float vector conversion into scalars. */
__attribute__((target("avx2,f16c"))) static float dot_q8_0_avx2(const uint8_t *w, const float *x,
                                                                 int64_t n)
{
    __m256 a = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 32; b++, w += 34, x += 32) {
        uint16_t h;
        memcpy(&h, w, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        for (int k = 0; k < 4; k++) {
            __m256 q = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + 2 + 8 * k))));
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(d, q), _mm256_loadu_ps(x + 8 * k)));
        }
    }
    float v[8]; /* by pointer: a vector argument would cross the AVX / non-AVX ABI unoptimised */
    _mm256_storeu_ps(v, a);
    return lanes(v);
}


__attribute__((target("avx2,f16c"))) static float dot_q4_0_avx2(const uint8_t *w, const float *x,
                                                                 int64_t n)
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
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(v, d), _mm256_loadu_ps(x + 8 * k)));
        }
    }
    float v[8];
    _mm256_storeu_ps(v, a);
    return lanes(v);
}

__attribute__((target("avx2,f16c"))) static float dot_q4_k_avx2(const uint8_t *w, const float *x,
                                                                 int64_t n)
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
                    a = _mm256_add_ps(a, _mm256_mul_ps(wv, _mm256_loadu_ps(x + 8 * k)));
                }
            }
        }
    }
    float v[8];
    _mm256_storeu_ps(v, a);
    return lanes(v);
}

__attribute__((target("avx2,f16c"))) static float dot_q6_k_avx2(const uint8_t *w, const float *x,
                                                                 int64_t n)
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
                        __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(lp + l)));
                        __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + l)));
                        lo = _mm256_and_si256(k < 2 ? lo : _mm256_srli_epi32(lo, 4), m4);
                        hi = _mm256_and_si256(_mm256_srli_epi32(hi, 2 * k), m2);
                        __m256i qi = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), k32);
                        __m256 wv = _mm256_mul_ps(sv, _mm256_cvtepi32_ps(qi));
                        a = _mm256_add_ps(a, _mm256_mul_ps(wv, _mm256_loadu_ps(x)));
                    }
                }
            }
        }
    }
    float v[8];
    _mm256_storeu_ps(v, a);
    return lanes(v);
}

__attribute__((target("avx,f16c"))) static float dot_f16_f16c(const uint8_t *w, const float *x,
                                                               int64_t n)
{
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(
                                               (const __m128i *)(w + 2 * i))),
                                           _mm256_loadu_ps(x + i)));
    float v[8]; /* by pointer: a vector argument would cross the AVX / non-AVX ABI unoptimised */
    _mm256_storeu_ps(v, a);
    return lanes(v);
}
#endif

bool td__cpu_dot_row(const td_mat_t *W, int64_t r, int64_t c0, int64_t n, const float *x,
                     float *out)
{
    if (n % 32)
        return false;
    const uint8_t *at = (const uint8_t *)W->data +
                        (size_t)r * td_dtype_row_bytes(W->dtype, W->cols) +
                        td_dtype_row_bytes(W->dtype, c0);
    switch (W->dtype) {
#ifdef TD_CPU_F16C
    case TD_DTYPE_Q8_0:
        if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c"))
            return false;
        *out = dot_q8_0_avx2(at, x, n);
        return true;
    case TD_DTYPE_Q4_0:
    case TD_DTYPE_Q4_K:
    case TD_DTYPE_Q6_K:
        if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c") ||
            n % td_dtype_block(W->dtype))
            return false;
        *out = W->dtype == TD_DTYPE_Q4_0   ? dot_q4_0_avx2(at, x, n)
               : W->dtype == TD_DTYPE_Q4_K ? dot_q4_k_avx2(at, x, n)
                                           : dot_q6_k_avx2(at, x, n);
        return true;
    case TD_DTYPE_F16:
        if (!__builtin_cpu_supports("f16c"))
            return false;
        *out = dot_f16_f16c(at, x, n);
        return true;
#endif
    default:
        return false;
    }
}
