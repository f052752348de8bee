/* kvdisk_index.c: the disk tier's index - hash -> entry (chained buckets) and the LRU list of
 * readable files - and the synchronous scan at open that fills it from the directory.
 *
 * Why the scan is synchronous, before td_kvdisk_open returns: a worker opens the tier once at
 * startup, before it registers with a router, so nothing waits on its loop yet; only the 72-byte
 * headers are read (payloads are checked at load); and with the index complete before the first
 * store or eviction there is no race between scanned files and new ones.
 */
#include "kvdisk_impl.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- index ---- */

static size_t bucket_of(const td_kvdisk_t *d, const td_kvhash_t *h)
{
    uint64_t k;
    memcpy(&k, h->b, 8); /* the hash is uniform already */
    return (size_t)(k & (d->n_buckets - 1));
}

entry_t *td__kvdisk_find(const td_kvdisk_t *d, const td_kvhash_t *h)
{
    for (entry_t *e = d->buckets[bucket_of(d, h)]; e; e = e->hnext)
        if (memcmp(e->h.b, h->b, 16) == 0)
            return e;
    return NULL;
}

static int grow(td_kvdisk_t *d)
{
    size_t n = d->n_buckets * 2;
    entry_t **nb = td_calloc(n, sizeof(*nb));
    if (!nb)
        return td_err_set(TD_ENOMEM, "kvdisk: no memory for %zu index buckets", n);
    entry_t **old = d->buckets;
    size_t on = d->n_buckets;
    d->buckets = nb;
    d->n_buckets = n;
    for (size_t i = 0; i < on; i++)
        for (entry_t *e = old[i], *next; e; e = next) {
            next = e->hnext;
            size_t b = bucket_of(d, &e->h);
            e->hnext = nb[b];
            nb[b] = e;
        }
    free(old);
    return 0;
}

/* A new entry for `h` (not present), in state `state`, outside the LRU list. NULL on ENOMEM. */
entry_t *td__kvdisk_entry_add(td_kvdisk_t *d, const td_kvhash_t *h, estate_t state, uint64_t bytes)
{
    if (d->n_entries >= d->n_buckets && grow(d) != 0)
        return NULL;
    entry_t *e = td_calloc(1, sizeof(*e));
    if (!e) {
        td_err_set(TD_ENOMEM, "kvdisk: no memory for an index entry");
        return NULL;
    }
    e->h = *h;
    e->state = state;
    e->bytes = bytes;
    size_t b = bucket_of(d, h);
    e->hnext = d->buckets[b];
    d->buckets[b] = e;
    d->n_entries++;
    return e;
}

