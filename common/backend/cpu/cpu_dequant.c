/* cpu_dequant.c: rows of stored weights as fp32 for the matmul kernels: F32 in place, the rest
 * converted into the caller's buffer by vectorised loops (BF16, F16 through F16C where the CPU
 * has it, Q8_0, and llama.cpp's Q4_0, Q4_K and Q6_K blocks). Every value is the same fp32
 * expression td_mat_row_f32 computes (an exact conversion, or d * q, or d * scale * q - min in
 * the same order), so the two agree bit for bit and the matmul's summation order alone decides
 * its result. (For one token, cpu_fma.c sums rows straight from the stored blocks over the same
 * values.) */
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
/* clang before 15 has no _Float16 on x86, and its __fp16 conversions call a compiler-rt helper
 * that Debian's clang 14 does not link by default: there, an exact conversion from the bits. */
#if defined(__clang__) && __clang_major__ < 15 && (defined(__x86_64__) || defined(__i386__))
#define TD_HALF_SOFT 1
static inline float half_bits(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0x1f)
        u = s | 0x7f800000u | (m << 13); /* inf, nan */
    else if (e)
        u = s | ((e + 112u) << 23) | (m << 13);
    else {
        f = (float)m * 0x1p-24f; /* zero and subnormals: exact (m < 2^10) */
        memcpy(&u, &f, 4);
        u |= s;
    }
    memcpy(&f, &u, 4);
    return f;
}
#else
typedef _Float16 td_half_t;
typedef td_half_t v8hf __attribute__((vector_size(16)));
#endif

/* The IEEE half at p (little-endian), exactly as a float. */
static inline float f16_at(const uint8_t *p)
{
#ifdef TD_HALF_SOFT
    uint16_t h;
    memcpy(&h, p, 2);
    return half_bits(h);
#else
    td_half_t h;
    memcpy(&h, p, 2);
    return (float)h;
#endif
}

float td__cpu_f16(const uint8_t *p)
{
    return f16_at(p);
}

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

/* n values: those at [8k, 8k + 8) from src + k * step (16: stored contiguously), the rest (n not
 * a multiple of 8, step 16 only) after them. */
TD_CPU_KERNEL static void f16_row_generic(const uint8_t *src, int64_t step, int64_t n, float *out)
{
    int64_t i = 0;
#ifndef TD_HALF_SOFT
    for (; i + 8 <= n; i += 8) {
        v8hf h;
        memcpy(&h, src + i / 8 * step, sizeof(h));
        v8f f = __builtin_convertvector(h, v8f);
        memcpy(out + i, &f, sizeof(f));
    }
#endif
    for (; i < n; i++)
        out[i] = f16_at(src + i / 8 * step + 2 * (i % 8));
}

TD_CPU_KERNEL TD_CPU_VECTORIZE static void q8_0_row(const uint8_t *src, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + b * 34;
        const int8_t *q = (const int8_t *)(blk + 2);
        float d = f16_at(blk), *o = out + b * 32;
        for (int j = 0; j < 32; j++) /* a fixed-length loop the compiler vectorises */
            o[j] = d * (float)q[j];
    }
}

#ifdef TD_CPU_F16C
__attribute__((target("avx,f16c"))) static void f16_row_f16c(const uint8_t *src, int64_t step,
                                                             int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i / 8 * step))));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i / 8 * step + 2 * (i % 8), 2);
        out[i] = _cvtsh_ss(h);
    }
}
#endif

/* GCC turns the generic vector conversion into one scalar conversion per value; F16C does 8. */
static void f16_row(const uint8_t *src, int64_t step, int64_t n, float *out)
{
#ifdef TD_CPU_F16C
    if (__builtin_cpu_supports("f16c")) {
        f16_row_f16c(src, step, n, out);
        return;
    }
#endif
    f16_row_generic(src, step, n, out);
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
        f16_row(at, 16, n, buf);
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

const float *td__cpu_row_chunk_grouped(const uint8_t *copy, const td_mat_t *W, int64_t r,
                                       int64_t c0, int64_t n, float *buf)
{
    int64_t step;
    const uint8_t *at = td__cpu_group_at(copy, W, r, c0, &step);
    f16_row(at, step, n, buf);
    return buf;
}
