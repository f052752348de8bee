/* kvredis.c: the cluster KV index in Redis through hiredis' async API on libuv (td_kvredis.h). */
#include "td_kvredis.h"
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u
/* hiredis' libuv adapter (0.14) drops a poll error, so a refused connect is never reported:
 * an attempt that has not connected by then is abandoned and retried */
#define CONNECT_TIMEOUT_MS 1000u
/* and a connection whose peer went away can be left with no event at all: a renewal that is
 * still unanswered after this long means the command connection is dead, and it is replaced */
#define REPLY_TIMEOUT_S 3.0
#define REC TD_KVREDIS_REC
#define HDR TD_KVREDIS_SET_HEADER
/* the set is rewritten once its appended records pass twice the live ones plus this */
#define COMPACT_SLACK 4096u

/* A batch of events: appended to the set and published, only while the set's header is ours.
 * KEYS[1] the set; ARGV: header, records, lease ms ("0": none), channel, message prefix.
 * Returns the set's new length, -1 when there is no set, -2 when another epoch owns it. */
static const char APPEND_SCRIPT[] =
    "local h = redis.call('GETRANGE', KEYS[1], 0, 15)\n"
    "if h == '' then return -1 end\n"
    "if h ~= ARGV[1] then return -2 end\n"
    "local n = redis.call('APPEND', KEYS[1], ARGV[2])\n"
    "if ARGV[3] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end\n"
    "redis.call('PUBLISH', ARGV[4], ARGV[5] .. ARGV[2])\n"
    "return n\n";

/* An orderly stop: the set removed while it is ours, its id with it, and the news published (a
 * RESET: subscribers read the set, find none and forget the worker's blocks).
 * KEYS[1] the set, KEYS[2] the workers' set; ARGV: header, worker id, channel, message.
 * Returns 1 when removed, 0 when it was gone or another epoch's. */
static const char LEAVE_SCRIPT[] =
    "if redis.call('GETRANGE', KEYS[1], 0, 15) ~= ARGV[1] then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('SREM', KEYS[2], ARGV[2])\n"
    "redis.call('PUBLISH', ARGV[3], ARGV[4])\n"
    "return 1\n";
/* how long td_kvredis_leave's teardown waits for that script's answer */
#define LEAVE_WAIT_MS 1000u

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void td_kvredis_set_header(uint8_t out[TD_KVREDIS_SET_HEADER], uint64_t epoch)
{
    memcpy(out, TD_KVREDIS_SET_MAGIC, 8);
    put_le64(out + 8, epoch);
}

int td_kvredis_set_parse(const uint8_t *buf, size_t len, uint64_t *epoch, size_t *n_recs)
{
    if (len < HDR)
        return td_err_set(TD_EPARSE, "KV index set: %zu bytes, shorter than its %u-byte header",
                          len, HDR);
    if (memcmp(buf, TD_KVREDIS_SET_MAGIC, 8) != 0)
        return td_err_set(TD_EPARSE, "KV index set: not a set (bad magic)");
    if ((len - HDR) % REC)
        return td_err_set(TD_EPARSE, "KV index set: %zu bytes of records, not a multiple of %u",
                          len - HDR, REC);
    *epoch = get_le64(buf + 8);
    *n_recs = (len - HDR) / REC;
    return 0;
}

typedef struct conn {
    td_kvredis_t *owner;
    redisAsyncContext *ac; /* NULL while down */
    bool up;               /* connected (and, for the subscriber, subscribed) */
    bool is_sub;
    uv_timer_t retry; /* the next attempt; while connecting, the attempt's deadline */
    uint64_t backoff_ms;
} conn_t;

