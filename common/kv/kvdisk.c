/* kvdisk.c: the disk tier (td_kvdisk.h): the cap and its evictions, the store / load / unlink
 * operations that run on libuv's threadpool, the API and open. The index and the scan at open
 * are in kvdisk_index.c, the file format in kvdisk_file.c.
 *
 * What the threadpool touches: an op_t's own fields (path, status, errno, message), the caller's
 * buffer it was lent, and the immutable fields of td_kvdisk (root, fingerprint, block_bytes).
 * Everything else - the index, entries, counters, the op list - is the loop thread's.
 */
#include "td_error.h"
#include "kvdisk_impl.h"
#include "td_log.h"
#include "td_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- threadpool work: only the op, its lent buffer and d's immutable fields ---- */

static void op_fail(op_t *op, int sys_err, const char *what)
{
    op->sys_err = sys_err;
    op->status = td_err_from_errno(sys_err);
    if (op->status == 0 || op->status == TD_ENOENT)
        op->status = TD_EIO; /* ENOTDIR and friends: the directory is broken, not the block */
    snprintf(op->msg, sizeof(op->msg), "kvdisk %s: %s: %s", op->path, what, strerror(sys_err));
}

static int write_all(int fd, const struct iovec *iov, int n)
{
    struct iovec v[2];
    TD_ASSERT(n <= 2);
    memcpy(v, iov, sizeof(v[0]) * (size_t)n);
    int i = 0;
    while (i < n) {
        ssize_t w = writev(fd, v + i, n - i);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        while (i < n && (size_t)w >= v[i].iov_len)
            w -= (ssize_t)v[i++].iov_len;
        if (i < n) {
            v[i].iov_base = (char *)v[i].iov_base + w;
            v[i].iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* Read up to n bytes at off; returns bytes read (short at EOF) or -1 with errno. */
ssize_t td__kvdisk_read_full(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static void store_work(uv_work_t *req)
{
    op_t *op = req->data;
    const td_kvdisk_t *d = op->d;
    char dir[PATH_MAX], tmp[PATH_MAX];
    size_t dl = strlen(op->path) - 33;
    snprintf(dir, sizeof(dir), "%.*s", (int)dl, op->path);
    snprintf(tmp, sizeof(tmp), "%s.tmp", op->path);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return op_fail(op, errno, "mkdir");
    uint8_t hdr[TD_KVDISK_HEADER_BYTES];
    td_kvdisk_header_encode(hdr, d->fp, &op->h, op->src, d->block_bytes);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return op_fail(op, errno, "create");
    struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)op->src, d->block_bytes}};
    if (write_all(fd, iov, 2) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return op_fail(op, e, "write");
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return op_fail(op, e, "close");
    }
    if (rename(tmp, op->path) != 0) {
        int e = errno;
        unlink(tmp);
        return op_fail(op, e, "rename");
    }
    op->status = 0;
}

static void load_work(uv_work_t *req)
{
    op_t *op = req->data;
    const td_kvdisk_t *d = op->d;
    int fd = open(op->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) { /* deleted behind our back: a miss, not a disk failure */
            op->status = TD_ENOENT;
            snprintf(op->msg, sizeof(op->msg), "kvdisk %s: the file is gone", op->path);
            return;
        }
        return op_fail(op, errno, "open");
    }
    uint8_t hdr[TD_KVDISK_HEADER_BYTES];
    uint8_t extra;
    uint64_t sum;
    ssize_t n = td__kvdisk_read_full(fd, hdr, sizeof(hdr), 0), m = 0, x = 0;
    int rc = 0;
    if (n >= 0)
        rc = td_kvdisk_header_check(hdr, (size_t)n, d->fp, &op->h, d->block_bytes, NULL, &sum);
    if (n >= 0 && rc == 0) {
        m = td__kvdisk_read_full(fd, op->dst, d->block_bytes, TD_KVDISK_HEADER_BYTES);
        if (m >= 0)
            x = td__kvdisk_read_full(fd, &extra, 1,
                                     (off_t)(TD_KVDISK_HEADER_BYTES + d->block_bytes));
    }
    if (n < 0 || m < 0 || x < 0) {
        int e = errno;
        close(fd);
        return op_fail(op, e, "read");
    }
    close(fd);
    if (rc == 0 && ((size_t)m != d->block_bytes || x != 0))
        rc = td_err_set(TD_EPARSE, "%s payload (%zd of %zu bytes)",
                        (size_t)m != d->block_bytes ? "truncated" : "oversized", m, d->block_bytes);
    if (rc == 0 && XXH3_64bits(op->dst, d->block_bytes) != sum)
        rc = td_err_set(TD_ECHECKSUM, "payload checksum mismatch");
    if (rc) { /* never served: delete it (the entry is pinned, so no store races this) */
        op->status = rc;
        snprintf(op->msg, sizeof(op->msg), "kvdisk %s: %s; deleted", op->path, td_err_msg());
        unlink(op->path);
        return;
    }
    op->status = 0;
}

