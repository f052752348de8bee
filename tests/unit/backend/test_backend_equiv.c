/* test_backend_equiv.c: a backend against the CPU backend. Built twice:
 *
 * - backend_cuda (with the cuda feature): the CUDA backend in both GEMM modes (BF16, and fp32 for
 *   a tight check of everything else) on every operation with random inputs, then the full
 *   engine on every tiny model mkmodel writes and on the golden fixtures (greedy ids and logits
 *   within the mode's tolerance). Without a CUDA device (no driver, or none found) it says why
 *   and exits 77, which meson reports as SKIP.
 * - backend_equiv_cpu (always): the same harness with a CPU backend of other thread count lent
 *   to the engine, its buffers and KV pool from its own alloc hooks, and marked as keeping its
 *   pool in device memory so the engine takes the paths it takes on a GPU; every result must be
 *   bitwise equal (the CPU backend is thread-count invariant). This proves the harness and the
 *   engine's lent-backend path on machines without a GPU.
 *
 * A greedy id may differ only where the CPU's best two logits are closer than twice the mode's
 * logit tolerance (a near tie the rounding can flip); any other difference fails. */
#include "equiv_fixture.h"
#include "td_backend.h"
#include "golden_fixture.h"
#include "half_fixture.h"
#include "td_check.h"
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "td_modelgen.h"

#include <check.h>
#include <float.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------- weights ---------- */

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* A rows x cols matrix of `dt` with random values (the caller frees ->data). */
static td_mat_t rand_mat(td_dtype_t dt, int64_t rows, int64_t cols)
{
    td_mat_t m = {.dtype = dt, .rows = rows, .cols = cols};
    size_t rb = td_dtype_row_bytes(dt, cols);
    uint8_t *d = malloc(rb * (size_t)rows);
    ck_assert_ptr_nonnull(d);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = d + (size_t)r * rb;
        for (int64_t c = 0; c < cols; c++) {
            float v = frand() * 0.25f;
            if (dt == TD_DTYPE_F32) {
                memcpy(row + 4 * c, &v, 4);
            } else if (dt == TD_DTYPE_BF16) {
                uint16_t h = to_bf16(v);
                memcpy(row + 2 * c, &h, 2);
            } else if (dt == TD_DTYPE_F16) {
                uint16_t h = fx_f32_to_f16(v);
                memcpy(row + 2 * c, &h, 2);
            } else if (dt == TD_DTYPE_Q8_0 && c % 32 == 0) {
                uint8_t *blk = row + (c / 32) * 34;
                uint16_t s = fx_f32_to_f16(0.25f / 127);
                memcpy(blk, &s, 2);
                for (int j = 0; j < 32; j++)
                    blk[2 + j] = (uint8_t)(int8_t)(frand() * 127);
            }
        }
    }
    m.data = d;
    return m;
}

/* Whether mode's reference keeps fp32 activations for Q8_0 weights: where the backend under test
 * does (CUDA, and the CPU's emulation of its BF16 mode); a plain CPU backend under test rounds
 * them to 8 bits as the reference does by default (cpu_q8.c), and must match it bitwise. */
static bool ref_f32_act(int mode)
{
#if TD_TEST_CUDA
    (void)mode;
    return true;
#else
    return mode != 0;
#endif
}

static td_backend_t *ref_backend(int mode)
{
    td_cpu_opts_t o = {.n_threads = 1, .f32_activations = ref_f32_act(mode)};
    td_backend_t *b = td_cpu_backend_create_opts(&o);
    ck_assert_ptr_nonnull(b);
    return b;
}

/* bound[t][r] = sum_c |W[r][c] x[t][c]|: what a product's rounding error scales with. */
static double *gemm_bound(const td_mat_t *W, const float *x, int x_ld, int T, int out_ld)
{
    double *bnd = calloc((size_t)T * out_ld, sizeof(double));
    float *row = malloc((size_t)W->cols * sizeof(float));
    for (int64_t r = 0; r < W->rows; r++) {
        td_mat_row_f32(W, r, row);
        for (int t = 0; t < T; t++)
            for (int64_t c = 0; c < W->cols; c++)
                bnd[(size_t)t * out_ld + r] += fabs((double)row[c] * x[(size_t)t * x_ld + c]);
    }
    free(row);
    return bnd;
}

static void check_matmul(td_backend_t *ref, td_backend_t *b, const tol_t *tol, const td_mat_t *W,
                         int T)
{
    int x_ld = (int)W->cols + 5, out_ld = (int)W->rows + 3;
    size_t nx = (size_t)T * x_ld, no = (size_t)T * out_ld;
    float *x = rand_vec(nx, 1), *want = calloc(no, sizeof(float));
    float *dx = up(b, x, nx), *dout = up(b, want, no);
    ref->matmul(ref, want, out_ld, x, x_ld, T, W);
    b->matmul(b, dout, out_ld, dx, x_ld, T, W);
    float *got = down(b, dout, no);
    double *bnd = gemm_bound(W, x, x_ld, T, out_ld);
    char what[96];
    snprintf(what, sizeof(what), "matmul %s %lldx%lld T=%d", td_dtype_name(W->dtype),
             (long long)W->rows, (long long)W->cols, T);
    expect_close(what, tol, got, want, bnd, no, tol->gemm);
    free(x), free(want), free(got), free(bnd);
    release(b, dx), release(b, dout);
}