struct td_kvredis {
    uv_loop_t *loop;
    td_kvredis_opts_t o;
    char *ns, *worker_id, *host;
    int port;
    char *set_key;        /* <ns>:set:<worker> (publishers) */
    char *channel;        /* <ns>:events */
    char *workers_key;    /* <ns>:workers */
    conn_t cmd;           /* commands: publishing, resync reads */
    conn_t sub;           /* subscription (subscribers only) */
    uv_timer_t flush;     /* publisher batch window; also runs deferred teardown */
    td_buf_t queue;       /* publisher: REC-byte records not yet sent */
    uint8_t header[HDR];  /* publisher: its set's header (magic, epoch) */
    uint8_t epoch[8];     /* publisher: its epoch, little endian */
    char lease_ms[24];    /* publisher: the lease as a decimal string, "0" for none */
    uint64_t live;        /* publisher: records the set would hold compacted (an estimate) */
    uint64_t logged;      /* publisher: records in the set, from the last append's reply */
    bool inventory_asked; /* publisher: on_state(true, true) is pending a publish_inventory */
    bool renew_pending;   /* publisher: a PEXPIRE is unanswered, sent at renew_sent */
    double renew_sent;
    bool foreign_logged;  /* publisher: another epoch owns the set, said once */
    bool closing;
    int open_handles;
    /* subscriber: a resync in progress, and messages held while any read is in flight */
    bool resyncing;
    int reads_pending;    /* SMEMBERS, MGET and GET replies awaited */
    td_buf_t held;        /* [u32 length][message] of messages held during reads */
    double t_resync;      /* td_now_s() when the resync in progress started */
    uint64_t resyncs;
};

static void conn_connect(conn_t *c);

static void on_retry(uv_timer_t *t)
{
    conn_connect(t->data);
}

static void schedule_retry(conn_t *c)
{
    if (c->owner->closing)
        return;
    uint64_t d = c->backoff_ms;
    c->backoff_ms = TD_MIN(c->backoff_ms * 2, (uint64_t)BACKOFF_MAX_MS);
    uv_timer_start(&c->retry, on_retry, d, 0);
}

/* ---- publisher ---------------------------------------------------------------------------- */

static void on_reply_checked(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)ac;
    redisReply *r = reply;
    if (r && r->type == REDIS_REPLY_ERROR)
        td_logf(TD_LOG_WARN, NULL, "redis: %s: %s", (const char *)priv, r->str);
}

/* The message header every PUBLISH starts with: worker id, NUL, epoch. 0 or TD_ENOMEM. */
static int msg_header(const td_kvredis_t *r, td_buf_t *msg)
{
    int rc = td_buf_append(msg, r->worker_id, strlen(r->worker_id) + 1);
    return rc ? rc : td_buf_append(msg, r->epoch, sizeof(r->epoch));
}

static void ask_inventory(td_kvredis_t *r);

/* PEXPIRE's answer: 0 when the set is gone (a renewal came after the lease, or Redis lost it).
 * A worker with no new blocks appends nothing, so without this its set would stay gone and a
 * router reading the index would drop its blocks: the set is written again at once. */
static void on_renewed(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    td_kvredis_t *r = ac->data ? ((conn_t *)ac->data)->owner : NULL;
    redisReply *m = reply;
    if (r)
        r->renew_pending = false;
    if (!r || r->closing || !m)
        return;
    if (m->type == REDIS_REPLY_ERROR) {
        td_logf(TD_LOG_WARN, NULL, "redis: PEXPIRE: %s", m->str);
    } else if (m->type == REDIS_REPLY_INTEGER && m->integer == 0) {
        td_logf(TD_LOG_INFO, NULL, "redis: KV index set %s lapsed before its renewal; "
                "publishing it again", r->set_key);
        ask_inventory(r);
    }
}

static void conn_down(conn_t *c, const char *why);

void td_kvredis_renew(td_kvredis_t *r)
{
    TD_ASSERT(r->worker_id);
    if (!r->cmd.up || !r->o.lease_ms)
        return;
    if (r->renew_pending) {
        if (td_now_s() - r->renew_sent < REPLY_TIMEOUT_S)
            return; /* the last one is still on its way */
        /* unanswered: the connection is dead without hiredis having seen it (a poll error its
         * libuv adapter drops); replace it, and the reconnect republishes the inventory */
        redisAsyncContext *ac = r->cmd.ac;
        ac->data = NULL; /* our callbacks ignore it from now on */
        conn_down(&r->cmd, "no answer to a lease renewal");
        redisAsyncFree(ac);
        return;
    }
    r->renew_pending = true;
    r->renew_sent = td_now_s();
    const char *argv[] = {"PEXPIRE", r->set_key, r->lease_ms};
    size_t lens[] = {7, strlen(r->set_key), strlen(r->lease_ms)};
    redisAsyncCommandArgv(r->cmd.ac, on_renewed, NULL, 3, argv, lens);
}

