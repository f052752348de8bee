/* test_cpu_kernels.c: the CPU backend's matmul kernels at every instruction-set level this CPU
 * has (td__cpu_isa: portable, AVX2, AVX-512).
 *
 * test_isa_equiv: F32, BF16 and F16 (common/backend/cpu/cpu_fma.c), the AVX2 and AVX-512 tiles
 * bitwise equal.
 *
 * test_q8_numerics: Q8_0 and Q4_0 matmuls against 8-bit activations
 * (common/backend/cpu/cpu_q8.c), bitwise against a scalar model of their numerics written here
 * from the description in cpu_q8.c: each token quantised per block of 32 (step amax / 127 rounded
 * to fp16, values rint(x * 127 / amax)), each block's exact integer sum S_b, lane b mod 8 taking
 * (dw * dx) * S_b (one fused multiply-add where the kernels are x86-64-v3's, a multiply then an
 * add for the portable loop), then the lanes' fixed tree. Every instruction-set level this CPU
 * has (portable, AVX2, AVX-512), 1 and 2 threads, token counts that take the one-token kernels
 * (1-3) and the prefill tiles (4 and up, odd and even: the tiles pair tokens), rows that leave
 * every remainder of the tiles' groups of rows, and columns that leave a partial group of eight
 * blocks.
 *
 * test_qk_numerics: Q4_K and Q6_K matmuls against 8-bit activations (common/backend/cpu/cpu_qk.c),
 * bitwise against a scalar model written here from cpu_qk.c's description, with its own decoding
 * of the two block formats (checked value by value against td_mat_row_f32's): each token quantised
 * per super-block of 256 (step amax / 127 in fp32, values rint(x * 127 / amax)), eight exact
 * integer lanes of scale * u * q (four consecutive values a lane in each group of 32) and the
 * integer sum of mins (or 32 * scales) times the sums of 16 values, then per super-block a multiply
 * and an add per lane and for the sum, then the lanes' tree less the sum. Every level, 1 and 2
 * threads, token counts 1 to 33.
 *
 * test_grouped: F16 matrices' grouped copy (common/backend/cpu/cpu_group.c): its layout,
 * and products from it bitwise those from the stored rows at every level. */
#include "../../../common/backend/cpu/cpu_impl.h"
#include "half_fixture.h"
#include "td_backend.h"
#include "td_check.h"
#include "td_rng.h"
#include "td_util.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static td_rng_t rng;

static uint32_t next_u32(void)
{
    return (uint32_t)(td_rng_next(&rng) >> 32);
}

static float frand(void) /* [-1, 1) */
{
    return (float)(2.0 * td_rng_uniform(&rng) - 1.0);
}

static float f16_to_f32(uint16_t h)
{
    return fx_f16_to_f32(h);
}

static uint16_t f32_to_f16(float f)
{
    return fx_f32_to_f16(f);
}

/* A rows x cols Q8_0 or Q4_0 matrix of random blocks (some with the extreme values). */
static td_mat_t rand_mat(td_dtype_t dt, int64_t rows, int64_t cols)
{
    td_mat_t m = {.dtype = dt, .rows = rows, .cols = cols};
    const size_t rb = td_dtype_row_bytes(dt, cols), bs = dt == TD_DTYPE_Q8_0 ? 34 : 18;
    uint8_t *d = malloc(rb * (size_t)rows);
    ck_assert_ptr_nonnull(d);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < cols / 32; b++) {
            uint8_t *blk = d + (size_t)r * rb + (size_t)b * bs;
            uint16_t s = f32_to_f16((0.5f + 0.5f * frand()) / 127);
            memcpy(blk, &s, 2);
            for (size_t j = 2; j < bs; j++)
                blk[j] = (uint8_t)next_u32();
            if (dt == TD_DTYPE_Q8_0 && b % 7 == 3) /* the extremes: -128 and 127 */
                for (int j = 0; j < 32; j++)
                    blk[2 + j] = (uint8_t)(j % 2 ? 0x80 : 0x7f);
        }
    m.data = d;
    return m;
}