START_TEST(test_matmul)
{
    const tol_t *tol = &modes[_i];
    td_backend_t *ref = ref_backend(_i), *b = dut(_i);
    const td_dtype_t dts[] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F16, TD_DTYPE_Q8_0};
    /* every matrix stays alive while the backend does: a device backend caches weights by
     * address, as the model's mapping outlives it in the engine */
    const void *keep[TD_ARRAY_LEN(dts)];
    for (size_t k = 0; k < TD_ARRAY_LEN(dts); k++) {
        td_mat_t W = rand_mat(dts[k], 67, 256);
        keep[k] = W.data;
        for (int T = 1; T <= 33; T += 16)
            check_matmul(ref, b, tol, &W, T);
        /* a view of some rows of a matrix already uploaded (per-head slices) */
        td_mat_t v = W;
        v.rows = 20;
        v.data = (const uint8_t *)W.data + 16 * td_dtype_row_bytes(W.dtype, W.cols);
        check_matmul(ref, b, tol, &v, 3);
    }
    ref->destroy(ref);
    b->destroy(b);
    for (size_t k = 0; k < TD_ARRAY_LEN(dts); k++)
        free((void *)keep[k]);
}
END_TEST

START_TEST(test_matmul_t)
{
    const tol_t *tol = &modes[_i];
    td_backend_t *ref = td_cpu_backend_create(1), *b = dut(_i);
    td_mat_t W = rand_mat(TD_DTYPE_BF16, 96, 40);
    const int T = 7, row0 = 32, n_rows = 48, x_ld = 60, out_ld = 45;
    size_t nx = (size_t)T * x_ld, no = (size_t)T * out_ld;
    float *x = rand_vec(nx, 1), *want = calloc(no, sizeof(float));
    float *dx = up(b, x, nx), *dout = up(b, want, no);
    ref->matmul_t(ref, want, out_ld, x, x_ld, T, &W, row0, n_rows);
    b->matmul_t(b, dout, out_ld, dx, x_ld, T, &W, row0, n_rows);
    float *got = down(b, dout, no);
    /* bound: sum_r |x[t][r] W[row0 + r][c]| */
    double *bnd = calloc(no, sizeof(double));
    float row[40];
    for (int r = 0; r < n_rows; r++) {
        td_mat_row_f32(&W, row0 + r, row);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < 40; c++)
                bnd[(size_t)t * out_ld + c] += fabs((double)x[(size_t)t * x_ld + r] * row[c]);
    }
    expect_close("matmul_t", tol, got, want, bnd, no, tol->gemm);
    free(x), free(want), free(got), free(bnd), free((void *)W.data);
    release(b, dx), release(b, dout);
    ref->destroy(ref);
    b->destroy(b);
}
END_TEST

START_TEST(test_elementwise)
{
    const tol_t *tol = &modes[_i];
    td_backend_t *ref = td_cpu_backend_create(1), *b = dut(_i);
    const int T = 9, n = 200, ld = 210;
    size_t N = (size_t)T * ld;

    /* rmsnorm into another buffer and in place */
    float *x = rand_vec(N, 3), *w = rand_vec(n, 1), *want = calloc(N, sizeof(float));
    float *dx = up(b, x, N), *dout = up(b, want, N);
    ref->rmsnorm(ref, want, ld, x, ld, T, n, w, 1e-5f);
    b->rmsnorm(b, dout, ld, dx, ld, T, n, w, 1e-5f);
    float *got = down(b, dout, N);
    expect_close("rmsnorm", tol, got, want, NULL, N, tol->rel);
    free(got);
    ref->rmsnorm(ref, x, ld, x, ld, T, n, w, 1e-5f);
    b->rmsnorm(b, dx, ld, dx, ld, T, n, w, 1e-5f);
    got = down(b, dx, N);
    expect_close("rmsnorm in place", tol, got, x, NULL, N, tol->rel);
    free(got);

    /* rope: both pairings, a YaRN-like mscale, positions far out, heads inside wider rows */
    int32_t pos[9] = {0, 1, 2, 17, 100, 1000, 4095, 30000, 5};
    float inv[8];
    for (int i = 0; i < 8; i++)
        inv[i] = (float)pow(10000.0, -2.0 * i / 16);
    for (int il = 0; il < 2; il++) {
        float *r = rand_vec(N, 1), *dr = up(b, r, N);
        ref->rope(ref, r, ld, T, 4, 40, 16, pos, inv, 1.3f, il);
        b->rope(b, dr, ld, T, 4, 40, 16, pos, inv, 1.3f, il);
        got = down(b, dr, N);
        expect_close(il ? "rope interleaved" : "rope halves", tol, got, r, NULL, N, tol->rel);
        free(r), free(got);
        release(b, dr);
    }

    /* silu_mul and add */
    float *g = rand_vec(N, 4), *u = rand_vec(N, 2), *dg = up(b, g, N), *du = up(b, u, N);
    ref->silu_mul(ref, g, ld, u, ld, T, n);
    b->silu_mul(b, dg, ld, du, ld, T, n);
    got = down(b, dg, N);
    expect_close("silu_mul", tol, got, g, NULL, N, tol->rel);
    free(got);
    ref->add(ref, g, u, N);
    b->add(b, dg, du, N);
    got = down(b, dg, N);
    expect_close("add", tol, got, g, NULL, N, tol->rel);
    free(got), free(g), free(u), free(x), free(w), free(want);
    release(b, dg), release(b, du), release(b, dx), release(b, dout);
    ref->destroy(ref);
    b->destroy(b);
}
END_TEST

/* ---------- the cache and attention ---------- */

/* A layout for tests: block_size tokens of tf floats over n_layers layers. */
static td_kv_layout_t test_layout(int block_size, int n_layers, int tf)
{
    td_kv_layout_t l;
    memset(&l, 0, sizeof(l));
    l.dtype = TD_DTYPE_F32;
    l.block_size = block_size;
    l.n_layers = n_layers;
    l.token_floats = tf;
    l.layer_bytes = (size_t)block_size * tf * sizeof(float);
    l.block_bytes = l.layer_bytes * n_layers;
    return l;
}

#define N_SEQ 4
static const int seq_len[N_SEQ] = {1, 13, 70, 150}; /* one token, chunks of 64 and beyond */

typedef struct cache_fx {
    td_kv_pool_t pref, pdut;
    int32_t *blocks[N_SEQ];
    td_attn_tok_t *all; /* every position of every sequence */
    int n_all;
} cache_fx_t;

