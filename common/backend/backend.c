/* backend.c: what every backend shares above its hooks: a KV pool in the backend's memory and the
 * staging of its blocks through host memory (the data plane's view of a device pool). */
#include "td_backend.h"
#include "td_error.h"
#include "td_util.h"

int td_backend_kv_pool_init(td_backend_t *b, td_kv_pool_t *p, const td_kv_layout_t *l,
                            int n_blocks)
{
    if (n_blocks < 1 || l->block_bytes == 0)
        return td_err_set(TD_EINVAL, "kv pool of %d blocks", n_blocks);
    if ((size_t)n_blocks > SIZE_MAX / l->block_bytes)
        return td_err_set(TD_EOVERFLOW, "kv pool of %d blocks is too large", n_blocks);
    size_t bytes = TD_ALIGN_UP((size_t)n_blocks * l->block_bytes, (size_t)64);
    void *mem = b->alloc(b, bytes, b->kv_mem);
    if (!mem)
        return td_err_set(TD_ENOMEM, "kv pool: %s backend cannot allocate %d blocks of %zu bytes",
                          b->name, n_blocks, l->block_bytes);
    int rc = td_kv_pool_init_mem_kind(p, l, n_blocks, mem, b->kv_mem);
    if (rc)
        b->free(b, mem, b->kv_mem);
    return rc;
}

void td_backend_kv_pool_free(td_backend_t *b, td_kv_pool_t *p)
{
    void *mem = p->mem;
    td_mem_kind_t kind = p->mem_kind;
    td_kv_pool_free(p);
    b->free(b, mem, kind);
}

void td_backend_kv_block_out(td_backend_t *b, const td_kv_pool_t *p, int32_t id, void *dst)
{
    b->copy(b, dst, td_kv_block_data(p, id), p->layout.block_bytes);
    b->sync(b);
}

void td_backend_kv_block_in(td_backend_t *b, td_kv_pool_t *p, int32_t id, const void *src)
{
    b->copy(b, td_kv_block_data(p, id), src, p->layout.block_bytes);
    b->sync(b);
}