void td__kvdisk_lru_unlink(entry_t *e)
{
    if (!e->lru_next)
        return;
    e->lru_prev->lru_next = e->lru_next;
    e->lru_next->lru_prev = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

void td__kvdisk_lru_push_front(td_kvdisk_t *d, entry_t *e)
{
    td__kvdisk_lru_unlink(e);
    e->lru_next = d->lru.lru_next;
    e->lru_prev = &d->lru;
    d->lru.lru_next->lru_prev = e;
    d->lru.lru_next = e;
}

/* READY -> counted as a file. */
void td__kvdisk_entry_ready(td_kvdisk_t *d, entry_t *e)
{
    e->state = E_READY;
    d->st.files++;
    td__kvdisk_lru_push_front(d, e);
}

/* Take `e` out of the index and free it, releasing its bytes and file count. */
void td__kvdisk_entry_remove(td_kvdisk_t *d, entry_t *e)
{
    if (e->state == E_READY)
        d->st.files--;
    if (e->state != E_DELETING) /* a deleting entry's bytes were released when it was evicted */
        d->st.bytes -= e->bytes;
    td__kvdisk_lru_unlink(e);
    entry_t **pp = &d->buckets[bucket_of(d, &e->h)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    d->n_entries--;
    free(e);
}

/* ---- open: the synchronous scan ---- */

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return s[n] == '\0';
}


/* Drop a bad file found by the scan. */
static void scan_drop(td_kvdisk_t *d, const char *path, const char *why)
{
    TD_LOG_W("kvdisk %s: %s; deleted", path, why);
    d->st.corrupt++;
    unlink(path);
}

/* Index one file of a prefix directory (its name already 32 hex digits). 0, or TD_ENOMEM. */
static int scan_file(td_kvdisk_t *d, const char *path, const char *name)
{
    td_kvhash_t h;
    int rc = td_hex_decode(name, 32, h.b);
    TD_ASSERT(rc == 0); /* is_hex checked the name */
    if (strncmp(name, strrchr(path, '/') - 2, 2) != 0) {
        scan_drop(d, path, "in the wrong prefix directory");
        return 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        TD_LOG_W("kvdisk %s: open: %s; skipped", path, strerror(errno));
        return 0;
    }
    uint8_t hdr[TD_KVDISK_HEADER_BYTES];
    struct stat st;
    ssize_t n = td__kvdisk_read_full(fd, hdr, sizeof(hdr), 0);
    int fs = fstat(fd, &st);
    close(fd);
    if (n < 0 || fs != 0) {
        TD_LOG_W("kvdisk %s: read: %s; skipped", path, strerror(errno));
        return 0;
    }
    if (td_kvdisk_header_check(hdr, (size_t)n, d->fp, &h, d->block_bytes, NULL, NULL) != 0) {
        scan_drop(d, path, td_err_msg());
        return 0;
    }
    if ((uint64_t)st.st_size != d->file_bytes) {
        scan_drop(d, path, (uint64_t)st.st_size < d->file_bytes ? "truncated" : "oversized");
        return 0;
    }
    if (td__kvdisk_find(d, &h))
        return 0;
    entry_t *e = td__kvdisk_entry_add(d, &h, E_READY, d->file_bytes);
    if (!e)
        return TD_ENOMEM;
    e->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    d->st.files++;
    d->st.bytes += e->bytes;
    return 0;
}

static int scan_prefix(td_kvdisk_t *d, const char *sub)
{
    DIR *dir = opendir(sub);
    if (!dir) {
        TD_LOG_W("kvdisk %s: opendir: %s; skipped", sub, strerror(errno));
        return 0;
    }
    int rc = 0;
    char path[PATH_MAX + NAME_MAX + 2];
    for (struct dirent *de; rc == 0 && (de = readdir(dir));) {
        const char *name = de->d_name;
        int pl = snprintf(path, sizeof(path), "%s/%s", sub, name);
        if (pl < 0 || (size_t)pl >= sizeof(path))
            continue;
        if (td_str_endswith(name, ".tmp")) /* a store cut short by a crash */
            unlink(path);
        else if (is_hex(name, 32))
            rc = scan_file(d, path, name);
    }
    closedir(dir);
    return rc;
}

static int by_mtime(const void *a, const void *b)
{
    const entry_t *x = *(entry_t *const *)a, *y = *(entry_t *const *)b;
    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

int td__kvdisk_scan(td_kvdisk_t *d)
{
    DIR *dir = opendir(d->root);
    if (!dir)
        return td_err_set(td_err_from_errno(errno), "kvdisk %s: opendir: %s", d->root,
                          strerror(errno));
    int rc = 0;
    char sub[PATH_MAX + NAME_MAX + 2];
    for (struct dirent *de; rc == 0 && (de = readdir(dir));)
        if (is_hex(de->d_name, 2)) {
            snprintf(sub, sizeof(sub), "%s/%s", d->root, de->d_name);
            rc = scan_prefix(d, sub);
        }
    closedir(dir);
    if (rc)
        return rc;
    /* the LRU order: oldest modification first, so the newest ends at the front */
    entry_t **all = td_calloc(d->n_entries ? d->n_entries : 1, sizeof(*all));
    if (!all)
        return td_err_set(TD_ENOMEM, "kvdisk: no memory to sort %zu entries", d->n_entries);
    size_t n = 0;
    for (size_t i = 0; i < d->n_buckets; i++)
        for (entry_t *e = d->buckets[i]; e; e = e->hnext)
            all[n++] = e;
    qsort(all, n, sizeof(*all), by_mtime);
    for (size_t i = 0; i < n; i++)
        td__kvdisk_lru_push_front(d, all[i]);
    free(all);
    /* a cap lowered since the last run: evict now, synchronously */
    char path[PATH_MAX], hex[33];
    while (d->st.bytes > d->max_bytes) {
        entry_t *e = d->lru.lru_prev;
        td_kvhash_hex(&e->h, hex);
        snprintf(path, sizeof(path), "%s/%.2s/%s", d->root, hex, hex);
        unlink(path);
        td__kvdisk_entry_remove(d, e);
        d->st.evictions++;
    }
    return 0;
}