/* Both pools filled by kv_store with the same random KV of every position of every sequence (one
 * call: many sequences at once), with scattered block tables. Checks the stored bytes. */
static void cache_fill(cache_fx_t *f, td_backend_t *ref, td_backend_t *b, int tf)
{
    const int B = 4, L = 2;
    td_kv_layout_t lay = test_layout(B, L, tf);
    int n_blocks = 0;
    for (int s = 0; s < N_SEQ; s++)
        n_blocks += (seq_len[s] + B - 1) / B;
    n_blocks += 5;
    ck_assert_int_eq(td_kv_pool_init(&f->pref, &lay, n_blocks), 0);
    ck_assert_int_eq(td_backend_kv_pool_init(b, &f->pdut, &lay, n_blocks), 0);
    /* blocks handed out in a scrambled order */
    int32_t *perm = malloc((size_t)n_blocks * sizeof(int32_t));
    for (int i = 0; i < n_blocks; i++)
        perm[i] = (int32_t)((i * 7 + 3) % n_blocks);
    int next = 0;
    f->n_all = 0;
    for (int s = 0; s < N_SEQ; s++) {
        int nb = (seq_len[s] + B - 1) / B;
        f->blocks[s] = malloc((size_t)nb * sizeof(int32_t));
        for (int k = 0; k < nb; k++)
            f->blocks[s][k] = perm[next++];
        f->n_all += seq_len[s];
    }
    free(perm);
    f->all = calloc((size_t)f->n_all, sizeof(td_attn_tok_t));
    for (int s = 0, t = 0; s < N_SEQ; s++)
        for (int p = 0; p < seq_len[s]; p++, t++)
            f->all[t] = (td_attn_tok_t){f->blocks[s], p, 0};
    for (int layer = 0; layer < L; layer++) {
        int ld = tf + 3;
        size_t n = (size_t)f->n_all * ld;
        float *src = rand_vec(n, 1), *dsrc = up(b, src, n);
        ref->kv_store(ref, &f->pref, layer, f->all, f->n_all, src, ld);
        b->kv_store(b, &f->pdut, layer, f->all, f->n_all, dsrc, ld);
        free(src);
        release(b, dsrc);
    }
    uint8_t *blk = malloc(lay.block_bytes);
    for (int i = 0; i < n_blocks; i++) {
        td_backend_kv_block_out(b, &f->pdut, i, blk);
        ck_assert_msg(memcmp(blk, td_kv_block_data(&f->pref, i), lay.block_bytes) == 0,
                      "kv_store: block %d differs", i);
    }
    free(blk);
}

static void cache_free(cache_fx_t *f, td_backend_t *b)
{
    td_kv_pool_free(&f->pref);
    td_backend_kv_pool_free(b, &f->pdut);
    for (int s = 0; s < N_SEQ; s++)
        free(f->blocks[s]);
    free(f->all);
}

/* The queries of a step: every position of seq 1 (a prefill), the last of the others (decodes),
 * seq 3 also with a sliding window. */
static int query_toks(const cache_fx_t *f, td_attn_tok_t *q)
{
    int T = 0;
    for (int p = 0; p < seq_len[1]; p++)
        q[T++] = (td_attn_tok_t){f->blocks[1], p, 0};
    q[T++] = (td_attn_tok_t){f->blocks[0], 0, 0};
    q[T++] = (td_attn_tok_t){f->blocks[2], seq_len[2] - 1, 0};
    q[T++] = (td_attn_tok_t){f->blocks[3], seq_len[3] - 1, 0};
    q[T++] = (td_attn_tok_t){f->blocks[3], seq_len[3] - 1, seq_len[3] - 40};
    return T;
}

START_TEST(test_attn_gqa)
{
    const tol_t *tol = &modes[_i];
    static const int shapes[][3] = {{4, 2, 16}, {8, 2, 128}, {6, 6, 64}}; /* heads, kv, dim */
    for (size_t k = 0; k < TD_ARRAY_LEN(shapes); k++) {
        td_backend_t *ref = td_cpu_backend_create(1), *b = dut(_i);
        int nh = shapes[k][0], nkv = shapes[k][1], hd = shapes[k][2];
        cache_fx_t f;
        cache_fill(&f, ref, b, 2 * nkv * hd);
        td_attn_tok_t q[64];
        int T = query_toks(&f, q), ld = nh * hd + 8;
        size_t n = (size_t)T * ld;
        float *qv = rand_vec(n, 1), *want = calloc(n, sizeof(float));
        float *dq = up(b, qv, n), *dout = up(b, want, n);
        for (int layer = 0; layer < 2; layer++) {
            float scale = 1.0f / sqrtf((float)hd);
            ref->attn_gqa(ref, want, ld, qv, ld, T, q, &f.pref, layer, nh, nkv, hd, scale);
            b->attn_gqa(b, dout, ld, dq, ld, T, q, &f.pdut, layer, nh, nkv, hd, scale);
            float *got = down(b, dout, n);
            char what[64];
            snprintf(what, sizeof(what), "attn_gqa %d/%d x %d layer %d", nh, nkv, hd, layer);
            expect_close_abs(what, tol, got, want, NULL, n, tol->rel, tol->attn_abs);
            free(got);
        }
        free(qv), free(want);
        release(b, dq), release(b, dout);
        cache_free(&f, b);
        ref->destroy(ref);
        b->destroy(b);
    }
}
END_TEST

