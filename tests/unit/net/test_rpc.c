/* test_rpc.c: authenticated control-plane connections on a real libuv loop over loopback TCP and
 * unix sockets: handshake, frames both ways, wrong secret, garbage and oversize input, handshake
 * deadline, reconnect with backoff, server shutdown. */
#include "control.pb-c.h"
#include "td_error.h"
#include "td_rpc.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SECRET "correct horse battery staple"

typedef struct side {
    int ready, frames, closes;
    int last_status;
    char last_reason[256];
    char peer_id[128];
    uint64_t last_seq;
    int hbs;       /* heartbeats received */
    bool disorder; /* a heartbeat's seq was not the previous one's plus one */
    bool reply;   /* answer each heartbeat with an Error frame carrying the same seq */
    bool send_on_ready;
} side_t;

static void on_ready(td_rpc_conn_t *c, void *ud)
{
    side_t *s = ud;
    s->ready++;
    snprintf(s->peer_id, sizeof(s->peer_id), "%s", td_rpc_conn_peer_id(c));
    if (s->send_on_ready) {
        Tandem__Load load = TANDEM__LOAD__INIT;
        Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
        hb.seq = 41;
        hb.load = &load;
        Tandem__Frame f = TANDEM__FRAME__INIT;
        f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
        f.heartbeat = &hb;
        ck_assert_int_eq(td_rpc_send(c, &f), 0);
    }
}

static void on_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    side_t *s = ud;
    s->frames++;
    if (f->body_case == TANDEM__FRAME__BODY_HEARTBEAT) {
        if (s->hbs++ && f->heartbeat->seq != s->last_seq + 1)
            s->disorder = true;
        s->last_seq = f->heartbeat->seq;
        if (s->reply) {
            Tandem__Error e = TANDEM__ERROR__INIT;
            e.code = TD_EBUSY;
            e.message = "busy";
            e.request_id = f->heartbeat->seq + 1;
            Tandem__Frame out = TANDEM__FRAME__INIT;
            out.body_case = TANDEM__FRAME__BODY_ERROR;
            out.error = &e;
            ck_assert_int_eq(td_rpc_send(c, &out), 0);
        }
    } else if (f->body_case == TANDEM__FRAME__BODY_ERROR) {
        s->last_seq = f->error->request_id;
    }
}

static void on_close(td_rpc_conn_t *c, int status, void *ud)
{
    side_t *s = ud;
    s->closes++;
    s->last_status = status;
    snprintf(s->last_reason, sizeof(s->last_reason), "%s", td_rpc_conn_reason(c));
}

static td_rpc_opts_t opts_for(side_t *s, const char *secret, const char *id)
{
    td_rpc_opts_t o = {0};
    o.secret = (const uint8_t *)secret;
    o.secret_len = secret ? strlen(secret) : 0;
    o.id = id;
    o.cb.on_ready = on_ready;
    o.cb.on_frame = on_frame;
    o.cb.on_close = on_close;
    o.ud = s;
    o.handshake_ms = 2000;
    return o;
}

/* Run the loop until cond() holds or `ms` pass; returns whether it held. */
typedef bool (*cond_fn)(void *);
static bool run_until(uv_loop_t *loop, cond_fn cond, void *arg, uint64_t ms)
{
    uint64_t end = td_now_ns() + ms * 1000000ull;
    while (!cond(arg) && td_now_ns() < end)
        uv_run(loop, UV_RUN_NOWAIT), usleep(1000);
    return cond(arg);
}

static void drain(uv_loop_t *loop)
{
    for (int i = 0; i < 2000 && uv_run(loop, UV_RUN_NOWAIT); i++)
        usleep(500);
    ck_assert_int_eq(uv_loop_close(loop), 0); /* every handle closed: nothing leaked */
}

typedef struct pair {
    side_t *srv, *cli;
    int want_srv_ready, want_cli_ready, want_cli_seq, want_srv_closes, want_cli_closes;
} pair_t;