/* A rows x cols F32, BF16 or F16 matrix of random values in [-0.25, 0.25). */
static td_mat_t rand_fmat(td_dtype_t dt, int64_t rows, int64_t cols)
{
    td_mat_t m = {.dtype = dt, .rows = rows, .cols = cols};
    const size_t rb = td_dtype_row_bytes(dt, cols);
    uint8_t *d = malloc(rb * (size_t)rows);
    ck_assert_ptr_nonnull(d);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float v = frand() * 0.25f;
            uint8_t *at = d + (size_t)r * rb;
            if (dt == TD_DTYPE_F32) {
                memcpy(at + 4 * c, &v, 4);
            } else if (dt == TD_DTYPE_F16) {
                uint16_t h = f32_to_f16(v);
                memcpy(at + 2 * c, &h, 2);
            } else { /* BF16, rounded to nearest even */
                uint32_t u;
                memcpy(&u, &v, 4);
                uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
                memcpy(at + 2 * c, &h, 2);
            }
        }
    m.data = d;
    return m;
}

static float *rand_vec(size_t n, float scale)
{
    float *v = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

/* Weight j of block b of row r, and the block's step. */
static int wval(const td_mat_t *W, int64_t r, int64_t b, int j, float *dw)
{
    const size_t rb = td_dtype_row_bytes(W->dtype, W->cols);
    const uint8_t *row = (const uint8_t *)W->data + (size_t)r * rb;
    uint16_t h;
    if (W->dtype == TD_DTYPE_Q8_0) {
        const uint8_t *blk = row + b * 34;
        memcpy(&h, blk, 2);
        *dw = f16_to_f32(h);
        return (int8_t)blk[2 + j];
    }
    const uint8_t *blk = row + b * 18;
    memcpy(&h, blk, 2);
    *dw = f16_to_f32(h);
    return (j < 16 ? blk[2 + j] & 0xf : blk[2 + j - 16] >> 4) - 8;
}

/* The model: out[t * out_ld + r]. */
static void model(const td_mat_t *W, const float *x, int x_ld, int T, float *out, int out_ld,
                  bool fused)
{
    const int64_t n = W->cols, nb = n / 32;
    int8_t *q = malloc((size_t)n);
    float *dx = malloc((size_t)nb * sizeof(float));
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * x_ld;
        for (int64_t b = 0; b < nb; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(xt[b * 32 + j]));
            dx[b] = f16_to_f32(f32_to_f16(amax / 127.0f));
            float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            for (int j = 0; j < 32; j++)
                q[b * 32 + j] = (int8_t)rintf(xt[b * 32 + j] * id);
        }
        for (int64_t r = 0; r < W->rows; r++) {
            float acc[8] = {0};
            for (int64_t b = 0; b < nb; b++) {
                float dw = 0;
                int32_t s = 0;
                for (int j = 0; j < 32; j++)
                    s += wval(W, r, b, j, &dw) * q[b * 32 + j];
                float dd = dw * dx[b];
                acc[b % 8] = fused ? fmaf(dd, (float)s, acc[b % 8]) : acc[b % 8] + dd * (float)s;
            }
            out[(size_t)t * out_ld + r] =
                ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        }
    }
    free(q);
    free(dx);
}

/* A matrix of random blocks of type dt, and a model's outputs out[t * out_ld + r] at a level. */
typedef td_mat_t (*mat_fn)(td_dtype_t dt, int64_t rows, int64_t cols);
typedef void (*model_fn)(const td_mat_t *W, const float *x, int x_ld, int T, float *out, int out_ld,
                         int level);

/* Matmuls of the types dts (shapes rows x cols, token counts Ts) at every level this CPU has, 1
 * and 2 threads, bitwise against the model; x has an all-zero block of blk values at blk. */