START_TEST(test_attn_mla)
{
    const tol_t *tol = &modes[_i];
    static const int shapes[][3] = {{4, 32, 16}, {16, 512, 64}}; /* heads, kv_rank, rope */
    for (size_t k = 0; k < TD_ARRAY_LEN(shapes); k++) {
        td_backend_t *ref = td_cpu_backend_create(1), *b = dut(_i);
        int nh = shapes[k][0], R = shapes[k][1], rope = shapes[k][2], qk = 16 + rope;
        cache_fx_t f;
        cache_fill(&f, ref, b, R + rope);
        td_attn_tok_t q[64];
        int T = query_toks(&f, q);
        size_t nl = (size_t)T * nh * R, npe = (size_t)T * nh * qk;
        float *ql = rand_vec(nl, 1), *qpe = rand_vec(npe, 1), *want = calloc(nl, sizeof(float));
        float *dql = up(b, ql, nl), *dqpe = up(b, qpe, npe), *dout = up(b, want, nl);
        float scale = 0.7f / sqrtf((float)qk);
        /* q_pe sits after 16 "nope" values inside each head of a [nh][qk] row, as the engine has it
         */
        ref->attn_mla(ref, want, ql, qpe + 16, nh * qk, qk, T, q, &f.pref, 1, nh, R, rope, scale);
        b->attn_mla(b, dout, dql, dqpe + 16, nh * qk, qk, T, q, &f.pdut, 1, nh, R, rope, scale);
        float *got = down(b, dout, nl);
        char what[64];
        snprintf(what, sizeof(what), "attn_mla %d heads rank %d rope %d", nh, R, rope);
        expect_close_abs(what, tol, got, want, NULL, nl, tol->rel, tol->attn_abs);
        free(got), free(ql), free(qpe), free(want);
        release(b, dql), release(b, dqpe), release(b, dout);
        cache_free(&f, b);
        ref->destroy(ref);
        b->destroy(b);
    }
}
END_TEST

START_TEST(test_memory)
{
    td_backend_t *b = dut(_i);
    const td_mem_kind_t kinds[] = {TD_MEM_HOST, TD_MEM_DEVICE, TD_MEM_SHARED, TD_MEM_PINNED};
    float *src = rand_vec(1000, 1);
    for (size_t k = 0; k < TD_ARRAY_LEN(kinds); k++) {
        float *p = b->alloc(b, 1000 * sizeof(float), kinds[k]);
        ck_assert_msg(p != NULL, "alloc kind %d: %s", (int)kinds[k], td_err_msg());
        ck_assert_int_eq((uintptr_t)p % 64, 0);
        float *z = down(b, p, 1000); /* zeroed */
        for (int i = 0; i < 1000; i++)
            ck_assert_msg(z[i] == 0.0f, "kind %d not zeroed at %d", (int)kinds[k], i);
        free(z);
        b->copy(b, p, src, 1000 * sizeof(float));
        if (kinds[k] == TD_MEM_HOST || kinds[k] == TD_MEM_SHARED || kinds[k] == TD_MEM_PINNED) {
            b->sync(b); /* the host reads these directly after a sync */
            ck_assert_int_eq(memcmp(p, src, 1000 * sizeof(float)), 0);
        }
        float *back = down(b, p, 1000);
        ck_assert_int_eq(memcmp(back, src, 1000 * sizeof(float)), 0);
        free(back);
        b->free(b, p, kinds[k]);
    }
    /* a pool in the backend's memory; blocks staged out and in through pinned memory */
    td_kv_layout_t lay = test_layout(4, 3, 10);
    td_kv_pool_t p;
    ck_assert_int_eq(td_backend_kv_pool_init(b, &p, &lay, 5), 0);
    ck_assert_int_eq(p.mem_kind, b->kv_mem);
    uint8_t *stage = b->alloc(b, lay.block_bytes, TD_MEM_PINNED),
            *zero = calloc(1, lay.block_bytes);
    memcpy(stage, src, lay.block_bytes);
    td_backend_kv_block_in(b, &p, 3, stage);
    memset(stage, 0, lay.block_bytes);
    td_backend_kv_block_out(b, &p, 2, stage);
    ck_assert_int_eq(memcmp(stage, zero, lay.block_bytes), 0);
    td_backend_kv_block_out(b, &p, 3, stage);
    ck_assert_int_eq(memcmp(stage, src, lay.block_bytes), 0);
    b->free(b, stage, TD_MEM_PINNED);
    td_backend_kv_pool_free(b, &p);
    free(zero), free(src);
    b->destroy(b);
}
END_TEST

/* ---------- what a device backend prepares on the host ---------- */

START_TEST(test_tok_tables)
{
    /* three sequences, tokens interleaved (a sequence's tokens need not be adjacent) */
    int32_t a[5] = {7, 3, 9, 1, 4}, b[2] = {11, 12}, c[1] = {5};
    td_attn_tok_t toks[] = {{a, 0, 0}, {a, 1, 0}, {b, 5, 2}, {a, 17, 3},
                            {c, 2, 0}, {b, 7, 0}, {a, 6, 0}};
    const int T = (int)TD_ARRAY_LEN(toks), B = 4;
    td_tok_tables_t tt = {0};
    for (int round = 0; round < 2; round++) { /* reused: the second build starts from the first */
        ck_assert_int_eq(td_tok_tables_build(&tt, toks, T - round, B), 0);
        int n = T - round;
        /* a: 17 / 4 + 1 = 5 blocks, b: 2, c: 1: each table once */
        ck_assert_uint_eq(tt.n_words, (size_t)n * 4 + 5 + 2 + 1);
        for (int t = 0; t < n; t++) {
            const int32_t *w = tt.words + 4 * t;
            ck_assert_int_eq(w[0], toks[t].pos);
            ck_assert_int_eq(w[1], toks[t].start);
            ck_assert_int_eq(w[3], 0);
            for (int p = 0; p <= toks[t].pos; p++)
                ck_assert_int_eq(tt.words[4 * n + w[2] + p / B], toks[t].blocks[p / B]);
        }
    }
    ck_assert_int_eq(td_tok_tables_build(&tt, toks, 0, B), 0);
    ck_assert_uint_eq(tt.n_words, 0);
    td_tok_tables_free(&tt);
}
END_TEST

/* The CPU backend itself: a token's products alone (one token's kernels, straight from the stored
 * blocks, several rows at a time) bitwise equal the same token's in a batch of five (the tiles),
 * at one and two threads, with rows long enough to go in two column chunks, for every weight
 * type the one-token kernels read and both activation modes (Q8_0 against fp32 activations takes
 * q8_0_rows). Seven rows: the groups of three and four leave a remainder on either thread. */
