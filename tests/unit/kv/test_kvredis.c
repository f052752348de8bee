/* test_kvredis.c: the Redis-backed KV index against a real redis-server on loopback: events from
 * a worker reach a router, a late router resyncs, and after Redis restarts empty the worker
 * republishes and routers resync; a worker's lease keeps its set while it renews and lets it go
 * when it dies; a restarted worker's new epoch replaces its set. */
#include "td_error.h"
#include "td_kvredis.h"
#include "td_util.h"

#include "td_check.h"
#include "td_redis.h"

#include <check.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* A tiny mirror: tier per (worker, block) for 2 workers x 256 blocks, -1 when absent. */
typedef struct mirror {
    int8_t tier[2][256];
    int resets;
    int ups, downs, inventories;
    uint64_t epoch; /* of the last event */
} mirror_t;

static td_kvhash_t blk(int i)
{
    td_kvhash_t h;
    memset(&h, 0, sizeof(h));
    h.b[0] = (uint8_t)i;
    h.b[15] = 0xAB;
    return h;
}

static void on_events(const td_kvredis_event_t *ev, size_t n, void *ud)
{
    mirror_t *m = ud;
    for (size_t i = 0; i < n; i++) {
        int w = strcmp(ev[i].worker, "d0") == 0 ? 0 : 1;
        m->epoch = ev[i].epoch;
        if (ev[i].op == TD_KVREDIS_RESET) {
            memset(m->tier[w], -1, sizeof(m->tier[w]));
            m->resets++;
        } else {
            ck_assert_uint_eq(ev[i].hash.b[15], 0xAB);
            m->tier[w][ev[i].hash.b[0]] = ev[i].op == TD_KVREDIS_ADD ? (int8_t)ev[i].tier : -1;
        }
    }
}

static void on_state(bool up, bool need_inventory, void *ud)
{
    mirror_t *m = ud;
    if (up)
        m->ups++;
    else
        m->downs++;
}

/* the worker's own inventory, republished on every connect */
static td_kvredis_t *worker;
static int8_t inventory[256];

static void worker_state(bool up, bool need_inventory, void *ud)
{
    mirror_t *m = ud;
    on_state(up, need_inventory, ud);
    if (!up || !need_inventory)
        return;
    uint8_t tiers[256];
    td_kvhash_t hs[256];
    size_t n = 0;
    for (int i = 0; i < 256; i++)
        if (inventory[i] >= 0)
            tiers[n] = (uint8_t)inventory[i], hs[n++] = blk(i);
    ck_assert_int_eq(td_kvredis_publish_inventory(worker, tiers, hs, n), 0);
    m->inventories++;
}

/* The blocks a worker's set in Redis holds once replayed (the test's 256 block names), or -1
 * when it has no set. */
static long long set_blocks(const char *key)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return -1;
    }
    redisReply *r = redisCommand(c, "GET %s", key);
    long long n = -1;
    uint64_t epoch;
    size_t recs;
    if (r && r->type == REDIS_REPLY_STRING &&
        td_kvredis_set_parse((const uint8_t *)r->str, r->len, &epoch, &recs) == 0) {
        bool have[256] = {false};
        for (size_t i = 0; i < recs; i++) {
            const uint8_t *p = (const uint8_t *)r->str + TD_KVREDIS_SET_HEADER + i * 18;
            have[p[2]] = p[0] == TD_KVREDIS_ADD;
        }
        n = 0;
        for (int i = 0; i < 256; i++)
            n += have[i];
    }
    freeReplyObject(r);
    redisFree(c);
    return n;
}

static int count(const mirror_t *m, int w)
{
    int n = 0;
    for (int i = 0; i < 256; i++)
        n += m->tier[w][i] >= 0;
    return n;
}

static uv_loop_t loop;
static bool run_until(bool (*cond)(void *), void *arg, int ms)
{
    return loop_run_until(&loop, cond, arg, ms);
}

typedef struct want {
    mirror_t *m;
    int w, n;
    long long scard;
    td_kvredis_t *r;
    uint64_t resyncs;
} want_t;

static bool have(void *a)
{
    want_t *x = a;
    if (x->r && td_kvredis_resyncs(x->r) < x->resyncs)
        return false;
    if (count(x->m, x->w) != x->n)
        return false;
    /* the worker's set in Redis holds its blocks */
    return x->scard < 0 || set_blocks("t:set:d0") == x->scard;
}

