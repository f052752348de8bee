/* model_dtype.c: the stored dtypes of weights: their names and sizes, and conversion of rows to
 * fp32 (F16 and E4M3 through tables built once, BF16 by shifting, Q8_0 by block). */
#include "model_impl.h"
#include "td_error.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

const char *td_dtype_name(td_dtype_t t)
{
    static const char *names[] = {"F32", "F16", "BF16", "F8_E4M3", "Q8_0"};
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

size_t td_dtype_row_bytes(td_dtype_t t, int64_t cols)
{
    if (t == TD_DTYPE_Q8_0)
        return (size_t)cols / 32 * 34;
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

/* Convert n values of dtype t at src to fp32 out[n] (Q8_0: n a multiple of 32). */
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
