/* kv.c: KV cache layout, fingerprint, block pool and per-sequence block tables. */
#include "td_error.h"
#include "td_kv.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The engine's numerics version, in every layout fingerprint: bumped whenever the KV an engine
 * computes for an existing model file changes in any bit (a kernel's summation order, an
 * activation scheme), so that KV of the old numerics, on a disk tier or on a worker not yet
 * upgraded, is never taken for the new (cached KV must be bitwise what a recompute gives).
 * 2: Q8_0 and Q4_0 weights against 8-bit activations (cpu_q8.c).
 * 3: those products summed a lane per block (each block's exact integer sum, then one
 *    multiply-add in lane b mod 8) instead of a lane per four values.
 * 4: Q4_K and Q6_K weights against activations quantised to 8 bits per 256 values (cpu_qk.c).
 * 5: attention's softmax over blocks of 8 keys with a vector exp (cpu_attn.c, fold_block). */
#define TD_KV_NUMERICS 5u

int td_kv_layout_init(td_kv_layout_t *l, const td_model_t *m, int block_size)
{
    const td_model_cfg_t *c = &m->cfg;
    if (block_size < 1 || block_size > 4096)
        return td_err_set(TD_EINVAL, "kv block size %d (1..4096)", block_size);
    memset(l, 0, sizeof(*l));
    memcpy(l->model_digest, m->digest, 16);
    l->dtype = TD_DTYPE_F32;
    l->block_size = block_size;
    l->n_layers = c->n_layers;
    const td_arch_desc_t *arch = td_arch_desc(c->arch);
    TD_ASSERT(arch); /* a loaded model's architecture has a row */
    l->token_floats = arch->kv_token_floats(c);
    l->layer_bytes = (size_t)block_size * (size_t)l->token_floats * sizeof(float);
    l->block_bytes = (size_t)l->n_layers * l->layer_bytes;
    /* fingerprint over a fixed little-endian encoding, not the struct (padding) */
    uint8_t buf[16 + 5 * 4 + 8];
    uint32_t f[5] = {(uint32_t)l->dtype, (uint32_t)block_size, (uint32_t)l->n_layers,
                     (uint32_t)l->token_floats, TD_KV_NUMERICS};
    uint64_t lb = l->layer_bytes;
    memcpy(buf, l->model_digest, 16);
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 4; b++)
            buf[16 + 4 * i + b] = (uint8_t)(f[i] >> (8 * b));
    for (int b = 0; b < 8; b++)
        buf[36 + b] = (uint8_t)(lb >> (8 * b));
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits(buf, sizeof(buf)));
    memcpy(l->fingerprint, canon.digest, 16);
    return 0;
}

bool td_kv_layout_match(const td_kv_layout_t *a, const td_kv_layout_t *b)
{
    return memcmp(a->fingerprint, b->fingerprint, 16) == 0;
}

static int pool_setup(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks, void *mem)
{
    memset(p, 0, sizeof(*p));
    if (n_blocks < 1 || l->block_bytes == 0)
        return td_err_set(TD_EINVAL, "kv pool of %d blocks", n_blocks);
    if ((size_t)n_blocks > SIZE_MAX / l->block_bytes)
        return td_err_set(TD_EOVERFLOW, "kv pool of %d blocks is too large", n_blocks);
    if (mem && ((uintptr_t)mem & 63u))
        return td_err_set(TD_EINVAL, "kv pool memory is not 64-byte aligned");
    p->layout = *l;
    p->n_blocks = n_blocks;
    size_t bytes = TD_ALIGN_UP((size_t)n_blocks * l->block_bytes, (size_t)64);
    p->borrowed = mem != NULL;
    p->mem = mem ? mem : aligned_alloc(64, bytes);
    size_t nb = (size_t)n_blocks;
    p->n_buckets = 1;
    while (p->n_buckets < n_blocks && p->n_buckets < (1 << 30))
        p->n_buckets <<= 1;
    p->free_ids = td_calloc(nb, sizeof(int32_t));
    p->refs = td_calloc(nb, sizeof(int32_t));
    p->hash = td_calloc(nb, sizeof(td_kvhash_t));
    p->cached = td_calloc(nb, 1);
    p->hnext = td_calloc(nb, sizeof(int32_t));
    p->lru_prev = td_calloc(nb, sizeof(int32_t));
    p->lru_next = td_calloc(nb, sizeof(int32_t));
    p->buckets = td_calloc((size_t)p->n_buckets, sizeof(int32_t));
    if (!p->mem || !p->free_ids || !p->refs || !p->hash || !p->cached || !p->hnext ||
        !p->lru_prev || !p->lru_next || !p->buckets) {
        td_kv_pool_free(p);
        return td_err_set(TD_ENOMEM, "kv pool: cannot allocate %d blocks of %zu bytes", n_blocks,
                          l->block_bytes);
    }
    if (!mem)
        memset(p->mem, 0, bytes);
    for (int i = 0; i < n_blocks; i++)
        p->free_ids[i] = n_blocks - 1 - i; /* pop order 0, 1, 2, ... */
    p->n_stack = p->n_free = n_blocks;
    for (int i = 0; i < p->n_buckets; i++)
        p->buckets[i] = -1;
    p->lru_head = p->lru_tail = -1;
    return 0;
}