static void check_levels(const char *name, const td_dtype_t *dts, size_t ndt,
                         const int64_t (*shapes)[2], size_t nshapes, const int *Ts, size_t nT,
                         mat_fn mat, model_fn model, int blk)
{
    const int top = td__cpu_isa();
    int compared = 0;
    for (int level = TD_CPU_ISA_GENERIC; level <= top; level++) {
        td__cpu_isa_cap(level);
        for (int threads = 1; threads <= 2; threads++) {
            td_backend_t *b = td_cpu_backend_create(threads);
            ck_assert_ptr_nonnull(b);
            for (size_t di = 0; di < ndt; di++)
                for (size_t si = 0; si < nshapes; si++) {
                    td_mat_t W = mat(dts[di], shapes[si][0], shapes[si][1]);
                    for (size_t ti = 0; ti < nT; ti++) {
                        const int T = Ts[ti], x_ld = (int)W.cols + 3, out_ld = (int)W.rows + 2;
                        float *x = malloc(sizeof(float) * (size_t)T * x_ld);
                        for (int i = 0; i < T * x_ld; i++)
                            x[i] = frand() * (i % 97 == 5 ? 40.0f : 1.0f);
                        for (int c = blk; c < 2 * blk && c < W.cols; c++) /* an all-zero block */
                            x[c] = 0.0f;
                        size_t no = (size_t)T * out_ld;
                        float *got = calloc(no, sizeof(float)), *want = calloc(no, sizeof(float));
                        b->matmul(b, got, out_ld, x, x_ld, T, &W);
                        model(&W, x, x_ld, T, want, out_ld, level);
                        for (int t = 0; t < T; t++)
                            for (int64_t r = 0; r < W.rows; r++) {
                                size_t i = (size_t)t * out_ld + r;
                                if (memcmp(&got[i], &want[i], sizeof(float)))
                                    ck_abort_msg(
                                        "%s %lldx%lld level %d threads %d T=%d: out[%d][%lld] "
                                        "%.9g, the model %.9g",
                                        td_dtype_name(W.dtype), (long long)W.rows,
                                        (long long)W.cols, level, threads, T, t, (long long)r,
                                        got[i], want[i]);
                                compared++;
                            }
                        free(x), free(got), free(want);
                    }
                    free((void *)W.data);
                }
            b->destroy(b);
        }
    }
    td__cpu_isa_cap(TD_CPU_ISA_AVX512);
    ck_assert_int_gt(compared, 0);
    if (top < TD_CPU_ISA_AVX512)
        fprintf(stderr, "%s: this CPU's level is %d: the AVX-512 kernels were not run\n", name,
                top);
}

/* The Q8_0 / Q4_0 model at a level: fused multiply-adds from x86-64-v3 up. */
static void model_q8(const td_mat_t *W, const float *x, int x_ld, int T, float *out, int out_ld,
                     int level)
{
    model(W, x, x_ld, T, out, out_ld, level >= TD_CPU_ISA_AVX2);
}

START_TEST(test_q8_numerics)
{
    td_rng_seed(&rng, 17);
    const td_dtype_t dts[] = {TD_DTYPE_Q8_0, TD_DTYPE_Q4_0};
    const int64_t shapes[][2] = {{13, 32}, {9, 96}, {7, 256}, {11, 288}, {6, 800}, {17, 2304}};
    const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 16, 33};
    check_levels("test_q8_numerics", dts, 2, shapes, sizeof(shapes) / sizeof(shapes[0]), Ts,
                 sizeof(Ts) / sizeof(Ts[0]), rand_mat, model_q8, 64);
}
END_TEST

/* A rows x cols Q4_K or Q6_K matrix of random super-blocks (steps small, so that values stay
 * near [-1, 1]; some Q6_K scales at -128 and 127). */
static td_mat_t rand_kmat(td_dtype_t dt, int64_t rows, int64_t cols)
{
    td_mat_t m = {.dtype = dt, .rows = rows, .cols = cols};
    const size_t rb = td_dtype_row_bytes(dt, cols), bs = dt == TD_DTYPE_Q4_K ? 144 : 210;
    uint8_t *d = malloc(rb * (size_t)rows);
    ck_assert_ptr_nonnull(d);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < cols / 256; b++) {
            uint8_t *blk = d + (size_t)r * rb + (size_t)b * bs;
            for (size_t j = 0; j < bs; j++)
                blk[j] = (uint8_t)next_u32();
            uint16_t s = f32_to_f16((0.5f + 0.5f * frand()) / 1024), s2 = f32_to_f16(0.5f / 1024);
            if (dt == TD_DTYPE_Q4_K) {
                memcpy(blk, &s, 2);
                memcpy(blk + 2, &s2, 2);
            } else {
                memcpy(blk + 208, &s, 2);
                if (b % 3 == 1)
                    blk[192] = 0x80, blk[193] = 0x7f;
            }
        }
    m.data = d;
    return m;
}

/* Value v of super-block b of row r as the integers the format holds: its unsigned u, its scale,
 * its run's mv (the min of its 32 for Q4_K, 32 * its scale for Q6_K) and the steps d, dmin (dmin =
 * d for Q6_K); the value is d * sc * u - dmin * mv (Q4_K) or d * sc * (u - 32) (Q6_K). */
