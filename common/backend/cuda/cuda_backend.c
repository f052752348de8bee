/* cuda_backend.c: the CUDA backend's host side: device memory, the weight cache (each td_mat_t
 * converted once, found again by its host address, row views of an uploaded matrix included),
 * the per-call tables (positions, the step's block tables), cuBLAS GEMMs and the kernel launches
 * of cuda_kernels.cu. */
#include "cuda_kernels.h"
#include "td_cuda.h"
#include "td_error.h"
#include "td_util.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One uploaded host array: a matrix (dtype >= 0) or an fp32 vector (dtype -1, rows 1). */
typedef struct went {
    const uint8_t *host;
    int64_t rows, cols;
    int dtype;
    size_t row_bytes; /* host bytes per row */
    void *dev;        /* rows x cols elements of elem bytes */
    bool alias;       /* rows of another entry's upload: its memory is the parent's */
} went_t;

typedef struct cuda {
    int device, cc;
    char name[256];
    bool fp32;
    size_t elem; /* bytes per weight element on the device: 2 (bf16) or 4 */
    cudaStream_t st;
    cublasHandle_t blas;
    went_t *ents; /* uploads, in order */
    int n_ents, cap_ents;
    int32_t *slots; /* open-addressed index into ents by (host, rows, cols, dtype); -1 empty */
    size_t n_slots; /* a power of two, at least twice n_ents */
    size_t weight_bytes;
    void *pack; /* device: activations packed for a GEMM */
    size_t pack_bytes;
    int32_t *d_pos, *h_pos; /* device and last uploaded host copy of a position table */
    size_t pos_cap, pos_n, h_pos_cap;
    td_tok_tables_t tabs;   /* the step tables being built */
    int32_t *d_tab, *h_tab; /* their device copy and what was last uploaded there */
    size_t tab_cap, tab_n, h_tab_cap;
    float *stage; /* pinned host staging for weight uploads */
    size_t stage_bytes;
} cuda_t;

#define STAGE_BYTES ((size_t)32 << 20)

static void fatal(const char *what, int err, const char *msg)
{
    fprintf(stderr, "tandem cuda backend: %s failed: %s (error %d)\n", what, msg, err);
    abort();
}

static void ck(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        fatal(what, (int)e, cudaGetErrorString(e));
}

static void ckk(int e, const char *what)
{
    if (e)
        fatal(what, e, cudaGetErrorString((cudaError_t)e));
}

static void ckb(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS)
        fatal(what, (int)s, cublasGetStatusString(s));
}

/* The backend's state, with its device current on the calling thread (the CUDA runtime keeps the
 * current device per thread; the engine may run on another thread than the one that created it). */
static cuda_t *ctx(td_backend_t *b)
{
    cuda_t *c = b->impl;
    ck(cudaSetDevice(c->device), "cudaSetDevice");
    return c;
}

/* ---------- memory ---------- */

static void *cu_alloc(td_backend_t *b, size_t bytes, td_mem_kind_t kind)
{
    cuda_t *c = ctx(b);
    size_t n = TD_ALIGN_UP(bytes ? bytes : 1, (size_t)256);
    void *p = NULL;
    cudaError_t e = cudaSuccess;
    switch (kind) {
    case TD_MEM_HOST:
        p = aligned_alloc(64, n);
        if (p)
            memset(p, 0, n);
        break;
    case TD_MEM_PINNED:
        if ((e = cudaMallocHost(&p, n)) == cudaSuccess)
            memset(p, 0, n);
        break;
    case TD_MEM_DEVICE:
        e = cudaMalloc(&p, n);
        break;
    case TD_MEM_SHARED:
        e = cudaMallocManaged(&p, n, cudaMemAttachGlobal);
        break;
    }
    if (e == cudaSuccess && p && (kind == TD_MEM_DEVICE || kind == TD_MEM_SHARED))
        if ((e = cudaMemsetAsync(p, 0, n, c->st)) == cudaSuccess)
            e = cudaStreamSynchronize(c->st);
    if (e != cudaSuccess || !p) {
        td_err_set(TD_ENOMEM, "cuda: cannot allocate %zu bytes: %s", bytes,
                   e != cudaSuccess ? cudaGetErrorString(e) : "out of host memory");
        return NULL;
    }
    return p;
}