START_TEST(test_cpu_token_invariant)
{
    const td_dtype_t dts[] = {TD_DTYPE_F32, TD_DTYPE_BF16, TD_DTYPE_F16, TD_DTYPE_Q8_0};
    const int64_t rows = 7, cols = 16384 + 512, T = 5;
    const int x_ld = (int)cols + 3, out_ld = (int)rows + 2;
    float *x = rand_vec((size_t)T * x_ld, 1), *batch = calloc((size_t)T * out_ld, sizeof(float)),
          *one = calloc((size_t)out_ld, sizeof(float));
    for (int threads = 1; threads <= 2; threads++) {
        for (int f32_act = 0; f32_act <= 1; f32_act++) {
            td_cpu_opts_t o = {.n_threads = threads, .f32_activations = f32_act};
            td_backend_t *b = td_cpu_backend_create_opts(&o);
            ck_assert_ptr_nonnull(b);
            for (size_t k = 0; k < TD_ARRAY_LEN(dts); k++) {
                td_mat_t W = rand_mat(dts[k], rows, cols);
                b->matmul(b, batch, out_ld, x, x_ld, (int)T, &W);
                for (int64_t t = 0; t < T; t++) {
                    b->matmul(b, one, out_ld, x + t * x_ld, x_ld, 1, &W);
                    for (int64_t r = 0; r < rows; r++)
                        ck_assert_msg(memcmp(&one[r], &batch[t * out_ld + r], 4) == 0,
                                      "%s threads %d f32_act %d token %lld row %lld: %a, in the "
                                      "batch %a",
                                      td_dtype_name(W.dtype), threads, f32_act, (long long)t,
                                      (long long)r, one[r], batch[t * out_ld + r]);
                }
                free((void *)W.data);
            }
            b->destroy(b);
        }
    }
    free(x), free(batch), free(one);
}
END_TEST

/* The nearest BF16 by search over the two candidates, ties to even: independent of the shifts
 * td_bf16_round uses. */
static uint16_t bf16_nearest(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if (isinf(f))
        return lo;
    uint32_t ul = (uint32_t)lo << 16, uh = (uint32_t)hi << 16;
    float fl, fh;
    memcpy(&fl, &ul, 4);
    memcpy(&fh, &uh, 4);
    double dl = fabs((double)f - fl), dh = isinf(fh) && !isinf(f)
                                               ? fabs((double)f - copysign(0x1p128, f))
                                               : fabs((double)f - fh);
    if (dl != dh)
        return dl < dh ? lo : hi;
    return (lo & 1) ? hi : lo;
}

START_TEST(test_bf16_round)
{
    enum { N = 200000 };
    float *in = malloc(N * sizeof(float));
    uint16_t *out = malloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++) {
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(rng_state >> 32);
        if (i % 4 == 0)
            u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        memcpy(&in[i], &u, 4);
        if (isnan(in[i]))
            in[i] = 1.0f;
    }
    in[0] = FLT_MAX; /* rounds up to infinity */
    in[1] = INFINITY;
    in[2] = -0.0f;
    in[3] = 0x1p-140f; /* subnormal */
    td_bf16_round(in, out, N);
    for (int i = 0; i < N; i++)
        ck_assert_msg(out[i] == bf16_nearest(in[i]), "bf16(%a): %04x, want %04x", in[i], out[i],
                      bf16_nearest(in[i]));
    ck_assert_uint_eq(out[0], 0x7f80);
    float nan = NAN;
    uint16_t h;
    td_bf16_round(&nan, &h, 1);
    ck_assert_msg((h & 0x7f80) == 0x7f80 && (h & 0x7f), "NaN rounded to %04x", h);
    /* in place over the float buffer, as the weight upload packs */
    uint16_t *inplace = (uint16_t *)in;
    td_bf16_round(in, inplace, N);
    ck_assert_int_eq(memcmp(inplace, out, N * sizeof(uint16_t)), 0);
    free(in);
    free(out);
}
END_TEST

/* ---------- the engine ---------- */

static int argmax2(const float *v, int n, double *margin)
{
    int a = 0, s = -1;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[a]) {
            s = a;
            a = i;
        } else if (s < 0 || v[i] > v[s]) {
            s = i;
        }
    }
    *margin = s < 0 ? INFINITY : (double)v[a] - v[s];
    return a;
}

/* Logits of the engine under test against the CPU engine's; the greedy ids must agree unless the
 * CPU's best two are within the tolerance's reach. Returns the largest relative difference. */
static int near_ties; /* greedy differences the rule below excused, in the current run */

static double expect_logits(const char *what, int step, const tol_t *tol, const float *got,
                            const float *want, int V)
{
    double mx = 0, err = 0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, fabs(want[i]));
    for (int i = 0; i < V; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (tol->logit == 0)
            ck_assert_msg(memcmp(&got[i], &want[i], 4) == 0, "%s step %d: logit %d %.9g, want %.9g",
                          what, step, i, got[i], want[i]);
        err = fmax(err, d / (mx > 0 ? mx : 1));
    }
    ck_assert_msg(err <= tol->logit, "%s (%s) step %d: logits differ by %.3g of their range", what,
                  tol->name, step, err);
    double mg, mg2;
    int a = argmax2(want, V, &mg), g = argmax2(got, V, &mg2);
    ck_assert_msg(a == g || mg < 2 * tol->logit * mx,
                  "%s (%s) step %d: greedy %d, the CPU's %d (margin %.3g)", what, tol->name, step,
                  g, a, mg);
    near_ties += a != g;
    return err;
}

/* Two sequences on both engines: seq 0 prefilled in two chunks, seq 1 whole in the first step with
 * seq 0's first chunk, then `n_dec` decode steps of both together, each fed the CPU's greedy id. */
