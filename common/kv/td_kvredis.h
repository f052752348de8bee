/* td_kvredis.h: the cluster KV index in Redis, kept by workers and mirrored by routers.
 *
 * Layout (binary-safe; `ns` is the namespace: the daemons use "tandem:kv", since every block hash
 * covers the layout fingerprint already):
 *   <ns>:set:<worker>   a STRING, the worker's set: a 16-byte header (ASCII "TDKVSET1", then the
 *                       publisher's epoch, 8 bytes little endian) and 18-byte records: op
 *                       (1 = add, 2 = remove), tier (0 pool, 2 disk), block hash (16 canonical
 *                       bytes of a hash version 1 td_kvhash_t, see td_kvhash.h). The worker's
 *                       inventory is written as adds with SET; every batch of events since is
 *                       APPENDed, so the set is its inventory replayed with the events after it.
 *                       A reader replays the records in order (a later record of a block wins).
 *                       With a lease the key expires lease_ms after the last renew or flush, so
 *                       a dead worker's set goes by itself; one that stops in order removes
 *                       it at once (td_kvredis_leave).
 *   <ns>:workers        a SET of the worker ids that ever wrote a set (resync reads their sets
 *                       with one MGET; an id whose set expired reads as nil)
 *   <ns>:events         a pub/sub channel; each message is the worker id, a NUL, the epoch
 *                       (8 bytes, little endian), then records as in the set, and op 3 (no tier,
 *                       no hash): "the worker's whole set was replaced" (subscribers read it)
 *
 * Why a packed string: a router that restarts reads 1M blocks as a few bulk strings (one MGET)
 * and parses them itself, instead of a hash field per block that the client library turns into
 * an object each (bench/index_rebuild.py measures it).
 *
 * The epoch is a random 64-bit value a publisher draws when it is created: a restarted worker
 * (same id, new process) has a new one and replaces the set, so subscribers can tell its events
 * from late ones of the process it replaced (td_kvredis_event_t.epoch). Fencing: a batch of
 * events is appended (and published) by a server-side script only while the set's header still
 * carries the publisher's epoch; a set that expired or was lost with a Redis restart makes the
 * publisher write its inventory again (on_state(true, true)), and a set another process of the
 * same id owns is left alone (logged once).
 *
 * Workers (publishers) queue add/remove events and flush them every `flush_ms` as one command.
 * When the appended records outgrow twice the live set (plus 4096), the publisher is asked for its
 * inventory again, which rewrites the set compactly. Routers (subscribers) receive the events and
 * resync by reading every set (SMEMBERS + MGET) whenever their connections come (back) up;
 * messages that arrive while a read is in flight are held and delivered after it, so an event
 * newer than the set read is never lost under it. Redis is never on a request's path: while it
 * is down publishers drop their events and subscribers are told (on_state(false, ...)); on every
 * (re)connect a publisher is asked (on_state(true, true)) to republish its whole inventory, since
 * Redis may have restarted empty. The index is eventually consistent; a stale entry costs a
 * recompute, never a wrong answer.
 *
 * Connections reconnect with backoff (100 ms doubling to 5 s). Loop thread only.
 */
#ifndef TD_KVREDIS_H
#define TD_KVREDIS_H

#include "td_kvhash.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct td_kvredis td_kvredis_t;

typedef enum td_kvredis_op {
    TD_KVREDIS_ADD = 1,
    TD_KVREDIS_REMOVE = 2,
    TD_KVREDIS_RESET = 3, /* forget everything the worker held (a resync follows) */
} td_kvredis_op_t;

typedef struct td_kvredis_event {
    td_kvredis_op_t op;
    uint8_t tier;
    td_kvhash_t hash;   /* unused for RESET */
    const char *worker; /* valid during the callback */
    uint64_t epoch;     /* the publisher's epoch (0 from a read that found no set) */
    size_t size_hint;   /* RESET from a read of sets: records that read delivers in all, every
                           worker's together (to make room at once); 0 otherwise */
} td_kvredis_event_t;