static void cu_free(td_backend_t *b, void *p, td_mem_kind_t kind)
{
    if (!p)
        return;
    cuda_t *c = ctx(b);
    switch (kind) {
    case TD_MEM_HOST:
        free(p);
        break;
    case TD_MEM_PINNED:
        cudaStreamSynchronize(c->st);
        cudaFreeHost(p);
        break;
    case TD_MEM_DEVICE:
    case TD_MEM_SHARED:
        cudaStreamSynchronize(c->st);
        cudaFree(p);
        break;
    }
}

static void cu_copy(td_backend_t *b, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = ctx(b);
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->st), "copy");
}

static void cu_sync(td_backend_t *b)
{
    cuda_t *c = ctx(b);
    ck(cudaStreamSynchronize(c->st), "sync");
}

/* Grow device buffer *p to hold `need` bytes (contents dropped). */
static void dev_reserve(cuda_t *c, void **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t n = TD_MAX(need, *cap * 2);
    if (*p) {
        ck(cudaStreamSynchronize(c->st), "sync");
        cudaFree(*p);
    }
    *p = NULL;
    *cap = 0;
    ck(cudaMalloc(p, n), "device scratch allocation");
    *cap = n;
}

static void *host_reserve(void *p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return p;
    size_t n = TD_MAX(need, *cap * 2);
    void *q = realloc(p, n);
    if (!q)
        fatal("host scratch allocation", 0, "out of memory");
    *cap = n;
    return q;
}

/* ---------- the weight cache ---------- */

static uint64_t went_hash(const void *host, int64_t rows, int64_t cols, int dtype)
{
    uint64_t h = (uint64_t)(uintptr_t)host * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)rows * 0xC2B2AE3D27D4EB4Full) ^ ((uint64_t)cols << 17) ^ (uint64_t)(dtype + 1);
    return h ^ (h >> 29);
}

static void slots_put(cuda_t *c, int32_t idx, const void *host, int64_t rows)
{
    const went_t *e = &c->ents[idx];
    size_t m = c->n_slots - 1, i = went_hash(host, rows, e->cols, e->dtype) & m;
    while (c->slots[i] >= 0)
        i = (i + 1) & m;
    c->slots[i] = idx;
}

/* An alias entry shares its parent's device memory: a view of some of its rows. */
static int32_t ents_add(cuda_t *c, const went_t *e)
{
    if (c->n_ents == c->cap_ents) {
        int cap = c->cap_ents ? 2 * c->cap_ents : 256;
        went_t *n = realloc(c->ents, (size_t)cap * sizeof(*n));
        if (!n)
            fatal("weight cache", 0, "out of memory");
        c->ents = n;
        c->cap_ents = cap;
    }
    if ((size_t)(c->n_ents + 1) * 2 > c->n_slots) {
        size_t ns = c->n_slots ? 2 * c->n_slots : 1024;
        int32_t *s = malloc(ns * sizeof(*s));
        if (!s)
            fatal("weight cache", 0, "out of memory");
        free(c->slots);
        c->slots = s;
        c->n_slots = ns;
        for (size_t i = 0; i < ns; i++)
            s[i] = -1;
        for (int32_t i = 0; i < c->n_ents; i++)
            slots_put(c, i, c->ents[i].host, c->ents[i].rows);
    }
    c->ents[c->n_ents] = *e;
    slots_put(c, c->n_ents, e->host, e->rows);
    return c->n_ents++;
}

