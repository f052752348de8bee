/* cpu_attn.c: the CPU backend's attention (td_backend_t's attn_gqa and attn_mla, through
 * cpu_backend.c): per (token, group of heads that read the same keys), an online softmax over the
 * token's keys in blocks of eight, split across the pool. */
#include "cpu_impl.h"
#include "td_backend.h"
#include "td_error.h"

#include <math.h>
#include <string.h>

typedef struct attn_job {
    float *out;
    int out_ld;
    const float *q;
    int q_ld;
    const float *q_pe;
    int q_pe_ld, q_pe_head_ld;
    const td_attn_tok_t *toks;
    const td_kv_pool_t *pool;
    int layer, n_heads, n_kv_heads, head_dim, rope_dim;
    float scale;
} attn_job_t;

/* Attention's softmax goes over a token's keys in blocks of ATTN_KEYS positions counted from its
 * first key (tk->start): a block's scores, then their weights with one vector exp, folded into
 * the running maximum m, sum l and accumulator acc:
 *   m' = max(m, the block's scores); c = e^(m - m') (0 on the first block); p_j = e^(s_j - m');
 *   acc = acc * c + p_0 v_0 + p_1 v_1 + ... in key order; l = l * c + (p_0 + ... + p_7) in hsum8's
 *   tree.
 * The blocks depend only on the token's first and last key, so its attention is the same bits
 * whether it is prefilled among others, alone, in chunks, or decoded. */
enum { ATTN_KEYS = 8 };

typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f splat8(float x)
{
    return (v8f){x, x, x, x, x, x, x, x};
}

/* e^x in each lane, for x <= 0 (softmax weights): 2^n e^r with n = x / ln 2 rounded to nearest,
 * r = x - n ln 2 in two parts, e^r by Cephes' expf polynomial: under 1 ulp from the float
 * exp (checked against double on every 7th float of [-87.33654, 0]). Below ln(FLT_MIN) =
 * -87.33654 (and -inf) it gives 0. Plain vector operations, no fused multiply-add (-std=c11), so
 * every build computes the same bits. */
static inline v8f exp8(v8f x)
{
    const v8f lo = splat8(-87.33654f);
    v8i under = x < lo;
    x = (v8f)(((v8i)x & ~under) | ((v8i)lo & under));
    v8f n = (x * splat8(1.44269504088896341f) + splat8(12582912.0f)) - splat8(12582912.0f);
    v8f r = x - n * splat8(0.693359375f);
    r = r - n * splat8(-2.12194440e-4f);
    v8f y = splat8(1.9875691500e-4f);
    y = y * r + splat8(1.3981999507e-3f);
    y = y * r + splat8(8.3334519073e-3f);
    y = y * r + splat8(4.1665795894e-2f);
    y = y * r + splat8(1.6666665459e-1f);
    y = y * r + splat8(5.0000001201e-1f);
    y = y * (r * r) + r + splat8(1.0f);
    v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    y = y * (v8f)e;
    return (v8f)((v8i)y & ~under);
}

/* q . k[b] for the ATTN_KEYS key rows k[0..8) (n values each): lane b of the result. One 8-lane
 * accumulator per key over 8-value steps, the eight reduced together in hsum8's tree
 * ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then the tail in order. */
static inline v8f pair_sums(v8f a, v8f b)
{
    return __builtin_shufflevector(a, b, 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a, b, 1, 9, 3, 11, 5, 13, 7, 15);
}

__attribute__((always_inline)) static inline v8f dots8(const float *q, const float *const *k,
                                                       int64_t n)
{
    v8f a[ATTN_KEYS] = {{0}};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f x = load8(q + i);
        for (int b = 0; b < ATTN_KEYS; b++)
            a[b] += x * load8(k[b] + i);
    }
    v8f x01 = pair_sums(a[0], a[1]), x23 = pair_sums(a[2], a[3]), x45 = pair_sums(a[4], a[5]),
        x67 = pair_sums(a[6], a[7]);
    v8f y03 = __builtin_shufflevector(x01, x23, 0, 1, 8, 9, 4, 5, 12, 13) +
              __builtin_shufflevector(x01, x23, 2, 3, 10, 11, 6, 7, 14, 15);
    v8f y47 = __builtin_shufflevector(x45, x67, 0, 1, 8, 9, 4, 5, 12, 13) +
              __builtin_shufflevector(x45, x67, 2, 3, 10, 11, 6, 7, 14, 15);
    v8f r = __builtin_shufflevector(y03, y47, 0, 1, 2, 3, 8, 9, 10, 11) +
            __builtin_shufflevector(y03, y47, 4, 5, 6, 7, 12, 13, 14, 15);
    for (; i < n; i++)
        for (int b = 0; b < ATTN_KEYS; b++)
            r[b] += q[i] * k[b][i];
    return r;
}