static bool pair_cond(void *a)
{
    pair_t *p = a;
    return p->srv->ready >= p->want_srv_ready && p->cli->ready >= p->want_cli_ready &&
           (int)p->cli->last_seq >= p->want_cli_seq && p->srv->closes >= p->want_srv_closes &&
           p->cli->closes >= p->want_cli_closes;
}

static void roundtrip(const char *listen_addr, bool tcp)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {.reply = true}, cli = {.send_on_ready = true};
    td_rpc_opts_t so = opts_for(&srv, SECRET, NULL), co = opts_for(&cli, SECRET, "decode-7");
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, listen_addr, &so, &s), 0);
    char addr[160];
    if (tcp)
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", td_rpc_server_port(s));
    else
        snprintf(addr, sizeof(addr), "%s", listen_addr);
    td_rpc_client_t *cl;
    ck_assert_int_eq(td_rpc_client_start(&loop, addr, &co, false, &cl), 0);
    pair_t p = {&srv, &cli, 1, 1, 42, 0, 0};
    ck_assert(run_until(&loop, pair_cond, &p, 5000));
    ck_assert_str_eq(srv.peer_id, "decode-7");
    ck_assert_uint_eq(srv.last_seq, 41);
    ck_assert_ptr_nonnull(td_rpc_client_conn(cl));
    /* client leaves: the server sees an orderly close */
    td_rpc_client_stop(cl);
    p.want_srv_closes = 1;
    p.want_cli_closes = 1;
    ck_assert(run_until(&loop, pair_cond, &p, 5000));
    ck_assert_int_eq(srv.last_status, 0);
    ck_assert_int_eq(cli.last_status, TD_ECLOSED);
    td_rpc_server_close(s);
    drain(&loop);
}

START_TEST(test_roundtrip_tcp)
{
    roundtrip("127.0.0.1:0", true);
}
END_TEST

START_TEST(test_roundtrip_unix)
{
    char path[64];
    snprintf(path, sizeof(path), "unix:/tmp/td_rpc_test_%d.sock", (int)getpid());
    roundtrip(path, false);
    unlink(path + 5);
}
END_TEST

START_TEST(test_wrong_secret)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {0}, cli = {0};
    td_rpc_opts_t so = opts_for(&srv, SECRET, NULL), co = opts_for(&cli, "guess", "intruder");
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", td_rpc_server_port(s));
    td_rpc_client_t *cl;
    ck_assert_int_eq(td_rpc_client_start(&loop, addr, &co, false, &cl), 0);
    pair_t p = {&srv, &cli, 0, 0, 0, 1, 1};
    ck_assert(run_until(&loop, pair_cond, &p, 5000));
    ck_assert_int_eq(srv.ready, 0);
    ck_assert_int_eq(cli.ready, 0);
    ck_assert_int_eq(srv.last_status, TD_EAUTH);
    ck_assert_int_eq(cli.last_status, TD_EAUTH);
    ck_assert_ptr_nonnull(strstr(cli.last_reason, "wrong cluster secret"));
    td_rpc_client_stop(cl);
    td_rpc_server_close(s);
    drain(&loop);
}
END_TEST

/* A rotation: a server holding a new and a previous secret authenticates clients of either (each
 * client checks the server's proof with its own secret); swapping the secrets leaves the
 * connections made and refuses newcomers with the dropped one. */
static void connect_one(uv_loop_t *loop, int port, const char *secret, side_t *cli,
                        td_rpc_client_t **cl)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    td_rpc_opts_t co = opts_for(cli, secret, "rot");
    ck_assert_int_eq(td_rpc_client_start(loop, addr, &co, false, cl), 0);
}

static bool ready_or_closed(void *a)
{
    side_t *s = a;
    return s->ready > 0 || s->closes > 0;
}