typedef struct td_kvredis_opts {
    const char *addr;      /* "host:port" of Redis (numeric host) */
    const char *ns;        /* key namespace */
    const char *worker_id; /* publishers: our id; NULL for a subscriber */
    bool subscribe;        /* receive events (routers) */
    uint64_t flush_ms;     /* publisher batch window; 0 = 5 ms */
    uint64_t epoch;        /* publishers: this process's epoch; 0 = drawn at random */
    uint64_t lease_ms;     /* publishers: the holders key expires this long after the last
                              renew or flush (PEXPIRE); 0 = never */
    /* events from the channel, or from a resync (as ADDs after one RESET per worker) */
    void (*on_events)(const td_kvredis_event_t *ev, size_t n, void *ud);
    /* connection state: true when (re)connected. Subscribers: a resync has been started.
     * Publishers: call td_kvredis_publish_inventory if `need_inventory` (also while connected,
     * when the set must be rewritten: it expired, was lost, or its appended events outgrew it). */
    void (*on_state)(bool up, bool need_inventory, void *ud);
    /* subscribers: a full resync (every set read and delivered) finished, `seconds` after it
     * started (may be NULL) */
    void (*on_resynced)(double seconds, void *ud);
    void *ud;
} td_kvredis_opts_t;

/* Create and start connecting. NULL on bad options (td_err_msg says why) or no memory. */
td_kvredis_t *td_kvredis_new(uv_loop_t *loop, const td_kvredis_opts_t *opts);
/* Close connections and free once closed (pending events are dropped). */
void td_kvredis_close(td_kvredis_t *r);
/* Publishers, on an orderly stop: remove the worker's set from Redis (only while it carries this
 * publisher's epoch) and its id from the workers' set, and publish a RESET, so that routers drop
 * its blocks at once instead of when the lease runs out; then close as td_kvredis_close. The
 * teardown waits for Redis's answer, at most 1 s. While disconnected it is td_kvredis_close. */
void td_kvredis_leave(td_kvredis_t *r);
bool td_kvredis_connected(const td_kvredis_t *r);

/* Publishers: queue one event (dropped while disconnected). 0, TD_ENOMEM. */
int td_kvredis_publish(td_kvredis_t *r, td_kvredis_op_t op, uint8_t tier, const td_kvhash_t *h);
/* Publishers: replace the worker's whole set with `n` (tier, hash) pairs and tell subscribers.
 * TD_EAGAIN while disconnected (on_state asks again on reconnect). */
int td_kvredis_publish_inventory(td_kvredis_t *r, const uint8_t *tiers, const td_kvhash_t *hashes,
                                 size_t n);
/* Publishers: renew the lease (PEXPIRE of the holders key; call it with every heartbeat). A no-op
 * without a lease or while disconnected. */
void td_kvredis_renew(td_kvredis_t *r);
/* Publishers: the epoch in use. */
uint64_t td_kvredis_epoch(const td_kvredis_t *r);
/* Subscribers: read every worker's set again (RESET then ADDs per worker). */
int td_kvredis_resync(td_kvredis_t *r);
/* Subscribers: read one worker's set again (RESET then ADDs), e.g. when it registers again.
 * 0, TD_EAGAIN while disconnected, TD_ENOMEM. */
int td_kvredis_resync_worker(td_kvredis_t *r, const char *worker);
/* Number of resyncs completed (for tests and status). */
uint64_t td_kvredis_resyncs(const td_kvredis_t *r);

/* ---- the set's byte format, for the library, its tests, benchmarks and the fuzz target ---- */

#define TD_KVREDIS_SET_MAGIC "TDKVSET1" /* 8 bytes */
#define TD_KVREDIS_SET_HEADER 16u       /* magic, epoch */
#define TD_KVREDIS_REC 18u              /* op, tier, hash */

/* Write a set's header for `epoch` into out[TD_KVREDIS_SET_HEADER]. */
void td_kvredis_set_header(uint8_t out[TD_KVREDIS_SET_HEADER], uint64_t epoch);
/* Check a set read from Redis (`len` bytes): 0, *epoch and *n_recs (records start at
 * buf + TD_KVREDIS_SET_HEADER), or TD_EPARSE (shorter than the header, another magic, or a
 * length that is not a whole number of records), td_err_msg saying which. Records of an unknown
 * op are the caller's to skip (a newer version's). */
int td_kvredis_set_parse(const uint8_t *buf, size_t len, uint64_t *epoch, size_t *n_recs);

#endif
