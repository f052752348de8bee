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
#define REC 18u /* op, tier, hash */
#define EPOCH_FIELD "epoch"

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
    char *set_key;        /* <ns>:holders:<worker> (publishers) */
    char *channel;        /* <ns>:events */
    char *pattern;        /* <ns>:holders:* */
    conn_t cmd;           /* commands: publishing, resync reads */
    conn_t sub;           /* subscription (subscribers only) */
    uv_timer_t flush;     /* publisher batch window; also runs deferred teardown */
    td_buf_t queue;       /* publisher: REC-byte records not yet sent */
    uint8_t epoch[8];     /* publisher: its epoch, little endian */
    bool closing;
    int open_handles;
    /* resync in progress */
    bool resyncing;
    int scans_pending, reads_pending;
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

void td_kvredis_renew(td_kvredis_t *r)
{
    TD_ASSERT(r->worker_id);
    if (!r->cmd.up || !r->o.lease_ms)
        return;
    char ms[24];
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)r->o.lease_ms);
    const char *argv[] = {"PEXPIRE", r->set_key, ms};
    size_t lens[] = {7, strlen(r->set_key), strlen(ms)};
    redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"PEXPIRE", 3, argv, lens);
}

uint64_t td_kvredis_epoch(const td_kvredis_t *r)
{
    return get_le64(r->epoch);
}

/* Send the queued records: HSET hash->tier for adds, HDEL for removes (in order, as runs of one
 * op), then one PUBLISH of them all. */
static void flush_queue(td_kvredis_t *r)
{
    if (!r->cmd.up || r->queue.len == 0)
        return;
    const uint8_t *q = (const uint8_t *)r->queue.data;
    size_t n = r->queue.len / REC;
    const char **argv = malloc((2 * n + 4) * sizeof(char *));
    size_t *lens = malloc((2 * n + 4) * sizeof(size_t));
    if (!argv || !lens)
        goto out;
    for (size_t i = 0; i < n;) {
        uint8_t op = q[i * REC];
        size_t j = i, argc = 2;
        argv[0] = op == TD_KVREDIS_ADD ? "HSET" : "HDEL";
        lens[0] = 4;
        argv[1] = r->set_key;
        lens[1] = strlen(r->set_key);
        if (op == TD_KVREDIS_ADD) {
            /* the epoch goes with every add, so the key never exists without it (and a resync
             * that reads the key after an inventory's DEL sees the adds too, or nothing) */
            argv[argc] = EPOCH_FIELD, lens[argc++] = strlen(EPOCH_FIELD);
            argv[argc] = (const char *)r->epoch, lens[argc++] = sizeof(r->epoch);
        }
        for (; j < n && q[j * REC] == op; j++) {
            argv[argc] = (const char *)q + j * REC + 2; /* field: the block hash */
            lens[argc++] = 16;
            if (op == TD_KVREDIS_ADD) {
                argv[argc] = (const char *)q + j * REC + 1; /* value: the tier */
                lens[argc++] = 1;
            }
        }
        redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"HSET/HDEL", (int)argc, argv,
                              lens);
        i = j;
    }
    /* PUBLISH <channel> <worker>\0<epoch><records> */
    td_buf_t msg;
    td_buf_init(&msg);
    if (msg_header(r, &msg) == 0 && td_buf_append(&msg, r->queue.data, r->queue.len) == 0) {
        argv[0] = "PUBLISH", lens[0] = 7;
        argv[1] = r->channel, lens[1] = strlen(r->channel);
        argv[2] = msg.data, lens[2] = msg.len;
        redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"PUBLISH", 3, argv, lens);
    }
    td_buf_free(&msg);
    td_buf_reset(&r->queue);
    td_kvredis_renew(r); /* an HSET may have created the key again, without its expiry */
