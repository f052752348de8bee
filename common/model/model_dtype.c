/* model_dtype.c: the stored dtypes of weights: their names and sizes, and conversion of rows to
 * fp32 (F16 and E4M3 through tables built once, BF16 by shifting, llama.cpp's block formats Q8_0,
 * Q4_0, Q4_K and Q6_K by block, as ggml's dequantize_row_* computes them). */
#include "model_impl.h"
#include "td_error.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

const char *td_dtype_name(td_dtype_t t)
{
    static const char *names[] = {"F32", "F16", "BF16", "F8_E4M3", "Q8_0", "Q4_0", "Q4_K", "Q6_K"};
    return (unsigned)t < TD_ARRAY_LEN(names) ? names[t] : "unknown";
}

size_t td__dtype_elt_size(td_dtype_t t)
{
    switch (t) {
    case TD_DTYPE_F32:
        return 4;
    case TD_DTYPE_F16:
    case TD_DTYPE_BF16:
        return 2;
    case TD_DTYPE_F8_E4M3:
        return 1;
    default:
        return 0;
    }
}

int td_dtype_block(td_dtype_t t)
{
    switch (t) {
    case TD_DTYPE_Q8_0:
    case TD_DTYPE_Q4_0:
        return 32;
    case TD_DTYPE_Q4_K:
    case TD_DTYPE_Q6_K:
        return 256;
    default:
        return 1;
    }
}

/* Bytes of one block of a block format. */
static size_t block_bytes(td_dtype_t t)
{
    switch (t) {
    case TD_DTYPE_Q8_0:
        return 34;
    case TD_DTYPE_Q4_0:
        return 18;
    case TD_DTYPE_Q4_K:
        return 144;
    case TD_DTYPE_Q6_K:
        return 210;
    default:
        return 0;
    }
}

size_t td_dtype_row_bytes(td_dtype_t t, int64_t cols)
{
    size_t bb = block_bytes(t);
    if (bb)
        return (size_t)cols / (size_t)td_dtype_block(t) * bb;
    return (size_t)cols * td__dtype_elt_size(t);
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000 | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* OCP FP8 E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN. */
static float e4m3_to_f32(uint8_t v)
{
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float f;
    if (exp == 0xf && man == 7)
        f = NAN;
    else if (exp == 0)
        f = ldexpf((float)man / 8.0f, -6);
    else
        f = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -f : f;
}

static float f16_table[65536];
static float e4m3_table[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        f16_table[i] = f16_to_f32((uint16_t)i);
    for (uint32_t i = 0; i < 256; i++)
        e4m3_table[i] = e4m3_to_f32((uint8_t)i);
}

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_table[h];
}

/* Q4_0 block: d, then 16 bytes: value j is the low nibble of byte j, value 16 + j its high one. */
static void q4_0_block(const uint8_t *blk, float *out)
{
    float d = f16_at(blk);
    const uint8_t *q = blk + 2;
    for (int j = 0; j < 16; j++) {
        out[j] = (float)((q[j] & 0xf) - 8) * d;
        out[j + 16] = (float)((q[j] >> 4) - 8) * d;
    }
}

/* Sub-block j's 6-bit scale and min in a Q4_K block's 12 scale bytes (ggml's get_scale_min_k4). */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K super-block: d, dmin, scales[12], qs[128]; 64 values per 32 bytes of qs (low nibbles are
 * sub-block 2i, high nibbles 2i + 1); value = d * scale * q - dmin * min. */
static void q4_k_block(const uint8_t *blk, float *out)
{
    float d = f16_at(blk), dmin = f16_at(blk + 2);
    const uint8_t *sc = blk + 4, *q = blk + 16;
    for (int i = 0; i < 4; i++) {
        int s0, m0, s1, m1;
        k4_scale_min(2 * i, sc, &s0, &m0);
        k4_scale_min(2 * i + 1, sc, &s1, &m1);
        float d0 = d * (float)s0, mm0 = dmin * (float)m0, d1 = d * (float)s1,
              mm1 = dmin * (float)m1;
        for (int l = 0; l < 32; l++) {
            out[64 * i + l] = d0 * (float)(q[32 * i + l] & 0xf) - mm0;
            out[64 * i + 32 + l] = d1 * (float)(q[32 * i + l] >> 4) - mm1;
        }
    }
}

/* Q6_K super-block: ql[128], qh[64], scales[16] (int8), d; two halves of 128 values, each from
 * 64 bytes of ql and 32 of qh; value = d * scale * (q6 - 32) with one scale per 16 values. */
static void q6_k_block(const uint8_t *blk, float *out)
{
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    float d = f16_at(blk + 208);
    for (int n = 0; n < 2; n++, ql += 64, qh += 32, sc += 8, out += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            out[l] = d * (float)sc[is] * (float)q1;
            out[l + 32] = d * (float)sc[is + 2] * (float)q2;
            out[l + 64] = d * (float)sc[is + 4] * (float)q3;
            out[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

/* Convert n values of dtype t at src to fp32 out[n] (block formats: n a multiple of the block). */
void td__convert_f32(td_dtype_t t, const uint8_t *src, int64_t n, float *out)
{
    pthread_once(&tables_once, init_tables);
    switch (t) {
    case TD_DTYPE_F32:
        memcpy(out, src, (size_t)n * 4);
        break;
    case TD_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = f16_table[h];
        }
        break;
    case TD_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(&out[i], &u, 4);
        }
        break;
    case TD_DTYPE_F8_E4M3:
        for (int64_t i = 0; i < n; i++)
            out[i] = e4m3_table[src[i]];
        break;
    case TD_DTYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 34;
            uint16_t h;
            memcpy(&h, blk, 2);
            float d = f16_table[h];
            for (int j = 0; j < 32; j++)
                out[b * 32 + j] = d * (float)(int8_t)blk[2 + j];
        }
        break;
    case TD_DTYPE_Q4_0:
        for (int64_t b = 0; b < n / 32; b++)
            q4_0_block(src + b * 18, out + b * 32);
        break;
    case TD_DTYPE_Q4_K:
        for (int64_t b = 0; b < n / 256; b++)
            q4_k_block(src + b * 144, out + b * 256);
        break;
    case TD_DTYPE_Q6_K:
        for (int64_t b = 0; b < n / 256; b++)
            q6_k_block(src + b * 210, out + b * 256);
        break;
    default:
        TD_ASSERT(0);
    }
}

void td_mat_row_f32(const td_mat_t *m, int64_t r, float *out)
{
    const uint8_t *row =
        (const uint8_t *)m->data + (size_t)r * td_dtype_row_bytes(m->dtype, m->cols);
    td__convert_f32(m->dtype, row, m->cols, out);
    if (m->dtype == TD_DTYPE_F8_E4M3) {
        const float *s = m->scale + ((m->scale_row0 + r) / 128) * m->scale_cols;
        for (int64_t c = 0; c < m->cols; c++)
            out[c] *= s[c / 128];
    }
}