static void *lookup(cuda_t *c, const void *host, int64_t rows, int64_t cols, int dtype)
{
    if (!c->n_slots)
        return NULL;
    size_t m = c->n_slots - 1, i = went_hash(host, rows, cols, dtype) & m;
    for (; c->slots[i] >= 0; i = (i + 1) & m) {
        const went_t *e = &c->ents[c->slots[i]];
        if (e->host == host && e->rows == rows && e->cols == cols && e->dtype == dtype)
            return e->dev;
    }
    return NULL;
}

/* Device copy of rows x cols elements at `host`, converted once. Matrices are converted row by
 * row with the model's own dequantiser (td_mat_row_f32), so every stored dtype uploads alike. */
static void *upload(cuda_t *c, const td_mat_t *W, const float *vec, int64_t n_vec)
{
    int dtype = W ? (int)W->dtype : -1;
    const uint8_t *host = W ? W->data : (const uint8_t *)vec;
    int64_t rows = W ? W->rows : 1, cols = W ? W->cols : n_vec;
    void *dev = lookup(c, host, rows, cols, dtype);
    if (dev)
        return dev;
    size_t row_bytes = W ? td_dtype_row_bytes(W->dtype, W->cols) : (size_t)n_vec * sizeof(float);
    size_t elem = W ? c->elem : sizeof(float);
    /* rows of a matrix already uploaded (mat_rows views of per-head slices) */
    for (int i = 0; W && i < c->n_ents; i++) {
        const went_t *e = &c->ents[i];
        if (e->dtype != dtype || e->cols != cols || host < e->host ||
            host + rows * row_bytes > e->host + e->rows * e->row_bytes ||
            (size_t)(host - e->host) % row_bytes != 0)
            continue;
        went_t a = *e;
        a.host = host;
        a.rows = rows;
        a.alias = true;
        a.dev = (uint8_t *)e->dev + (size_t)(host - e->host) / row_bytes * (size_t)cols * elem;
        ents_add(c, &a);
        return a.dev;
    }
    size_t bytes = (size_t)rows * (size_t)cols * elem;
    ck(cudaMalloc(&dev, bytes ? bytes : 1), "weight allocation");
    c->weight_bytes += bytes;
    if (!W) {
        /* on our stream, then waited for: a plain cudaMemcpy from pageable memory may return
         * before the DMA lands, and the non-blocking stream does not wait for it */
        ck(cudaMemcpyAsync(dev, vec, bytes, cudaMemcpyHostToDevice, c->st), "vector upload");
        ck(cudaStreamSynchronize(c->st), "vector upload");
    } else {
        /* convert a batch of rows into the pinned stage (fp32 first, packed to bf16 in place:
         * element i's bf16 is written at or before where its fp32 was read) */
        int64_t per = TD_MAX((int64_t)1, (int64_t)(STAGE_BYTES / sizeof(float)) / cols);
        TD_ASSERT(cols * (int64_t)sizeof(float) <= (int64_t)STAGE_BYTES);
        for (int64_t r0 = 0; r0 < rows; r0 += per) {
            int64_t nr = TD_MIN(per, rows - r0);
            ck(cudaStreamSynchronize(c->st), "sync"); /* the stage's previous copy is done */
            for (int64_t r = 0; r < nr; r++)
                td_mat_row_f32(W, r0 + r, c->stage + r * cols);
            if (!c->fp32)
                td_bf16_round(c->stage, (uint16_t *)c->stage, (size_t)(nr * cols));
            ck(cudaMemcpyAsync((uint8_t *)dev + (size_t)r0 * cols * elem, c->stage,
                               (size_t)nr * cols * elem, cudaMemcpyHostToDevice, c->st),
               "weight upload");
        }
        ck(cudaStreamSynchronize(c->st), "weight upload");
    }
    went_t e = {host, rows, cols, dtype, row_bytes, dev, false};
    ents_add(c, &e);
    return dev;
}

static const float *host_vec(cuda_t *c, const float *v, int64_t n)
{
    return upload(c, NULL, v, n);
}

/* ---------- per-call tables ---------- */