uint64_t td_kvredis_epoch(const td_kvredis_t *r)
{
    return get_le64(r->epoch);
}

/* Ask the owner for its inventory (once until it publishes it). */
static void ask_inventory(td_kvredis_t *r)
{
    if (r->inventory_asked || r->closing || !r->o.on_state)
        return;
    r->inventory_asked = true;
    r->o.on_state(true, true, r->o.ud);
}

static void on_appended(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    td_kvredis_t *r = ac->data ? ((conn_t *)ac->data)->owner : NULL;
    redisReply *m = reply;
    if (!r || r->closing || !m)
        return;
    if (m->type == REDIS_REPLY_ERROR) {
        td_logf(TD_LOG_WARN, NULL, "redis: KV index append: %s", m->str);
        return;
    }
    if (m->type != REDIS_REPLY_INTEGER)
        return;
    if (m->integer == -1) { /* expired (a missed lease) or lost: write it again */
        td_logf(TD_LOG_INFO, NULL, "redis: KV index set %s is gone; publishing it again",
                r->set_key);
        ask_inventory(r);
    } else if (m->integer == -2) {
        if (!r->foreign_logged)
            td_logf(TD_LOG_WARN, NULL,
                    "redis: KV index set %s belongs to another process of this worker id "
                    "(another epoch); not writing to it",
                    r->set_key);
        r->foreign_logged = true;
    } else if (m->integer >= (long long)HDR) {
        r->logged = ((uint64_t)m->integer - HDR) / REC;
        if (r->logged > 2 * r->live + COMPACT_SLACK)
            ask_inventory(r); /* the events outgrew the set: rewrite it compactly */
    }
}

/* Send the queued records: one script call appends them to the set (while it is ours), renews
 * the lease and publishes them. */
static void flush_queue(td_kvredis_t *r)
{
    if (!r->cmd.up || r->queue.len == 0)
        return;
    const uint8_t *q = (const uint8_t *)r->queue.data;
    for (size_t i = 0; i < r->queue.len; i += REC) {
        if (q[i] == TD_KVREDIS_ADD)
            r->live++;
        else if (r->live > 0)
            r->live--;
    }
    td_buf_t msg;
    td_buf_init(&msg);
    if (msg_header(r, &msg) == 0) {
        const char *argv[] = {"EVAL",     APPEND_SCRIPT,   "1",          r->set_key,
                              (char *)r->header, r->queue.data, r->lease_ms, r->channel,
                              msg.data};
        size_t lens[] = {4,   sizeof(APPEND_SCRIPT) - 1, 1, strlen(r->set_key), HDR,
                         r->queue.len, strlen(r->lease_ms), strlen(r->channel), msg.len};
        redisAsyncCommandArgv(r->cmd.ac, on_appended, NULL, 9, argv, lens);
    }
    td_buf_free(&msg);
    td_buf_reset(&r->queue);
}

static void on_flush_timer(uv_timer_t *t);

int td_kvredis_publish(td_kvredis_t *r, td_kvredis_op_t op, uint8_t tier, const td_kvhash_t *h)
{
    TD_ASSERT(r->worker_id && (op == TD_KVREDIS_ADD || op == TD_KVREDIS_REMOVE));
    if (!r->cmd.up)
        return 0; /* dropped: the inventory republished on reconnect carries it */
    uint8_t rec[REC] = {(uint8_t)op, tier};
    memcpy(rec + 2, h->b, 16);
    int rc = td_buf_append(&r->queue, rec, REC);
    if (rc)
        return rc;
    if (!uv_is_active((uv_handle_t *)&r->flush))
        uv_timer_start(&r->flush, on_flush_timer, r->o.flush_ms, 0);
    return 0;
}