int td_kv_pool_init(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks)
{
    return pool_setup(p, l, n_blocks, NULL);
}

int td_kv_pool_init_mem(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks, void *mem)
{
    if (!mem)
        return td_err_set(TD_EINVAL, "kv pool: no memory given");
    return pool_setup(p, l, n_blocks, mem);
}

int td_kv_pool_init_mem_kind(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks, void *mem,
                             td_mem_kind_t kind)
{
    int rc = td_kv_pool_init_mem(p, l, n_blocks, mem);
    if (rc == 0)
        p->mem_kind = kind;
    return rc;
}

void td_kv_pool_free(td_kv_pool_t *p)
{
    if (!p->borrowed)
        free(p->mem);
    free(p->free_ids);
    free(p->refs);
    free(p->hash);
    free(p->cached);
    free(p->hnext);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->buckets);
    memset(p, 0, sizeof(*p));
}

static uint32_t bucket_of(const td_kv_pool_t *p, const td_kvhash_t *h)
{
    uint64_t k;
    memcpy(&k, h->b, sizeof(k));
    return (uint32_t)(k & (uint64_t)(p->n_buckets - 1));
}

static void lru_remove(td_kv_pool_t *p, int32_t id)
{
    int32_t a = p->lru_prev[id], b = p->lru_next[id];
    if (a >= 0)
        p->lru_next[a] = b;
    else
        p->lru_head = b;
    if (b >= 0)
        p->lru_prev[b] = a;
    else
        p->lru_tail = a;
    p->n_evictable--;
    p->n_free--;
}

static void lru_append(td_kv_pool_t *p, int32_t id)
{
    p->lru_prev[id] = p->lru_tail;
    p->lru_next[id] = -1;
    if (p->lru_tail >= 0)
        p->lru_next[p->lru_tail] = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
    p->n_evictable++;
    p->n_free++;
}

/* Take block id out of the hash index. */
static void unpublish(td_kv_pool_t *p, int32_t id)
{
    int32_t *at = &p->buckets[bucket_of(p, &p->hash[id])];
    while (*at != id) {
        TD_ASSERT(*at >= 0);
        at = &p->hnext[*at];
    }
    *at = p->hnext[id];
    p->cached[id] = 0;
    p->n_cached--;
}

int td_kv_block_alloc(td_kv_pool_t *p, int32_t *id)
{
    if (p->n_stack > 0) {
        *id = p->free_ids[--p->n_stack];
        p->n_free--;
    } else if (p->lru_head >= 0) {
        *id = p->lru_head; /* the least recently used cached block */
        lru_remove(p, *id);
        unpublish(p, *id);
        p->evictions++;
        if (p->on_cache)
            p->on_cache(p->on_cache_ud, *id, &p->hash[*id], false);
    } else {
        return td_err_set(TD_ENOSPC, "kv pool: all %d blocks in use", p->n_blocks);
    }
    p->refs[*id] = 1;
    return 0;
}

void td_kv_block_ref(td_kv_pool_t *p, int32_t id)
{
    TD_ASSERT(id >= 0 && id < p->n_blocks && (p->refs[id] > 0 || p->cached[id]));
    if (p->refs[id]++ == 0)
        lru_remove(p, id);
}

