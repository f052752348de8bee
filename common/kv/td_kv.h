/* td_kv.h: the paged, block-major KV cache.
 *
 * A block holds the attention state of `block_size` consecutive tokens of one sequence for every
 * layer, in one contiguous byte range, so one block moves in one RDMA operation:
 *
 *   block [n_layers][block_size][token_floats]  (fp32)
 *
 * token_floats is what one token leaves per layer: for MLA models the normalised latent and the
 * RoPE'd key part (kv_lora_rank + qk_rope_head_dim); for GQA models K then V of every KV head
 * (2 * n_kv_heads * head_dim). A sequence owns a block table: token i lives in block
 * blocks[i / block_size] at slot i % block_size.
 *
 * The layout fingerprint (XXH3-128 of the model digest, dtype, block size, layer count, the
 * engine's numerics version and bytes per layer) is what workers compare before they exchange
 * blocks, and what every block hash and disk-tier path is rooted in.
 */
#ifndef TD_KV_H
#define TD_KV_H

#include "td_kvhash.h"
#include "td_model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_kv_layout {
    uint8_t model_digest[16]; /* td_model_t.digest */
    td_dtype_t dtype;         /* of the cached values: TD_DTYPE_F32 */
    int block_size;           /* tokens per block */
    int n_layers;
    int token_floats;        /* values per token per layer */
    size_t layer_bytes;      /* bytes of one layer within a block: block_size * token_floats * 4 */
    size_t block_bytes;      /* n_layers * layer_bytes */
    uint8_t fingerprint[16]; /* XXH3-128 (canonical bytes) of the fields above */
} td_kv_layout_t;

/* Describe the cache of `m` with `block_size` tokens per block (1..4096). 0 or TD_EINVAL. */
int td_kv_layout_init(td_kv_layout_t *l, const td_model_t *m, int block_size);

/* Whether two workers may exchange blocks: same fingerprint. */
bool td_kv_layout_match(const td_kv_layout_t *a, const td_kv_layout_t *b);

/* Where a buffer lives (the KV pool's memory, a backend's allocations: td_backend.h).
 * HOST: ordinary host memory. DEVICE: accelerator memory that only the backend's operations (and
 * a device-aware data plane) may touch; the host reaches it through the backend's copy hook.
 * SHARED: one address valid on the host and the device (CUDA managed memory); the host touches it
 * only after the backend's sync. PINNED: host memory the device can DMA to and from (a staging
 * buffer, registerable with the data plane). */
typedef enum td_mem_kind {
    TD_MEM_HOST = 0,
    TD_MEM_DEVICE,
    TD_MEM_SHARED,
    TD_MEM_PINNED,
} td_mem_kind_t;

/* A pool of blocks, in host memory unless mem_kind says otherwise, refcounted, with the worker's
 * prefix cache (tier 0) in it.
 *
 * A full block whose content is known by its chain hash (td_kvhash.h) can be *published*: the
 * pool then finds it by that hash, and when its last reference goes it is not freed but kept as
 * a cached block, least recently used first in line for eviction, until an allocation needs room.
 * A sequence takes cached blocks into its block table with td_kv_seq_attach_cached (a reference
 * each), so sequences with a common prefix share its blocks. Blocks are only ever published full
 * and never written after that (every writer owns its blocks alone: the prompt's uncached suffix
 * and the generated tokens go into blocks of its own).
 *
 * n_free counts every block an allocation can take: free ones and unreferenced cached ones. Not
 * thread-safe: one owner thread. */
typedef struct td_kv_pool {
    td_kv_layout_t layout;
    int n_blocks;
    uint8_t *mem;      /* [n_blocks][block_bytes], 64-byte aligned */
    int32_t *free_ids; /* [n_blocks] stack of free blocks without cached content, n_stack of them */
    int n_stack;
    int n_free;    /* allocatable: n_stack + n_evictable */
    int32_t *refs; /* [n_blocks] reference counts (0: free or cached) */
    bool borrowed; /* mem belongs to someone else (a registered data-plane pool) */
    /* where mem lives: HOST unless made by td_kv_pool_init_mem_kind */
    td_mem_kind_t mem_kind;
    /* prefix cache */
    td_kvhash_t *hash;   /* [n_blocks] a published block's hash */
    uint8_t *cached;     /* [n_blocks] 1: published (findable by hash) */
    int32_t *hnext;      /* [n_blocks] next block in the same hash bucket, -1 */
    int32_t *buckets;    /* [n_buckets] first block of each bucket, -1 */
    int n_buckets;       /* a power of two */
    int32_t *lru_prev;   /* [n_blocks] unreferenced cached blocks, oldest first */
    int32_t *lru_next;   /* [n_blocks] */
    int32_t lru_head, lru_tail; /* -1 when empty */
    int n_cached;        /* published blocks, referenced or not */
    int n_evictable;     /* published blocks with no reference */
    uint64_t evictions;  /* cached blocks reused for new content */
    /* Told when the cache's content changes (the worker's cluster index listens): `added` when
     * block `id` is published under `h` (td_kv_block_publish returned true), not `added` when
     * td_kv_block_alloc evicts it (it is reused for new content). Called on the pool's thread,
     * inside those calls; it must not call back into the pool. NULL: nobody listens. */
    void (*on_cache)(void *ud, int32_t id, const td_kvhash_t *h, bool added);
    void *on_cache_ud;
} td_kv_pool_t;