START_TEST(test_secret_rotation)
{
    static const char old_s[] = "the-old-cluster-secret", new_s[] = "the-new-cluster-secret";
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {0}, c_old = {0}, c_new = {0}, c_late = {0}, c_new2 = {0};
    td_rpc_opts_t so = opts_for(&srv, new_s, NULL);
    so.secret_prev = (const uint8_t *)old_s;
    so.secret_prev_len = strlen(old_s);
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), 0);
    int port = td_rpc_server_port(s);
    td_rpc_client_t *cl_old, *cl_new, *cl_late, *cl_new2;
    connect_one(&loop, port, old_s, &c_old, &cl_old);
    connect_one(&loop, port, new_s, &c_new, &cl_new);
    ck_assert(run_until(&loop, ready_or_closed, &c_old, 5000));
    ck_assert(run_until(&loop, ready_or_closed, &c_new, 5000));
    ck_assert_int_eq(c_old.ready, 1);
    ck_assert_int_eq(c_new.ready, 1);
    /* the rotation ends: only the new secret */
    ck_assert_int_eq(td_rpc_server_set_secrets(s, (const uint8_t *)new_s, strlen(new_s), NULL, 0),
                     0);
    connect_one(&loop, port, old_s, &c_late, &cl_late);
    connect_one(&loop, port, new_s, &c_new2, &cl_new2);
    ck_assert(run_until(&loop, ready_or_closed, &c_late, 5000));
    ck_assert(run_until(&loop, ready_or_closed, &c_new2, 5000));
    ck_assert_int_eq(c_late.ready, 0);
    ck_assert_int_eq(c_late.last_status, TD_EAUTH);
    ck_assert_int_eq(c_new2.ready, 1);
    /* the connections made before the swap are still up */
    ck_assert_int_eq(c_old.closes, 0);
    ck_assert_ptr_nonnull(td_rpc_client_conn(cl_old));
    ck_assert_int_eq(td_rpc_server_set_secrets(s, NULL, 0, NULL, 0), TD_EAUTH);
    td_rpc_client_stop(cl_old);
    td_rpc_client_stop(cl_new);
    td_rpc_client_stop(cl_late);
    td_rpc_client_stop(cl_new2);
    td_rpc_server_close(s);
    drain(&loop);
}
END_TEST

START_TEST(test_no_secret_refused)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {0};
    td_rpc_opts_t so = opts_for(&srv, NULL, NULL);
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), TD_EAUTH);
    ck_assert_ptr_null(s);
    td_rpc_client_t *cl;
    ck_assert_int_eq(td_rpc_client_start(&loop, "127.0.0.1:1", &so, false, &cl), TD_EAUTH);
    td_rpc_addr_t a;
    ck_assert_int_eq(td_rpc_addr_parse("nohostport", &a), TD_EINVAL);
    ck_assert_int_eq(td_rpc_addr_parse("127.0.0.1:99999", &a), TD_EINVAL);
    ck_assert_int_eq(td_rpc_addr_parse("[::1]:80", &a), 0);
    ck_assert_int_eq(td_rpc_addr_parse("unix:", &a), TD_EINVAL);
    drain(&loop);
}
END_TEST

/* A raw TCP peer that writes `bytes` right after connecting. */
typedef struct raw {
    uv_tcp_t tcp;
    uv_connect_t req;
    uv_write_t wreq;
    const char *bytes;
    size_t len;
} raw_t;

static void raw_connected(uv_connect_t *req, int status)
{
    raw_t *r = req->data;
    ck_assert_int_eq(status, 0);
    if (r->len) {
        uv_buf_t b = uv_buf_init((char *)r->bytes, (unsigned)r->len);
        uv_write(&r->wreq, (uv_stream_t *)&r->tcp, &b, 1, NULL);
    }
}

static void raw_connect(uv_loop_t *loop, raw_t *r, int port, const char *bytes, size_t len)
{
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", port, &sa);
    uv_tcp_init(loop, &r->tcp);
    r->req.data = r;
    r->bytes = bytes;
    r->len = len;
    ck_assert_int_eq(uv_tcp_connect(&r->req, &r->tcp, (struct sockaddr *)&sa, raw_connected), 0);
}

