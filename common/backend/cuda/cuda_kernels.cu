/* cuda_kernels.cu: the CUDA backend's kernels: activation packing for the GEMMs, RMSNorm, RoPE,
 * SwiGLU, the residual add, the KV store and one attention kernel over the paged cache that
 * serves grouped-query attention and absorbed MLA, prefill and decode alike. fp32 math throughout
 * (the GEMMs are cuBLAS's, cuda_backend.c). */
#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

static int launched(void)
{
    return (int)cudaGetLastError();
}

static unsigned blocks_for(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* ---------- packing ---------- */

__global__ void k_pack_bf16(__nv_bfloat16 *out, const float *x, int ld, int T, int n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * n)
        return;
    size_t t = i / n, c = i % n;
    out[i] = __float2bfloat16_rn(x[t * ld + c]);
}

__global__ void k_pack_f32(float *out, const float *x, int ld, int T, int n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * n)
        return;
    size_t t = i / n, c = i % n;
    out[i] = x[t * ld + c];
}

extern "C" int tdk_pack(void *stream, void *out, int bf16, const float *x, int ld, int T, int n)
{
    size_t total = (size_t)T * n;
    if (total == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (bf16)
        k_pack_bf16<<<blocks_for(total, 256), 256, 0, s>>>((__nv_bfloat16 *)out, x, ld, T, n);
    else
        k_pack_f32<<<blocks_for(total, 256), 256, 0, s>>>((float *)out, x, ld, T, n);
    return launched();
}

/* ---------- reductions ---------- */

__device__ static float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block of 256 threads per row. */
__global__ void k_rmsnorm(float *out, int out_ld, const float *x, int x_ld, int n, const float *w,
                          float eps)
{
    __shared__ float part[8];
    const float *xr = x + (size_t)blockIdx.x * x_ld;
    float *o = out + (size_t)blockIdx.x * out_ld;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++)
        tot += part[k];
    float inv = (float)(1.0 / sqrt((double)tot / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        o[i] = xr[i] * inv * w[i]; /* each thread rereads only its own values: in place is safe */
}

extern "C" int tdk_rmsnorm(void *stream, float *out, int out_ld, const float *x, int x_ld, int T,
                           int n, const float *w, float eps)
{
    if (T <= 0)
        return 0;
    k_rmsnorm<<<T, 256, 0, (cudaStream_t)stream>>>(out, out_ld, x, x_ld, n, w, eps);
    return launched();
}

/* ---------- elementwise ---------- */

__global__ void k_rope(float *x, int ld, int T, int n_heads, int head_ld, int half,
                       const int32_t *pos, const float *inv_freq, float mscale, int interleaved)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * half * n_heads)
        return;
    int h = (int)(idx % n_heads);
    int i = (int)((idx / n_heads) % half);
    size_t t = idx / ((size_t)n_heads * half);
    float angle = (float)pos[t] * inv_freq[i]; /* fp32 like the references */
    float cs = (float)cos((double)angle) * mscale, sn = (float)sin((double)angle) * mscale;
    float *v = x + t * ld + (size_t)h * head_ld;
    int a = interleaved ? 2 * i : i, c = interleaved ? 2 * i + 1 : i + half;
    float x0 = v[a], x1 = v[c];
    v[a] = x0 * cs - x1 * sn;
    v[c] = x0 * sn + x1 * cs;
}

extern "C" int tdk_rope(void *stream, float *x, int ld, int T, int n_heads, int head_ld,
                        int rope_dim, const int32_t *pos, const float *inv_freq, float mscale,
                        int interleaved)
{
    size_t total = (size_t)T * (rope_dim / 2) * n_heads;
    if (total == 0)
        return 0;
    k_rope<<<blocks_for(total, 256), 256, 0, (cudaStream_t)stream>>>(
        x, ld, T, n_heads, head_ld, rope_dim / 2, pos, inv_freq, mscale, interleaved);
    return launched();
}

__global__ void k_silu_mul(float *g, int g_ld, const float *u, int u_ld, int T, int n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * n)
        return;
    size_t t = i / n, c = i % n;
    float v = g[t * g_ld + c];
    g[t * g_ld + c] = v / (1.0f + expf(-v)) * u[t * u_ld + c];
}

extern "C" int tdk_silu_mul(void *stream, float *g, int g_ld, const float *u, int u_ld, int T,
                            int n)
{
    size_t total = (size_t)T * n;
    if (total == 0)
        return 0;
    k_silu_mul<<<blocks_for(total, 256), 256, 0, (cudaStream_t)stream>>>(g, g_ld, u, u_ld, T, n);
    return launched();
}