static const int32_t *upload_pos(cuda_t *c, const int32_t *pos, int T)
{
    size_t bytes = (size_t)T * sizeof(int32_t);
    if (c->pos_n == (size_t)T && memcmp(c->h_pos, pos, bytes) == 0)
        return c->d_pos; /* the same table as the last call (the other layers of a step) */
    if (bytes > c->pos_cap)
        dev_reserve(c, (void **)&c->d_pos, &c->pos_cap, bytes);
    c->h_pos = host_reserve(c->h_pos, &c->h_pos_cap, bytes);
    memcpy(c->h_pos, pos, bytes);
    c->pos_n = (size_t)T;
    ck(cudaMemcpyAsync(c->d_pos, pos, bytes, cudaMemcpyHostToDevice, c->st), "position upload");
    return c->d_pos;
}

/* The step's cache locations on the device (td_tok_tables_build's layout, which tdk_tok_t and the
 * kernels read): uploaded only when they differ from the last call's. */
static void upload_toks(cuda_t *c, const td_attn_tok_t *toks, int T, int B, const tdk_tok_t **dt,
                        const int32_t **db)
{
    if (td_tok_tables_build(&c->tabs, toks, T, B) != 0)
        fatal("step tables", 0, td_err_msg());
    size_t words = c->tabs.n_words, bytes = words * sizeof(int32_t);
    if (c->tab_n != words || memcmp(c->h_tab, c->tabs.words, bytes) != 0) {
        if (bytes > c->tab_cap)
            dev_reserve(c, (void **)&c->d_tab, &c->tab_cap, bytes);
        c->h_tab = host_reserve(c->h_tab, &c->h_tab_cap, bytes);
        memcpy(c->h_tab, c->tabs.words, bytes);
        c->tab_n = words;
        ck(cudaMemcpyAsync(c->d_tab, c->h_tab, bytes, cudaMemcpyHostToDevice, c->st),
           "block table upload");
    }
    *dt = (const tdk_tok_t *)c->d_tab;
    *db = c->d_tab + (size_t)T * 4;
}

static tdk_pool_t pool_view(const td_kv_pool_t *p)
{
    if (p->mem_kind == TD_MEM_HOST)
        fatal("attention", 0, "the KV pool is host memory (make it with td_backend_kv_pool_init)");
    tdk_pool_t v = {(float *)p->mem, (int64_t)(p->layout.block_bytes / sizeof(float)),
                    (int64_t)(p->layout.layer_bytes / sizeof(float)), p->layout.token_floats,
                    p->layout.block_size};
    return v;
}

/* The pool as kernels see it and the step's tables on the device. */
static void step_tables(cuda_t *c, const td_kv_pool_t *pool, const td_attn_tok_t *toks, int T,
                        tdk_pool_t *pv, const tdk_tok_t **dt, const int32_t **db)
{
    *pv = pool_view(pool);
    upload_toks(c, toks, T, pool->layout.block_size, dt, db);
}

/* ---------- operations ---------- */

/* x rows as the GEMM's B operand: packed to bf16 [T][n], or x itself (fp32). */
static const void *gemm_b(cuda_t *c, const float *x, int x_ld, int T, int64_t n, int *ldb)
{
    if (c->fp32) {
        *ldb = x_ld;
        return x;
    }
    dev_reserve(c, &c->pack, &c->pack_bytes, (size_t)T * (size_t)n * 2);
    ckk(tdk_pack(c->st, c->pack, 1, x, x_ld, T, (int)n), "activation packing");
    *ldb = (int)n;
    return c->pack;
}

static void cu_matmul(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                      const td_mat_t *W)
{
    cuda_t *c = ctx(b);
    if (T <= 0 || W->rows == 0)
        return;
    const void *A = upload(c, W, NULL, 0);
    int ldb;
    const void *Bm = gemm_b(c, x, x_ld, T, W->cols, &ldb);
    const float one = 1, zero = 0;
    cudaDataType_t t = c->fp32 ? CUDA_R_32F : CUDA_R_16BF;
    /* column-major: out^T (rows x T) = W (rows x cols, stored as its transpose) . x^T */
    ckb(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->rows, T, (int)W->cols, &one, A, t,
                     (int)W->cols, Bm, t, ldb, &zero, out, CUDA_R_32F, out_ld, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "matmul");
}