out:
    free(argv);
    free(lens);
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
    td_buf_reset(&r->queue);
    const char *del[] = {"DEL", r->set_key};
    size_t del_len[] = {3, strlen(r->set_key)};
    redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"DEL", 2, del, del_len);
    /* the reset goes out first, then the set as ordinary adds in batches */
    uint8_t reset[REC] = {TD_KVREDIS_RESET};
    td_buf_t msg;
    td_buf_init(&msg);
    int rc = msg_header(r, &msg);
    if (!rc)
        rc = td_buf_append(&msg, reset, REC);
    if (!rc) {
        const char *pub[] = {"PUBLISH", r->channel, msg.data};
        size_t pub_len[] = {7, strlen(r->channel), msg.len};
        redisAsyncCommandArgv(r->cmd.ac, on_reply_checked, (void *)"PUBLISH", 3, pub, pub_len);
    }
    td_buf_free(&msg);
    for (size_t i = 0; i < n && !rc; i++)
        rc = td_kvredis_publish(r, TD_KVREDIS_ADD, tiers[i], &hashes[i]);
    return rc;
}

/* ---- subscriber --------------------------------------------------------------------------- */

static void deliver(td_kvredis_t *r, const char *worker, uint64_t epoch, const uint8_t *recs,
                    size_t n_recs)
{
    if (r->closing)
        return; /* td_kvredis_close: the owner hears nothing more */
    td_kvredis_event_t ev[64];
    size_t k = 0;
    for (size_t i = 0; i < n_recs; i++) {
        const uint8_t *p = recs + i * REC;
        td_kvredis_event_t *e = &ev[k++];
        e->op = (td_kvredis_op_t)p[0];
        e->tier = p[1];
        memcpy(e->hash.b, p + 2, 16);
        e->worker = worker;
        e->epoch = epoch;
        if (e->op < TD_KVREDIS_ADD || e->op > TD_KVREDIS_RESET)
            k--; /* a record from a newer version: skip it */
        if (k == TD_ARRAY_LEN(ev) || i + 1 == n_recs) {
            if (k && r->o.on_events)
                r->o.on_events(ev, k, r->o.ud);
            k = 0;
        }
    }
}

static void on_message(redisAsyncContext *ac, void *reply, void *priv)
{
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
    const char *p = m->element[2]->str;
    size_t len = m->element[2]->len;
    const char *nul = memchr(p, '\0', len);
    if (!nul)
        return;
    size_t off = (size_t)(nul - p) + 1;
    if (len - off < 8)
        return; /* no epoch: a message of an older version */
    uint64_t epoch = get_le64((const uint8_t *)p + off);
    off += 8;
    deliver(r, p, epoch, (const uint8_t *)p + off, (len - off) / REC);
}

static void resync_maybe_done(td_kvredis_t *r)
{
    if (r->resyncing && r->scans_pending == 0 && r->reads_pending == 0) {
        r->resyncing = false;
        r->resyncs++;
    }
}

/* One HGETALL of a resync: the worker whose set it reads, and whether a full resync counts it. */
typedef struct read_ctx {
    bool counted;
    char worker[];
} read_ctx_t;

static read_ctx_t *read_ctx_new(const char *worker, size_t len, bool counted)
{
    read_ctx_t *x = malloc(sizeof(*x) + len + 1);
    if (!x)
        return NULL;
    x->counted = counted;
    memcpy(x->worker, worker, len);
    x->worker[len] = '\0';
    return x;
}

static void on_members(redisAsyncContext *ac, void *reply, void *priv)
{
    read_ctx_t *x = priv;
    const char *worker = x->worker;
    td_kvredis_t *r = ac->data ? ((conn_t *)ac->data)->owner : NULL;
    redisReply *m = reply;
    if (r && !r->closing && m && m->type == REDIS_REPLY_ARRAY) {
        uint64_t epoch = 0;
        for (size_t i = 0; i + 1 < m->elements; i += 2) {
            redisReply *f = m->element[i], *v = m->element[i + 1];
            if (f->type == REDIS_REPLY_STRING && f->len == strlen(EPOCH_FIELD) &&
                memcmp(f->str, EPOCH_FIELD, f->len) == 0 && v->type == REDIS_REPLY_STRING &&
                v->len == 8)
                epoch = get_le64((const uint8_t *)v->str);
        }
        td_kvredis_event_t reset = {TD_KVREDIS_RESET, 0, {{0}}, worker, epoch};
        if (r->o.on_events)
            r->o.on_events(&reset, 1, r->o.ud);
        /* HGETALL: field (16-byte hash), value (1-byte tier), ... as ADD records */
        td_buf_t recs;
        td_buf_init(&recs);
        for (size_t i = 0; i + 1 < m->elements; i += 2) {
            redisReply *f = m->element[i], *v = m->element[i + 1];
            if (f->type != REDIS_REPLY_STRING || f->len != 16 || v->type != REDIS_REPLY_STRING ||
                v->len != 1)
                continue;
            uint8_t rec[REC] = {TD_KVREDIS_ADD, (uint8_t)v->str[0]};
            memcpy(rec + 2, f->str, 16);
            if (td_buf_append(&recs, rec, REC))
                break;
        }
        deliver(r, worker, epoch, (const uint8_t *)recs.data, recs.len / REC);
        td_buf_free(&recs);
    }
    bool counted = x->counted;
    free(x);
    if (r && counted) {
        r->reads_pending--;
        resync_maybe_done(r);
    }
}