static void engine_pair(const char *what, const char *path, const tol_t *tol, int mode)
{
    td_model_t *m;
    ck_assert_msg(td_model_load(path, &m) == 0, "load %s: %s", path, td_err_msg());
    td_backend_t *b = dut(mode);
    td_engine_t *er, *ed;
    td_engine_opts_t oref = {.n_threads = 1, .f32_activations = ref_f32_act(mode)},
                     odut = {.backend = b};
    ck_assert_int_eq(td_engine_create(m, &oref, &er), 0);
    ck_assert_msg(td_engine_create(m, &odut, &ed) == 0, "%s", td_err_msg());
    td_kv_layout_t lay;
    ck_assert_int_eq(td_kv_layout_init(&lay, m, 4), 0);
    td_kv_pool_t pr, pd;
    ck_assert_int_eq(td_kv_pool_init(&pr, &lay, 64), 0);
    ck_assert_int_eq(td_backend_kv_pool_init(b, &pd, &lay, 64), 0);
    td_kv_seq_t sr[2], sd[2];
    for (int i = 0; i < 2; i++)
        td_kv_seq_init(&sr[i]), td_kv_seq_init(&sd[i]);
    int V = m->cfg.vocab_size;
    int32_t prompt[23], p1[9];
    for (int i = 0; i < 23; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % V);
    for (int i = 0; i < 9; i++)
        p1[i] = (int32_t)((i * 53 + 5) % V);
    float *lr[2], *ld[2];
    for (int i = 0; i < 2; i++)
        lr[i] = calloc((size_t)V, sizeof(float)), ld[i] = calloc((size_t)V, sizeof(float));
    double worst = 0;
    near_ties = 0;

    td_batch_seq_t a[2] = {{&sr[0], prompt, 16, NULL}, {&sr[1], p1, 9, lr[1]}};
    td_batch_seq_t d[2] = {{&sd[0], prompt, 16, NULL}, {&sd[1], p1, 9, ld[1]}};
    ck_assert_int_eq(td_engine_step(er, &pr, a, 2), 0);
    ck_assert_msg(td_engine_step(ed, &pd, d, 2) == 0, "%s", td_err_msg());
    worst = fmax(worst, expect_logits(what, 0, tol, ld[1], lr[1], V));
    td_batch_seq_t a2 = {&sr[0], prompt + 16, 7, lr[0]}, d2 = {&sd[0], prompt + 16, 7, ld[0]};
    ck_assert_int_eq(td_engine_step(er, &pr, &a2, 1), 0);
    ck_assert_int_eq(td_engine_step(ed, &pd, &d2, 1), 0);
    worst = fmax(worst, expect_logits(what, 1, tol, ld[0], lr[0], V));
    for (int step = 2; step < 20; step++) {
        int32_t tok[2];
        double mg;
        for (int i = 0; i < 2; i++)
            tok[i] = argmax2(lr[i], V, &mg);
        td_batch_seq_t ra[2] = {{&sr[0], &tok[0], 1, lr[0]}, {&sr[1], &tok[1], 1, lr[1]}};
        td_batch_seq_t da[2] = {{&sd[0], &tok[0], 1, ld[0]}, {&sd[1], &tok[1], 1, ld[1]}};
        ck_assert_int_eq(td_engine_step(er, &pr, ra, 2), 0);
        ck_assert_int_eq(td_engine_step(ed, &pd, da, 2), 0);
        for (int i = 0; i < 2; i++)
            worst = fmax(worst, expect_logits(what, step, tol, ld[i], lr[i], V));
    }
    printf("equiv %-26s %s: 20 steps, greedy ids agree (%d near ties excused), logits within %.3g "
           "of their range\n",
           what, tol->name, near_ties, worst);
    for (int i = 0; i < 2; i++) {
        td_kv_seq_release(&pr, &sr[i]);
        td_kv_seq_release(&pd, &sd[i]);
        free(lr[i]), free(ld[i]);
    }
    td_kv_pool_free(&pr);
    td_backend_kv_pool_free(b, &pd);
    td_engine_free(er);
    td_engine_free(ed);
    b->destroy(b);
    td_model_free(m);
}

typedef struct variant {
    const char *name;
    td_modelgen_arch_t arch;
    td_modelgen_dtype_t dtype;
    bool fp8, gguf;
    td_modelgen_dtype_t gguf_dtype;
} variant_t;

static const variant_t variants[] = {
    {"llama", TD_MODELGEN_LLAMA, TD_MODELGEN_F32, false, false, 0},
    {"llama_gguf_q8_0", TD_MODELGEN_LLAMA, TD_MODELGEN_F32, false, true, TD_MODELGEN_Q8_0},
    {"qwen3", TD_MODELGEN_QWEN3, TD_MODELGEN_F32, false, false, 0},
    {"deepseek_v2", TD_MODELGEN_DEEPSEEK_V2, TD_MODELGEN_F32, false, false, 0},
    {"deepseek_v2_gguf_f16", TD_MODELGEN_DEEPSEEK_V2, TD_MODELGEN_F32, false, true,
     TD_MODELGEN_F16},
    {"deepseek_v3_bf16", TD_MODELGEN_DEEPSEEK_V3, TD_MODELGEN_BF16, false, false, 0},
    {"deepseek_v3_fp8", TD_MODELGEN_DEEPSEEK_V3, TD_MODELGEN_F32, true, false, 0},
};