int td_kvredis_publish_inventory(td_kvredis_t *r, const uint8_t *tiers, const td_kvhash_t *hashes,
                                 size_t n)
{
    TD_ASSERT(r->worker_id);
    if (!r->cmd.up)
        return TD_EAGAIN; /* on_state(true, true) asks again on reconnect */
    r->inventory_asked = false;
    td_buf_reset(&r->queue); /* the inventory supersedes what was queued */
    td_buf_t set, msg;
    td_buf_init(&set);
    td_buf_init(&msg);
    int rc = td_buf_reserve(&set, HDR + n * REC);
    if (!rc) {
        td_buf_append(&set, r->header, HDR);
        uint8_t *p = (uint8_t *)set.data + HDR;
        for (size_t i = 0; i < n; i++, p += REC) {
            p[0] = TD_KVREDIS_ADD;
            p[1] = tiers[i];
            memcpy(p + 2, hashes[i].b, 16);
        }
        set.len = HDR + n * REC;
        rc = msg_header(r, &msg);
    }
    uint8_t reset[REC] = {TD_KVREDIS_RESET};
    if (!rc)
        rc = td_buf_append(&msg, reset, REC);
    if (!rc) {
        /* the set, replaced whole (with its lease), then its id in the workers' set, then the
         * news: subscribers read the new set when they hear of it */
        const char *a1[] = {"SET", r->set_key, set.data, "PX", r->lease_ms};
        size_t l1[] = {3, strlen(r->set_key), set.len, 2, strlen(r->lease_ms)};
        redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"SET", r->o.lease_ms ? 5 : 3,
                              a1, l1);
        const char *a2[] = {"SADD", r->workers_key, r->worker_id};
        size_t l2[] = {4, strlen(r->workers_key), strlen(r->worker_id)};
        redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"SADD", 3, a2, l2);
        const char *a3[] = {"PUBLISH", r->channel, msg.data};
        size_t l3[] = {7, strlen(r->channel), msg.len};
        redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"PUBLISH", 3, a3, l3);
        r->live = r->logged = n;
        r->foreign_logged = false;
    }
    td_buf_free(&set);
    td_buf_free(&msg);
    return rc;
}

/* ---- subscriber --------------------------------------------------------------------------- */

static void deliver(td_kvredis_t *r, const char *worker, uint64_t epoch, const uint8_t *recs,
                    size_t n_recs)
{
    if (r->closing)
        return; /* td_kvredis_close: the owner hears nothing more */
    td_kvredis_event_t ev[256];
    size_t k = 0;
    for (size_t i = 0; i < n_recs; i++) {
        const uint8_t *p = recs + i * REC;
        if (p[0] < TD_KVREDIS_ADD || p[0] > TD_KVREDIS_RESET)
            continue; /* a record from a newer version: skip it */
        td_kvredis_event_t *e = &ev[k++];
        e->op = (td_kvredis_op_t)p[0];
        e->tier = p[1];
        memcpy(e->hash.b, p + 2, 16);
        e->worker = worker;
        e->epoch = epoch;
        if (k == TD_ARRAY_LEN(ev)) {
            if (r->o.on_events)
                r->o.on_events(ev, k, r->o.ud);
            k = 0;
        }
    }
    if (k && r->o.on_events)
        r->o.on_events(ev, k, r->o.ud);
}

/* A set read for `worker` (NULL reply element: it has none): RESET with the set's epoch, then its
 * records as events. */
static void deliver_set(td_kvredis_t *r, const char *worker, const redisReply *v, size_t hint)
{
    uint64_t epoch = 0;
    size_t n = 0;
    const uint8_t *buf = NULL;
    if (v && v->type == REDIS_REPLY_STRING) {
        buf = (const uint8_t *)v->str;
        if (td_kvredis_set_parse(buf, v->len, &epoch, &n) != 0) {
            td_logf(TD_LOG_WARN, NULL, "redis: worker %s: %s; ignored", worker, td_err_msg());
            return;
        }
    }
    td_kvredis_event_t reset = {TD_KVREDIS_RESET, 0, {{0}}, worker, epoch, hint};
    if (!r->closing && r->o.on_events)
        r->o.on_events(&reset, 1, r->o.ud);
    if (n)
        deliver(r, worker, epoch, buf + HDR, n);
}

/* One message from the channel: worker id, NUL, epoch, records. A RESET record makes us read the
 * worker's new set (which carries its own RESET). */
static int resync_worker(td_kvredis_t *r, const char *worker, size_t len);