__global__ void k_add(float *x, const float *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

extern "C" int tdk_add(void *stream, float *x, const float *y, size_t n)
{
    if (n == 0)
        return 0;
    k_add<<<blocks_for(n, 256), 256, 0, (cudaStream_t)stream>>>(x, y, n);
    return launched();
}

/* ---------- the cache ---------- */

__device__ static size_t slot_off(const tdk_pool_t &p, const int32_t *blocks, const tdk_tok_t &tk,
                                  int pos, int layer)
{
    int32_t blk = blocks[tk.boff + pos / p.block_size];
    return (size_t)blk * p.block_floats + (size_t)layer * p.layer_floats +
           (size_t)(pos % p.block_size) * p.token_floats;
}

__global__ void k_kv_store(tdk_pool_t pool, int layer, const tdk_tok_t *toks,
                           const int32_t *blocks, const float *src, int src_ld)
{
    tdk_tok_t tk = toks[blockIdx.x];
    float *dst = pool.mem + slot_off(pool, blocks, tk, tk.pos, layer);
    const float *s = src + (size_t)blockIdx.x * src_ld;
    for (int i = threadIdx.x; i < pool.token_floats; i += blockDim.x)
        dst[i] = s[i];
}

extern "C" int tdk_kv_store(void *stream, tdk_pool_t pool, int layer, const tdk_tok_t *toks,
                            const int32_t *blocks, int T, const float *src, int src_ld)
{
    if (T <= 0)
        return 0;
    k_kv_store<<<T, 128, 0, (cudaStream_t)stream>>>(pool, layer, toks, blocks, src, src_ld);
    return launched();
}

/* ---------- attention ----------
 * One block of ATT_THREADS per (token, head). Positions go in chunks of ATT_CHUNK: each warp
 * scores positions of the chunk (lanes split the dot products, so cache rows are read
 * coalesced), then the online softmax folds the chunk in: thread d keeps output values
 * d, d + ATT_THREADS, ... in registers. */
#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_CHUNK 64
#define ATT_J (TDK_MAX_HEAD / ATT_THREADS)

__global__ void __launch_bounds__(ATT_THREADS)
    k_attn(tdk_attn_t a, tdk_pool_t pool, const tdk_tok_t *toks, const int32_t *blocks)
{
    __shared__ float q1s[TDK_MAX_HEAD], q2s[TDK_MAX_Q2], sc[ATT_CHUNK], wt[ATT_CHUNK];
    __shared__ size_t off[ATT_CHUNK];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads, kvh = h / a.group;
    const float *q1 = a.q1 + (size_t)t * a.q1_ld + (size_t)h * a.q1_head_ld;
    for (int i = tid; i < a.n1; i += ATT_THREADS)
        q1s[i] = q1[i];
    if (a.n2) {
        const float *q2 = a.q2 + (size_t)t * a.q2_ld + (size_t)h * a.q2_head_ld;
        for (int i = tid; i < a.n2; i += ATT_THREADS)
            q2s[i] = q2[i];
    }
    const tdk_tok_t tk = toks[t];
    const int k1 = kvh * a.k1_head + a.k1_off, v0 = kvh * a.v_head + a.v_off;
    float m = -INFINITY, l = 0, acc[ATT_J];
#pragma unroll
    for (int j = 0; j < ATT_J; j++)
        acc[j] = 0;
    __syncthreads();
    for (int p0 = tk.start; p0 <= tk.pos; p0 += ATT_CHUNK) {
        const int n = min(ATT_CHUNK, tk.pos - p0 + 1);
        if (tid < n)
            off[tid] = slot_off(pool, blocks, tk, p0 + tid, a.layer);
        __syncthreads();
        for (int c = warp; c < n; c += ATT_WARPS) {
            const float *kv = pool.mem + off[c];
            float s = 0;
            for (int i = lane; i < a.n1; i += 32)
                s += q1s[i] * kv[k1 + i];
            for (int i = lane; i < a.n2; i += 32)
                s += q2s[i] * kv[a.k2_off + i];
            s = warp_sum(s);
            if (lane == 0)
                sc[c] = s * a.scale;
        }
        __syncthreads();
        float cm = -INFINITY;
        for (int c = 0; c < n; c++)
            cm = fmaxf(cm, sc[c]);
        const float mn = fmaxf(m, cm), corr = expf(m - mn); /* 0 on the first chunk */
        if (tid < n)
            wt[tid] = expf(sc[tid] - mn);
        __syncthreads();
        float ws = 0;
        for (int c = 0; c < n; c++)
            ws += wt[c];
        l = l * corr + ws;
#pragma unroll
        for (int j = 0; j < ATT_J; j++)
            acc[j] *= corr;
        for (int c = 0; c < n; c++) {
            const float *v = pool.mem + off[c] + v0;
            const float w = wt[c];
#pragma unroll
            for (int j = 0; j < ATT_J; j++) {
                int d = tid + j * ATT_THREADS;
                if (d < a.nv)
                    acc[j] += w * v[d];
            }
        }
        m = mn;
        __syncthreads(); /* the next chunk rewrites off, sc and wt */
    }
    float *o = a.out + (size_t)t * a.out_ld + (size_t)h * a.out_head_ld;
#pragma unroll
    for (int j = 0; j < ATT_J; j++) {
        int d = tid + j * ATT_THREADS;
        if (d < a.nv)
            o[d] = acc[j] / l;
    }
}

extern "C" int tdk_attn(void *stream, const tdk_attn_t *a, int T, tdk_pool_t pool,
                        const tdk_tok_t *toks, const int32_t *blocks)
{
    if (T <= 0)
        return 0;
    if (a->n1 > TDK_MAX_HEAD || a->nv > TDK_MAX_HEAD || a->n2 > TDK_MAX_Q2)
        return (int)cudaErrorInvalidValue;
    k_attn<<<(unsigned)T * a->n_heads, ATT_THREADS, 0, (cudaStream_t)stream>>>(*a, pool, toks,
                                                                              blocks);
    return launched();
}