static void cu_matmul_t(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                        const td_mat_t *W, int64_t row0, int64_t n_rows)
{
    cuda_t *c = ctx(b);
    if (T <= 0)
        return;
    const uint8_t *A = upload(c, W, NULL, 0);
    A += (size_t)row0 * (size_t)W->cols * c->elem;
    int ldb;
    const void *Bm = gemm_b(c, x, x_ld, T, n_rows, &ldb);
    const float one = 1, zero = 0;
    cudaDataType_t t = c->fp32 ? CUDA_R_32F : CUDA_R_16BF;
    /* column-major: out^T (cols x T) = W[row0 .. row0 + n_rows)^T (cols x n_rows) . x^T */
    ckb(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)W->cols, T, (int)n_rows, &one, A, t,
                     (int)W->cols, Bm, t, ldb, &zero, out, CUDA_R_32F, out_ld, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "matmul_t");
}

static void cu_rmsnorm(td_backend_t *b, float *out, int out_ld, const float *x, int x_ld, int T,
                       int n, const float *w, float eps)
{
    cuda_t *c = ctx(b);
    ckk(tdk_rmsnorm(c->st, out, out_ld, x, x_ld, T, n, host_vec(c, w, n), eps), "rmsnorm");
}

static void cu_rope(td_backend_t *b, float *x, int ld, int T, int n_heads, int head_ld,
                    int rope_dim, const int32_t *pos, const float *inv_freq, float mscale,
                    bool interleaved)
{
    cuda_t *c = ctx(b);
    if (T <= 0 || rope_dim < 2)
        return;
    const float *f = host_vec(c, inv_freq, rope_dim / 2);
    ckk(tdk_rope(c->st, x, ld, T, n_heads, head_ld, rope_dim, upload_pos(c, pos, T), f, mscale,
                 interleaved),
        "rope");
}

static void cu_silu_mul(td_backend_t *b, float *g, int g_ld, const float *u, int u_ld, int T, int n)
{
    cuda_t *c = ctx(b);
    ckk(tdk_silu_mul(c->st, g, g_ld, u, u_ld, T, n), "silu_mul");
}

static void cu_add(td_backend_t *b, float *x, const float *y, size_t n)
{
    cuda_t *c = ctx(b);
    ckk(tdk_add(c->st, x, y, n), "add");
}

static void cu_kv_store(td_backend_t *b, td_kv_pool_t *pool, int layer, const td_attn_tok_t *toks,
                        int T, const float *src, int src_ld)
{
    cuda_t *c = ctx(b);
    if (T <= 0)
        return;
    tdk_pool_t pv;
    const tdk_tok_t *dt;
    const int32_t *db;
    step_tables(c, pool, toks, T, &pv, &dt, &db);
    ckk(tdk_kv_store(c->st, pv, layer, dt, db, T, src, src_ld), "kv_store");
}

static void cu_attn_gqa(td_backend_t *b, float *out, int out_ld, const float *q, int q_ld, int T,
                        const td_attn_tok_t *toks, const td_kv_pool_t *pool, int layer, int n_heads,
                        int n_kv_heads, int head_dim, float scale)
{
    cuda_t *c = ctx(b);
    if (T <= 0)
        return;
    tdk_pool_t pv;
    const tdk_tok_t *dt;
    const int32_t *db;
    step_tables(c, pool, toks, T, &pv, &dt, &db);
    tdk_attn_t a = {
        .out = out,
        .out_ld = out_ld,
        .out_head_ld = head_dim,
        .q1 = q,
        .q1_ld = q_ld,
        .q1_head_ld = head_dim,
        .n1 = head_dim,
        .nv = head_dim,
        .k1_off = 0,
        .k1_head = head_dim,
        .v_off = n_kv_heads * head_dim,
        .v_head = head_dim,
        .n_heads = n_heads,
        .group = n_heads / n_kv_heads,
        .layer = layer,
        .scale = scale,
    };
    ckk(tdk_attn(c->st, &a, T, pv, dt, db), "attn_gqa");
}

