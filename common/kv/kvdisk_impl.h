/* kvdisk_impl.h: what the disk tier's files share (kvdisk.c: operations and the API;
 * kvdisk_index.c: the index and the scan that fills it at open). Loop thread only, except where
 * a field says otherwise. */
#ifndef TD_KVDISK_IMPL_H
#define TD_KVDISK_IMPL_H

#include "td_kvdisk.h"

#include <sys/types.h>

typedef enum estate { E_WRITING, E_READY, E_DELETING } estate_t;

typedef struct entry {
    td_kvhash_t h;
    struct entry *hnext;               /* bucket chain */
    struct entry *lru_prev, *lru_next; /* READY entries only; d->lru.lru_next is the newest */
    uint64_t bytes;                    /* the file's size: header + block_bytes */
    uint64_t mtime_ns;                 /* at open: the file's mtime (the initial LRU order) */
    uint32_t loads;                    /* loads in flight: not evicted, not removed */
    estate_t state;
    bool dead; /* a load found the file bad or gone: removed once loads reach 0 */
} entry_t;

typedef enum op_kind { OP_STORE, OP_LOAD, OP_UNLINK, OP_CLOSE } op_kind_t;

typedef struct op {
    uv_work_t req; /* req.data = the op */
    td_kvdisk_t *d;
    op_kind_t kind;
    entry_t *e; /* loop thread only */
    td_kvhash_t h;
    const void *src; /* STORE: the caller's block, lent until cb */
    void *dst;       /* LOAD: the caller's buffer, lent until cb */
    td_kvdisk_cb cb;
    void *arg;
    int status;             /* set by the work function */
    int sys_err;            /* errno of a failing system call (the disk, not the file): tier off */
    char msg[256];          /* the work thread's detail message */
    struct op *prev, *next; /* d->ops: every op queued and not yet completed */
    char path[];            /* <root>/<2 hex>/<32 hex> */
} op_t;

struct td_kvdisk {
    uv_loop_t *loop;
    char *root;          /* <opts.dir>/<fingerprint hex>; immutable after open */
    uint8_t fp[16];      /* immutable after open */
    size_t block_bytes;  /* immutable after open */
    uint64_t file_bytes; /* TD_KVDISK_HEADER_BYTES + block_bytes */
    uint64_t max_bytes;
    int lock_fd;
    entry_t **buckets;
    size_t n_buckets, n_entries;
    entry_t lru; /* sentinel */
    td_kvdisk_stats_t st;
    op_t ops; /* sentinel */
    size_t in_flight;
    bool closing;
    op_t *close_op; /* allocated at open, so close cannot fail */
    td_kvdisk_closed_cb closed_cb;
    void *closed_arg;
    td_kvdisk_change_cb on_change; /* td_kvdisk_set_listener */
    void *on_change_ud;
};

/* Tell the listener (if any) that `h` became readable or stopped being (NULL: all of them). */
static inline void td__kvdisk_changed(const td_kvdisk_t *d, const td_kvhash_t *h, bool added)
{
    if (d->on_change)
        d->on_change(d->on_change_ud, h, added);
}

/* The index (kvdisk_index.c). find: the entry of `h` or NULL. entry_add: a new entry for an
 * absent `h`, outside the LRU list, or NULL (TD_ENOMEM in td_err_msg). entry_ready: WRITING ->
 * READY, counted, most recently used. entry_remove: out of the index and freed, its bytes and
 * file released. lru_push_front: mark most recently used. */
entry_t *td__kvdisk_find(const td_kvdisk_t *d, const td_kvhash_t *h);
entry_t *td__kvdisk_entry_add(td_kvdisk_t *d, const td_kvhash_t *h, estate_t state, uint64_t bytes);
void td__kvdisk_entry_ready(td_kvdisk_t *d, entry_t *e);
void td__kvdisk_entry_remove(td_kvdisk_t *d, entry_t *e);
void td__kvdisk_lru_push_front(td_kvdisk_t *d, entry_t *e);
void td__kvdisk_lru_unlink(entry_t *e);

/* Scan d->root synchronously and fill the index (kvdisk_index.c). 0, or TD_ENOMEM / the errno's
 * code when the root cannot be read, td_err_msg naming it. */
int td__kvdisk_scan(td_kvdisk_t *d);

/* Read up to n bytes at off (short only at end of file); bytes read, or -1 with errno set. Any
 * thread. */
ssize_t td__kvdisk_read_full(int fd, void *buf, size_t n, off_t off);

#endif