/* Allocate a pool of `n_blocks` blocks. 0, TD_EINVAL or TD_ENOMEM. */
int td_kv_pool_init(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks);
void td_kv_pool_free(td_kv_pool_t *p);
/* A pool over `mem` that the caller owns: [n_blocks][block_bytes] bytes, 64-byte aligned, e.g. the
 * UCX-registered pool of td_kvx so that blocks move without a copy. td_kv_pool_free leaves `mem`
 * alone. 0, TD_EINVAL or TD_ENOMEM. */
int td_kv_pool_init_mem(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks, void *mem);
/* td_kv_pool_init_mem over memory of kind `kind` (e.g. device memory a backend allocated:
 * td_backend_kv_pool_init). The pool never reads or writes mem itself; td_kv_block_data and
 * td_kv_slot return addresses in that memory. */
int td_kv_pool_init_mem_kind(td_kv_pool_t *p, const td_kv_layout_t *l, int n_blocks, void *mem,
                             td_mem_kind_t kind);
/* Take a block (refcount 1): a free one, else the least recently used cached one (which leaves
 * the cache). 0 or TD_ENOSPC. */
int td_kv_block_alloc(td_kv_pool_t *p, int32_t *id);
/* Add a reference to a used or cached block (prefix sharing). */
void td_kv_block_ref(td_kv_pool_t *p, int32_t id);
/* Drop a reference; at zero the block is free again, or cached when it was published. */
void td_kv_block_unref(td_kv_pool_t *p, int32_t id);
/* Publish block `id` (referenced, full, its KV final) under hash `h`. Returns true when it is now
 * cached, false when another block already holds that content (this one stays unpublished and is
 * freed as usual). */
bool td_kv_block_publish(td_kv_pool_t *p, int32_t id, const td_kvhash_t *h);
/* The cached block with hash `h`, or -1. */
int32_t td_kv_cache_find(const td_kv_pool_t *p, const td_kvhash_t *h);

/* The bytes of block `id`: block_bytes of them. */
uint8_t *td_kv_block_data(const td_kv_pool_t *p, int32_t id);
/* The token_floats values of layer `layer`, slot `slot` of block `id`. */
float *td_kv_slot(const td_kv_pool_t *p, int32_t id, int layer, int slot);

/* One sequence's cache: tokens [0, n_tokens) are stored. */
typedef struct td_kv_seq {
    int n_tokens;
    int32_t *blocks; /* [n_blocks] block ids in token order */
    int n_blocks;
    int cap;
} td_kv_seq_t;

void td_kv_seq_init(td_kv_seq_t *s);
/* Make room for `n_tokens` tokens in total, taking blocks from the pool: all of them or none.
 * 0 or TD_ENOSPC / TD_ENOMEM (the sequence is as it was). When the room is already there it
 * reads only `s`, not the pool (the engine's step calls it on the compute thread while the loop
 * owns the pool). */
int td_kv_seq_reserve(td_kv_pool_t *p, td_kv_seq_t *s, int n_tokens);
/* Return every block to the pool and empty the sequence. Blocks are let go last first, so a
 * cached prefix is evicted from its end: what stays cached is always a prefix. */
void td_kv_seq_release(td_kv_pool_t *p, td_kv_seq_t *s);
/* Keep only the first n_blocks blocks of s (the rest go back to the pool); n_tokens is capped to
 * what they hold. */
void td_kv_seq_truncate(td_kv_pool_t *p, td_kv_seq_t *s, int n_blocks);
/* Take the longest cached prefix of the chain h[0, n) into the empty sequence s (a reference per
 * block); s->n_tokens becomes that many full blocks. Returns the number of blocks taken (0 on
 * allocation failure too). */
int td_kv_seq_attach_cached(td_kv_pool_t *p, td_kv_seq_t *s, const td_kvhash_t *h, int n);

#endif