static void cu_attn_mla(td_backend_t *b, float *out, const float *q_lat, const float *q_pe,
                        int q_pe_ld, int q_pe_head_ld, int T, const td_attn_tok_t *toks,
                        const td_kv_pool_t *pool, int layer, int n_heads, int kv_rank, int rope_dim,
                        float scale)
{
    cuda_t *c = ctx(b);
    if (T <= 0)
        return;
    tdk_pool_t pv;
    const tdk_tok_t *dt;
    const int32_t *db;
    step_tables(c, pool, toks, T, &pv, &dt, &db);
    tdk_attn_t a = {
        .out = out,
        .out_ld = n_heads * kv_rank,
        .out_head_ld = kv_rank,
        .q1 = q_lat,
        .q1_ld = n_heads * kv_rank,
        .q1_head_ld = kv_rank,
        .n1 = kv_rank,
        .q2 = q_pe,
        .q2_ld = q_pe_ld,
        .q2_head_ld = q_pe_head_ld,
        .n2 = rope_dim,
        .nv = kv_rank,
        .k1_off = 0,
        .k1_head = 0,
        .k2_off = kv_rank,
        .v_off = 0,
        .v_head = 0,
        .n_heads = n_heads,
        .group = 1,
        .layer = layer,
        .scale = scale,
    };
    ckk(tdk_attn(c->st, &a, T, pv, dt, db), "attn_mla");
}

_Static_assert(sizeof(tdk_tok_t) == 4 * sizeof(int32_t), "td_tok_tables_t's token words");

/* ---------- lifecycle ---------- */

static void cu_destroy(td_backend_t *b)
{
    if (!b)
        return;
    cuda_t *c = b->impl; /* also after a failed creation: no check */
    if (c) {
        cudaSetDevice(c->device);
        if (c->st)
            cudaStreamSynchronize(c->st);
        for (int i = 0; i < c->n_ents; i++)
            if (!c->ents[i].alias)
                cudaFree(c->ents[i].dev);
        free(c->ents);
        free(c->slots);
        cudaFree(c->pack);
        cudaFree(c->d_pos);
        cudaFree(c->d_tab);
        free(c->h_pos);
        free(c->h_tab);
        td_tok_tables_free(&c->tabs);
        if (c->stage)
            cudaFreeHost(c->stage);
        if (c->blas)
            cublasDestroy(c->blas);
        if (c->st)
            cudaStreamDestroy(c->st);
        free(c);
    }
    free(b);
}

int td_cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        td_err_set(TD_ENOTSUP, "no CUDA device: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        td_err_set(TD_ENOTSUP, "no CUDA device: the driver reports none");
    return n;
}