static void deliver_message(td_kvredis_t *r, const char *p, size_t len)
{
    const char *nul = memchr(p, '\0', len);
    if (!nul)
        return;
    size_t off = (size_t)(nul - p) + 1;
    if (len - off < 8)
        return; /* no epoch: a message of an older version */
    uint64_t epoch = get_le64((const uint8_t *)p + off);
    off += 8;
    const uint8_t *recs = (const uint8_t *)p + off;
    size_t n = (len - off) / REC, from = 0;
    for (size_t i = 0; i < n; i++) {
        if (recs[i * REC] != TD_KVREDIS_RESET)
            continue;
        deliver(r, p, epoch, recs + from * REC, i - from);
        from = i + 1;
        resync_worker(r, p, (size_t)(nul - p));
    }
    deliver(r, p, epoch, recs + from * REC, n - from);
}

/* A read finished: when none is left, deliver what was held meanwhile, in order. */
static void read_done(td_kvredis_t *r)
{
    if (--r->reads_pending > 0)
        return;
    if (r->resyncing) {
        r->resyncing = false;
        r->resyncs++;
        if (r->o.on_resynced && !r->closing)
            r->o.on_resynced(td_now_s() - r->t_resync, r->o.ud);
    }
    td_buf_t held = r->held;
    td_buf_init(&r->held);
    for (size_t off = 0; off + 4 <= held.len && !r->closing;) {
        uint32_t n;
        memcpy(&n, held.data + off, 4);
        deliver_message(r, held.data + off + 4, n);
        off += 4 + n;
    }
    td_buf_free(&held);
}

static void on_message(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)ac;
    td_kvredis_t *r = priv;
    redisReply *m = reply;
    if (!m || m->type != REDIS_REPLY_ARRAY || m->elements != 3 ||
        m->element[0]->type != REDIS_REPLY_STRING)
        return;
    if (strcmp(m->element[0]->str, "subscribe") == 0) {
        conn_t *c = &r->sub;
        c->up = true;
        c->backoff_ms = BACKOFF_MIN_MS;
        td_logf(TD_LOG_INFO, NULL, "redis: subscribed to %s", r->channel);
        if (r->cmd.up)
            td_kvredis_resync(r);
        if (r->o.on_state)
            r->o.on_state(true, false, r->o.ud);
        return;
    }
    if (strcmp(m->element[0]->str, "message") != 0 || m->element[2]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *b = m->element[2];
    if (r->reads_pending > 0) { /* held until the sets being read are in */
        uint32_t n = (uint32_t)b->len;
        if (td_buf_append(&r->held, &n, 4) == 0 && td_buf_append(&r->held, b->str, b->len) != 0)
            r->held.len -= 4;
        return;
    }
    deliver_message(r, b->str, b->len);
}

/* A read of one or more sets: the workers they belong to ("\0"-separated), in reply order. */
typedef struct read_ctx {
    size_t n;
    char ids[]; /* n NUL-terminated ids */
} read_ctx_t;

static void on_sets(redisAsyncContext *ac, void *reply, void *priv)
{
    read_ctx_t *x = priv;
    td_kvredis_t *r = ac->data ? ((conn_t *)ac->data)->owner : NULL;
    redisReply *m = reply;
    if (r && !r->closing && m) {
        size_t hint = 0; /* every set's records, a size hint with the first RESET */
        redisReply **els = m->type == REDIS_REPLY_ARRAY ? m->element : NULL;
        for (size_t i = 0; i < (els ? m->elements : 1); i++) {
            const redisReply *v = els ? els[i] : m;
            if (v->type == REDIS_REPLY_STRING && v->len >= HDR)
                hint += (v->len - HDR) / REC;
        }
        const char *id = x->ids;
        for (size_t i = 0; i < x->n; i++, id += strlen(id) + 1) {
            if (els && i < m->elements)
                deliver_set(r, id, els[i], i ? 0 : hint); /* MGET */
            else if (m->type == REDIS_REPLY_STRING || m->type == REDIS_REPLY_NIL)
                deliver_set(r, id, m->type == REDIS_REPLY_NIL ? NULL : m, hint); /* GET */
        }
    }
    free(x);
    if (r)
        read_done(r);
}

