/* td_kvdisk.h: the disk tier of the KV cache (tier 2): a directory of self-describing block
 * files, named by their hash version 1 block hash (td_kvhash.h), that survives restarts.
 *
 *   <dir>/<layout fingerprint hex>/<first 2 hex of the hash>/<hash hex>
 *
 * so that models and layouts never mix; each file is a 72-byte header (magic, format and hash
 * versions, fingerprint, hash, payload length and checksum, header checksum) and the block's
 * bytes (docs/kv-cache.md has the byte layout). Writes and loads run on libuv's threadpool
 * (uv_queue_work), never on the loop: a store writes `<hash hex>.tmp` in the same directory and
 * renames it into place, so a torn write is never read as valid; a load checks the header, the
 * length and the payload checksum and deletes a bad file instead of serving it. The cap
 * (max_bytes) is kept by evicting the least recently used files. A failing disk (ENOSPC, EIO,
 * EACCES, ...) turns the tier off: calls then fail at once with TD_EDISABLED and serving goes on.
 *
 * Threads: every function below is called on the loop thread, and callbacks run there. The
 * threadpool only sees an operation's own copy of its path, the immutable options and the buffer
 * the caller lent it (see each function). One process per directory: open takes an flock.
 */
#ifndef TD_KVDISK_H
#define TD_KVDISK_H

#include "td_kvhash.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* The block file format (docs/kv-cache.md). */
#define TD_KVDISK_MAGIC "TDKVBLK\n" /* 8 bytes */
#define TD_KVDISK_FORMAT_VERSION 1
#define TD_KVDISK_HEADER_BYTES 72

typedef struct td_kvdisk td_kvdisk_t;

typedef struct td_kvdisk_opts {
    const char *dir;         /* root of the cache; created if missing (its parent must exist) */
    uint64_t max_bytes;      /* cap on this layout's files, headers included, in bytes (> 0) */
    uint8_t fingerprint[16]; /* td_kv_layout_t.fingerprint of this worker */
    size_t block_bytes;      /* td_kv_layout_t.block_bytes: the payload of every file (> 0) */
} td_kvdisk_opts_t;

typedef struct td_kvdisk_stats {
    uint64_t files;     /* block files indexed and readable now */
    uint64_t bytes;     /* bytes of those files plus stores in flight (what the cap counts) */
    uint64_t hits;      /* loads that returned a verified block */
    uint64_t misses;    /* loads that did not (absent, corrupt, failed) */
    uint64_t corrupt;   /* bad files found (at open or load) and deleted */
    uint64_t evictions; /* files deleted to keep the cap */
    uint64_t errors;    /* system call failures (the first one turns the tier off) */
    bool enabled;       /* false once a failure turned the tier off (metric: export as 0/1) */
} td_kvdisk_stats_t;

/* An operation finished, on the loop thread. `status` is 0, or TD_ECANCELED (closed before it
 * ran), or for a load: TD_ENOENT (the file was gone), TD_EPARSE (truncated or not a block file),
 * TD_ECHECKSUM (header or payload checksum), TD_EMISMATCH (another fingerprint, hash, hash version
 * or length) - the file was deleted and counted as corrupt - or another TD_E* code from a failing
 * disk, which turned the tier off. td_err_msg names the file. `hash` is the operation's. */
typedef void (*td_kvdisk_cb)(td_kvdisk_t *d, const td_kvhash_t *hash, int status, void *arg);
typedef void (*td_kvdisk_closed_cb)(void *arg);

/* Open the tier on `loop`: create <dir>/<fingerprint hex>, lock it, and scan it synchronously
 * (every header is read and checked; bad and leftover temporary files are deleted; files of other
 * fingerprints live in other directories and are left alone). Blocks found are indexed, least
 * recently used first by modification time, and evicted at once down to the cap. Returns 0 and
 * *out, or TD_EINVAL (options), TD_EBUSY (another process holds the directory), TD_ENOMEM, or the
 * errno's code when the directory cannot be made or read, with td_err_msg naming the path. */
int td_kvdisk_open(uv_loop_t *loop, const td_kvdisk_opts_t *opts, td_kvdisk_t **out);

/* Whether a verified-at-open or stored block of `hash` is indexed (false while it is being
 * written, after the tier was turned off, and while closing). */
bool td_kvdisk_contains(const td_kvdisk_t *d, const td_kvhash_t *hash);