static void publish(int i, int tier)
{
    inventory[i] = (int8_t)tier;
    td_kvhash_t h = blk(i);
    ck_assert_int_eq(td_kvredis_publish(worker, tier < 0 ? TD_KVREDIS_REMOVE : TD_KVREDIS_ADD,
                                        (uint8_t)(tier < 0 ? 0 : tier), &h),
                     0);
}

START_TEST(test_events_resync_restart)
{
    char addr[32];
    redis_setup(&loop, addr);
    memset(inventory, -1, sizeof(inventory));
    mirror_t wm = {0}, rm = {0}, late = {0};
    memset(rm.tier, -1, sizeof(rm.tier));
    memset(late.tier, -1, sizeof(late.tier));
    td_kvredis_opts_t wo = {.addr = addr, .ns = "t", .worker_id = "d0", .on_state = worker_state,
                            .ud = &wm};
    td_kvredis_opts_t ro = {.addr = addr, .ns = "t", .subscribe = true, .on_events = on_events,
                            .on_state = on_state, .ud = &rm};
    td_kvredis_t *router = td_kvredis_new(&loop, &ro);
    worker = td_kvredis_new(&loop, &wo);
    ck_assert_ptr_nonnull(router);
    ck_assert_ptr_nonnull(worker);
    want_t w = {&rm, 0, 0, 0, router, 1};
    ck_assert(run_until(have, &w, 5000)); /* both connected, first resync done */
    ck_assert(td_kvredis_connected(worker));
    /* 100 adds, then 10 removes and 5 tier changes, as events */
    for (int i = 0; i < 100; i++)
        publish(i, i % 3);
    w = (want_t){&rm, 0, 100, 100, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    for (int i = 0; i < 10; i++)
        publish(i, -1);
    for (int i = 50; i < 55; i++)
        publish(i, 2);
    w = (want_t){&rm, 0, 90, 90, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    for (int i = 0; i < 256; i++)
        ck_assert_int_eq(rm.tier[0][i], inventory[i]);
    /* a router that starts late learns everything by resync */
    ro.ud = &late;
    td_kvredis_t *router2 = td_kvredis_new(&loop, &ro);
    w = (want_t){&late, 0, 90, 90, router2, 1};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_int_ge(late.resets, 1);
    /* Redis dies and comes back empty: the worker republishes, routers resync */
    redis_stop();
    for (int i = 200; i < 205; i++)
        publish(i, 1); /* while Redis is down: carried by the inventory */
    /* down long enough for several reconnect attempts to fail */
    for (uint64_t end = td_now_ns() + 1500000000ull; td_now_ns() < end; usleep(1000))
        uv_run(&loop, UV_RUN_NOWAIT);
    redis_start();
    w = (want_t){&rm, 0, 95, 95, NULL, 0};
    ck_assert(run_until(have, &w, 15000));
    for (int i = 0; i < 256; i++)
        ck_assert_int_eq(rm.tier[0][i], inventory[i]);
    ck_assert_int_ge(wm.inventories, 2);
    ck_assert_int_ge(rm.downs, 1);
    td_kvredis_close(worker);
    td_kvredis_close(router);
    td_kvredis_close(router2);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

static bool gone(void *a)
{
    return redis_int("EXISTS %s", a) == 0;
}

static bool exists(void *a)
{
    return redis_int("EXISTS %s", a) == 1;
}

typedef struct {
    const mirror_t *m;
    int ups;
} ups_t;

static bool up_again(void *a)
{
    const ups_t *x = a;
    return x->m->ups > x->ups;
}

static bool resets_above(void *a)
{
    want_t *x = a;
    return x->m->resets > x->n && count(x->m, x->w) == 1;
}

/* A fresh redis-server, a router (subscriber, into rm) and `worker` d0 (publisher of epoch
 * `epoch` with a lease, its state into wm; its options in *wo for restarts); the router. */
static td_kvredis_t *start_pair(char addr[32], mirror_t *wm, mirror_t *rm, td_kvredis_opts_t *wo,
                                uint64_t epoch, uint64_t lease_ms)
{
    redis_setup(&loop, addr);
    memset(inventory, -1, sizeof(inventory));
    memset(wm, 0, sizeof(*wm));
    memset(rm, 0, sizeof(*rm));
    memset(rm->tier, -1, sizeof(rm->tier));
    *wo = (td_kvredis_opts_t){.addr = addr, .ns = "t", .worker_id = "d0", .epoch = epoch,
                              .lease_ms = lease_ms, .on_state = worker_state, .ud = wm};
    td_kvredis_opts_t ro = {.addr = addr, .ns = "t", .subscribe = true, .on_events = on_events,
                            .on_state = on_state, .ud = rm};
    td_kvredis_t *router = td_kvredis_new(&loop, &ro);
    worker = td_kvredis_new(&loop, wo);
    return router;
}

START_TEST(test_lease_epoch)
{
    char addr[32];
    mirror_t wm, rm;
    td_kvredis_opts_t wo;
    td_kvredis_t *router = start_pair(addr, &wm, &rm, &wo, 42, 400);
    ck_assert_uint_eq(td_kvredis_epoch(worker), 42);
    want_t w = {&rm, 0, 0, -1, router, 1};
    ck_assert(run_until(have, &w, 5000));
    publish(1, 0);
    publish(2, 0);
    w = (want_t){&rm, 0, 2, 2, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_uint_eq(rm.epoch, 42); /* events carry the publisher's epoch */
    long long ttl = redis_int("PTTL %s", "t:set:d0");
    ck_assert(ttl > 0 && ttl <= 400);
    /* renewed every 100 ms, the set outlives its lease */
    for (int i = 0; i < 8; i++) {
        uint64_t end = td_now_ns() + 100000000;
        while (td_now_ns() < end) {
            uv_run(&loop, UV_RUN_NOWAIT);
            usleep(1000);
        }
        td_kvredis_renew(worker);
    }
    ck_assert_int_eq(redis_int("EXISTS %s", "t:set:d0"), 1);
    /* the set lapses while the worker is idle (a renewal came too late): the next renewal finds
     * it gone and the worker writes it again, blocks and all */
    ck_assert_int_eq(redis_int("DEL %s", "t:set:d0"), 1);
    memset(inventory, -1, sizeof(inventory));
    inventory[1] = inventory[2] = 0;
    td_kvredis_renew(worker);
    ck_assert(run_until(exists, "t:set:d0", 2000));
    ck_assert_int_eq(redis_int("STRLEN %s", "t:set:d0"),
                     TD_KVREDIS_SET_HEADER + 2 * TD_KVREDIS_REC);
    /* Redis stops answering (SIGSTOP) with the connection open: the renewal goes unanswered,
     * and 3 s later the next renewal replaces the connection; once Redis answers again the
     * worker is connected anew and writes its set again */
    int downs = wm.downs, ups = wm.ups;
    kill(redis_pid, SIGSTOP);
    td_kvredis_renew(worker);
    uint64_t stop_end = td_now_ns() + 3500000000ull;
    while (td_now_ns() < stop_end && wm.downs == downs) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(20000);
        td_kvredis_renew(worker);
    }
    ck_assert_int_eq(wm.downs, downs + 1);
    kill(redis_pid, SIGCONT);
    ups_t u = {&wm, ups};
    ck_assert(run_until(up_again, &u, 8000));
    ck_assert(run_until(exists, "t:set:d0", 2000));
    /* the worker dies (no goodbye, no renewal): its set is gone within the lease */
    td_kvredis_close(worker);
    uint64_t t0 = td_now_ns();
    ck_assert(run_until(gone, "t:set:d0", 2000));
    ck_assert_uint_lt(td_now_ns() - t0, 900000000ull); /* 400 ms lease, generous slack */
    /* it restarts under the same id: a new epoch, and its inventory replaces the old set */
    memset(inventory, -1, sizeof(inventory));
    inventory[7] = 0;
    wo.epoch = 0; /* drawn at random */
    worker = td_kvredis_new(&loop, &wo);
    ck_assert_uint_ne(td_kvredis_epoch(worker), 42);
    w = (want_t){&rm, 0, 1, 1, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_int_eq(rm.tier[0][7], 0);
    ck_assert_int_eq(rm.tier[0][1], -1);
    ck_assert_uint_eq(rm.epoch, td_kvredis_epoch(worker));
    /* one worker's set read again: a RESET, then its blocks */
    w = (want_t){&rm, 0, rm.resets};
    ck_assert_int_eq(td_kvredis_resync_worker(router, "d0"), 0);
    ck_assert(run_until(resets_above, &w, 5000));
    ck_assert_int_eq(rm.tier[0][7], 0);
    ck_assert_uint_eq(rm.epoch, td_kvredis_epoch(worker));
    td_kvredis_close(worker);
    td_kvredis_close(router);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

/* The set's byte format: a header and whole records; anything else is refused by name. */
START_TEST(test_set_parse)
{
    uint8_t buf[TD_KVREDIS_SET_HEADER + 2 * TD_KVREDIS_REC] = {0};
    td_kvredis_set_header(buf, 0x0102030405060708ull);
    uint64_t epoch = 0;
    size_t n = 99;
    ck_assert_int_eq(td_kvredis_set_parse(buf, TD_KVREDIS_SET_HEADER, &epoch, &n), 0);
    ck_assert_uint_eq(epoch, 0x0102030405060708ull);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(td_kvredis_set_parse(buf, sizeof(buf), &epoch, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(buf[8], 0x08); /* little endian */
    ck_assert_int_eq(td_kvredis_set_parse(buf, sizeof(buf) - 1, &epoch, &n), TD_EPARSE);
    ck_assert(strstr(td_err_msg(), "multiple"));
    ck_assert_int_eq(td_kvredis_set_parse(buf, 15, &epoch, &n), TD_EPARSE);
    ck_assert(strstr(td_err_msg(), "shorter"));
    ck_assert_int_eq(td_kvredis_set_parse(buf, 0, &epoch, &n), TD_EPARSE);
    buf[3] ^= 1;
    ck_assert_int_eq(td_kvredis_set_parse(buf, sizeof(buf), &epoch, &n), TD_EPARSE);
    ck_assert(strstr(td_err_msg(), "magic"));
}
END_TEST

static long long redis_strlen(const char *key)
{
    return redis_int("STRLEN %s", key);
}

static bool strlen_below(void *a)
{
    return redis_strlen("t:set:d0") < *(long long *)a;
}

/* Fencing and upkeep of the set: a set deleted behind the worker's back (a missed lease) is
 * written again at the next flush; a second process of the same id (a new epoch) owns the set and
 * the old one's events are neither appended nor published; churn past twice the live set makes
 * the worker rewrite it compactly. */
START_TEST(test_set_upkeep)
{
    char addr[32];
    redis_setup(&loop, addr);
    memset(inventory, -1, sizeof(inventory));
    mirror_t wm = {0}, rm = {0};
    memset(rm.tier, -1, sizeof(rm.tier));
    td_kvredis_opts_t wo = {.addr = addr, .ns = "t", .worker_id = "d0", .epoch = 7,
                            .on_state = worker_state, .ud = &wm};
    td_kvredis_opts_t ro = {.addr = addr, .ns = "t", .subscribe = true, .on_events = on_events,
                            .on_state = on_state, .ud = &rm};
    td_kvredis_t *router = td_kvredis_new(&loop, &ro);
    worker = td_kvredis_new(&loop, &wo);
    want_t w = {&rm, 0, 0, 0, router, 1};
    ck_assert(run_until(have, &w, 5000));
    publish(1, 0);
    w = (want_t){&rm, 0, 1, 1, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    /* the set vanishes (as when its lease lapsed): the next flush finds it gone and the worker
     * writes its inventory again */
    ck_assert_int_eq(redis_int("DEL %s", "t:set:d0"), 1);
    int inv = wm.inventories;
    publish(2, 2);
    w = (want_t){&rm, 0, 2, 2, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_int_eq(wm.inventories, inv + 1);
    ck_assert_int_eq(rm.tier[0][2], 2);
    /* another process takes the id over with its own inventory (block 9 only) */
    td_kvredis_t *old = worker;
    memset(inventory, -1, sizeof(inventory));
    inventory[9] = 0;
    mirror_t wm2 = {0};
    wo.epoch = 8;
    wo.ud = &wm2;
    worker = td_kvredis_new(&loop, &wo);
    w = (want_t){&rm, 0, 1, 1, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_int_eq(rm.tier[0][9], 0);
    ck_assert_uint_eq(rm.epoch, 8);
    /* the old process keeps publishing: nothing reaches the set or the routers */
    td_kvredis_t *cur = worker;
    worker = old;
    publish(3, 0);
    worker = cur;
    memset(inventory, -1, sizeof(inventory)); /* the new process's inventory: block 9 only */
    inventory[9] = 0;
    for (uint64_t end = td_now_ns() + 300000000ull; td_now_ns() < end; usleep(1000))
        uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(rm.tier[0][3], -1);
    ck_assert_int_eq(set_blocks("t:set:d0"), 1);
    ck_assert_int_eq(wm.inventories, inv + 1); /* and it did not fight for the set */
    td_kvredis_close(old);
    /* churn: 3000 add/remove pairs of one block (6000 records over a live set of 1-2) pass
     * 2 x live + 4096, and the worker rewrites the set from its inventory (6000 records would be
     * 108 KB) */
    int inv2 = wm2.inventories;
    for (int i = 0; i < 3000; i++) {
        publish(10, 0);
        publish(10, -1);
        if (i % 100 == 99)
            for (uint64_t end = td_now_ns() + 2000000ull; td_now_ns() < end; usleep(200))
                uv_run(&loop, UV_RUN_NOWAIT);
    }
    /* bounded: the records since the last rewrite stay under 2 x live + 4096 (plus one batch) */
    long long small = TD_KVREDIS_SET_HEADER + (4096 + 2 * 2 + 400) * TD_KVREDIS_REC;
    ck_assert(run_until(strlen_below, &small, 5000));
    ck_assert_int_gt(wm2.inventories, inv2);
    w = (want_t){&rm, 0, 1, 1, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_int_eq(rm.tier[0][10], -1);
    td_kvredis_close(worker);
    td_kvredis_close(router);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

static bool none_of_d0(void *a)
{
    return count(a, 0) == 0;
}

static bool newest_holds_5(void *a)
{
    const mirror_t *m = a;
    return m->epoch == 9 && count(m, 0) == 1 && m->tier[0][5] == 0;
}

/* An orderly stop removes the worker's set, and routers forget its blocks at once, well inside
 * the lease; a process whose set another epoch has since replaced leaves that set alone. */
START_TEST(test_leave)
{
    char addr[32];
    mirror_t wm, rm;
    td_kvredis_opts_t wo;
    td_kvredis_t *router = start_pair(addr, &wm, &rm, &wo, 7, 60000);
    want_t w = {&rm, 0, 0, -1, router, 1};
    ck_assert(run_until(have, &w, 5000));
    publish(3, 0);
    publish(4, 2);
    w = (want_t){&rm, 0, 2, 2, NULL, 0};
    ck_assert(run_until(have, &w, 5000));
    ck_assert_int_eq(redis_int("SISMEMBER t:workers %s", "d0"), 1);
    uint64_t t0 = td_now_ns();
    td_kvredis_leave(worker);
    ck_assert(run_until(none_of_d0, &rm, 2000));
    ck_assert_uint_lt(td_now_ns() - t0, 1500000000ull); /* not the 60 s lease */
    ck_assert_int_eq(redis_int("EXISTS %s", "t:set:d0"), 0);
    ck_assert_int_eq(redis_int("SISMEMBER t:workers %s", "d0"), 0);
    /* two processes of one id: the newer one's set replaced the older's; the older leaving
     * removes nothing */
    memset(inventory, -1, sizeof(inventory));
    inventory[5] = 0;
    wo.epoch = 8;
    td_kvredis_t *old = td_kvredis_new(&loop, &wo);
    worker = old;
    ck_assert(run_until(exists, "t:set:d0", 5000));
    wo.epoch = 9;
    worker = td_kvredis_new(&loop, &wo);
    ck_assert(run_until(newest_holds_5, &rm, 5000));
    td_kvredis_leave(old);
    uint64_t end = td_now_ns() + 1500000000ull;
    while (td_now_ns() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(2000);
    }
    ck_assert_int_eq(redis_int("EXISTS %s", "t:set:d0"), 1);
    ck_assert_int_eq(count(&rm, 0), 1);
    td_kvredis_close(worker);
    td_kvredis_close(router);
    loop_finish(&loop);
    redis_stop();
}
END_TEST

START_TEST(test_bad_address)
{
    uv_loop_init(&loop);
    td_kvredis_opts_t o = {.addr = "nowhere", .ns = "t"};
    ck_assert_ptr_null(td_kvredis_new(&loop, &o));
    uv_loop_close(&loop);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kvredis");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_events_resync_restart);
    tcase_add_test(tc, test_lease_epoch);
    tcase_add_test(tc, test_set_parse);
    tcase_add_test(tc, test_set_upkeep);
    tcase_add_test(tc, test_leave);
    tcase_add_test(tc, test_bad_address);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