START_TEST(test_engine_tiny_models)
{
    char tmpl[] = "/tmp/td_equiv_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(tmpl));
    for (size_t k = 0; k < TD_ARRAY_LEN(variants); k++) {
        const variant_t *v = &variants[k];
        bool moe = v->arch == TD_MODELGEN_DEEPSEEK_V2 || v->arch == TD_MODELGEN_DEEPSEEK_V3;
        if (moe && !modes[_i].moe)
            continue;
        char dir[4200], path[4300];
        snprintf(dir, sizeof(dir), "%s/%s", tmpl, v->name);
        td_modelgen_opts_t o = {.arch = v->arch,
                                .seed = 7,
                                .dtype = v->dtype,
                                .fp8 = v->fp8,
                                .gguf = v->gguf,
                                .gguf_dtype = v->gguf_dtype,
                                .out_dir = dir};
        ck_assert_msg(td_modelgen_write(&o, NULL) == 0, "%s: %s", v->name, td_err_msg());
        snprintf(path, sizeof(path), v->gguf ? "%s/model.gguf" : "%s", dir);
        engine_pair(v->name, path, &modes[_i], _i);
        char cmd[4400];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
    rmdir(tmpl);
}
END_TEST

/* One golden fixture on the backend under test: the prompt prefilled, then the golden ids fed one
 * by one; each step's greedy id must be the golden one (unless the golden top two are within the
 * mode's logprob tolerance) and its top-5 logprobs within that tolerance. */
static void golden_case(const char *name, const char *rel, const tol_t *tol, int mode)
{
    char path[4300], gpath[4300];
    snprintf(path, sizeof(path), "%s/%s/%s", golden_dir, name, rel);
    snprintf(gpath, sizeof(gpath), "%s/%s/golden.json", golden_dir, name);
    json_object *g = json_object_from_file(gpath), *jp, *jg, *jt;
    ck_assert_msg(g != NULL, "cannot read %s", gpath);
    ck_assert(json_object_object_get_ex(g, "prompt_token_ids", &jp));
    ck_assert(json_object_object_get_ex(g, "greedy_token_ids", &jg));
    ck_assert(json_object_object_get_ex(g, "top5_logprobs_per_step", &jt));
    td_model_t *m;
    ck_assert_msg(td_model_load(path, &m) == 0, "load %s: %s", path, td_err_msg());
    td_backend_t *b = dut(mode);
    td_engine_t *e;
    td_engine_opts_t o = {.backend = b};
    ck_assert_int_eq(td_engine_create(m, &o, &e), 0);
    td_kv_layout_t lay;
    ck_assert_int_eq(td_kv_layout_init(&lay, m, 16), 0);
    td_kv_pool_t pool;
    ck_assert_int_eq(td_backend_kv_pool_init(b, &pool, &lay, 64), 0);
    td_kv_seq_t seq;
    td_kv_seq_init(&seq);
    int V = m->cfg.vocab_size, np = (int)json_object_array_length(jp);
    int ng = (int)json_object_array_length(jg);
    int32_t *prompt = calloc((size_t)np, sizeof(int32_t));
    float *logits = calloc((size_t)V, sizeof(float));
    for (int i = 0; i < np; i++)
        prompt[i] = json_object_get_int(json_object_array_get_idx(jp, i));
    td_batch_seq_t bs = {&seq, prompt, np, logits};
    ck_assert_msg(td_engine_step(e, &pool, &bs, 1) == 0, "%s", td_err_msg());
    double max_err = 0;
    for (int step = 0; step < ng; step++) {
        int want = json_object_get_int(json_object_array_get_idx(jg, step));
        json_object *top = json_object_array_get_idx(jt, step);
        double lp0 = 0, lp1 = -INFINITY;
        for (size_t k = 0; k < json_object_array_length(top); k++) {
            json_object *pair = json_object_array_get_idx(top, k);
            int id = json_object_get_int(json_object_array_get_idx(pair, 0));
            double lp = json_object_get_double(json_object_array_get_idx(pair, 1));
            if (k == 0)
                lp0 = lp;
            else if (k == 1)
                lp1 = lp;
            double err = fabs(log_softmax_at(logits, V, id) - lp);
            max_err = fmax(max_err, err);
            ck_assert_msg(err < tol->golden_lp,
                          "%s (%s) step %d token %d: logprob %.6f, golden %.6f", name, tol->name,
                          step, id, log_softmax_at(logits, V, id), lp);
        }
        double mg;
        int got = argmax2(logits, V, &mg);
        ck_assert_msg(got == want || lp0 - lp1 < 2 * tol->golden_lp,
                      "%s (%s) step %d: greedy %d, golden %d", name, tol->name, step, got, want);
        int32_t tok = want;
        td_batch_seq_t d = {&seq, &tok, 1, logits};
        ck_assert_int_eq(td_engine_step(e, &pool, &d, 1), 0);
    }
    printf("golden %-18s %s: %d greedy ids match, max top-5 logprob error %.3g\n", name, tol->name,
           ng, max_err);
    td_kv_seq_release(&pool, &seq);
    td_backend_kv_pool_free(b, &pool);
    td_engine_free(e);
    b->destroy(b);
    td_model_free(m);
    free(prompt);
    free(logits);
    json_object_put(g);
}

START_TEST(test_golden)
{
    if (!have_golden()) {
        /* bench/gpu_check.sh sets TD_REQUIRE_GOLDEN: a device check without them proves less */
        ck_assert_msg(!getenv("TD_REQUIRE_GOLDEN"), "golden fixtures not found at %s", golden_dir);
        printf("golden fixtures not found at %s: golden cases not run\n", golden_dir);
        return;
    }
    if (modes[_i].moe) {
        golden_case("deepseek_v3_tiny", "", &modes[_i], _i);
        golden_case("deepseek_v2_tiny", "", &modes[_i], _i);
    }
    golden_case("llama_tiny", "model.gguf", &modes[_i], _i);
}
END_TEST

/* One head's attention in double, straight from the pool: scores k . q * scale over positions
 * start..pos, softmax, the weighted sum of v. k and v at koff / voff floats into a token's row. */
static void naive_head(const td_kv_pool_t *pool, int layer, const td_attn_tok_t *tk, const float *q,
                       const float *qpe, int d, int koff, int voff, int rope, float scale,
                       double *out)
{
    int B = pool->layout.block_size, n = tk->pos - tk->start + 1;
    double *s = malloc((size_t)n * sizeof(double)), mx = -INFINITY, l = 0;
    for (int p = tk->start; p <= tk->pos; p++) {
        const float *kv = td_kv_slot(pool, tk->blocks[p / B], layer, p % B);
        double a = 0;
        for (int i = 0; i < d; i++)
            a += (double)q[i] * kv[koff + i];
        for (int i = 0; i < rope; i++)
            a += (double)qpe[i] * kv[d + i];
        s[p - tk->start] = a * scale;
        mx = fmax(mx, a * scale);
    }
    for (int i = 0; i < d; i++)
        out[i] = 0;
    for (int p = tk->start; p <= tk->pos; p++) {
        const float *kv = td_kv_slot(pool, tk->blocks[p / B], layer, p % B);
        double w = exp(s[p - tk->start] - mx);
        l += w;
        for (int i = 0; i < d; i++)
            out[i] += w * kv[voff + i];
    }
    for (int i = 0; i < d; i++)
        out[i] /= l;
    free(s);
}

/* The CPU backend's attention takes the query heads that read the same keys together, a run of
 * at most eight (fewer for wide heads) at a time: each head must still get its own attention.
 * Against naive_head, at one and two threads, with groups of one, of 10 (8 + 2), of 8 heads of
 * width 2048 (runs of 4), and MLA's 20 heads (8 + 8 + 4) and 3 of width 4096 (2 + 1). */
START_TEST(test_attn_heads_alone)
{
    static const int gqa[][3] = {{6, 6, 64}, {20, 2, 64}, {8, 1, 2048}}; /* heads, kv, dim */
    static const int mla[][3] = {{20, 512, 64}, {3, 4096, 16}};          /* heads, rank, rope */
    for (int th = 1; th <= 2; th++) {
        for (size_t k = 0; k < TD_ARRAY_LEN(gqa) + TD_ARRAY_LEN(mla); k++) {
            bool is_mla = k >= TD_ARRAY_LEN(gqa);
            const int *sh = is_mla ? mla[k - TD_ARRAY_LEN(gqa)] : gqa[k];
            int nh = sh[0], d = sh[1], nkv = is_mla ? 1 : sh[1], rope = is_mla ? sh[2] : 0;
            if (!is_mla)
                d = sh[2], nkv = sh[1];
            td_backend_t *ref = td_cpu_backend_create(1), *b = td_cpu_backend_create(th);
            cache_fx_t f;
            cache_fill(&f, ref, b, is_mla ? d + rope : 2 * nkv * d);
            td_attn_tok_t q[64];
            int T = query_toks(&f, q), qld = nh * d + 8, qk = 16 + rope;
            float *qv = rand_vec((size_t)T * qld, 1), *qpe = rand_vec((size_t)T * nh * qk + 16, 1);
            float *out = calloc((size_t)T * qld, sizeof(float)), scale = 0.6f / sqrtf((float)d);
            if (is_mla)
                b->attn_mla(b, out, qv, qpe + 16, nh * qk, qk, T, q, &f.pdut, 1, nh, d, rope,
                            scale);
            else
                b->attn_gqa(b, out, qld, qv, qld, T, q, &f.pdut, 1, nh, nkv, d, scale);
            double *want = malloc((size_t)d * sizeof(double)), worst = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < nh; h++) {
                    int kvh = h / (nh / nkv);
                    const float *qh = is_mla ? qv + ((size_t)t * nh + h) * d
                                             : qv + (size_t)t * qld + (size_t)h * d;
                    const float *o = is_mla ? out + ((size_t)t * nh + h) * d
                                            : out + (size_t)t * qld + (size_t)h * d;
                    naive_head(&f.pdut, 1, &q[t], qh, qpe + 16 + ((size_t)t * nh + h) * qk, d,
                               is_mla ? 0 : kvh * d, is_mla ? 0 : (nkv + kvh) * d, rope, scale,
                               want);
                    for (int i = 0; i < d; i++)
                        worst = fmax(worst, fabs(o[i] - want[i]));
                }
            ck_assert_msg(worst < 2e-5, "%s %d heads, %d kv, width %d, %d threads: off by %g",
                          is_mla ? "mla" : "gqa", nh, nkv, d, th, worst);
            free(want), free(out), free(qv), free(qpe);
            cache_free(&f, b);
            ref->destroy(ref);
            b->destroy(b);
        }
    }
}
END_TEST