int td_cuda_backend_create(const td_cuda_opts_t *opts, td_backend_t **out)
{
    *out = NULL;
    td_cuda_opts_t o = opts ? *opts : (td_cuda_opts_t){0};
    int n = td_cuda_device_count();
    if (n == 0)
        return TD_ENOTSUP;
    if (o.device < 0 || o.device >= n)
        return td_err_set(TD_ENOTSUP, "no CUDA device %d (%d present)", o.device, n);
    td_backend_t *b = td_calloc(1, sizeof(*b));
    cuda_t *c = td_calloc(1, sizeof(*c));
    if (!b || !c) {
        free(b);
        free(c);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    b->impl = c;
    b->name = "cuda";
    c->device = o.device;
    c->fp32 = o.fp32_gemm;
    c->elem = c->fp32 ? 4 : 2;
    struct cudaDeviceProp prop;
    cudaError_t e;
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    if ((e = cudaSetDevice(o.device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, o.device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&c->stage, STAGE_BYTES)) != cudaSuccess)
        goto cuda_err;
    snprintf(c->name, sizeof(c->name), "%s", prop.name);
    c->cc = prop.major * 10 + prop.minor;
    if ((bs = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetStream(c->blas, c->st)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        cu_destroy(b);
        return td_err_set(TD_ENOTSUP, "cuBLAS: %s", cublasGetStatusString(bs));
    }
    b->destroy = cu_destroy;
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->copy = cu_copy;
    b->sync = cu_sync;
    b->kv_mem = TD_MEM_DEVICE;
    b->max_head = TDK_MAX_HEAD;
    b->matmul = cu_matmul;
    b->matmul_t = cu_matmul_t;
    b->rmsnorm = cu_rmsnorm;
    b->rope = cu_rope;
    b->silu_mul = cu_silu_mul;
    b->add = cu_add;
    b->kv_store = cu_kv_store;
    b->attn_gqa = cu_attn_gqa;
    b->attn_mla = cu_attn_mla;
    *out = b;
    return 0;
cuda_err:
    cu_destroy(b);
    return td_err_set(TD_ENOTSUP, "CUDA device %d: %s", o.device, cudaGetErrorString(e));
}

const char *td_cuda_device_name(const td_backend_t *b, int *cc)
{
    const cuda_t *c = b->impl;
    if (cc)
        *cc = c->cc;
    return c->name;
}

size_t td_cuda_weight_bytes(const td_backend_t *b)
{
    return ((const cuda_t *)b->impl)->weight_bytes;
}

int td_cuda_measure_peaks(td_backend_t *b, double *hbm_gbs, double *gemm_tflops)
{
    cuda_t *c = ctx(b);
    const size_t bytes = (size_t)1 << 30;
    const int n = 8192, reps = 10;
    void *src = NULL, *dst = NULL, *A = NULL, *Bm = NULL, *C = NULL;
    cudaEvent_t e0, e1;
    float ms = 0;
    int rc = 0;
    ck(cudaEventCreate(&e0), "event");
    ck(cudaEventCreate(&e1), "event");
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess ||
        cudaMalloc(&A, (size_t)n * n * 2) != cudaSuccess ||
        cudaMalloc(&Bm, (size_t)n * n * 2) != cudaSuccess ||
        cudaMalloc(&C, (size_t)n * n * 4) != cudaSuccess) {
        rc = td_err_set(TD_ENOMEM, "cuda: no room for the peak measurements");
        goto out;
    }
    ck(cudaMemsetAsync(src, 1, bytes, c->st), "memset");
    ck(cudaMemsetAsync(A, 0, (size_t)n * n * 2, c->st), "memset");
    ck(cudaMemsetAsync(Bm, 0, (size_t)n * n * 2, c->st), "memset");
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st), "copy"); /* warm */
    ck(cudaEventRecord(e0, c->st), "event");
    for (int i = 0; i < reps; i++)
        ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st), "copy");
    ck(cudaEventRecord(e1, c->st), "event");
    ck(cudaEventSynchronize(e1), "event");
    ck(cudaEventElapsedTime(&ms, e0, e1), "event");
    *hbm_gbs = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    const float one = 1, zero = 0;
    for (int i = 0; i <= reps; i++) {
        if (i == 1)
            ck(cudaEventRecord(e0, c->st), "event");
        ckb(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, Bm,
                         CUDA_R_16BF, n, &zero, C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "peak gemm");
    }
    ck(cudaEventRecord(e1, c->st), "event");
    ck(cudaEventSynchronize(e1), "event");
    ck(cudaEventElapsedTime(&ms, e0, e1), "event");
    *gemm_tflops = 2.0 * n * (double)n * n * reps / (ms * 1e-3) / 1e12;
out:
    cudaFree(src);
    cudaFree(dst);
    cudaFree(A);
    cudaFree(Bm);
    cudaFree(C);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}
