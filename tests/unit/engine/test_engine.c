/* test_engine.c: the engine's invariants on small generated models: prefill at once, in chunks or
 * token by token gives the same logits; a mixed batch gives what each sequence gives alone; block
 * sizes agree; the same weights in every supported file form (safetensors F32/F16/BF16/FP8,
 * sharded, fused experts; GGUF F32/Q8_0) give the same logits; chunking and batching stay bitwise
 * invariant on llama.cpp's block formats too (mkmodel's Q4_K_M, Q4_0, Q8_0 and F16 GGUF copies); the KV
 * layout fingerprint; weights moved to anonymous memory give the same bits. */
#include "model_fixture.h"
#include "td_engine.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_model.h"
#include "td_check.h"
#include "td_modelgen.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/td_engine_XXXXXX";

static const int32_t prompt[] = {3, 17, 42, 5, 88, 9, 9, 61, 2, 70, 33, 12, 50, 7, 94, 21, 64};
#define NP ((int)(sizeof(prompt) / sizeof(prompt[0])))

/* A model directory (HF layout) under tmpdir. */
static void write_hf(const char *name, fx_set_t *s, const fx_cfg_t *c, fx_st_opts_t o, char *dir,
                     size_t n)
{
    snprintf(dir, n, "%s/%s", tmpdir, name);
    mkdir(dir, 0755);
    fx_write_config(dir, c);
    fx_write_safetensors(dir, s, c, &o);
}

typedef struct runner {
    td_model_t *m;
    td_engine_t *e;
    td_kv_pool_t pool;
    int V;
} runner_t;

static int n_threads = 2;
static bool f32_act; /* the engines' CPU backends keep fp32 activations for Q8_0 / Q4_0 weights */

static void runner_open(runner_t *r, const char *path, int block)
{
    int rc = td_model_load(path, &r->m);
    ck_assert_msg(rc == 0, "%s: %s", path, td_err_msg());
    td_engine_opts_t o = {.n_threads = n_threads, .f32_activations = f32_act};
    ck_assert_int_eq(td_engine_create(r->m, &o, &r->e), 0);
    td_kv_layout_t l;
    ck_assert_int_eq(td_kv_layout_init(&l, r->m, block), 0);
    ck_assert_int_eq(td_kv_pool_init(&r->pool, &l, 256), 0);
    r->V = r->m->cfg.vocab_size;
}

static void runner_close(runner_t *r)
{
    td_kv_pool_free(&r->pool);
    td_engine_free(r->e);
    td_model_free(r->m);
}

/* Prefill `prompt` in chunks of `chunk` tokens; logits after the last one into out[V]. */
static void prefill(runner_t *r, int chunk, float *out)
{
    td_kv_seq_t s;
    td_kv_seq_init(&s);
    for (int i = 0; i < NP; i += chunk) {
        int n = i + chunk <= NP ? chunk : NP - i;
        td_batch_seq_t b = {&s, prompt + i, n, out};
        ck_assert_msg(td_engine_step(r->e, &r->pool, &b, 1) == 0, "%s", td_err_msg());
    }
    ck_assert_int_eq(s.n_tokens, NP);
    td_kv_seq_release(&r->pool, &s);
    ck_assert_int_eq(r->pool.n_free, r->pool.n_blocks);
}

/* Q8_0 weights with 8-bit activations against the same values in F32 (largest logit's share) */
#define Q8_ACT_TOL 5e-2

static double max_rel_diff(const float *a, const float *b, int n)
{
    double mx = 0, scale = 1e-6;
    for (int i = 0; i < n; i++)
        scale = fmax(scale, fabs(a[i]));
    for (int i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)a[i] - b[i]));
    return mx / scale;
}