/* Fold a block of nb keys (scores s[0..nb), already scaled; value rows v[0..8), those past nb
 * any readable rows of finite values: their weight is 0) into one head's (m, l, acc[width]). */
__attribute__((always_inline)) static inline void
fold_block(v8f s, int nb, const float *const *v, int width, float *m, float *l, float *acc)
{
    float mx = *m;
    for (int k = 0; k < nb; k++)
        mx = s[k] > mx ? s[k] : mx;
    v8f e = splat8(-INFINITY);
    for (int k = 0; k < nb; k++)
        e[k] = s[k] - mx;
    v8f p = exp8(e), c8 = exp8(splat8(*m - mx)), pk[ATTN_KEYS];
    float c = c8[0];
    for (int k = 0; k < ATTN_KEYS; k++) /* p is +0 past nb: those keys add nothing */
        pk[k] = splat8(p[k]);
    int d = 0;
    for (; d + 8 <= width; d += 8) {
        v8f a = load8(acc + d) * c8;
        for (int k = 0; k < ATTN_KEYS; k++)
            a += pk[k] * load8(v[k] + d);
        memcpy(acc + d, &a, sizeof(a));
    }
    for (; d < width; d++) {
        float a = acc[d] * c;
        for (int k = 0; k < ATTN_KEYS; k++)
            a += p[k] * v[k][d];
        acc[d] = a;
    }
    *l = *l * c + hsum8(p);
    *m = mx;
}

/* Heads that attend over the same keys are folded together, position by position: each key and
 * value row is read once for all of them while it is in L1, not once per head. Up to
 * ATTN_HEADS heads and ATTN_ACC floats of accumulators at a time. Each head's own sums are
 * the same operations in the same order as one head alone, so grouping changes no bit. */
enum { ATTN_HEADS = 8, ATTN_ACC = 8192 };

static int attn_heads_at_once(int heads, int width)
{
    return TD_MAX(1, TD_MIN(TD_MIN(heads, ATTN_HEADS), ATTN_ACC / width));
}

/* Heads h0..h0+g of token t: the g accumulators reset, folded over t's positions, divided out. */
typedef struct attn_heads {
    float m[ATTN_HEADS], l[ATTN_HEADS];
    float acc[ATTN_ACC];
} attn_heads_t;

static inline void heads_reset(attn_heads_t *a, int g, int width)
{
    for (int i = 0; i < g; i++) {
        a->m[i] = -INFINITY;
        a->l[i] = 0;
    }
    memset(a->acc, 0, (size_t)g * (size_t)width * sizeof(float));
}

static inline void heads_out(const attn_heads_t *a, int g, int width, float *out, size_t head_ld)
{
    for (int i = 0; i < g; i++)
        for (int d = 0; d < width; d++)
            out[(size_t)i * head_ld + d] = a->acc[(size_t)i * width + d] / a->l[i];
}

/* Attention's items (a token and a group of its heads) in about eight chunks per thread: under a
 * causal mask a later token attends over more keys, so equal ranges would leave the last thread
 * most of the work. */
static int64_t attn_grain(const td_cpu_pool_t *p, int T, int n_heads)
{
    return td_cpu_pool_grain(p, (int64_t)T * n_heads, 8, 1, 1);
}

/* The cache rows of token tk's keys p0 .. p0 + nb - 1 into row[0..ATTN_KEYS), the last one again
 * past nb (fold_block gives those no weight). */
static inline void block_rows(const attn_job_t *j, const td_attn_tok_t *tk, int p0, int nb,
                              const float **row)
{
    int B = j->pool->layout.block_size;
    for (int b = 0; b < ATTN_KEYS; b++) {
        int p = p0 + TD_MIN(b, nb - 1);
        row[b] = td_kv_slot(j->pool, tk->blocks[p / B], j->layer, p % B);
    }
}

/* MLA's items per token: runs of attn_heads_at_once heads. */
static int mla_runs(int n_heads, int kv_rank)
{
    int G = attn_heads_at_once(n_heads, kv_rank);
    return (n_heads + G - 1) / G;
}