/* Store block_bytes of `data` as the block `hash`. Returns 0 and `cb` (may be NULL) runs later;
 * or 1 when the hash is already stored or being stored: nothing to do, no callback; or, with no
 * callback: TD_ECLOSED (closing), TD_EDISABLED (tier off), TD_EBUSY (that hash's file is being
 * deleted), TD_ENOSPC (block larger than the cap, or every file is in use by loads), TD_ENOMEM.
 * Least recently used files are evicted first when the store would pass the cap.
 * Ownership: `data` is lent to the threadpool; keep it valid and unchanged until `cb` runs (with
 * cb NULL, until the tier's closed_cb). */
int td_kvdisk_store(td_kvdisk_t *d, const td_kvhash_t *hash, const void *data, td_kvdisk_cb cb,
                    void *arg);

/* Load the block `hash` into dst[0 .. block_bytes). Returns 0 and `cb` runs later with the status
 * (0: dst holds the verified block; otherwise dst's contents are unspecified and a bad file is
 * gone); or, with no callback: TD_ENOENT (not indexed: a miss), TD_ECLOSED, TD_EDISABLED,
 * TD_ENOMEM. Ownership: `dst` is written by the threadpool; keep it valid and do not read it
 * until `cb` runs. A load marks the block most recently used. */
int td_kvdisk_load(td_kvdisk_t *d, const td_kvhash_t *hash, void *dst, td_kvdisk_cb cb, void *arg);

/* The counters, for /metrics. */
void td_kvdisk_stats(const td_kvdisk_t *d, td_kvdisk_stats_t *out);

/* Every indexed, readable block's hash (what contains() is true for), most recently used first:
 * writes at most `max` to `out` and returns how many there are (may exceed max). For publishing
 * the tier's inventory to the cluster index (td_kvredis_publish_inventory). */
size_t td_kvdisk_list(const td_kvdisk_t *d, td_kvhash_t *out, size_t max);

/* Be told when a block becomes readable here (its store finished: `added`) and when it stops
 * being (evicted, found bad at a load: !added); `hash` NULL and !added: every block went at
 * once (the tier turned off). For announcing the tier to the cluster KV index; blocks indexed by
 * the scan at open are not reported (td_kvdisk_list has them). `cb` NULL: no more calls. Runs on
 * the loop thread, inside the tier's own calls and completions: it must not call back into the
 * tier. */
typedef void (*td_kvdisk_change_cb)(void *ud, const td_kvhash_t *hash, bool added);
void td_kvdisk_set_listener(td_kvdisk_t *d, td_kvdisk_change_cb cb, void *ud);

/* Close: operations not yet started are canceled (their callbacks run with TD_ECANCELED), those
 * running finish; when none is left, `closed_cb` (may be NULL) runs on the loop thread, always
 * after close returns, and `d` is freed. Calls after close return TD_ECLOSED until then. */
void td_kvdisk_close(td_kvdisk_t *d, td_kvdisk_closed_cb closed_cb, void *arg);

/* ---- the block file format (kvdisk_file.c), for the tier, its tests and its fuzz target ---- */

/* Write the header of a block file for `payload` (`len` bytes) into out[TD_KVDISK_HEADER_BYTES].
 * Cannot fail. */
void td_kvdisk_header_encode(uint8_t out[TD_KVDISK_HEADER_BYTES], const uint8_t fingerprint[16],
                             const td_kvhash_t *hash, const void *payload, size_t len);

/* Check a header (`len` bytes available at `buf`) against the expected fingerprint, hash (NULL:
 * any, *hash_out gets it when non-NULL) and payload length; *payload_sum gets the payload's
 * XXH3-64 to compare. 0, or TD_EPARSE (short or bad magic), TD_ECHECKSUM (header checksum),
 * TD_EMISMATCH (format or hash version, fingerprint, hash or length), td_err_msg saying which. */
int td_kvdisk_header_check(const uint8_t *buf, size_t len, const uint8_t fingerprint[16],
                           const td_kvhash_t *hash, size_t block_bytes, td_kvhash_t *hash_out,
                           uint64_t *payload_sum);

/* Parse a whole block file held in buf[0..len): the header check above, then exactly
 * block_bytes of payload (TD_EPARSE when truncated or with trailing bytes) whose checksum must
 * match (TD_ECHECKSUM). 0 and *payload pointing into buf, or the error. */
int td_kvdisk_parse(const uint8_t *buf, size_t len, const uint8_t fingerprint[16],
                    const td_kvhash_t *hash, size_t block_bytes, const uint8_t **payload);

#endif