static void check_chunking(const char *path)
{
    int blocks[3] = {16, 64, 5};
    float *ref = NULL;
    for (int bi = 0; bi < 3; bi++) {
        runner_t r;
        n_threads = bi == 2 ? 1 : 2; /* one thread or two: the same bits */
        runner_open(&r, path, blocks[bi]);
        float *a = malloc((size_t)r.V * 4), *b = malloc((size_t)r.V * 4),
              *c = malloc((size_t)r.V * 4);
        prefill(&r, NP, a);
        prefill(&r, 4, b);
        prefill(&r, 1, c);
        /* the CPU backend sums every output in a fixed order: results are bitwise equal */
        ck_assert_msg(max_rel_diff(a, b, r.V) == 0, "%s: chunks of 4 differ by %g", path,
                      max_rel_diff(a, b, r.V));
        ck_assert_msg(max_rel_diff(a, c, r.V) == 0, "%s: token by token differs by %g", path,
                      max_rel_diff(a, c, r.V));
        if (!ref) {
            ref = malloc((size_t)r.V * 4);
            memcpy(ref, a, (size_t)r.V * 4);
        } else {
            ck_assert_msg(max_rel_diff(ref, a, r.V) == 0,
                          "%s: block size %d (%d threads) differs by %g", path, blocks[bi],
                          n_threads, max_rel_diff(ref, a, r.V));
        }
        free(a);
        free(b);
        free(c);
        runner_close(&r);
    }
    n_threads = 2;
    free(ref);
}

