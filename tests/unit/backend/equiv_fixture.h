/* equiv_fixture.h: what test_backend_equiv.c's tests share: the modes (backend under test and
 * tolerances), the BF16 emulation of the cpu-bf16 mode, random inputs, copies to and from the
 * backend's memory and the comparison. Included once, by that file (built twice: TD_TEST_CUDA). */
#ifndef TD_TEST_EQUIV_FIXTURE_H
#define TD_TEST_EQUIV_FIXTURE_H

#include "td_backend.h"
#include "td_error.h"
#if TD_TEST_CUDA
#include "td_cuda.h"
#endif

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances of one mode. 0 everywhere: bitwise equality. */
typedef struct tol {
    const char *name;
    double gemm;      /* |d| <= gemm * sum_c |W[r][c] x[c]| */
    double rel, abs;  /* other operations: |d| <= abs + rel * |want| */
    double attn_abs;  /* attention: |d| <= attn_abs + rel * |want| (sums of up to 150 terms) */
    double logit;     /* engine: |d| <= logit * max |logit| of the row */
    double golden_lp; /* golden fixtures: top-5 logprob error */
    bool moe;         /* MoE models through the engine too (see modes[]) */
} tol_t;

#if TD_TEST_CUDA
#define N_MODES 2
static const tol_t modes[N_MODES] = {
    /* BF16 products: each of W and x rounded to 8 bits of mantissa; MoE models only in fp32
     * (see the cpu-bf16 mode below for why) */
    {"bf16", 1.6e-2, 2e-5, 1e-6, 2e-5, 5e-2, 0.15, false},
    {"fp32", 2e-5, 2e-5, 1e-6, 2e-5, 1e-4, 1e-3, true},
};
#else
/* cpu: a lent CPU backend, bitwise. cpu-bf16: the CPU backend with its GEMM inputs rounded as
 * the CUDA backend's BF16 mode rounds them (weights and activations to BF16, fp32 sums), against
 * the plain CPU backend with the BF16 mode's tolerances: where those tolerances were calibrated
 * (2026-12-01: dense engine logits within 0.020 of their range, llama_tiny's golden logprobs
 * within 0.050) and are checked without a GPU (the other operations stay bitwise). On the tiny
 * DeepSeek models BF16 rounding anywhere flips expert choices (routing is discontinuous; logits
 * then differ by 25-100% of their range, golden logprobs by up to 1.1), so MoE models go through
 * the engine only in the exact and fp32 modes. */
#define N_MODES 2
static const tol_t modes[N_MODES] = {
    {"cpu", 0, 0, 0, 0, 0, 1e-3, true},
    {"cpu-bf16", 1.6e-2, 0, 0, 0, 5e-2, 0.15, false},
};

/* The BF16 emulation: matmul and matmul_t of the wrapped CPU backend see BF16-rounded weights
 * (converted once per matrix) and BF16-rounded inputs. One emulated backend at a time. */
typedef struct emu_w {
    const void *data;
    int64_t rows;
    td_dtype_t dtype;
    td_mat_t bf; /* the BF16 copy */
} emu_w_t;

static struct emu {
    td_backend_t *inner;
    emu_w_t *w;
    int n_w, cap_w;
    float *x;
    size_t x_cap;
} emu;

static const td_mat_t *emu_weight(const td_mat_t *W)
{
    for (int i = 0; i < emu.n_w; i++)
        if (emu.w[i].data == W->data && emu.w[i].rows == W->rows && emu.w[i].bf.cols == W->cols &&
            emu.w[i].dtype == W->dtype)
            return &emu.w[i].bf;
    if (emu.n_w == emu.cap_w) {
        emu.cap_w = emu.cap_w ? 2 * emu.cap_w : 64;
        emu.w = realloc(emu.w, (size_t)emu.cap_w * sizeof(*emu.w));
        ck_assert_ptr_nonnull(emu.w);
    }
    emu_w_t *e = &emu.w[emu.n_w++];
    uint16_t *d = malloc((size_t)W->rows * (size_t)W->cols * 2);
    float *row = malloc((size_t)W->cols * sizeof(float));
    ck_assert(d && row);
    for (int64_t r = 0; r < W->rows; r++) {
        td_mat_row_f32(W, r, row);
        td_bf16_round(row, d + (size_t)r * W->cols, (size_t)W->cols);
    }
    free(row);
    *e = (emu_w_t){
        W->data, W->rows, W->dtype, {.dtype = TD_DTYPE_BF16, .rows = W->rows, .cols = W->cols}};
    e->bf.data = d;
    return &e->bf;
}