static void kval(const td_mat_t *W, int64_t r, int64_t b, int v, int *u, int *sc, int *mv, float *d,
                 float *dmin)
{
    const size_t rb = td_dtype_row_bytes(W->dtype, W->cols);
    const uint8_t *row = (const uint8_t *)W->data + (size_t)r * rb;
    uint16_t h;
    if (W->dtype == TD_DTYPE_Q4_K) {
        const uint8_t *blk = row + b * 144, *q = blk + 4;
        memcpy(&h, blk, 2);
        *d = f16_to_f32(h);
        memcpy(&h, blk + 2, 2);
        *dmin = f16_to_f32(h);
        int j = v / 32, i = v / 64, l = v % 32; /* sub-block j: low nibbles for even j */
        *u = j % 2 ? blk[16 + 32 * i + l] >> 4 : blk[16 + 32 * i + l] & 0xf;
        if (j < 4) {
            *sc = q[j] & 63;
            *mv = q[j + 4] & 63;
        } else {
            *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
            *mv = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
        return;
    }
    const uint8_t *blk = row + b * 210;
    memcpy(&h, blk + 208, 2);
    *d = *dmin = f16_to_f32(h);
    int half = v / 128, w = v % 128, quarter = w / 32, l = w % 32;
    const uint8_t *ql = blk + 64 * half, *qh = blk + 128 + 32 * half;
    int lo = quarter == 0   ? ql[l] & 0xf
             : quarter == 1 ? ql[32 + l] & 0xf
             : quarter == 2 ? ql[l] >> 4
                            : ql[32 + l] >> 4;
    *u = lo | ((qh[l] >> (2 * quarter)) & 3) << 4;
    *sc = (int8_t)blk[192 + v / 16];
    *mv = 32 * *sc;
}

/* The model of cpu_qk.c's numerics: out[t * out_ld + r]. */
static void kmodel(const td_mat_t *W, const float *x, int x_ld, int T, float *out, int out_ld,
                   int level)
{
    (void)level; /* the same numerics at every level */
    const int64_t n = W->cols, nsb = n / 256;
    int8_t *q = malloc((size_t)n);
    float *dx = malloc((size_t)nsb * sizeof(float));
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * x_ld;
        for (int64_t b = 0; b < nsb; b++) {
            float amax = 0;
            for (int j = 0; j < 256; j++)
                amax = fmaxf(amax, fabsf(xt[b * 256 + j]));
            dx[b] = amax / 127.0f;
            float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            for (int j = 0; j < 256; j++)
                q[b * 256 + j] = (int8_t)rintf(xt[b * 256 + j] * id);
        }
        for (int64_t r = 0; r < W->rows; r++) {
            float acc[8] = {0}, accm = 0;
            for (int64_t b = 0; b < nsb; b++) {
                int32_t A[8] = {0}, B = 0, bsum = 0;
                float d = 0, dmin = 0;
                for (int v = 0; v < 256; v++) {
                    int u, sc, mv;
                    kval(W, r, b, v, &u, &sc, &mv, &d, &dmin);
                    A[(v % 32) / 4] += sc * u * q[b * 256 + v];
                    bsum += q[b * 256 + v];
                    if (v % 16 == 15) {
                        B += mv * bsum;
                        bsum = 0;
                    }
                }
                float dd = dx[b] * d, dm = dx[b] * dmin;
                for (int l = 0; l < 8; l++)
                    acc[l] = acc[l] + dd * (float)A[l];
                accm = accm + dm * (float)B;
            }
            out[(size_t)t * out_ld + r] = (((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                                           ((acc[4] + acc[5]) + (acc[6] + acc[7]))) -
                                          accm;
        }
    }
    free(q);
    free(dx);
}

START_TEST(test_qk_numerics)
{
    td_rng_seed(&rng, 23);
    const td_dtype_t dts[] = {TD_DTYPE_Q4_K, TD_DTYPE_Q6_K};
    const int64_t shapes[][2] = {{13, 256}, {9, 768}, {6, 2048}};
    const int Ts[] = {1, 2, 3, 4, 5, 8, 33};
    /* the test's decoding is the format's: every value against the model module's dequantisation */
    for (size_t di = 0; di < 2; di++) {
        td_mat_t W = rand_kmat(dts[di], 3, 512);
        float row[512];
        for (int64_t r = 0; r < W.rows; r++) {
            td_mat_row_f32(&W, r, row);
            for (int c = 0; c < 512; c++) {
                int u, sc, mv;
                float d, dmin;
                kval(&W, r, c / 256, c % 256, &u, &sc, &mv, &d, &dmin);
                float want = W.dtype == TD_DTYPE_Q4_K ? d * (float)sc * (float)u - dmin * (float)mv
                                                      : d * (float)sc * (float)(u - 32);
                ck_assert_msg(fabsf(row[c] - want) <= 1e-6f * fmaxf(1.0f, fabsf(want)),
                              "%s value %lld,%d: %g, the test's decoding %g",
                              td_dtype_name(W.dtype), (long long)r, c, row[c], want);
            }
        }
        free((void *)W.data);
    }
    check_levels("test_qk_numerics", dts, 2, shapes, sizeof(shapes) / sizeof(shapes[0]), Ts,
                 sizeof(Ts) / sizeof(Ts[0]), rand_kmat, kmodel, 256);
}
END_TEST

/* The CPU backend's F32, BF16 and F16 matmuls at every instruction-set level this CPU has above
 * the portable one (AVX2 and AVX-512: the AVX-512 tiles hold two outputs per register and take
 * tokens in packed pairs) bitwise equal: token counts that take the one-token kernels (1-3), one
 * or several AVX-512 groups of 12 tokens, odd and even (a pair completed by zeros), and one past
 * a packed block (300 tokens of 1000 columns; 20000 columns pack 12 tokens a block); rows that
 * leave every remainder of the tiles' groups of four (and three); columns with a scalar tail and
 * past one 16384-column chunk. 1 and 2 threads. Each token alone must match the batch too. */
START_TEST(test_isa_equiv)
{
    td_rng_seed(&rng, 29);
    if (td__cpu_isa() < TD_CPU_ISA_AVX512) {
        printf("test_isa_equiv: skipped, this CPU (or build) has no AVX-512 kernels (level "
               "%d)\n",
               td__cpu_isa());
        return;
    }
    const td_dtype_t dts[] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F16};
    const struct {
        int64_t rows, cols;
        int T[8];
    } cases[] = {
        {7, 1000, {1, 2, 4, 5, 8, 13, 64, 300}}, {13, 20000, {1, 2, 3, 4, 5, 13, 25, 64}},
        {5, 16390, {1, 4, 5, 12, 13, 24, 0, 0}}, {1, 64, {1, 2, 4, 7, 64, 0, 0, 0}},
        {6, 8, {4, 5, 0, 0, 0, 0, 0, 0}},        {66, 773, {4, 13, 64, 0, 0, 0, 0, 0}},
    };
    int compared = 0;
    for (int threads = 1; threads <= 2; threads++) {
        td_backend_t *b = td_cpu_backend_create(threads);
        ck_assert_ptr_nonnull(b);
        for (size_t ci = 0; ci < TD_ARRAY_LEN(cases); ci++) {
            const int64_t rows = cases[ci].rows, cols = cases[ci].cols;
            const int x_ld = (int)cols + 5, out_ld = (int)rows + 3;
            for (size_t k = 0; k < TD_ARRAY_LEN(dts); k++) {
                td_mat_t W = rand_fmat(dts[k], rows, cols);
                for (int ti = 0; ti < 8 && cases[ci].T[ti]; ti++) {
                    const int T = cases[ci].T[ti];
                    float *x = rand_vec((size_t)T * x_ld, 1);
                    float *o2 = calloc((size_t)T * out_ld, sizeof(float)),
                          *o5 = calloc((size_t)T * out_ld, sizeof(float)),
                          *one = calloc((size_t)out_ld, sizeof(float));
                    ck_assert(o2 && o5 && one);
                    td__cpu_isa_cap(TD_CPU_ISA_AVX2);
                    b->matmul(b, o2, out_ld, x, x_ld, T, &W);
                    td__cpu_isa_cap(TD_CPU_ISA_AVX512);
                    b->matmul(b, o5, out_ld, x, x_ld, T, &W);
                    for (int t = 0; t < T; t++) {
                        b->matmul(b, one, out_ld, x + (size_t)t * x_ld, x_ld, 1, &W);
                        for (int64_t r = 0; r < rows; r++) {
                            const float a = o2[(size_t)t * out_ld + r],
                                        v = o5[(size_t)t * out_ld + r];
                            ck_assert_msg(memcmp(&a, &v, 4) == 0 && memcmp(&one[r], &v, 4) == 0,
                                          "%s %lldx%lld T %d threads %d token %d row %lld: AVX2 "
                                          "%a, AVX-512 %a, alone %a",
                                          td_dtype_name(W.dtype), (long long)rows, (long long)cols,
                                          T, threads, t, (long long)r, a, v, one[r]);
                            compared++;
                        }
                    }
                    free(x), free(o2), free(o5), free(one);
                }
                free((void *)W.data);
            }
        }
        b->destroy(b);
    }
    td__cpu_isa_cap(TD_CPU_ISA_AVX512);
    ck_assert_int_gt(compared, 0);
}
END_TEST

/* F16 matrices in groups of rows (common/backend/cpu/cpu_group.c). The copy's layout,
 * byte by byte against the stored rows, for row counts that leave every remainder of a group;
 * then the products the backend computes from the copy bitwise equal those from the stored rows
 * (a backend with td_cpu_opts_t.stored_rows), at every level this CPU has, 1 and 2 threads, token
 * counts that take the one-token kernels and the tiles, columns past one chunk, and a view whose
 * first row is not a group's; then that the copy is what is read: with the stored values changed
 * after the first product, the default backend still gives the first result and the stored-rows
 * one a new one. */
START_TEST(test_grouped)
{
    td_rng_seed(&rng, 31);
    const td_dtype_t dts[] = {TD_DTYPE_F16};
    /* the layout */
    const int64_t lay_rows[] = {1, 2, 3, 4, 5, 7, 67}, lay_cols[] = {32, 96, 16896};
    for (size_t di = 0; di < TD_ARRAY_LEN(dts); di++) {
        const int64_t es = 2; /* bytes per value */
        for (size_t ri = 0; ri < TD_ARRAY_LEN(lay_rows); ri++) {
            for (size_t ci = 0; ci < TD_ARRAY_LEN(lay_cols); ci++) {
                const int64_t rows = lay_rows[ri], cols = lay_cols[ci];
                td_cpu_groups_t *gs = td__cpu_groups_new();
                ck_assert_ptr_nonnull(gs);
                td_mat_t W = rand_fmat(dts[di], rows, cols);
                ck_assert(td__cpu_groupable(&W));
                const uint8_t *copy = td__cpu_groups_get(gs, &W);
                ck_assert_ptr_nonnull(copy);
                ck_assert_ptr_eq(td__cpu_groups_get(gs, &W), copy); /* found again */
                td_mat_t v = W; /* the same address, fewer rows: another matrix */
                v.rows = rows > 1 ? rows - 1 : 1;
                if (v.rows != rows)
                    ck_assert_ptr_ne(td__cpu_groups_get(gs, &v), copy);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c += 8) {
                        int64_t step;
                        const uint8_t *at = td__cpu_group_at(copy, &W, r, c, &step);
                        const int64_t g0 = r / TD_CPU_GROUP * TD_CPU_GROUP;
                        ck_assert_int_eq(step, 8 * es * TD_MIN(TD_CPU_GROUP, rows - g0));
                        ck_assert_msg(at >= copy && at + 8 * es <= copy + rows * cols * es &&
                                          memcmp(at, (const uint8_t *)W.data + (r * cols + c) * es,
                                                 (size_t)(8 * es)) == 0,
                                      "%s %lldx%lld row %lld column %lld", td_dtype_name(W.dtype),
                                      (long long)rows, (long long)cols, (long long)r, (long long)c);
                    }
                td__cpu_groups_free(gs);
                free((void *)W.data);
            }
        }
    }
    {
        td_mat_t b = {.dtype = TD_DTYPE_BF16, .rows = 4, .cols = 64},
                 odd = {.dtype = TD_DTYPE_F16, .rows = 4, .cols = 40},
                 f32 = {.dtype = TD_DTYPE_F32, .rows = 4, .cols = 64},
                 q = {.dtype = TD_DTYPE_Q8_0, .rows = 4, .cols = 64};
        ck_assert(!td__cpu_groupable(&b) && !td__cpu_groupable(&odd) && !td__cpu_groupable(&f32) &&
                  !td__cpu_groupable(&q));
    }

    /* the products */
    const struct {
        int64_t rows, cols;
    } shapes[] = {{7, 16896}, {67, 256}, {1, 32}, {2, 64}, {3, 96}, {5, 768}};
    const int Ts[] = {1, 2, 3, 4, 5, 13};
    const int top = td__cpu_isa();
    int compared = 0;
    for (int threads = 1; threads <= 2; threads++) {
        for (size_t di = 0; di < TD_ARRAY_LEN(dts); di++) {
            td_cpu_opts_t og = {.n_threads = threads},
                          os = {.n_threads = threads, .stored_rows = true};
            td_backend_t *bg = td_cpu_backend_create_opts(&og),
                         *bs = td_cpu_backend_create_opts(&os);
            ck_assert(bg && bs);
            void *keep[TD_ARRAY_LEN(shapes)];
            for (size_t si = 0; si < TD_ARRAY_LEN(shapes); si++) {
                td_mat_t W = rand_fmat(dts[di], shapes[si].rows, shapes[si].cols);
                keep[si] = (void *)W.data;
                td_mat_t view = W; /* rows 1.. of it (1 is not a group's first row) */
                if (W.rows > 2) {
                    view.rows = W.rows - 2;
                    view.data = (const uint8_t *)W.data + td_dtype_row_bytes(W.dtype, W.cols);
                }
                for (int isa = TD_CPU_ISA_GENERIC; isa <= top; isa++) {
                    td__cpu_isa_cap(isa);
                    for (int m = 0; m < 2; m++) {
                        const td_mat_t *M = m ? &view : &W;
                        for (size_t ti = 0; ti < TD_ARRAY_LEN(Ts); ti++) {
                            const int T = Ts[ti], x_ld = (int)M->cols + 3,
                                      out_ld = (int)M->rows + 2;
                            float *x = rand_vec((size_t)T * x_ld, 1),
                                  *yg = calloc((size_t)T * out_ld, sizeof(float)),
                                  *ys = calloc((size_t)T * out_ld, sizeof(float));
                            ck_assert(yg && ys);
                            bg->matmul(bg, yg, out_ld, x, x_ld, T, M);
                            bs->matmul(bs, ys, out_ld, x, x_ld, T, M);
                            for (int t = 0; t < T; t++)
                                for (int64_t r = 0; r < M->rows; r++) {
                                    const float a = yg[(size_t)t * out_ld + r],
                                                b = ys[(size_t)t * out_ld + r];
                                    ck_assert_msg(memcmp(&a, &b, 4) == 0,
                                                  "%s %lldx%lld%s level %d threads %d T %d token "
                                                  "%d row %lld: grouped %a, stored %a",
                                                  td_dtype_name(W.dtype), (long long)W.rows,
                                                  (long long)W.cols, m ? " (view)" : "", isa,
                                                  threads, T, t, (long long)r, a, b);
                                    compared++;
                                }
                            free(x), free(yg), free(ys);
                        }
                    }
                }
                td__cpu_isa_cap(TD_CPU_ISA_AVX512);
            }
            /* the copy is read: change the stored values after a product */
            td_mat_t W = {.dtype = dts[di], .rows = 5, .cols = 768, .data = keep[5]};
            const size_t es = 2;
            float *x = rand_vec(768, 1), before[5], g2[5], s2[5];
            bg->matmul(bg, before, 5, x, 768, 1, &W);
            for (size_t i = 0; i < 5 * 768; i++) /* every sign flipped (the high byte's top bit) */
                ((uint8_t *)keep[5])[(i + 1) * es - 1] ^= 0x80;
            bg->matmul(bg, g2, 5, x, 768, 1, &W);
            bs->matmul(bs, s2, 5, x, 768, 1, &W);
            for (int r = 0; r < 5; r++) {
                ck_assert_msg(memcmp(&g2[r], &before[r], 4) == 0, "row %d: %a, first %a", r, g2[r],
                              before[r]);
                ck_assert_msg(s2[r] == -before[r], "row %d: stored rows %a, first %a", r, s2[r],
                              before[r]);
            }
            free(x);
            bg->destroy(bg);
            bs->destroy(bs);
            for (size_t si = 0; si < TD_ARRAY_LEN(shapes); si++)
                free(keep[si]);
        }
    }
    ck_assert_int_gt(compared, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu_kernels");
    TCase *tc = tcase_create("levels");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_isa_equiv);
    tcase_add_test(tc, test_q8_numerics);
    tcase_add_test(tc, test_qk_numerics);
    tcase_add_test(tc, test_grouped);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