void td_kv_block_unref(td_kv_pool_t *p, int32_t id)
{
    TD_ASSERT(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
    if (--p->refs[id] > 0)
        return;
    if (p->cached[id]) {
        lru_append(p, id);
    } else {
        p->free_ids[p->n_stack++] = id;
        p->n_free++;
    }
}

int32_t td_kv_cache_find(const td_kv_pool_t *p, const td_kvhash_t *h)
{
    for (int32_t id = p->buckets[bucket_of(p, h)]; id >= 0; id = p->hnext[id])
        if (memcmp(p->hash[id].b, h->b, sizeof(h->b)) == 0)
            return id;
    return -1;
}

bool td_kv_block_publish(td_kv_pool_t *p, int32_t id, const td_kvhash_t *h)
{
    TD_ASSERT(id >= 0 && id < p->n_blocks && p->refs[id] > 0);
    if (p->cached[id])
        return memcmp(p->hash[id].b, h->b, sizeof(h->b)) == 0;
    if (td_kv_cache_find(p, h) >= 0)
        return false;
    uint32_t b = bucket_of(p, h);
    p->hash[id] = *h;
    p->cached[id] = 1;
    p->hnext[id] = p->buckets[b];
    p->buckets[b] = id;
    p->n_cached++;
    if (p->on_cache)
        p->on_cache(p->on_cache_ud, id, h, true);
    return true;
}

uint8_t *td_kv_block_data(const td_kv_pool_t *p, int32_t id)
{
    TD_ASSERT(id >= 0 && id < p->n_blocks);
    return p->mem + (size_t)id * p->layout.block_bytes;
}

float *td_kv_slot(const td_kv_pool_t *p, int32_t id, int layer, int slot)
{
    return (float *)(td_kv_block_data(p, id) + (size_t)layer * p->layout.layer_bytes +
                     (size_t)slot * (size_t)p->layout.token_floats * sizeof(float));
}

void td_kv_seq_init(td_kv_seq_t *s)
{
    memset(s, 0, sizeof(*s));
}

/* Room for `need` block ids in s's table. 0 or TD_ENOMEM. */
static int reserve_table(td_kv_seq_t *s, int need)
{
    if (need <= s->cap)
        return 0;
    int cap = TD_MAX(need, s->cap * 2);
    int32_t *b = td_reallocarray(s->blocks, (size_t)cap, sizeof(int32_t));
    if (!b)
        return td_err_set(TD_ENOMEM, "out of memory growing a block table");
    s->blocks = b;
    s->cap = cap;
    return 0;
}

int td_kv_seq_reserve(td_kv_pool_t *p, td_kv_seq_t *s, int n_tokens)
{
    int need = (n_tokens + p->layout.block_size - 1) / p->layout.block_size;
    if (need <= s->n_blocks)
        return 0; /* reads only the sequence: the engine calls this on the compute thread */
    if (reserve_table(s, need))
        return TD_ENOMEM;
    if (need - s->n_blocks > p->n_free)
        return td_err_set(TD_ENOSPC, "kv pool: %d blocks wanted, %d of %d free",
                          need - s->n_blocks, p->n_free, p->n_blocks);
    while (s->n_blocks < need) {
        int rc = td_kv_block_alloc(p, &s->blocks[s->n_blocks]);
        TD_ASSERT(rc == 0);
        s->n_blocks++;
    }
    return 0;
}

void td_kv_seq_release(td_kv_pool_t *p, td_kv_seq_t *s)
{
    for (int i = s->n_blocks - 1; i >= 0; i--)
        td_kv_block_unref(p, s->blocks[i]);
    free(s->blocks);
    memset(s, 0, sizeof(*s));
}

void td_kv_seq_truncate(td_kv_pool_t *p, td_kv_seq_t *s, int n_blocks)
{
    while (s->n_blocks > n_blocks)
        td_kv_block_unref(p, s->blocks[--s->n_blocks]);
    s->n_tokens = TD_MIN(s->n_tokens, s->n_blocks * p->layout.block_size);
}

int td_kv_seq_attach_cached(td_kv_pool_t *p, td_kv_seq_t *s, const td_kvhash_t *h, int n)
{
    TD_ASSERT(s->n_blocks == 0);
    int hit = 0;
    while (hit < n && td_kv_cache_find(p, &h[hit]) >= 0)
        hit++;
    if (hit == 0 || reserve_table(s, hit) != 0)
        return 0;
    for (int i = 0; i < hit; i++) {
        int32_t id = td_kv_cache_find(p, &h[i]);
        td_kv_block_ref(p, id);
        s->blocks[s->n_blocks++] = id;
    }
    s->n_tokens = hit * p->layout.block_size;
    return hit;
}
