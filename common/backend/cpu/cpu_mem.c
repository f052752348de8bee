/* cpu_mem.c: the CPU backend's memory hooks: every kind is ordinary host memory, copies are
 * memcpy and there is nothing to wait for. */
#include "cpu_impl.h"
#include "td_backend.h"
#include "td_error.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(td_backend_t *b, size_t bytes, td_mem_kind_t kind)
{
    size_t n = TD_ALIGN_UP(bytes ? bytes : 1, (size_t)64);
    void *p = aligned_alloc(64, n);
    if (!p) {
        td_err_set(TD_ENOMEM, "out of memory: %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

static void cpu_free(td_backend_t *b, void *p, td_mem_kind_t kind)
{
    free(p);
}

static void cpu_copy(td_backend_t *b, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static void cpu_sync(td_backend_t *b)
{
}

void td__cpu_mem_hooks(td_backend_t *b)
{
    b->alloc = cpu_alloc;
    b->free = cpu_free;
    b->copy = cpu_copy;
    b->sync = cpu_sync;
    b->kv_mem = TD_MEM_HOST;
    b->max_head = TD_CPU_MAX_HEAD;
}