static void on_members(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    td_kvredis_t *r = ac->data ? ((conn_t *)ac->data)->owner : NULL;
    redisReply *m = reply;
    if (!r)
        return;
    if (m && m->type == REDIS_REPLY_ARRAY && m->elements > 0 && !r->closing) {
        /* one MGET of every set, with the ids to name them by */
        size_t n = m->elements, ids_len = 0;
        for (size_t i = 0; i < n; i++)
            ids_len += m->element[i]->len + 1;
        read_ctx_t *x = malloc(sizeof(*x) + ids_len);
        const char **argv = malloc((n + 1) * sizeof(char *));
        size_t *lens = malloc((n + 1) * sizeof(size_t));
        td_buf_t keys;
        td_buf_init(&keys);
        size_t prefix = strlen(r->ns) + 5; /* "<ns>:set:" */
        bool ok = x && argv && lens && td_buf_reserve(&keys, n * (prefix + 1) + ids_len) == 0;
        if (ok) {
            x->n = n;
            char *id = x->ids;
            argv[0] = "MGET", lens[0] = 4;
            for (size_t i = 0; i < n; i++) {
                const redisReply *e = m->element[i];
                memcpy(id, e->str, e->len);
                id[e->len] = '\0';
                id += e->len + 1;
                size_t at = keys.len;
                td_buf_printf(&keys, "%s:set:", r->ns);
                td_buf_append(&keys, e->str, e->len);
                lens[i + 1] = keys.len - at;
            }
            for (size_t i = 0, at = 0; i < n; i++) { /* the buffer no longer moves */
                argv[i + 1] = keys.data + at;
                at += lens[i + 1];
            }
            if (redisAsyncCommandArgv(ac, on_sets, x, (int)n + 1, argv, lens) == REDIS_OK) {
                r->reads_pending++;
                x = NULL;
            }
        }
        free(x);
        free(argv);
        free(lens);
        td_buf_free(&keys);
    }
    read_done(r);
}

int td_kvredis_resync(td_kvredis_t *r)
{
    if (!r->cmd.up)
        return TD_EAGAIN;
    if (r->resyncing)
        return 0;
    const char *argv[] = {"SMEMBERS", r->workers_key};
    size_t lens[] = {8, strlen(r->workers_key)};
    if (redisAsyncCommandArgv(r->cmd.ac, on_members, NULL, 2, argv, lens) != REDIS_OK)
        return TD_EIO;
    r->resyncing = true;
    r->t_resync = td_now_s();
    r->reads_pending++;
    return 0;
}

static int resync_worker(td_kvredis_t *r, const char *worker, size_t len)
{
    if (!r->cmd.up)
        return TD_EAGAIN;
    read_ctx_t *x = malloc(sizeof(*x) + len + 1);
    td_buf_t key;
    td_buf_init(&key);
    if (!x || td_buf_printf(&key, "%s:set:", r->ns) || td_buf_append(&key, worker, len)) {
        free(x);
        td_buf_free(&key);
        return TD_ENOMEM;
    }
    x->n = 1;
    memcpy(x->ids, worker, len);
    x->ids[len] = '\0';
    const char *argv[] = {"GET", key.data};
    size_t lens[] = {3, key.len};
    int rc = redisAsyncCommandArgv(r->cmd.ac, on_sets, x, 2, argv, lens) == REDIS_OK ? 0 : TD_EIO;
    if (rc)
        free(x);
    else
        r->reads_pending++;
    td_buf_free(&key);
    return rc;
}

int td_kvredis_resync_worker(td_kvredis_t *r, const char *worker)
{
    return resync_worker(r, worker, strlen(worker));
}

uint64_t td_kvredis_resyncs(const td_kvredis_t *r)
{
    return r->resyncs;
}

/* ---- connections -------------------------------------------------------------------------- */