/* x's T rows of n values rounded to BF16, dense (ld n). */
static const float *emu_x(const float *x, int ld, int T, int64_t n)
{
    size_t need = (size_t)T * (size_t)n;
    if (need > emu.x_cap) {
        free(emu.x);
        emu.x = malloc(need * sizeof(float));
        ck_assert_ptr_nonnull(emu.x);
        emu.x_cap = need;
    }
    for (int t = 0; t < T; t++) {
        uint16_t *h = (uint16_t *)(emu.x + (size_t)t * n); /* packed in place, then widened */
        td_bf16_round(x + (size_t)t * ld, h, (size_t)n);
        for (int64_t i = n - 1; i >= 0; i--) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&emu.x[(size_t)t * n + i], &u, 4);
        }
    }
    return emu.x;
}

static void emu_matmul(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                       const td_mat_t *W)
{
    const float *xb = emu_x(x, x_ld, T, W->cols);
    emu.inner->matmul(emu.inner, out, out_ld, xb, (int)W->cols, T, emu_weight(W));
}

static void emu_matmul_t(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                         const td_mat_t *W, int64_t row0, int64_t n_rows)
{
    const float *xb = emu_x(x, x_ld, T, n_rows);
    emu.inner->matmul_t(emu.inner, out, out_ld, xb, (int)n_rows, T, emu_weight(W), row0, n_rows);
}

static void emu_destroy(td_backend_t *b)
{
    for (int i = 0; i < emu.n_w; i++)
        free((void *)emu.w[i].bf.data);
    free(emu.w);
    free(emu.x);
    emu.inner->destroy(emu.inner);
    memset(&emu, 0, sizeof(emu));
    free(b);
}
#endif

/* The backend under test in mode `mode`. */
static td_backend_t *dut(int mode)
{
#if TD_TEST_CUDA
    td_cuda_opts_t o = {.device = 0, .fp32_gemm = mode == 1};
    td_backend_t *b = NULL;
    ck_assert_msg(td_cuda_backend_create(&o, &b) == 0, "cuda backend: %s", td_err_msg());
    return b;
#else
    td_backend_t *b = td_cpu_backend_create(3);
    ck_assert_ptr_nonnull(b);
    /* the CPU backend's memory is host memory whatever the kind; saying its pool is device memory
     * makes the engine take its device paths (staged embeddings, copies instead of stores) */
    b->kv_mem = TD_MEM_DEVICE;
    if (mode == 0)
        return b;
    ck_assert_ptr_null(emu.inner);
    td_backend_t *w = malloc(sizeof(*w));
    ck_assert_ptr_nonnull(w);
    *w = *b; /* the same CPU state (impl) behind every other operation */
    w->name = "cpu-bf16";
    w->matmul = emu_matmul;
    w->matmul_t = emu_matmul_t;
    w->destroy = emu_destroy;
    emu.inner = b;
    return w;
#endif
}

static uint64_t rng_state = 88172645463325252ull;

static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *rand_vec(size_t n, float scale)
{
    float *v = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    return v;
}

/* A copy of host floats in the backend's device memory, and back. */
static float *up(td_backend_t *b, const float *h, size_t n)
{
    float *d = b->alloc(b, n * sizeof(float), TD_MEM_DEVICE);
    ck_assert_msg(d != NULL, "%s", td_err_msg());
    b->copy(b, d, h, n * sizeof(float));
    return d;
}

static float *down(td_backend_t *b, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(h);
    b->copy(b, h, d, n * sizeof(float));
    b->sync(b);
    return h;
}

static void release(td_backend_t *b, void *d)
{
    b->free(b, d, TD_MEM_DEVICE);
}

/* got against want for n values; bound[i] (may be NULL) replaces |want[i]| as the scale. */
static void expect_close_abs(const char *what, const tol_t *t, const float *got, const float *want,
                             const double *bound, size_t n, double rel, double abs)
{
    for (size_t i = 0; i < n; i++) {
        if (rel == 0 && abs == 0) {
            ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                          "%s [%zu]: %.9g, want exactly %.9g", what, i, got[i], want[i]);
            continue;
        }
        double lim = abs + rel * (bound ? bound[i] : fabs(want[i]));
        ck_assert_msg(fabs((double)got[i] - want[i]) <= lim,
                      "%s (%s) [%zu]: %.9g, want %.9g +- %.3g", what, t->name, i, got[i], want[i],
                      lim);
    }
}

static void expect_close(const char *what, const tol_t *t, const float *got, const float *want,
                         const double *bound, size_t n, double rel)
{
    expect_close_abs(what, t, got, want, bound, n, rel, t->abs);
}

#endif