START_TEST(test_bad_peers_do_not_disturb_others)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {.reply = true}, cli = {.send_on_ready = true};
    td_rpc_opts_t so = opts_for(&srv, SECRET, NULL), co = opts_for(&cli, SECRET, "good");
    so.handshake_ms = 300;
    so.max_frame = 4096;
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), 0);
    int port = td_rpc_server_port(s);
    /* 1: announces a 1 GiB frame; 2: a well-framed payload that is not a Frame;
     * 3: silent (handshake deadline) */
    static const char huge[] = {0x40, 0, 0, 0};
    static const char junk[] = {0, 0, 0, 3, (char)0xff, (char)0xff, (char)0xff};
    raw_t r1, r2, r3;
    raw_connect(&loop, &r1, port, huge, sizeof(huge));
    raw_connect(&loop, &r2, port, junk, sizeof(junk));
    raw_connect(&loop, &r3, port, NULL, 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    td_rpc_client_t *cl;
    ck_assert_int_eq(td_rpc_client_start(&loop, addr, &co, false, &cl), 0);
    pair_t p = {&srv, &cli, 1, 1, 42, 3, 0};
    ck_assert(run_until(&loop, pair_cond, &p, 5000));
    ck_assert_int_eq(srv.closes, 3);
    ck_assert_int_eq(srv.ready, 1);
    /* the good client is still served after the bad ones were dropped */
    ck_assert_ptr_nonnull(td_rpc_client_conn(cl));
    td_rpc_client_stop(cl);
    td_rpc_server_close(s);
    uv_close((uv_handle_t *)&r1.tcp, NULL);
    uv_close((uv_handle_t *)&r2.tcp, NULL);
    uv_close((uv_handle_t *)&r3.tcp, NULL);
    drain(&loop);
}
END_TEST

typedef struct statuses {
    side_t *srv;
    int seen_proto, seen_timeout;
} statuses_t;

static void count_close(td_rpc_conn_t *c, int status, void *ud)
{
    statuses_t *st = ud;
    st->srv->closes++;
    if (status == TD_EPROTO)
        st->seen_proto++;
    if (status == TD_ETIMEDOUT)
        st->seen_timeout++;
}

static bool statuses_cond(void *a)
{
    statuses_t *st = a;
    return st->seen_proto >= 2 && st->seen_timeout >= 1;
}

START_TEST(test_bad_peer_statuses)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {0};
    statuses_t st = {&srv, 0, 0};
    td_rpc_opts_t so = opts_for(&srv, SECRET, NULL);
    so.cb.on_close = count_close;
    so.ud = &st;
    so.handshake_ms = 300;
    so.max_frame = 4096;
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), 0);
    int port = td_rpc_server_port(s);
    static const char huge[] = {0x40, 0, 0, 0};
    static const char junk[] = {0, 0, 0, 3, (char)0xff, (char)0xff, (char)0xff};
    raw_t r1, r2, r3;
    raw_connect(&loop, &r1, port, huge, sizeof(huge));
    raw_connect(&loop, &r2, port, junk, sizeof(junk));
    raw_connect(&loop, &r3, port, NULL, 0);
    ck_assert(run_until(&loop, statuses_cond, &st, 5000));
    td_rpc_server_close(s);
    uv_close((uv_handle_t *)&r1.tcp, NULL);
    uv_close((uv_handle_t *)&r2.tcp, NULL);
    uv_close((uv_handle_t *)&r3.tcp, NULL);
    drain(&loop);
}
END_TEST

typedef struct recon {
    td_rpc_client_t *cl;
    side_t *cli;
} recon_t;

static bool attempts_cond(void *a)
{
    recon_t *r = a;
    return td_rpc_client_attempts(r->cl) >= 3;
}

static bool ready_cond(void *a)
{
    recon_t *r = a;
    return r->cli->ready >= 1;
}