START_TEST(test_chunked_prefill)
{
    fx_set_t s = {0};
    char dir[512];
    fx_generate(&s, &fx_llama_cfg, 1);
    write_hf("llama_chunk", &s, &fx_llama_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
    check_chunking(dir);
    fx_free(&s);
    fx_generate(&s, &fx_deepseek_cfg, 2);
    write_hf("ds_chunk", &s, &fx_deepseek_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
    check_chunking(dir);
    fx_free(&s);
}
END_TEST

/* Three sequences: alone (prefill, then greedy decodes), and together in mixed steps where one
 * sequence prefills in chunks while the others decode. Every logits row must match. */
static void check_batch(const char *path)
{
    runner_t r;
    runner_open(&r, path, 8);
    const int lens[3] = {5, NP, 9}, steps = 4, V = r.V;
    float *alone = malloc((size_t)3 * (steps + 1) * V * 4); /* [seq][step][V] */
    for (int q = 0; q < 3; q++) {
        td_kv_seq_t s;
        td_kv_seq_init(&s);
        float *lg = alone + (size_t)q * (steps + 1) * V;
        td_batch_seq_t b = {&s, prompt + q, lens[q] - q, lg};
        ck_assert_int_eq(td_engine_step(r.e, &r.pool, &b, 1), 0);
        for (int k = 1; k <= steps; k++) {
            int32_t tok = (int32_t)((k * 31 + q * 7) % V);
            td_batch_seq_t d = {&s, &tok, 1, lg + (size_t)k * V};
            ck_assert_int_eq(td_engine_step(r.e, &r.pool, &d, 1), 0);
        }
        td_kv_seq_release(&r.pool, &s);
    }
    /* together: seq 1 prefills in chunks of 5 while 0 and 2 prefill at once then decode */
    td_kv_seq_t s[3];
    for (int q = 0; q < 3; q++)
        td_kv_seq_init(&s[q]);
    float *lg = malloc((size_t)3 * V * 4);
    int done[3] = {0, 0, 0}, dec[3] = {0, 0, 0};
    for (int it = 0; it < 20; it++) {
        td_batch_seq_t b[3];
        int n = 0, who[3];
        int32_t toks[3];
        for (int q = 0; q < 3; q++) {
            int plen = lens[q] - q;
            if (dec[q] >= steps)
                continue;
            if (done[q] < plen) {
                int chunk = q == 1 ? 5 : plen;
                chunk = TD_MIN(chunk, plen - done[q]);
                b[n] = (td_batch_seq_t){&s[q], prompt + q + done[q], chunk,
                                        done[q] + chunk == plen ? lg + (size_t)q * V : NULL};
                done[q] += chunk;
            } else {
                dec[q]++;
                toks[q] = (int32_t)((dec[q] * 31 + q * 7) % V);
                b[n] = (td_batch_seq_t){&s[q], &toks[q], 1, lg + (size_t)q * V};
            }
            who[n++] = q;
        }
        if (n == 0)
            break;
        ck_assert_int_eq(td_engine_step(r.e, &r.pool, b, n), 0);
        for (int i = 0; i < n; i++) {
            int q = who[i];
            if (!b[i].logits)
                continue;
            int k = b[i].n_tokens == 1 && done[q] == lens[q] - q && dec[q] > 0 ? dec[q] : 0;
            const float *want = alone + ((size_t)q * (steps + 1) + k) * V;
            ck_assert_msg(max_rel_diff(want, b[i].logits, V) == 0,
                          "%s: seq %d step %d differs in a batch by %g", path, q, k,
                          max_rel_diff(want, b[i].logits, V));
        }
    }
    for (int q = 0; q < 3; q++) {
        ck_assert_int_eq(dec[q], steps);
        td_kv_seq_release(&r.pool, &s[q]);
    }
    free(lg);
    free(alone);
    runner_close(&r);
}

START_TEST(test_batch_mixed)
{
    fx_set_t s = {0};
    char dir[512];
    fx_generate(&s, &fx_llama_cfg, 3);
    write_hf("llama_batch", &s, &fx_llama_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
    check_batch(dir);
    fx_free(&s);
    fx_generate(&s, &fx_deepseek_cfg, 4);
    write_hf("ds_batch", &s, &fx_deepseek_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
    check_batch(dir);
    fx_free(&s);
}
END_TEST

/* The block formats (Q4_K_M: Q4_K and Q6_K, with Q4_0 / Q8_0 on the short rows; Q4_0; Q8_0) and
 * F16 GGUF keep the bitwise invariants: the values do not depend on which kernel reads them (one
 * token's Q8_0 / F16 rows are summed straight from the stored data, more tokens' from a
 * dequantised copy). */
START_TEST(test_quant_invariant)
{
    const td_modelgen_arch_t archs[] = {TD_MODELGEN_LLAMA, TD_MODELGEN_DEEPSEEK_V3};
    const td_modelgen_dtype_t types[] = {TD_MODELGEN_Q4_K_M, TD_MODELGEN_Q4_0, TD_MODELGEN_Q8_0,
                                         TD_MODELGEN_F16};
    for (int a = 0; a < 2; a++)
        for (int t = 0; t < 4; t++) {
            char dir[512], path[600];
            snprintf(dir, sizeof(dir), "%s/quant_%d_%d", tmpdir, a, t);
            td_modelgen_opts_t o = {.arch = archs[a], .preset = TD_MODELGEN_SMALL, .seed = 9,
                                    .gguf = true, .gguf_dtype = types[t], .out_dir = dir};
            ck_assert_msg(td_modelgen_write(&o, NULL) == 0, "%s", td_err_msg());
            snprintf(path, sizeof(path), "%s/model.gguf", dir);
            check_chunking(path);
            check_batch(path);
        }
}
END_TEST

static void logits_of(const char *path, float **out, int *V)
{
    runner_t r;
    runner_open(&r, path, 16);
    *V = r.V;
    *out = malloc((size_t)r.V * 4);
    prefill(&r, NP, *out);
    runner_close(&r);
}

static void expect_same(const char *a, const char *b, double tol)
{
    float *la, *lb;
    int va, vb;
    logits_of(a, &la, &va);
    logits_of(b, &lb, &vb);
    ck_assert_int_eq(va, vb);
    double d = max_rel_diff(la, lb, va);
    if (getenv("TD_TEST_VERBOSE"))
        printf("%s vs %s: %g (tolerance %g)\n", a, b, d, tol);
    ck_assert_msg(d < tol, "%s and %s differ by %g", a, b, d);
    free(la);
    free(lb);
}

/* Writes a quantised form first (rounding the set), then the F32 reference of the same values. */
static void check_dtype(const fx_cfg_t *c, fx_dtype_t dt, const char *tag, bool fused, int shards)
{
    fx_set_t s = {0};
    char qdir[512], fdir[512], name[64];
    fx_generate(&s, c, 11);
    snprintf(name, sizeof(name), "%s_%s_q", c->deepseek ? "ds" : "llama", tag);
    write_hf(name, &s, c, (fx_st_opts_t){dt, shards, fused}, qdir, sizeof(qdir));
    snprintf(name, sizeof(name), "%s_%s_f", c->deepseek ? "ds" : "llama", tag);
    write_hf(name, &s, c, (fx_st_opts_t){FX_F32, 1, false}, fdir, sizeof(fdir));
    expect_same(qdir, fdir, 1e-6);
    fx_free(&s);
}

START_TEST(test_safetensors_forms)
{
    check_dtype(&fx_llama_cfg, FX_BF16, "bf16", false, 1);
    check_dtype(&fx_llama_cfg, FX_F16, "f16", false, 3);
    check_dtype(&fx_deepseek_cfg, FX_F8, "f8", false, 1);
    check_dtype(&fx_deepseek_cfg, FX_BF16, "fused_bf16", true, 2);
    check_dtype(&fx_deepseek_cfg, FX_F8, "fused_f8", true, 1);
    check_dtype(&fx_deepseek_cfg, FX_F32, "sharded", false, 4);
}
END_TEST

START_TEST(test_gguf_matches_safetensors)
{
    fx_cfg_t llama3 = fx_llama_cfg;
    llama3.llama3 = true;
    const fx_cfg_t *cfgs[3] = {&fx_llama_cfg, &fx_deepseek_cfg, &llama3};
    for (int i = 0; i < 3; i++) {
        for (int form = 0; form < 3; form++) { /* F32; Q8_0; F32 with MLA's split k_b/v_b */
            fx_set_t s = {0};
            char dir[512], gpath[512], name[64];
            fx_generate(&s, cfgs[i], 21 + i);
            snprintf(gpath, sizeof(gpath), "%s/m%d%d.gguf", tmpdir, i, form);
            /* Q8_0 rounds the set first, so the F32 copy holds the same values: the same logits
             * with fp32 activations; with the default 8-bit ones (llama.cpp's scheme), within
             * what rounding every product's input to 8 bits costs (measured 2026-12-01:
             * 0.011-0.018) */
            fx_write_gguf(gpath, &s, cfgs[i], form == 1, form == 2 && cfgs[i]->deepseek);
            snprintf(name, sizeof(name), "gguf_ref_%d%d", i, form);
            write_hf(name, &s, cfgs[i], (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
            f32_act = true;
            expect_same(gpath, dir, 1e-5);
            f32_act = false;
            if (form == 1)
                expect_same(gpath, dir, Q8_ACT_TOL);
            fx_free(&s);
        }
    }
}
END_TEST

/* Weights moved to anonymous memory (td_model_weights_to_anon, engine.hugepage_weights) give the
 * same bits, prefilled at once and token by token (the one-token kernels). */
START_TEST(test_anon_weights)
{
    fx_set_t s = {0};
    char dir[512];
    fx_generate(&s, &fx_llama_cfg, 5);
    write_hf("anon", &s, &fx_llama_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
    fx_free(&s);
    float *out[2][2];
    for (int anon = 0; anon < 2; anon++) {
        runner_t r;
        ck_assert_int_eq(td_model_load(dir, &r.m), 0);
        if (anon) {
            const uint8_t *at = r.m->maps[0].data;
            ck_assert_msg(td_model_weights_to_anon(r.m) == 0, "%s", td_err_msg());
            ck_assert_ptr_eq(r.m->maps[0].data, at);
        }
        td_engine_opts_t o = {.n_threads = 1};
        ck_assert_int_eq(td_engine_create(r.m, &o, &r.e), 0);
        td_kv_layout_t l;
        ck_assert_int_eq(td_kv_layout_init(&l, r.m, 16), 0);
        ck_assert_int_eq(td_kv_pool_init(&r.pool, &l, 256), 0);
        r.V = r.m->cfg.vocab_size;
        for (int k = 0; k < 2; k++) {
            out[anon][k] = malloc((size_t)r.V * 4);
            prefill(&r, k ? 1 : NP, out[anon][k]);
        }
        runner_close(&r);
    }
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(memcmp(out[0][k], out[1][k], (size_t)fx_llama_cfg.vocab * 4) == 0,
                      "chunk %d: anonymous weights differ", k ? 1 : NP);
        free(out[0][k]);
        free(out[1][k]);
    }
}
END_TEST

START_TEST(test_kv_layout)
{
    fx_set_t s = {0};
    char dir[512], dir2[512];
    fx_generate(&s, &fx_deepseek_cfg, 5);
    write_hf("ds_layout", &s, &fx_deepseek_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir, sizeof(dir));
    s.t[5].data[0] += 0.5f; /* a different checkpoint of the same architecture */
    write_hf("ds_layout2", &s, &fx_deepseek_cfg, (fx_st_opts_t){FX_F32, 1, false}, dir2,
             sizeof(dir2));
    fx_free(&s);
    td_model_t *m, *m2;
    ck_assert_int_eq(td_model_load(dir, &m), 0);
    ck_assert_int_eq(td_model_load(dir2, &m2), 0);
    td_kv_layout_t a, b, c, d;
    ck_assert_int_eq(td_kv_layout_init(&a, m, 16), 0);
    ck_assert_int_eq(td_kv_layout_init(&b, m, 16), 0);
    ck_assert_int_eq(td_kv_layout_init(&c, m, 64), 0);
    ck_assert_int_eq(td_kv_layout_init(&d, m2, 16), 0);
    /* MLA caches the latent and the rope key part only */
    ck_assert_int_eq(a.token_floats, fx_deepseek_cfg.kv_lora + fx_deepseek_cfg.rope);
    ck_assert_uint_eq(a.layer_bytes, 16u * (32 + 8) * 4);
    ck_assert_uint_eq(a.block_bytes, a.layer_bytes * 3);
    ck_assert(td_kv_layout_match(&a, &b));
    ck_assert(!td_kv_layout_match(&a, &c));
    ck_assert(!td_kv_layout_match(&a, &d));
    /* the fingerprint as documented (common/kv/td_kv.h): XXH3-128 of the model digest, u32le
     * dtype, block size, layers, token floats and the numerics version (5: attention's softmax
     * in blocks of 8 keys with a vector exp; kv.c lists the versions), then u64le bytes per
     * layer; a new version changes every fingerprint */
    uint8_t enc[44];
    memcpy(enc, a.model_digest, 16);
    uint32_t f[5] = {(uint32_t)a.dtype, 16, (uint32_t)a.n_layers, (uint32_t)a.token_floats, 5};
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++)
            enc[16 + 4 * i + k] = (uint8_t)(f[i] >> (8 * k));
    for (int k = 0; k < 8; k++)
        enc[36 + k] = (uint8_t)((uint64_t)a.layer_bytes >> (8 * k));
    XXH128_canonical_t want;
    XXH128_canonicalFromHash(&want, XXH3_128bits(enc, sizeof(enc)));
    ck_assert_mem_eq(a.fingerprint, want.digest, 16);
    ck_assert_int_eq(td_kv_layout_init(&a, m, 0), TD_EINVAL);
    /* block-major: consecutive layers of one block are adjacent, blocks are disjoint */
    td_kv_pool_t p;
    ck_assert_int_eq(td_kv_pool_init(&p, &b, 3), 0);
    ck_assert_ptr_eq((uint8_t *)td_kv_slot(&p, 1, 1, 0), td_kv_block_data(&p, 1) + b.layer_bytes);
    ck_assert_ptr_eq(td_kv_block_data(&p, 2), td_kv_block_data(&p, 1) + b.block_bytes);
    td_kv_seq_t q;
    td_kv_seq_init(&q);
    ck_assert_int_eq(td_kv_seq_reserve(&p, &q, 33), 0);
    ck_assert_int_eq(q.n_blocks, 3);
    ck_assert_int_eq(p.n_free, 0);
    ck_assert_int_eq(td_kv_seq_reserve(&p, &q, 49), TD_ENOSPC);
    td_kv_seq_release(&p, &q);
    /* all or nothing: a reservation that does not fit takes no block */
    ck_assert_int_eq(td_kv_seq_reserve(&p, &q, 16), 0);
    ck_assert_int_eq(td_kv_seq_reserve(&p, &q, 64), TD_ENOSPC);
    ck_assert_int_eq(q.n_blocks, 1);
    ck_assert_int_eq(p.n_free, 2);
    td_kv_seq_release(&p, &q);
    ck_assert_int_eq(p.n_free, 3);
    /* a step that does not fit leaves the sequence where it was */
    td_engine_t *e;
    ck_assert_int_eq(td_engine_create(m, NULL, &e), 0);
    td_kv_seq_init(&q);
    td_batch_seq_t bs = {&q, prompt, NP, NULL};
    int32_t big[64] = {0};
    td_batch_seq_t bb = {&q, big, 64, NULL};
    ck_assert_int_eq(td_engine_step(e, &p, &bs, 1), 0);
    ck_assert_int_eq(td_engine_step(e, &p, &bb, 1), TD_ENOSPC);
    ck_assert_int_eq(q.n_tokens, NP);
    int32_t bad = 100000;
    td_batch_seq_t bt = {&q, &bad, 1, NULL};
    ck_assert_int_eq(td_engine_step(e, &p, &bt, 1), TD_EINVAL);
    td_batch_seq_t twice[2] = {bs, bs};
    ck_assert_int_eq(td_engine_step(e, &p, twice, 2), TD_EINVAL);
    /* a pool laid out for another model is refused */
    td_kv_pool_t p2;
    ck_assert_int_eq(td_kv_pool_init(&p2, &d, 3), 0);
    td_kv_seq_t q2;
    td_kv_seq_init(&q2);
    td_batch_seq_t b2 = {&q2, prompt, 2, NULL};
    ck_assert_int_eq(td_engine_step(e, &p2, &b2, 1), TD_EMISMATCH);
    td_kv_pool_free(&p2);
    /* a pool over borrowed memory (the data plane's registered pool): the engine writes there,
     * and freeing the pool leaves the memory to its owner (ASan would see a double free) */
    uint8_t *mem = aligned_alloc(64, 3 * b.block_bytes);
    memset(mem, 0xAB, 3 * b.block_bytes);
    td_kv_pool_t pb;
    ck_assert_int_eq(td_kv_pool_init_mem(&pb, &b, 3, mem + 8), TD_EINVAL);
    ck_assert_int_eq(td_kv_pool_init_mem(&pb, &b, 3, mem), 0);
    ck_assert_ptr_eq(td_kv_block_data(&pb, 0), mem);
    td_kv_seq_t q3;
    td_kv_seq_init(&q3);
    td_batch_seq_t b3 = {&q3, prompt, NP, NULL};
    ck_assert_int_eq(td_engine_step(e, &pb, &b3, 1), 0);
    const uint8_t *slot = (const uint8_t *)td_kv_slot(&pb, q3.blocks[0], 0, 0);
    ck_assert(slot >= mem && slot < mem + 3 * b.block_bytes);
    ck_assert(slot[0] != 0xAB || slot[1] != 0xAB || slot[2] != 0xAB || slot[3] != 0xAB);
    td_kv_seq_release(&pb, &q3);
    td_kv_pool_free(&pb);
    ck_assert_int_eq(mem[3 * b.block_bytes - 1], 0xAB);
    free(mem);
    td_kv_seq_release(&p, &q);
    td_kv_pool_free(&p);
    td_engine_free(e);
    td_model_free(m);
    td_model_free(m2);
}
END_TEST

int main(void)
{
    if (!mkdtemp(tmpdir))
        return 1;
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_chunked_prefill);
    tcase_add_test(tc, test_batch_mixed);
    tcase_add_test(tc, test_safetensors_forms);
    tcase_add_test(tc, test_gguf_matches_safetensors);
    tcase_add_test(tc, test_quant_invariant);
    tcase_add_test(tc, test_kv_layout);
    tcase_add_test(tc, test_anon_weights);
    suite_add_tcase(s, tc);
    int failed = td_check_run(s);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        return 1;
    return failed ? 1 : 0;
}