static void unlink_work(uv_work_t *req)
{
    op_t *op = req->data;
    if (unlink(op->path) != 0 && errno != ENOENT)
        return op_fail(op, errno, "unlink");
    op->status = 0;
}

static void close_work(uv_work_t *req)
{
    (void)req;
}

/* ---- loop thread ---- */

static void tier_off(td_kvdisk_t *d, const char *msg)
{
    d->st.errors++;
    if (!d->st.enabled)
        return;
    d->st.enabled = false;
    td__kvdisk_changed(d, NULL, false);
    TD_LOG_W("%s; disk tier off (serving goes on without it)", msg);
}

static void destroy(td_kvdisk_t *d)
{
    for (size_t i = 0; d->buckets && i < d->n_buckets; i++)
        for (entry_t *e = d->buckets[i], *next; e; e = next) {
            next = e->hnext;
            free(e);
        }
    free(d->buckets);
    if (d->lock_fd >= 0)
        close(d->lock_fd);
    free(d->close_op);
    free(d->root);
    free(d);
}

static void after_work(uv_work_t *req, int uv_status);

static op_t *op_new(td_kvdisk_t *d, op_kind_t kind, const td_kvhash_t *h)
{
    size_t plen = strlen(d->root) + 1 + 2 + 1 + 32 + 1;
    op_t *op = td_calloc(1, sizeof(*op) + plen);
    if (!op) {
        td_err_set(TD_ENOMEM, "kvdisk: no memory for an operation");
        return NULL;
    }
    op->d = d;
    op->kind = kind;
    op->req.data = op;
    if (h) {
        char hex[33];
        op->h = *h;
        td_kvhash_hex(h, hex);
        snprintf(op->path, plen, "%s/%.2s/%s", d->root, hex, hex);
    }
    return op;
}

/* Queue `op` on the threadpool. 0, or a TD_E* code (op not queued, still the caller's). */
static int op_submit(td_kvdisk_t *d, op_t *op)
{
    static const uv_work_cb work[] = {[OP_STORE] = store_work,
                                      [OP_LOAD] = load_work,
                                      [OP_UNLINK] = unlink_work,
                                      [OP_CLOSE] = close_work};
    int rc = uv_queue_work(d->loop, &op->req, work[op->kind], after_work);
    if (rc)
        return td_err_set(TD_EINTERNAL, "kvdisk: uv_queue_work: %s", uv_strerror(rc));
    op->next = &d->ops;
    op->prev = d->ops.prev;
    d->ops.prev->next = op;
    d->ops.prev = op;
    d->in_flight++;
    return 0;
}

/* Evict least recently used, unpinned files until `need` more bytes fit under the cap. Each
 * victim leaves the cap's count now and its file is deleted on the threadpool (the entry stays,
 * DELETING, until then, so a store of the same hash cannot race the unlink). 0 or TD_ENOSPC. */
static int make_room(td_kvdisk_t *d, uint64_t need)
{
    entry_t *e = d->lru.lru_prev;
    while (d->st.bytes + need > d->max_bytes) {
        while (e != &d->lru && (e->loads || e->dead))
            e = e->lru_prev;
        if (e == &d->lru)
            return td_err_set(TD_ENOSPC,
                              "kvdisk %s: cap of %llu bytes reached and every file "
                              "is being read",
                              d->root, (unsigned long long)d->max_bytes);
        entry_t *victim = e;
        e = e->lru_prev;
        op_t *op = op_new(d, OP_UNLINK, &victim->h);
        if (!op)
            return TD_ENOMEM;
        op->e = victim;
        if (op_submit(d, op) != 0) {
            free(op);
            return TD_EINTERNAL;
        }
        td__kvdisk_lru_unlink(victim);
        victim->state = E_DELETING;
        td__kvdisk_changed(d, &victim->h, false);
        d->st.files--;
        d->st.bytes -= victim->bytes;
        d->st.evictions++;
    }
    return 0;
}