/* Items are (token, KV head): the query heads that share the KV head go together. */
TD_CPU_KERNEL static void gqa_items(void *arg, int64_t i0, int64_t i1, int tid)
{
    attn_job_t *j = arg;
    int hd = j->head_dim, group = j->n_heads / j->n_kv_heads;
    int G = attn_heads_at_once(group, hd);
    attn_heads_t a;
    (void)tid;
    for (int64_t it = i0; it < i1; it++) {
        int t = (int)(it / j->n_kv_heads), kvh = (int)(it % j->n_kv_heads);
        const td_attn_tok_t *tk = &j->toks[t];
        for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += G) {
            int g = TD_MIN(G, (kvh + 1) * group - h0);
            const float *q = j->q + (size_t)t * j->q_ld + (size_t)h0 * hd;
            heads_reset(&a, g, hd);
            for (int p0 = tk->start; p0 <= tk->pos; p0 += ATTN_KEYS) {
                int nb = TD_MIN(ATTN_KEYS, tk->pos + 1 - p0);
                const float *row[ATTN_KEYS], *k[ATTN_KEYS], *v[ATTN_KEYS];
                block_rows(j, tk, p0, nb, row);
                for (int b = 0; b < ATTN_KEYS; b++) {
                    k[b] = row[b] + (size_t)kvh * hd;
                    v[b] = row[b] + (size_t)(j->n_kv_heads + kvh) * hd;
                }
                for (int i = 0; i < g; i++)
                    fold_block(dots8(q + (size_t)i * hd, k, hd) * splat8(j->scale), nb, v, hd,
                               &a.m[i], &a.l[i], a.acc + (size_t)i * hd);
            }
            heads_out(&a, g, hd, j->out + (size_t)t * j->out_ld + (size_t)h0 * hd, (size_t)hd);
        }
    }
}

void td__cpu_attn_gqa(td_cpu_pool_t *p, float *out, int out_ld, const float *q, int q_ld, int T,
                         const td_attn_tok_t *toks, const td_kv_pool_t *pool, int layer,
                         int n_heads, int n_kv_heads, int head_dim, float scale)
{
    TD_ASSERT(head_dim <= TD_CPU_MAX_HEAD);
    attn_job_t j = {out,  out_ld, q,       q_ld,       NULL,     0, 0,    toks,
                    pool, layer,  n_heads, n_kv_heads, head_dim, 0, scale};
    td_cpu_pool_run(p, (int64_t)T * n_kv_heads, attn_grain(p, T, n_kv_heads), gqa_items, &j);
}

/* Items are (token, a run of attn_heads_at_once heads): all heads share the one latent row. */
TD_CPU_KERNEL static void mla_items(void *arg, int64_t i0, int64_t i1, int tid)
{
    attn_job_t *j = arg;
    int r = j->head_dim; /* head_dim carries kv_rank */
    int G = attn_heads_at_once(j->n_heads, r), runs = mla_runs(j->n_heads, r);
    attn_heads_t a;
    (void)tid;
    for (int64_t it = i0; it < i1; it++) {
        int t = (int)(it / runs), h0 = (int)(it % runs) * G, g = TD_MIN(G, j->n_heads - h0);
        const float *ql = j->q + ((size_t)t * j->n_heads + h0) * r;
        const float *qp = j->q_pe + (size_t)t * j->q_pe_ld + (size_t)h0 * j->q_pe_head_ld;
        const td_attn_tok_t *tk = &j->toks[t];
        heads_reset(&a, g, r);
        for (int p0 = tk->start; p0 <= tk->pos; p0 += ATTN_KEYS) {
            int nb = TD_MIN(ATTN_KEYS, tk->pos + 1 - p0);
            const float *kv[ATTN_KEYS], *pe[ATTN_KEYS];
            block_rows(j, tk, p0, nb, kv);
            for (int b = 0; b < ATTN_KEYS; b++)
                pe[b] = kv[b] + r;
            for (int i = 0; i < g; i++) {
                v8f sc = (dots8(ql + (size_t)i * r, kv, r) +
                          dots8(qp + (size_t)i * j->q_pe_head_ld, pe, j->rope_dim)) *
                         splat8(j->scale);
                fold_block(sc, nb, kv, r, &a.m[i], &a.l[i], a.acc + (size_t)i * r);
            }
        }
        heads_out(&a, g, r, j->out + ((size_t)t * j->n_heads + h0) * r, (size_t)r);
    }
}

void td__cpu_attn_mla(td_cpu_pool_t *p, float *out, const float *q_lat, const float *q_pe,
                         int q_pe_ld, int q_pe_head_ld, int T, const td_attn_tok_t *toks,
                         const td_kv_pool_t *pool, int layer, int n_heads, int kv_rank,
                         int rope_dim, float scale)
{
    TD_ASSERT(kv_rank <= TD_CPU_MAX_HEAD);
    attn_job_t j = {out,  0,     q_lat,   0, q_pe,    q_pe_ld,  q_pe_head_ld, toks,
                    pool, layer, n_heads, 0, kv_rank, rope_dim, scale};
    int runs = mla_runs(n_heads, kv_rank);
    td_cpu_pool_run(p, (int64_t)T * runs, attn_grain(p, T, runs), mla_items, &j);
}
