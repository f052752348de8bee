/* td_kvredis.h: the cluster KV index in Redis, kept by workers and mirrored by routers.
 *
 * Layout (binary-safe; `ns` is the namespace: the daemons use "tandem:kv", since every block hash
 * covers the layout fingerprint already):
 *   <ns>:holders:<worker>   a HASH: field = block hash (16 canonical bytes of a hash
 *                           version 1 td_kvhash_t, see td_kvhash.h), value = tier (1 byte); one
 *                           more field "epoch" holds the publisher's epoch (8 bytes, little
 *                           endian), written with every batch of adds. With a lease the key
 *                           expires lease_ms after the last td_kvredis_renew (or flush), so a
 *                           dead worker's set goes by itself.
 *   <ns>:events             a pub/sub channel; each message is the worker id, a NUL, the epoch
 *                           (8 bytes, little endian), then 18-byte records: op (1 = add,
 *                           2 = remove), tier, hash (op 3, with no hash, says "the worker's whole
 *                           set was replaced")
 *
 * The epoch is a random 64-bit value a publisher draws when it is created: a restarted worker
 * (same id, new process) has a new one, so subscribers can tell its events from late ones of the
 * process it replaced (td_kvredis_event_t.epoch; an inventory starts a new epoch's set).
 *
 * Workers (publishers) queue add/remove events and flush them every `flush_ms` as one pipeline:
 * HSET/HDEL on their own hash, then one PUBLISH. Routers (subscribers) receive the events and
 * resync by reading every holders hash (SCAN + HGETALL) whenever their connections come (back)
 * up. Redis is never on a request's path: while it is down publishers drop their events and
 * subscribers keep serving from their mirror; on every (re)connect a publisher is asked
 * (on_state(true, true)) to republish its whole inventory, since Redis may have restarted empty.
 * The index is eventually consistent; a stale entry costs a recompute, never a wrong answer.
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
    uint64_t epoch;     /* the publisher's epoch (0 from a resync of a set written without one) */
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
     * Publishers: call td_kvredis_publish_inventory if `need_inventory`. */
    void (*on_state)(bool up, bool need_inventory, void *ud);
    void *ud;
} td_kvredis_opts_t;

/* Create and start connecting. NULL on bad options (td_err_msg says why) or no memory. */
td_kvredis_t *td_kvredis_new(uv_loop_t *loop, const td_kvredis_opts_t *opts);
/* Close connections and free once closed (pending events are dropped). */
void td_kvredis_close(td_kvredis_t *r);
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

#endif