static void on_scan(redisAsyncContext *ac, void *reply, void *priv)
{
    td_kvredis_t *r = priv;
    redisReply *m = reply;
    r->scans_pending--;
    if (!m || m->type != REDIS_REPLY_ARRAY || m->elements != 2 || !r->cmd.up) {
        r->resyncing = false; /* retried on the next connect */
        return;
    }
    size_t prefix = strlen(r->pattern) - 1; /* "<ns>:holders:" */
    redisReply *keys = m->element[1];
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING || k->len <= prefix)
            continue;
        read_ctx_t *x = read_ctx_new(k->str + prefix, k->len - prefix, true);
        if (!x)
            continue;
        const char *argv[] = {"HGETALL", k->str};
        size_t lens[] = {7, k->len};
        if (redisAsyncCommandArgv(ac, on_members, x, 2, argv, lens) == REDIS_OK)
            r->reads_pending++;
        else
            free(x);
    }
    const char *cursor = m->element[0]->str;
    if (strcmp(cursor, "0") != 0) {
        if (redisAsyncCommand(ac, on_scan, r, "SCAN %s MATCH %s COUNT 1000", cursor, r->pattern) ==
            REDIS_OK)
            r->scans_pending++;
    }
    resync_maybe_done(r);
}

int td_kvredis_resync(td_kvredis_t *r)
{
    if (!r->cmd.up)
        return TD_EAGAIN;
    if (r->resyncing)
        return 0;
    if (redisAsyncCommand(r->cmd.ac, on_scan, r, "SCAN 0 MATCH %s COUNT 1000", r->pattern) !=
        REDIS_OK)
        return TD_EIO;
    r->resyncing = true;
    r->scans_pending = 1;
    r->reads_pending = 0;
    return 0;
}

int td_kvredis_resync_worker(td_kvredis_t *r, const char *worker)
{
    if (!r->cmd.up)
        return TD_EAGAIN;
    read_ctx_t *x = read_ctx_new(worker, strlen(worker), false);
    td_buf_t key;
    td_buf_init(&key);
    if (!x || td_buf_printf(&key, "%s:holders:%s", r->ns, worker)) {
        free(x);
        td_buf_free(&key);
        return TD_ENOMEM;
    }
    const char *argv[] = {"HGETALL", key.data};
    size_t lens[] = {7, key.len};
    int rc = redisAsyncCommandArgv(r->cmd.ac, on_members, x, 2, argv, lens) == REDIS_OK ? 0 : TD_EIO;
    if (rc)
        free(x);
    td_buf_free(&key);
    return rc;
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
    if (c == &r->cmd)
        r->resyncing = false;
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
        if (r->o.on_state)
            r->o.on_state(true, true, r->o.ud);
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
    td_buf_printf(&b, "%s:holders:*", opts->ns);
    r->pattern = td_buf_steal(&b, NULL);
    if (r->worker_id) {
        td_buf_printf(&b, "%s:holders:%s", opts->ns, opts->worker_id);
        r->set_key = td_buf_steal(&b, NULL);
        uint64_t epoch = opts->epoch;
        if (!epoch && getrandom(&epoch, sizeof(epoch), 0) != (ssize_t)sizeof(epoch))
            epoch = 0;
        if (!epoch)
            epoch = (td_wall_ns() ^ ((uint64_t)getpid() << 32)) | 1;
        put_le64(r->epoch, epoch);
    }
    td_buf_init(&r->queue);
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
    free(r->ns);
    free(r->worker_id);
    free(r->host);
    free(r->set_key);
    free(r->channel);
    free(r->pattern);
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