START_TEST(test_reconnect_backoff)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {0}, cli = {0};
    td_rpc_opts_t so = opts_for(&srv, SECRET, NULL), co = opts_for(&cli, SECRET, "prefill-1");
    /* find a free port, then free it */
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), 0);
    int port = td_rpc_server_port(s);
    td_rpc_server_close(s);
    uv_run(&loop, UV_RUN_NOWAIT);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    td_rpc_client_t *cl;
    ck_assert_int_eq(td_rpc_client_start(&loop, addr, &co, true, &cl), 0);
    recon_t r = {cl, &cli};
    /* refused attempts keep coming, each reported */
    ck_assert(run_until(&loop, attempts_cond, &r, 5000));
    ck_assert_int_ge(cli.closes, 2);
    ck_assert_int_eq(cli.last_status, TD_ECONNREFUSED);
    ck_assert_int_eq(cli.ready, 0);
    /* the router comes up: the client connects on its own */
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    ck_assert_int_eq(td_rpc_server_start(&loop, addr, &so, &s), 0);
    ck_assert(run_until(&loop, ready_cond, &r, 8000));
    ck_assert_int_eq(srv.ready, 1);
    /* the router restarts: the client comes back again */
    td_rpc_server_close(s);
    uv_run(&loop, UV_RUN_NOWAIT);
    cli.ready = 0;
    ck_assert_int_eq(td_rpc_server_start(&loop, addr, &so, &s), 0);
    ck_assert(run_until(&loop, ready_cond, &r, 8000));
    /* a router down for a while (the backoff has grown to its cap) is found again within about
     * a second of listening: the cap is 1 s, not the 5 s that left workers away after a router
     * restart */
    td_rpc_server_close(s);
    uv_run(&loop, UV_RUN_NOWAIT);
    cli.ready = 0;
    uint64_t end = td_now_ns() + 3000000000ull;
    while (td_now_ns() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    ck_assert_int_eq(cli.ready, 0);
    ck_assert_int_eq(td_rpc_server_start(&loop, addr, &so, &s), 0);
    uint64_t t0 = td_now_ns();
    ck_assert(run_until(&loop, ready_cond, &r, 8000));
    double dt = (double)(td_now_ns() - t0) / 1e9;
    ck_assert_msg(dt < 1.5, "reconnected %.2f s after the router listened again", dt);
    td_rpc_client_stop(cl);
    td_rpc_server_close(s);
    drain(&loop);
}
END_TEST

static void send_heartbeats(td_rpc_conn_t *c, uint64_t from, uint64_t to)
{
    Tandem__Load load = TANDEM__LOAD__INIT;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.load = &load;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    for (hb.seq = from; hb.seq <= to; hb.seq++)
        ck_assert_int_eq(td_rpc_send(c, &f), 0);
}

typedef struct count_wait {
    side_t *s;
    int hbs, closes;
} count_wait_t;

static bool count_cond(void *a)
{
    count_wait_t *w = a;
    return w->s->hbs >= w->hbs && w->s->closes >= w->closes;
}

/* Frames sent in one loop iteration are gathered and written together: a burst of 40,000 (past
 * the 256 KiB at which a burst is written without waiting) arrives whole and in order; bytes sent
 * and not yet written count in the write queue; frames sent right before a close are written
 * before it. */
