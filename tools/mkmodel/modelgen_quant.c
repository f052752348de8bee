/* modelgen_quant.c: llama.cpp's block formats as ggml's reference quantizers write them
 * (quantize_row_q8_0_ref, q4_0_ref, q4_K_ref with make_qkx2_quants, q6_K_ref with
 * make_qx_quants): the same choices of scales, minimums and rounding, so a file quantised here
 * holds what llama-quantize would write without an importance matrix. */
#include "modelgen_impl.h"

#include <math.h>
#include <string.h>

#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even (ggml's nearest_int under the default rounding mode). */
static int nearest_int(float f)
{
    return (int)lrintf(f);
}

static float f16_round(float f)
{
    return td__mg_f16_to_f32(td__mg_f32_to_f16(f));
}

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = td__mg_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static void q8_0_blocks(const float *v, int64_t n, uint8_t *out)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const float *x = v + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t *blk = out + b * 34;
        put_f16(blk, d);
        for (int i = 0; i < 32; i++)
            blk[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

static void q4_0_blocks(const float *v, int64_t n, uint8_t *out)
{
    for (int64_t b = 0; b < n / 32; b++) {
        const float *x = v + b * 32;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t *blk = out + b * 18;
        put_f16(blk, d);
        for (int j = 0; j < 16; j++) {
            int x0 = (int)(int8_t)(x[j] * id + 8.5f), x1 = (int)(int8_t)(x[16 + j] * id + 8.5f);
            x0 = x0 < 15 ? x0 : 15;
            x1 = x1 < 15 ? x1 : 15;
            blk[2 + j] = (uint8_t)(x0 | (x1 << 4));
        }
    }
}

/* ggml's make_qkx2_quants: scale and (negated) minimum of n values in [0, nmax] levels, the
 * weighted least-squares fit refined over nstep trial scales. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        min = x[i] < min ? x[i] : min;
        max = x[i] > max ? x[i] : max;
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * L[i] + min - x[i];
        best_error += weights[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += weights[i] * diff * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Sub-block j's 6-bit scale and min (ggml's get_scale_min_k4). */
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

static void q4_k_blocks(const float *v, int64_t n, uint8_t *out)
{
    uint8_t L[QK_K], Laux[32];
    float weights[32], mins[8], scales[8];
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *x = v + b * QK_K;
        uint8_t *blk = out + b * 144, *sc = blk + 4, *q = blk + 16;
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; l++)
                sum_x2 += x[32 * j + l] * x[32 * j + l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; l++)
                weights[l] = av_x + fabsf(x[32 * j + l]);
            scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                         -1.0f, 0.1f, 20);
            max_scale = scales[j] > max_scale ? scales[j] : max_scale;
            max_min = mins[j] > max_min ? mins[j] : max_min;
        }
        float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
        float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
        memset(sc, 0, 12);
        for (int j = 0; j < 8; j++) {
            int ls = nearest_int(inv_scale * scales[j]), lm = nearest_int(inv_min * mins[j]);
            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
            if (j < 4) {
                sc[j] = (uint8_t)ls;
                sc[j + 4] = (uint8_t)lm;
            } else {
                sc[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
                sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        put_f16(blk, max_scale / 63.0f);
        put_f16(blk + 2, max_min / 63.0f);
        float d_all = f16_round(max_scale / 63.0f), dmin_all = f16_round(max_min / 63.0f);
        for (int j = 0; j < 8; j++) {
            int s, m;
            k4_scale_min(j, sc, &s, &m);
            float d = d_all * (float)s;
            if (d == 0.0f)
                continue;
            float dm = dmin_all * (float)m;
            for (int ii = 0; ii < 32; ii++) {
                int l = nearest_int((x[32 * j + ii] + dm) / d);
                L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > 15 ? 15 : l);
            }
        }
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

/* ggml's make_qx_quants with rmse_type 1 (weights x^2) and no importance: the scale of n values
 * as signed levels in [-nmax, nmax - 1], searched over 18 trial scales. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static void q6_k_blocks(const float *v, int64_t n, uint8_t *out)
{
    int8_t L[QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *x = v + b * QK_K;
        uint8_t *blk = out + b * 210, *ql = blk, *qh = blk + 128;
        int8_t *sc = (int8_t *)(blk + 192);
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(blk, 0, 210);
            continue;
        }
        float iscale = -128.0f / max_scale;
        put_f16(blk + 208, 1 / iscale);
        for (int ib = 0; ib < 16; ib++) {
            int s = nearest_int(iscale * scales[ib]);
            sc[ib] = (int8_t)(s < 127 ? s : 127);
        }
        float d_all = f16_round(1 / iscale);
        for (int j = 0; j < 16; j++) {
            float d = d_all * (float)sc[j];
            if (d == 0.0f)
                continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = nearest_int(x[16 * j + ii] / d);
                l = l < -32 ? -32 : l > 31 ? 31 : l;
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                int q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf, q3 = L[j + l + 64] & 0xf,
                    q4 = L[j + l + 96] & 0xf;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
    }
}

void td__mg_quantize(int ggml_type, const float *v, int64_t n, uint8_t *out)
{
    switch (ggml_type) {
    case MG_GGML_Q8_0:
        q8_0_blocks(v, n, out);
        break;
    case MG_GGML_Q4_0:
        q4_0_blocks(v, n, out);
        break;
    case MG_GGML_Q4_K:
        q4_k_blocks(v, n, out);
        break;
    case MG_GGML_Q6_K:
        q6_k_blocks(v, n, out);
        break;
    }
}