static void conn_down(conn_t *c, const char *why)
{
    td_kvredis_t *r = c->owner;
    bool was_up = c->up;
    c->up = false;
    c->ac = NULL;
    if (was_up) {
        td_logf(TD_LOG_WARN, NULL, "redis %s: connection lost (%s); serving without it", r->host,
                why);
        if (r->o.on_state && !r->closing)
            r->o.on_state(false, false, r->o.ud);
    }
    if (c == &r->cmd) {
        r->resyncing = false;
        r->renew_pending = false;
    }
    schedule_retry(c);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    conn_t *c = ac->data;
    if (!c)
        return; /* torn down by td_kvredis_close */
    td_kvredis_t *r = c->owner;
    uv_timer_stop(&c->retry); /* the deadline */
    if (status != REDIS_OK) {
        conn_down(c, ac->errstr);
        return;
    }
    if (c->is_sub) { /* up once the subscription is confirmed */
        redisAsyncCommand(c->ac, on_message, r, "SUBSCRIBE %s", r->channel);
        return;
    }
    c->up = true;
    c->backoff_ms = BACKOFF_MIN_MS;
    if (r->worker_id) {
        /* Redis may have restarted empty, and events were dropped while it was down: the
         * worker republishes its whole inventory on every connect */
        r->inventory_asked = false;
        ask_inventory(r);
    } else if (r->sub.up) {
        td_kvredis_resync(r);
    }
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    conn_t *c = ac->data;
    if (!c)
        return; /* torn down by td_kvredis_close */
    conn_down(c, status == REDIS_OK ? "closed" : ac->errstr);
}

static void on_connect_timeout(uv_timer_t *t)
{
    conn_t *c = t->data;
    redisAsyncContext *ac = c->ac;
    if (!ac || c->up || c->owner->closing)
        return;
    ac->data = NULL; /* our callbacks ignore it from now on */
    c->ac = NULL;
    redisAsyncFree(ac);
    schedule_retry(c);
}

static void conn_connect(conn_t *c)
{
    td_kvredis_t *r = c->owner;
    if (r->closing || c->ac)
        return;
    redisAsyncContext *ac = redisAsyncConnect(r->host, r->port);
    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        schedule_retry(c);
        return;
    }
    ac->data = c;
    c->ac = ac;
    redisLibuvAttach(ac, r->loop);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    uv_timer_start(&c->retry, on_connect_timeout, CONNECT_TIMEOUT_MS, 0);
}