static void after_work(uv_work_t *req, int uv_status)
{
    op_t *op = req->data;
    td_kvdisk_t *d = op->d;
    op->prev->next = op->next;
    op->next->prev = op->prev;
    d->in_flight--;
    int status = uv_status == UV_ECANCELED ? TD_ECANCELED : op->status;
    entry_t *e = op->e;
    switch (op->kind) {
    case OP_STORE:
        if (status == 0) {
            td__kvdisk_entry_ready(d, e);
            if (!d->closing)
                td__kvdisk_changed(d, &e->h, true);
        } else {
            td__kvdisk_entry_remove(d, e);
            if (status != TD_ECANCELED)
                tier_off(d, op->msg);
        }
        break;
    case OP_LOAD:
        e->loads--;
        if (status == 0) {
            d->st.hits++;
        } else if (status != TD_ECANCELED) {
            d->st.misses++;
            if (!e->dead && d->st.enabled)
                td__kvdisk_changed(d, &e->h, false);
            e->dead = true;
            if (op->sys_err) {
                tier_off(d, op->msg);
            } else if (status != TD_ENOENT) {
                d->st.corrupt++;
                TD_LOG_W("%s", op->msg);
            }
        }
        if (e->dead && e->loads == 0)
            td__kvdisk_entry_remove(d, e);
        break;
    case OP_UNLINK:
        td__kvdisk_entry_remove(d, e);
        if (status != 0 && status != TD_ECANCELED)
            tier_off(d, op->msg);
        break;
    case OP_CLOSE:
        break;
    }
    if (status != 0 && op->msg[0])
        td_err_set(status, "%s", op->msg);
    else if (status == TD_ECANCELED)
        td_err_set(status, "kvdisk %s: canceled by close", d->root);
    if (op->cb)
        op->cb(d, &op->h, status, op->arg);
    if (op != d->close_op)
        free(op);
    if (d->closing && d->in_flight == 0) {
        td_kvdisk_closed_cb cb = d->closed_cb;
        void *arg = d->closed_arg;
        destroy(d);
        if (cb)
            cb(arg);
    }
}

bool td_kvdisk_contains(const td_kvdisk_t *d, const td_kvhash_t *hash)
{
    if (d->closing || !d->st.enabled)
        return false;
    const entry_t *e = td__kvdisk_find(d, hash);
    return e && e->state == E_READY && !e->dead;
}

/* TD_ECLOSED / TD_EDISABLED for a tier that takes no more work, else 0. */
static int usable(const td_kvdisk_t *d)
{
    if (d->closing)
        return td_err_set(TD_ECLOSED, "kvdisk %s: closing", d->root);
    if (!d->st.enabled)
        return td_err_set(TD_EDISABLED, "kvdisk %s: the disk tier is off after a failure", d->root);
    return 0;
}

int td_kvdisk_store(td_kvdisk_t *d, const td_kvhash_t *hash, const void *data, td_kvdisk_cb cb,
                    void *arg)
{
    int rc = usable(d);
    if (rc)
        return rc;
    entry_t *e = td__kvdisk_find(d, hash);
    if (e && !e->dead && (e->state == E_READY || e->state == E_WRITING))
        return 1;
    if (e)
        return td_err_set(TD_EBUSY, "kvdisk %s: that block's file is being deleted", d->root);
    if (d->file_bytes > d->max_bytes)
        return td_err_set(TD_ENOSPC, "kvdisk %s: a block file (%llu bytes) exceeds the cap",
                          d->root, (unsigned long long)d->file_bytes);
    if ((rc = make_room(d, d->file_bytes)))
        return rc;
    op_t *op = op_new(d, OP_STORE, hash);
    if (!op)
        return TD_ENOMEM;
    if (!(e = td__kvdisk_entry_add(d, hash, E_WRITING, d->file_bytes))) {
        free(op);
        return TD_ENOMEM;
    }
    d->st.bytes += e->bytes; /* reserved now, so concurrent stores respect the cap */
    op->e = e;
    op->src = data;
    op->cb = cb;
    op->arg = arg;
    if ((rc = op_submit(d, op))) {
        td__kvdisk_entry_remove(d, e);
        free(op);
        return rc;
    }
    return 0;
}

int td_kvdisk_load(td_kvdisk_t *d, const td_kvhash_t *hash, void *dst, td_kvdisk_cb cb, void *arg)
{
    int rc = usable(d);
    if (rc)
        return rc;
    entry_t *e = td__kvdisk_find(d, hash);
    if (!e || e->state != E_READY || e->dead) {
        d->st.misses++;
        return td_err_set(TD_ENOENT, "kvdisk %s: block not on disk", d->root);
    }
    op_t *op = op_new(d, OP_LOAD, hash);
    if (!op)
        return TD_ENOMEM;
    op->e = e;
    op->dst = dst;
    op->cb = cb;
    op->arg = arg;
    if ((rc = op_submit(d, op))) {
        free(op);
        return rc;
    }
    e->loads++;
    td__kvdisk_lru_push_front(d, e);
    return 0;
}