int main(void)
{
#if TD_TEST_CUDA
    /* Probe in a child: a CUDA context does not survive fork, and Check forks for every test. */
    pid_t pid = fork();
    if (pid == 0) {
        if (td_cuda_device_count() == 0) {
            printf("SKIP: %s\n", td_err_msg());
            fflush(stdout);
            _exit(77);
        }
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return 1;
    if (WEXITSTATUS(st) != 0)
        return WEXITSTATUS(st);
#endif
    Suite *s = suite_create("backend_equiv");
    TCase *ops = tcase_create("ops"), *eng = tcase_create("engine");
    tcase_add_loop_test(ops, test_matmul, 0, N_MODES);
    tcase_add_loop_test(ops, test_matmul_t, 0, N_MODES);
    tcase_add_loop_test(ops, test_elementwise, 0, N_MODES);
    tcase_add_loop_test(ops, test_attn_gqa, 0, N_MODES);
    tcase_add_loop_test(ops, test_attn_mla, 0, N_MODES);
    tcase_add_loop_test(ops, test_memory, 0, N_MODES);
    tcase_add_test(ops, test_tok_tables);
    tcase_add_test(ops, test_bf16_round);
    tcase_add_test(ops, test_cpu_token_invariant);
    tcase_add_test(ops, test_attn_heads_alone);
    tcase_add_loop_test(eng, test_engine_tiny_models, 0, N_MODES);
    tcase_add_loop_test(eng, test_golden, 0, N_MODES);
    tcase_set_timeout(eng, 600);
    suite_add_tcase(s, ops);
    suite_add_tcase(s, eng);
    return td_check_run(s);
}
