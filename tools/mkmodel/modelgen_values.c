/* modelgen_values.c: the weights' values (a splitmix64 normal stream per tensor, scaled by kind),
 * the number formats they are stored in (BF16, F16, FP8 E4M3 with block scales), and the values
 * the safetensors copy ends up holding, which the GGUF copy repeats. */
#include "modelgen_impl.h"
#include "td_rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Raw fp32 values of tensor `t`, out[numel]: a normal stream from (seed, name), scaled by kind. */
void td__mg_gen_raw(uint64_t seed, const mg_tensor_t *t, int hidden, float *out)
{
    uint64_t s = seed ^ fnv1a64(t->name);
    int64_t n = td__mg_numel(t);
    double std, mean = 0.0;
    switch (t->kind) {
    case K_EMBED:
        std = 1.0 / sqrt((double)hidden);
        break;
    case K_NORM:
        mean = 1.0;
        std = 0.1;
        break;
    case K_FINAL_NORM: /* scales the logits to a standard deviation of about 3 */
        mean = 3.0;
        std = 0.3;
        break;
    case K_BIAS:
        std = 0.1;
        break;
    default: /* K_LINEAR, K_ROUTER */
        std = 1.0 / sqrt((double)t->cols);
        break;
    }
    for (int64_t i = 0; i < n; i += 2) {
        /* Box-Muller: u1 in (0, 1], u2 in [0, 1) */
        double u1 = ((double)(td_rng_splitmix64(&s) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (double)(td_rng_splitmix64(&s) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        out[i] = (float)(mean + std * r * cos(2.0 * M_PI * u2));
        if (i + 1 < n)
            out[i + 1] = (float)(mean + std * r * sin(2.0 * M_PI * u2));
    }
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t td__mg_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half, value / 2^-24 rounded to even */
        float v;
        memcpy(&v, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(v * 16777216.0f));
    }
    ax += 0xc8000fffu + ((ax >> 13) & 1u); /* rebias exponent by -112, round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

float td__mg_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 0x400u), (int)e - 25);
    uint32_t x;
    memcpy(&x, &v, 4);
    x |= sign;
    memcpy(&v, &x, 4);
    return v;
}

/* E4M3 ("e4m3fn"): codes 0..126 are the non-negative finite values in increasing order. */
static float e4m3_value(int code)
{
    int e = (code >> 3) & 0xf, m = code & 7;
    return e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

/* Nearest E4M3 code to x (ties to the even code), saturating at +-448. */
static uint8_t f32_to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (!(a < 448.0f))
        return sign | 126;
    if (a < 0x1p-6f) /* subnormal: steps of 2^-9; 8 steps is 2^-6, code 8 */
        return (uint8_t)(sign | (uint8_t)lrintf(a * 512.0f));
    uint32_t u;
    memcpy(&u, &a, 4);
    u += 0x7ffffu + ((u >> 20) & 1u); /* keep 3 mantissa bits, round to nearest even */
    int code = ((int)(u >> 23) - 127 + 7) << 3 | (int)((u >> 20) & 7u);
    return (uint8_t)(sign | (code > 126 ? 126 : code));
}

/* DeepSeek's block quantisation of w [rows][cols]: per 128x128 block, scale = amax / 448,
 * q = e4m3(w / scale). q [rows][cols], scale [ceil(rows/128)][ceil(cols/128)]. */
void td__mg_fp8_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale)
{
    int64_t sc = (cols + FP8_BLOCK - 1) / FP8_BLOCK;
    for (int64_t br = 0; br < rows; br += FP8_BLOCK) {
        for (int64_t bc = 0; bc < cols; bc += FP8_BLOCK) {
            int64_t re = TD_MIN(br + FP8_BLOCK, rows), ce = TD_MIN(bc + FP8_BLOCK, cols);
            float amax = 0.0f;
            for (int64_t r = br; r < re; r++)
                for (int64_t c = bc; c < ce; c++)
                    amax = fmaxf(amax, fabsf(w[r * cols + c]));
            float s = amax > 0.0f ? amax / 448.0f : 1.0f;
            scale[(br / FP8_BLOCK) * sc + bc / FP8_BLOCK] = s;
            for (int64_t r = br; r < re; r++)
                for (int64_t c = bc; c < ce; c++)
                    q[r * cols + c] = f32_to_e4m3(w[r * cols + c] / s);
        }
    }
}

bool td__mg_tensor_fp8(const mg_ctx_t *c, const mg_tensor_t *t)
{
    return c->use_fp8 && t->fp8_ok;
}

/* The values the safetensors copy holds for `t` (after its dtype's rounding, or FP8 quantise +
 * dequantise), out[numel]. */
int td__mg_canonical(const mg_ctx_t *c, const mg_tensor_t *t, float *out)
{
    int64_t n = td__mg_numel(t);
    td__mg_gen_raw(c->o->seed, t, c->hp.hidden, out);
    if (td__mg_tensor_fp8(c, t)) {
        int64_t sr = (t->rows + FP8_BLOCK - 1) / FP8_BLOCK,
                sc = (t->cols + FP8_BLOCK - 1) / FP8_BLOCK;
        uint8_t *q = malloc((size_t)n);
        float *s = td_calloc((size_t)(sr * sc), sizeof(float));
        if (!q || !s) {
            free(q);
            free(s);
            return TD_ENOMEM;
        }
        td__mg_fp8_quantize(out, t->rows, t->cols, q, s);
        for (int64_t r = 0; r < t->rows; r++)
            for (int64_t k = 0; k < t->cols; k++) {
                uint8_t b = q[r * t->cols + k];
                float v = e4m3_value(b & 0x7f) * s[(r / FP8_BLOCK) * sc + k / FP8_BLOCK];
                out[r * t->cols + k] = (b & 0x80) ? -v : v;
            }
        free(q);
        free(s);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        if (c->o->dtype == TD_MODELGEN_BF16)
            out[i] = bf16_to_f32(f32_to_bf16(out[i]));
        else if (c->o->dtype == TD_MODELGEN_F16)
            out[i] = td__mg_f16_to_f32(td__mg_f32_to_f16(out[i]));
    }
    return 0;
}

int td__mg_canonical_by_name(const mg_ctx_t *c, const char *name, float *out)
{
    const mg_tensor_t *t = td__mg_list_find(&c->list, name);
    TD_ASSERT(t != NULL);
    return td__mg_canonical(c, t, out);
}

void td__mg_encode(td_modelgen_dtype_t d, const float *v, int64_t n, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        if (d == TD_MODELGEN_F32) {
            memcpy(out + 4 * i, &v[i], 4);
        } else {
            uint16_t h = d == TD_MODELGEN_BF16 ? f32_to_bf16(v[i]) : td__mg_f32_to_f16(v[i]);
            memcpy(out + 2 * i, &h, 2); /* little-endian host */
        }
    }
}