void td_kvdisk_stats(const td_kvdisk_t *d, td_kvdisk_stats_t *out)
{
    *out = d->st;
}

size_t td_kvdisk_list(const td_kvdisk_t *d, td_kvhash_t *out, size_t max)
{
    size_t n = 0;
    for (const entry_t *e = d->lru.lru_next; e != &d->lru; e = e->lru_next) {
        if (e->dead)
            continue;
        if (n < max)
            out[n] = e->h;
        n++;
    }
    return n;
}

void td_kvdisk_set_listener(td_kvdisk_t *d, td_kvdisk_change_cb cb, void *ud)
{
    d->on_change = cb;
    d->on_change_ud = ud;
}

void td_kvdisk_close(td_kvdisk_t *d, td_kvdisk_closed_cb closed_cb, void *arg)
{
    TD_ASSERT(!d->closing);
    d->closing = true;
    d->closed_cb = closed_cb;
    d->closed_arg = arg;
    for (op_t *op = d->ops.next; op != &d->ops; op = op->next)
        uv_cancel((uv_req_t *)&op->req); /* fails for running ops: they finish */
    /* one more op, so that closed_cb runs from after_work, after close has returned */
    int rc = op_submit(d, d->close_op);
    TD_ASSERT(rc == 0); /* uv_queue_work fails only for a NULL work callback */
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return td_err_set(td_err_from_errno(errno), "kvdisk %s: mkdir: %s", path, strerror(errno));
    return 0;
}

int td_kvdisk_open(uv_loop_t *loop, const td_kvdisk_opts_t *o, td_kvdisk_t **out)
{
    *out = NULL;
    if (!o->dir || !*o->dir)
        return td_err_set(TD_EINVAL, "kvdisk: dir is empty");
    if (o->block_bytes == 0 || o->max_bytes == 0)
        return td_err_set(TD_EINVAL, "kvdisk %s: block_bytes and max_bytes must be > 0", o->dir);
    td_kvdisk_t *d = td_calloc(1, sizeof(*d));
    if (!d)
        return td_err_set(TD_ENOMEM, "kvdisk: no memory");
    int rc = TD_ENOMEM;
    char fphex[33];
    td_hex_encode(o->fingerprint, 16, fphex);
    d->loop = loop;
    d->lock_fd = -1;
    memcpy(d->fp, o->fingerprint, 16);
    d->block_bytes = o->block_bytes;
    d->file_bytes = TD_KVDISK_HEADER_BYTES + (uint64_t)o->block_bytes;
    d->max_bytes = o->max_bytes;
    d->lru.lru_next = d->lru.lru_prev = &d->lru;
    d->ops.next = d->ops.prev = &d->ops;
    d->st.enabled = true;
    d->n_buckets = 64;
    size_t rl = strlen(o->dir) + 1 + 32 + 1;
    if (rl + 2 + 1 + 32 + 4 + 1 > PATH_MAX) {
        rc = td_err_set(TD_EINVAL, "kvdisk %s: path too long", o->dir);
        goto err;
    }
    if (!(d->buckets = td_calloc(d->n_buckets, sizeof(*d->buckets))) || !(d->root = malloc(rl))) {
        td_err_set(TD_ENOMEM, "kvdisk: no memory");
        goto err;
    }
    snprintf(d->root, rl, "%s/%s", o->dir, fphex);
    if (!(d->close_op = op_new(d, OP_CLOSE, NULL)))
        goto err;
    if ((rc = make_dir(o->dir)) || (rc = make_dir(d->root)))
        goto err;
    char lock[PATH_MAX];
    snprintf(lock, sizeof(lock), "%s/.lock", d->root);
    if ((d->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        rc = td_err_set(td_err_from_errno(errno), "kvdisk %s: %s", lock, strerror(errno));
        goto err;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        rc = td_err_set(TD_EBUSY, "kvdisk %s: held by another process (%s)", lock, strerror(errno));
        goto err;
    }
    if ((rc = td__kvdisk_scan(d)))
        goto err;
    TD_LOG_I("kvdisk %s: %llu blocks, %llu bytes (cap %llu), %llu bad files deleted", d->root,
             (unsigned long long)d->st.files, (unsigned long long)d->st.bytes,
             (unsigned long long)d->max_bytes, (unsigned long long)d->st.corrupt);
    *out = d;
    return 0;
err:
    destroy(d);
    return rc;
}