static void on_flush_timer(uv_timer_t *t)
{
    td_kvredis_t *r = t->data;
    if (r->closing)
        return;
    flush_queue(r);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

td_kvredis_t *td_kvredis_new(uv_loop_t *loop, const td_kvredis_opts_t *opts)
{
    const char *colon = opts->addr ? strrchr(opts->addr, ':') : NULL;
    uint64_t port;
    if (!colon || td_parse_u64(colon + 1, &port) || port == 0 || port > 65535 || !opts->ns) {
        td_err_set(TD_EINVAL, "redis address \"%s\": expected host:port",
                   opts->addr ? opts->addr : "");
        return NULL;
    }
    td_kvredis_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->loop = loop;
    r->o = *opts;
    if (!r->o.flush_ms)
        r->o.flush_ms = 5;
    r->host = td_strndup(opts->addr, (size_t)(colon - opts->addr));
    r->port = (int)port;
    r->ns = td_strdup(opts->ns);
    r->worker_id = opts->worker_id ? td_strdup(opts->worker_id) : NULL;
    td_buf_t b;
    td_buf_init(&b);
    td_buf_printf(&b, "%s:events", opts->ns);
    r->channel = td_buf_steal(&b, NULL);
    td_buf_printf(&b, "%s:workers", opts->ns);
    r->workers_key = td_buf_steal(&b, NULL);
    snprintf(r->lease_ms, sizeof(r->lease_ms), "%llu", (unsigned long long)opts->lease_ms);
    if (r->worker_id) {
        td_buf_printf(&b, "%s:set:%s", opts->ns, opts->worker_id);
        r->set_key = td_buf_steal(&b, NULL);
        uint64_t epoch = opts->epoch;
        if (!epoch && getrandom(&epoch, sizeof(epoch), 0) != (ssize_t)sizeof(epoch))
            epoch = 0;
        if (!epoch)
            epoch = (td_wall_ns() ^ ((uint64_t)getpid() << 32)) | 1;
        put_le64(r->epoch, epoch);
        td_kvredis_set_header(r->header, epoch);
    }
    td_buf_init(&r->queue);
    td_buf_init(&r->held);
    conn_t *cs[2] = {&r->cmd, &r->sub};
    for (int i = 0; i < 2; i++) {
        cs[i]->owner = r;
        cs[i]->is_sub = i == 1;
        cs[i]->backoff_ms = BACKOFF_MIN_MS;
        uv_timer_init(loop, &cs[i]->retry);
        cs[i]->retry.data = cs[i];
    }
    uv_timer_init(loop, &r->flush);
    r->flush.data = r;
    conn_connect(&r->cmd);
    if (opts->subscribe)
        conn_connect(&r->sub);
    return r;
}

bool td_kvredis_connected(const td_kvredis_t *r)
{
    return r->cmd.up && (!r->o.subscribe || r->sub.up);
}

static void free_if_done(td_kvredis_t *r)
{
    if (r->open_handles > 0 || r->cmd.ac || r->sub.ac)
        return;
    td_buf_free(&r->queue);
    td_buf_free(&r->held);
    free(r->ns);
    free(r->worker_id);
    free(r->host);
    free(r->set_key);
    free(r->channel);
    free(r->workers_key);
    free(r);
}

static void on_closed(uv_handle_t *h)
{
    td_kvredis_t *r = h->data;
    r->open_handles--;
    free_if_done(r);
}

/* Deferred teardown: runs from a timer, never inside a hiredis callback. */
static void teardown(uv_timer_t *t)
{
    td_kvredis_t *r = t->data;
    conn_t *cs[2] = {&r->cmd, &r->sub};
    for (int i = 0; i < 2; i++) {
        redisAsyncContext *ac = cs[i]->ac;
        cs[i]->ac = NULL;
        cs[i]->up = false;
        if (ac) {
            ac->data = NULL; /* our callbacks then ignore it (hiredis keeps the callback set) */
            redisAsyncFree(ac); /* pending callbacks run with a NULL reply */
        }
    }
    r->open_handles = 3;
    /* the retry timers' data point at the conns; repoint them at the owner for on_closed */
    r->cmd.retry.data = r;
    r->sub.retry.data = r;
    uv_close((uv_handle_t *)&r->cmd.retry, on_closed);
    uv_close((uv_handle_t *)&r->sub.retry, on_closed);
    uv_close((uv_handle_t *)&r->flush, on_closed);
}

void td_kvredis_close(td_kvredis_t *r)
{
    if (!r || r->closing)
        return;
    r->closing = true;
    uv_timer_stop(&r->cmd.retry);
    uv_timer_stop(&r->sub.retry);
    uv_timer_start(&r->flush, teardown, 0, 0);
}

/* The leave script answered (or the connection went: a NULL reply): tear down now. */
static void on_left(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    td_kvredis_t *r = ac->data ? ((conn_t *)ac->data)->owner : NULL;
    redisReply *m = reply;
    if (!r)
        return; /* torn down already (the wait ran out) */
    if (m && m->type == REDIS_REPLY_ERROR)
        td_logf(TD_LOG_WARN, NULL, "redis: KV index leave: %s", m->str);
    else if (m && m->type == REDIS_REPLY_INTEGER && m->integer == 1)
        td_logf(TD_LOG_INFO, NULL, "redis: KV index set %s removed", r->set_key);
    uv_timer_start(&r->flush, teardown, 0, 0);
}

void td_kvredis_leave(td_kvredis_t *r)
{
    if (!r || r->closing)
        return;
    TD_ASSERT(r->worker_id);
    td_buf_t msg;
    td_buf_init(&msg);
    uint8_t reset[REC] = {TD_KVREDIS_RESET};
    bool sent = false;
    if (r->cmd.up && msg_header(r, &msg) == 0 && td_buf_append(&msg, reset, REC) == 0) {
        const char *argv[] = {"EVAL",        LEAVE_SCRIPT,  "2",        r->set_key,
                              r->workers_key, (char *)r->header, r->worker_id, r->channel,
                              msg.data};
        size_t lens[] = {4, sizeof(LEAVE_SCRIPT) - 1, 1, strlen(r->set_key),
                         strlen(r->workers_key), HDR, strlen(r->worker_id), strlen(r->channel),
                         msg.len};
        sent = redisAsyncCommandArgv(r->cmd.ac, on_left, NULL, 9, argv, lens) == REDIS_OK;
    }
    td_buf_free(&msg);
    td_kvredis_close(r);
    if (sent) /* teardown once the script answers, or after the wait */
        uv_timer_start(&r->flush, teardown, LEAVE_WAIT_MS, 0);
}