START_TEST(test_send_burst_order_and_close)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    side_t srv = {0}, cli = {0};
    td_rpc_opts_t so = opts_for(&srv, SECRET, NULL), co = opts_for(&cli, SECRET, "decode-9");
    td_rpc_server_t *s;
    ck_assert_int_eq(td_rpc_server_start(&loop, "127.0.0.1:0", &so, &s), 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", td_rpc_server_port(s));
    td_rpc_client_t *cl;
    ck_assert_int_eq(td_rpc_client_start(&loop, addr, &co, false, &cl), 0);
    pair_t p = {&srv, &cli, 1, 1, 0, 0, 0};
    ck_assert(run_until(&loop, pair_cond, &p, 5000));
    td_rpc_conn_t *c = td_rpc_client_conn(cl);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(td_rpc_conn_write_queue(c), 0);
    send_heartbeats(c, 1, 3);
    ck_assert_uint_gt(td_rpc_conn_write_queue(c), 0); /* gathered, not yet written */
    count_wait_t w = {&srv, 3, 0};
    ck_assert(run_until(&loop, count_cond, &w, 5000));
    ck_assert_uint_eq(td_rpc_conn_write_queue(c), 0);
    send_heartbeats(c, 4, 40000);
    w.hbs = 40000;
    ck_assert(run_until(&loop, count_cond, &w, 10000));
    ck_assert(!srv.disorder);
    ck_assert_uint_eq(srv.last_seq, 40000);
    /* sent, then the client leaves in the same iteration: the frames still arrive */
    send_heartbeats(c, 40001, 40010);
    td_rpc_client_stop(cl);
    w.hbs = 40010;
    w.closes = 1;
    ck_assert(run_until(&loop, count_cond, &w, 5000));
    ck_assert_int_eq(srv.hbs, 40010);
    ck_assert(!srv.disorder);
    td_rpc_server_close(s);
    drain(&loop);
}
END_TEST

/* The cluster secret: option text first, then the file, then systemd's credential; whitespace
 * trimmed; short or missing secrets refused with a message naming where it looked. */
START_TEST(test_secret_load)
{
    char dir[] = "/tmp/td-secret-XXXXXX", path[256], cred[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/secret", dir);
    FILE *f = fopen(path, "w");
    fputs("  0123456789abcdef0123\n", f);
    fclose(f);
    uint8_t *s;
    size_t n;
    unsetenv("CREDENTIALS_DIRECTORY");
    ck_assert_int_eq(td_rpc_secret_load(NULL, path, &s, &n), 0);
    ck_assert_uint_eq(n, 20);
    ck_assert(memcmp(s, "0123456789abcdef0123", 20) == 0);
    free(s);
    ck_assert_int_eq(td_rpc_secret_load("from-the-option-text", path, &s, &n), 0);
    ck_assert(n == 20 && memcmp(s, "from-the-option-text", 20) == 0);
    free(s);
    ck_assert_int_eq(td_rpc_secret_load("short", NULL, &s, &n), TD_EAUTH);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "at least 16"));
    ck_assert_int_eq(td_rpc_secret_load(NULL, NULL, &s, &n), TD_EAUTH);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "cluster.secret_file"));
    snprintf(cred, sizeof(cred), "%s/missing", dir);
    ck_assert_int_eq(td_rpc_secret_load(NULL, cred, &s, &n), TD_ENOENT);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), cred));
    /* systemd LoadCredential=cluster-secret */
    snprintf(cred, sizeof(cred), "%s/cluster-secret", dir);
    ck_assert_int_eq(rename(path, cred), 0);
    setenv("CREDENTIALS_DIRECTORY", dir, 1);
    ck_assert_int_eq(td_rpc_secret_load(NULL, NULL, &s, &n), 0);
    ck_assert_uint_eq(n, 20);
    free(s);
    unsetenv("CREDENTIALS_DIRECTORY");
    unlink(cred);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("rpc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_roundtrip_tcp);
    tcase_add_test(tc, test_roundtrip_unix);
    tcase_add_test(tc, test_wrong_secret);
    tcase_add_test(tc, test_secret_rotation);
    tcase_add_test(tc, test_no_secret_refused);
    tcase_add_test(tc, test_bad_peers_do_not_disturb_others);
    tcase_add_test(tc, test_bad_peer_statuses);
    tcase_add_test(tc, test_reconnect_backoff);
    tcase_add_test(tc, test_secret_load);
    tcase_add_test(tc, test_send_burst_order_and_close);
    suite_add_tcase(su, tc);
    return td_check_run(su);
}
