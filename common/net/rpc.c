/* rpc.c: authenticated, length-prefixed protobuf connections on libuv (see td_rpc.h). */
#include "td_rpc.h"
#include "td_error.h"
#include "td_frame.h"
#include "td_log.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROTOCOL_VERSION 1u
#define NONCE_LEN 32u
#define MAC_LEN 32u
#define READ_CHUNK (64u << 10)
#define FLUSH_AT (256u << 10)       /* bytes of sent frames that are written without waiting */
#define FLUSH_KEEP_CAP (1u << 20)  /* a larger send buffer is freed once written */
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 1000u /* a restarted router sees its workers back within about 1.25 s */

static const char client_label[] = "tandem-auth-v1 client";
static const char server_label[] = "tandem-auth-v1 server";

enum conn_state { ST_HANDSHAKE, ST_READY, ST_CLOSING };

/* Options shared by a server's or a client's connections; owns copies of the secrets and id. */
typedef struct rpc_cfg {
    td_rpc_opts_t opts;
    uint8_t *secret;
    uint8_t *secret_prev; /* server: also accepted during a rotation, or NULL */
    char *id;
} rpc_cfg_t;

struct td_rpc_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_timer_t timer;            /* handshake deadline */
    uv_shutdown_t shutdown_req;  /* flush-then-close */
    uv_connect_t connect_req;    /* client: connect in progress */
    const rpc_cfg_t *cfg;
    td_rpc_server_t *server;     /* owner when accepted */
    td_rpc_client_t *client;     /* owner when connected out */
    td_rpc_conn_t *prev, *next;  /* server's list */
    enum conn_state state;
    bool sent_response;          /* client: AuthResponse sent, waiting for AuthResult */
    int open_handles;            /* handles still to be closed before the conn is freed */
    int close_status;
    td_frame_reader_t reader;
    td_frame_arena_t arena;      /* the received frame being handled */
    uint8_t nonce[NONCE_LEN];        /* server's challenge */
    uint8_t client_nonce[NONCE_LEN]; /* client's nonce */
    char peer_id[128];
    char reason[256];
    size_t write_queue;          /* bytes handed to uv_write and not yet completed */
    td_buf_t out;                /* frames sent in this loop iteration, not yet written */
    uv_idle_t flush;             /* active while `out` holds bytes: writes them next iteration */
    char *rbuf;                  /* READ_CHUNK bytes for libuv reads */
    void *data;
};

struct td_rpc_server {
    uv_loop_t *loop;
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } listen;
    bool is_unix;
    bool closing;
    bool listen_closed;
    rpc_cfg_t cfg;
    td_rpc_conn_t *conns;
};

struct td_rpc_client {
    uv_loop_t *loop;
    td_rpc_addr_t addr;
    rpc_cfg_t cfg;
    bool reconnect;
    bool stopping;
    bool timer_closed;
    uv_timer_t backoff;
    uint64_t backoff_ms;
    uint64_t attempts;
    td_rpc_conn_t *conn;
};

/* What the kernel did not take at once: the bytes stay with their uv_write until it completes. */
typedef struct write_req {
    uv_write_t req;
    td_rpc_conn_t *conn;
    size_t len;
    char data[];
} write_req_t;

/* ---- configuration ---------------------------------------------------------------------- */

static int cfg_init(rpc_cfg_t *cfg, const td_rpc_opts_t *opts)
{
    memset(cfg, 0, sizeof(*cfg));
    if (!opts->secret || opts->secret_len == 0)
        return td_err_set(TD_EAUTH, "no cluster secret configured: connections are refused");
    cfg->opts = *opts;
    cfg->secret = malloc(opts->secret_len);
    cfg->id = td_strdup(opts->id ? opts->id : "");
    if (!cfg->secret || !cfg->id) {
        free(cfg->secret);
        free(cfg->id);
        return TD_ENOMEM;
    }
    memcpy(cfg->secret, opts->secret, opts->secret_len);
    cfg->opts.secret = cfg->secret;
    cfg->opts.id = cfg->id;
    cfg->opts.secret_prev = NULL;
    cfg->opts.secret_prev_len = 0;
    if (opts->secret_prev && opts->secret_prev_len) {
        if (!(cfg->secret_prev = malloc(opts->secret_prev_len))) {
            free(cfg->secret);
            free(cfg->id);
            return TD_ENOMEM;
        }
        memcpy(cfg->secret_prev, opts->secret_prev, opts->secret_prev_len);
        cfg->opts.secret_prev = cfg->secret_prev;
        cfg->opts.secret_prev_len = opts->secret_prev_len;
    }
    if (!cfg->opts.handshake_ms)
        cfg->opts.handshake_ms = 5000;
    if (!cfg->opts.max_frame)
        cfg->opts.max_frame = TD_FRAME_DEFAULT_MAX;
    return 0;
}

static void secrets_free(rpc_cfg_t *cfg)
{
    if (cfg->secret)
        memset(cfg->secret, 0, cfg->opts.secret_len);
    free(cfg->secret);
    if (cfg->secret_prev)
        memset(cfg->secret_prev, 0, cfg->opts.secret_prev_len);
    free(cfg->secret_prev);
    cfg->secret = cfg->secret_prev = NULL;
}

static void cfg_free(rpc_cfg_t *cfg)
{
    secrets_free(cfg);
    free(cfg->id);
}

/* ---- connections ------------------------------------------------------------------------ */

static void conn_fail(td_rpc_conn_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void client_conn_gone(td_rpc_client_t *cl);
static void server_conn_gone(td_rpc_server_t *s);

static void on_conn_handle_closed(uv_handle_t *h)
{
    td_rpc_conn_t *c = h->data;
    if (--c->open_handles > 0)
        return;
    const td_rpc_callbacks_t *cb = &c->cfg->opts.cb;
    if (cb->on_close)
        cb->on_close(c, c->close_status, c->cfg->opts.ud);
    td_rpc_server_t *s = c->server;
    td_rpc_client_t *cl = c->client;
    if (s) {
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
    }
    td_frame_reader_free(&c->reader);
    td_frame_arena_free(&c->arena);
    td_buf_free(&c->out);
    free(c->rbuf);
    free(c);
    if (s)
        server_conn_gone(s);
    if (cl)
        client_conn_gone(cl);
}

static void conn_close_handles(td_rpc_conn_t *c)
{
    c->open_handles = 3;
    uv_close(&c->h.handle, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->flush, on_conn_handle_closed);
}

static void conn_flush(td_rpc_conn_t *c);

static void set_reason(td_rpc_conn_t *c, int status, const char *reason)
{
    c->close_status = status;
    snprintf(c->reason, sizeof(c->reason), "%s", reason ? reason : td_strerror(status));
}

void td_rpc_conn_close(td_rpc_conn_t *c, int status, const char *reason)
{
    if (c->state == ST_CLOSING)
        return;
    conn_flush(c); /* what was sent before the close goes out, as far as the kernel takes it */
    if (c->state == ST_CLOSING) /* the flush failed and closed it */
        return;
    c->state = ST_CLOSING;
    set_reason(c, status, reason);
    uv_read_stop(&c->h.stream);
    uv_timer_stop(&c->timer);
    conn_close_handles(c);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    td_rpc_conn_t *c = req->data;
    conn_close_handles(c);
}

/* Close after whatever is queued has been written (so a refusal reaches the peer). */
static void conn_close_flush(td_rpc_conn_t *c, int status, const char *reason)
{
    if (c->state == ST_CLOSING)
        return;
    conn_flush(c); /* queued before the shutdown, so written before it */
    if (c->state == ST_CLOSING) /* the flush failed and closed it */
        return;
    c->state = ST_CLOSING;
    set_reason(c, status, reason);
    uv_read_stop(&c->h.stream);
    uv_timer_stop(&c->timer);
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, &c->h.stream, on_shutdown) != 0)
        conn_close_handles(c);
}

static void conn_fail(td_rpc_conn_t *c, int status, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    td_logf(TD_LOG_WARN, NULL, "control connection%s%s closed: %s", *c->peer_id ? " from " : "",
            c->peer_id, msg);
    td_rpc_conn_close(c, status, msg);
}

static void on_write(uv_write_t *req, int status)
{
    write_req_t *w = (write_req_t *)req;
    td_rpc_conn_t *c = w->conn;
    c->write_queue -= w->len;
    free(w);
    if (status < 0 && status != UV_ECANCELED)
        conn_fail(c, TD_ECONNRESET, "write failed: %s", uv_strerror(status));
}

/* Write what the loop iteration's sends gathered in `out`: as much as the kernel takes at once
 * (no allocation), the rest through one uv_write that owns a copy. Frames reach the kernel in the
 * order they were sent: uv_try_write refuses while an earlier uv_write is still queued. */
static void conn_flush(td_rpc_conn_t *c)
{
    uv_idle_stop(&c->flush);
    if (!c->out.len || c->state == ST_CLOSING)
        return;
    size_t done = 0;
    int n = uv_try_write(&c->h.stream, &(uv_buf_t){.base = c->out.data, .len = c->out.len}, 1);
    if (n > 0)
        done = (size_t)n;
    else if (n < 0 && n != UV_EAGAIN) {
        td_buf_reset(&c->out);
        conn_fail(c, TD_ECONNRESET, "write failed: %s", uv_strerror(n));
        return;
    }
    if (done < c->out.len) {
        size_t rest = c->out.len - done;
        write_req_t *w = malloc(sizeof(*w) + rest);
        if (!w) {
            td_buf_reset(&c->out);
            conn_fail(c, TD_ENOMEM, "out of memory for a write of %zu bytes", rest);
            return;
        }
        memcpy(w->data, c->out.data + done, rest);
        w->conn = c;
        w->len = rest;
        uv_buf_t buf = uv_buf_init(w->data, (unsigned)rest);
        int rc = uv_write(&w->req, &c->h.stream, &buf, 1, on_write);
        if (rc < 0) {
            free(w);
            td_buf_reset(&c->out);
            conn_fail(c, TD_ECONNRESET, "write failed: %s", uv_strerror(rc));
            return;
        }
        c->write_queue += rest;
    }
    td_buf_reset(&c->out);
    if (c->out.cap > FLUSH_KEEP_CAP) /* keep a burst's buffer from staying */
        td_buf_free(&c->out);
}

static void on_flush(uv_idle_t *h)
{
    conn_flush(h->data);
}

/* Pack the frame at the end of `out`. Every frame sent in one loop iteration leaves in one write
 * at the start of the next (an idle handle, so the loop does not block in between), or at once
 * when `out` passes FLUSH_AT bytes. */
static int conn_send(td_rpc_conn_t *c, const Tandem__Frame *f)
{
    if (c->state == ST_CLOSING)
        return TD_ECLOSED;
    int rc = td_frame_encode_max(&f->base, &c->out, c->cfg->opts.max_frame);
    if (rc)
        return rc;
    if (c->out.len >= FLUSH_AT)
        conn_flush(c);
    else if (!uv_is_active((uv_handle_t *)&c->flush))
        uv_idle_start(&c->flush, on_flush);
    return 0;
}

void td_rpc_conn_flush(td_rpc_conn_t *c)
{
    conn_flush(c);
}

int td_rpc_send(td_rpc_conn_t *c, const Tandem__Frame *f)
{
    if (c->state == ST_HANDSHAKE)
        return TD_EAGAIN;
    return conn_send(c, f);
}

static void compute_mac(const uint8_t *key, size_t key_len, bool server_side,
                        const uint8_t *nonce, const uint8_t *client_nonce, const char *id,
                        uint8_t out[MAC_LEN])
{
    const void *parts[4];
    size_t lens[4], n = 0;
    if (server_side) {
        parts[n] = server_label, lens[n++] = sizeof(server_label) - 1;
        parts[n] = client_nonce, lens[n++] = NONCE_LEN;
        parts[n] = nonce, lens[n++] = NONCE_LEN;
    } else {
        parts[n] = client_label, lens[n++] = sizeof(client_label) - 1;
        parts[n] = nonce, lens[n++] = NONCE_LEN;
        parts[n] = client_nonce, lens[n++] = NONCE_LEN;
        parts[n] = id, lens[n++] = strlen(id);
    }
    if (td_auth_mac(key, key_len, parts, lens, n, out) != 0)
        memset(out, 0, MAC_LEN); /* never matches a real MAC */
}

/* Server side: the client's answer to our challenge. */
static void server_handshake(td_rpc_conn_t *c, const Tandem__Frame *f)
{
    if (f->body_case != TANDEM__FRAME__BODY_AUTH_RESPONSE) {
        conn_fail(c, TD_EPROTO, "expected AuthResponse, got frame type %d", (int)f->body_case);
        return;
    }
    const Tandem__AuthResponse *r = f->auth_response;
    Tandem__AuthResult res = TANDEM__AUTH_RESULT__INIT;
    Tandem__Frame out = TANDEM__FRAME__INIT;
    out.body_case = TANDEM__FRAME__BODY_AUTH_RESULT;
    out.auth_result = &res;
    uint8_t mac[MAC_LEN];
    const rpc_cfg_t *cfg = c->cfg;
    bool ok = r->client_nonce.len == NONCE_LEN && r->mac.len == MAC_LEN && r->worker_id &&
              strlen(r->worker_id) < sizeof(c->peer_id);
    /* the current secret, else (during a rotation) the previous one; the proof we send back is
     * made with the secret the client used */
    const uint8_t *key = cfg->secret;
    size_t key_len = cfg->opts.secret_len;
    if (ok) {
        memcpy(c->client_nonce, r->client_nonce.data, NONCE_LEN);
        compute_mac(key, key_len, false, c->nonce, c->client_nonce, r->worker_id, mac);
        ok = td_auth_equal(mac, r->mac.data, MAC_LEN);
        if (!ok && cfg->secret_prev) {
            key = cfg->secret_prev;
            key_len = cfg->opts.secret_prev_len;
            compute_mac(key, key_len, false, c->nonce, c->client_nonce, r->worker_id, mac);
            ok = td_auth_equal(mac, r->mac.data, MAC_LEN);
            if (ok)
                td_logf(TD_LOG_INFO, NULL, "control connection from %s uses the previous "
                                          "cluster secret", r->worker_id);
        }
    }
    if (!ok) {
        res.ok = false;
        res.message = "authentication failed: wrong cluster secret";
        conn_send(c, &out);
        td_logf(TD_LOG_WARN, NULL, "control connection refused: authentication failed%s%s",
                r->worker_id ? " for id " : "", r->worker_id ? r->worker_id : "");
        conn_close_flush(c, TD_EAUTH, "authentication failed: wrong cluster secret");
        return;
    }
    snprintf(c->peer_id, sizeof(c->peer_id), "%s", r->worker_id);
    compute_mac(key, key_len, true, c->nonce, c->client_nonce, NULL, mac);
    res.ok = true;
    res.message = "";
    res.mac.data = mac;
    res.mac.len = MAC_LEN;
    if (conn_send(c, &out) != 0)
        return;
    c->state = ST_READY;
    uv_timer_stop(&c->timer);
    if (c->cfg->opts.cb.on_ready)
        c->cfg->opts.cb.on_ready(c, c->cfg->opts.ud);
}

/* Client side: the server's challenge, then its verdict. */
static void client_handshake(td_rpc_conn_t *c, const Tandem__Frame *f)
{
    if (!c->sent_response) {
        if (f->body_case != TANDEM__FRAME__BODY_AUTH_CHALLENGE ||
            f->auth_challenge->nonce.len != NONCE_LEN) {
            conn_fail(c, TD_EPROTO, "expected AuthChallenge, got frame type %d",
                      (int)f->body_case);
            return;
        }
        if (f->auth_challenge->protocol_version != PROTOCOL_VERSION) {
            conn_fail(c, TD_EPROTO, "peer speaks protocol version %u, we speak %u",
                      f->auth_challenge->protocol_version, PROTOCOL_VERSION);
            return;
        }
        memcpy(c->nonce, f->auth_challenge->nonce.data, NONCE_LEN);
        if (td_random_bytes(c->client_nonce, NONCE_LEN) != 0) {
            conn_fail(c, TD_EINTERNAL, "no random bytes");
            return;
        }
        uint8_t mac[MAC_LEN];
        compute_mac(c->cfg->secret, c->cfg->opts.secret_len, false, c->nonce, c->client_nonce,
                    c->cfg->id, mac);
        Tandem__AuthResponse r = TANDEM__AUTH_RESPONSE__INIT;
        r.client_nonce.data = c->client_nonce;
        r.client_nonce.len = NONCE_LEN;
        r.worker_id = c->cfg->id;
        r.mac.data = mac;
        r.mac.len = MAC_LEN;
        Tandem__Frame out = TANDEM__FRAME__INIT;
        out.body_case = TANDEM__FRAME__BODY_AUTH_RESPONSE;
        out.auth_response = &r;
        if (conn_send(c, &out) == 0)
            c->sent_response = true;
        return;
    }
    if (f->body_case != TANDEM__FRAME__BODY_AUTH_RESULT) {
        conn_fail(c, TD_EPROTO, "expected AuthResult, got frame type %d", (int)f->body_case);
        return;
    }
    const Tandem__AuthResult *res = f->auth_result;
    if (!res->ok) {
        conn_fail(c, TD_EAUTH, "refused by server: %s",
                  res->message && *res->message ? res->message : "authentication failed");
        return;
    }
    uint8_t mac[MAC_LEN];
    compute_mac(c->cfg->secret, c->cfg->opts.secret_len, true, c->nonce, c->client_nonce, NULL,
                mac);
    if (res->mac.len != MAC_LEN || !td_auth_equal(mac, res->mac.data, MAC_LEN)) {
        conn_fail(c, TD_EAUTH, "server could not prove it knows the cluster secret");
        return;
    }
    c->state = ST_READY;
    uv_timer_stop(&c->timer);
    if (c->client)
        c->client->backoff_ms = BACKOFF_MIN_MS;
    if (c->cfg->opts.cb.on_ready)
        c->cfg->opts.cb.on_ready(c, c->cfg->opts.ud);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    td_rpc_conn_t *c = h->data;
    *buf = uv_buf_init(c->rbuf, READ_CHUNK);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    td_rpc_conn_t *c = st->data;
    if (nread == 0 || c->state == ST_CLOSING)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && c->state == ST_READY)
            td_rpc_conn_close(c, 0, "closed by peer");
        else if (nread == UV_EOF)
            conn_fail(c, TD_ECONNRESET, "peer closed the connection during the handshake");
        else
            conn_fail(c, TD_ECONNRESET, "read failed: %s", uv_strerror((int)nread));
        return;
    }
    int rc = td_frame_reader_feed(&c->reader, buf->base, (size_t)nread);
    if (rc) {
        conn_fail(c, rc == TD_EPROTO ? TD_EPROTO : rc, "%s", td_err_msg());
        return;
    }
    const uint8_t *p;
    size_t len;
    while (c->state != ST_CLOSING && (rc = td_frame_reader_next(&c->reader, &p, &len)) == 1) {
        Tandem__Frame *f = tandem__frame__unpack(td_frame_arena_allocator(&c->arena), len, p);
        if (!f) {
            td_frame_arena_reset(&c->arena);
            conn_fail(c, TD_EPROTO, "malformed frame (%zu bytes)", len);
            return;
        }
        if (c->state == ST_READY) {
            if (c->cfg->opts.cb.on_frame)
                c->cfg->opts.cb.on_frame(c, f, c->cfg->opts.ud);
        } else if (c->server) {
            server_handshake(c, f);
        } else {
            client_handshake(c, f);
        }
        td_frame_arena_reset(&c->arena); /* the callbacks copy what they keep */
    }
    if (rc < 0)
        conn_fail(c, rc, "%s", td_err_msg());
}

static void on_handshake_timeout(uv_timer_t *t)
{
    td_rpc_conn_t *c = t->data;
    conn_fail(c, TD_ETIMEDOUT, "handshake not finished within %llu ms",
              (unsigned long long)c->cfg->opts.handshake_ms);
}

static td_rpc_conn_t *conn_new(uv_loop_t *loop, const rpc_cfg_t *cfg, bool is_unix)
{
    td_rpc_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->rbuf = malloc(READ_CHUNK);
    if (!c->rbuf) {
        free(c);
        return NULL;
    }
    c->cfg = cfg;
    c->state = ST_HANDSHAKE;
    td_frame_reader_init(&c->reader, cfg->opts.max_frame);
    td_frame_arena_init(&c->arena);
    if (is_unix)
        uv_pipe_init(loop, &c->h.pipe, 0);
    else
        uv_tcp_init(loop, &c->h.tcp);
    uv_timer_init(loop, &c->timer);
    uv_idle_init(loop, &c->flush);
    td_buf_init(&c->out);
    c->h.handle.data = c;
    c->timer.data = c;
    c->flush.data = c;
    return c;
}

static int conn_begin(td_rpc_conn_t *c, bool is_unix)
{
    if (!is_unix)
        uv_tcp_nodelay(&c->h.tcp, 1);
    uv_timer_start(&c->timer, on_handshake_timeout, c->cfg->opts.handshake_ms, 0);
    int rc = uv_read_start(&c->h.stream, on_alloc, on_read);
    if (rc < 0) {
        conn_fail(c, TD_ECONNRESET, "read start failed: %s", uv_strerror(rc));
        return TD_ECONNRESET;
    }
    return 0;
}

/* ---- server ----------------------------------------------------------------------------- */

static void server_maybe_free(td_rpc_server_t *s)
{
    if (s->closing && s->listen_closed && !s->conns) {
        cfg_free(&s->cfg);
        free(s);
    }
}

static void server_conn_gone(td_rpc_server_t *s)
{
    server_maybe_free(s);
}

static void on_listen_closed(uv_handle_t *h)
{
    td_rpc_server_t *s = h->data;
    s->listen_closed = true;
    server_maybe_free(s);
}

static void on_connection(uv_stream_t *ls, int status)
{
    td_rpc_server_t *s = ls->data;
    if (status < 0 || s->closing) {
        td_logf(TD_LOG_WARN, NULL, "accept failed: %s", uv_strerror(status));
        return;
    }
    td_rpc_conn_t *c = conn_new(s->loop, &s->cfg, s->is_unix);
    if (!c)
        return;
    c->server = s;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    if (uv_accept(ls, &c->h.stream) != 0) {
        td_rpc_conn_close(c, TD_ECONNRESET, "accept failed");
        return;
    }
    if (conn_begin(c, s->is_unix) != 0)
        return;
    if (td_random_bytes(c->nonce, NONCE_LEN) != 0) {
        conn_fail(c, TD_EINTERNAL, "no random bytes");
        return;
    }
    Tandem__AuthChallenge ch = TANDEM__AUTH_CHALLENGE__INIT;
    ch.nonce.data = c->nonce;
    ch.nonce.len = NONCE_LEN;
    ch.protocol_version = PROTOCOL_VERSION;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_AUTH_CHALLENGE;
    f.auth_challenge = &ch;
    conn_send(c, &f);
}

int td_rpc_server_start(uv_loop_t *loop, const char *addr, const td_rpc_opts_t *opts,
                        td_rpc_server_t **out)
{
    *out = NULL;
    td_rpc_addr_t a;
    int rc = td_rpc_addr_parse(addr, &a);
    if (rc)
        return rc;
    td_rpc_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return TD_ENOMEM;
    if ((rc = cfg_init(&s->cfg, opts))) {
        free(s);
        return rc;
    }
    s->loop = loop;
    s->is_unix = a.is_unix;
    if (a.is_unix) {
        uv_pipe_init(loop, &s->listen.pipe, 0);
        struct stat st;
        if (lstat(a.path, &st) == 0 && S_ISSOCK(st.st_mode))
            unlink(a.path); /* a stale socket from an earlier run */
        rc = uv_pipe_bind(&s->listen.pipe, a.path);
    } else {
        uv_tcp_init(loop, &s->listen.tcp);
        rc = uv_tcp_bind(&s->listen.tcp, (const struct sockaddr *)&a.sa, 0);
    }
    s->listen.handle.data = s;
    if (rc == 0)
        rc = uv_listen(&s->listen.stream, 128, on_connection);
    if (rc < 0) {
        int err = td_err_set(rc == UV_EADDRINUSE ? TD_EBUSY : TD_EIO, "listen on %s: %s", addr,
                             uv_strerror(rc));
        s->closing = true;
        uv_close(&s->listen.handle, on_listen_closed);
        return err;
    }
    *out = s;
    return 0;
}

int td_rpc_server_port(const td_rpc_server_t *s)
{
    if (s->is_unix)
        return 0;
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getsockname(&s->listen.tcp, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

void td_rpc_server_close(td_rpc_server_t *s)
{
    if (!s || s->closing)
        return;
    s->closing = true;
    uv_close(&s->listen.handle, on_listen_closed);
    for (td_rpc_conn_t *c = s->conns; c; c = c->next)
        td_rpc_conn_close(c, TD_ECLOSED, "server shutting down");
}

/* ---- client ----------------------------------------------------------------------------- */

static void client_connect(td_rpc_client_t *cl);

static void client_maybe_free(td_rpc_client_t *cl)
{
    if (cl->stopping && cl->timer_closed && !cl->conn) {
        cfg_free(&cl->cfg);
        free(cl);
    }
}

static void on_backoff(uv_timer_t *t)
{
    client_connect(t->data);
}

static void client_conn_gone(td_rpc_client_t *cl)
{
    cl->conn = NULL;
    if (cl->stopping) {
        client_maybe_free(cl);
        return;
    }
    if (!cl->reconnect)
        return;
    /* exponential backoff with up to 25% jitter, so a restarted router is not stampeded */
    uint64_t delay = cl->backoff_ms;
    uint8_t r = 0;
    td_random_bytes(&r, 1);
    delay += delay * r / 1024;
    cl->backoff_ms = TD_MIN(cl->backoff_ms * 2, (uint64_t)BACKOFF_MAX_MS);
    uv_timer_start(&cl->backoff, on_backoff, delay, 0);
}

static void on_connect(uv_connect_t *req, int status)
{
    td_rpc_conn_t *c = req->data;
    if (c->state == ST_CLOSING)
        return;
    if (status < 0) {
        td_rpc_conn_close(c, status == UV_ECONNREFUSED ? TD_ECONNREFUSED : TD_EUNREACH,
                          uv_strerror(status));
        return;
    }
    conn_begin(c, c->client->addr.is_unix);
}

static void client_connect(td_rpc_client_t *cl)
{
    if (cl->stopping || cl->conn)
        return;
    td_rpc_conn_t *c = conn_new(cl->loop, &cl->cfg, cl->addr.is_unix);
    if (!c) {
        uv_timer_start(&cl->backoff, on_backoff, BACKOFF_MAX_MS, 0);
        return;
    }
    c->client = cl;
    cl->conn = c;
    cl->attempts++;
    c->connect_req.data = c;
    int rc;
    if (cl->addr.is_unix) {
        uv_pipe_connect(&c->connect_req, &c->h.pipe, cl->addr.path, on_connect);
        rc = 0;
    } else {
        rc = uv_tcp_connect(&c->connect_req, &c->h.tcp, (const struct sockaddr *)&cl->addr.sa,
                            on_connect);
    }
    if (rc < 0)
        td_rpc_conn_close(c, TD_EUNREACH, uv_strerror(rc));
}

static void on_backoff_closed(uv_handle_t *h)
{
    td_rpc_client_t *cl = h->data;
    cl->timer_closed = true;
    client_maybe_free(cl);
}

int td_rpc_client_start(uv_loop_t *loop, const char *addr, const td_rpc_opts_t *opts,
                        bool reconnect, td_rpc_client_t **out)
{
    *out = NULL;
    td_rpc_client_t *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return TD_ENOMEM;
    int rc = td_rpc_addr_parse(addr, &cl->addr);
    if (!rc)
        rc = cfg_init(&cl->cfg, opts);
    if (rc) {
        free(cl);
        return rc;
    }
    cl->loop = loop;
    cl->reconnect = reconnect;
    cl->backoff_ms = BACKOFF_MIN_MS;
    uv_timer_init(loop, &cl->backoff);
    cl->backoff.data = cl;
    client_connect(cl);
    *out = cl;
    return 0;
}

td_rpc_conn_t *td_rpc_client_conn(td_rpc_client_t *cl)
{
    return cl->conn && cl->conn->state == ST_READY ? cl->conn : NULL;
}

uint64_t td_rpc_client_attempts(const td_rpc_client_t *cl)
{
    return cl->attempts;
}

void td_rpc_client_stop(td_rpc_client_t *cl)
{
    if (!cl || cl->stopping)
        return;
    cl->stopping = true;
    uv_timer_stop(&cl->backoff);
    uv_close((uv_handle_t *)&cl->backoff, on_backoff_closed);
    if (cl->conn)
        td_rpc_conn_close(cl->conn, TD_ECLOSED, "client stopped");
}

/* ---- accessors -------------------------------------------------------------------------- */

const char *td_rpc_conn_peer_id(const td_rpc_conn_t *c)
{
    return c->peer_id;
}

const char *td_rpc_conn_reason(const td_rpc_conn_t *c)
{
    return c->reason;
}

size_t td_rpc_conn_write_queue(const td_rpc_conn_t *c)
{
    return c->write_queue + c->out.len;
}

void td_rpc_conn_set_data(td_rpc_conn_t *c, void *data)
{
    c->data = data;
}

void *td_rpc_conn_get_data(const td_rpc_conn_t *c)
{
    return c->data;
}

int td_rpc_server_set_secrets(td_rpc_server_t *s, const uint8_t *secret, size_t len,
                              const uint8_t *prev, size_t prev_len)
{
    if (!secret || !len)
        return td_err_set(TD_EAUTH, "no cluster secret: connections would all be refused");
    uint8_t *a = malloc(len), *b = prev && prev_len ? malloc(prev_len) : NULL;
    if (!a || (prev && prev_len && !b)) {
        free(a);
        free(b);
        return TD_ENOMEM;
    }
    memcpy(a, secret, len);
    if (b)
        memcpy(b, prev, prev_len);
    secrets_free(&s->cfg);
    s->cfg.secret = a;
    s->cfg.secret_prev = b;
    s->cfg.opts.secret = a;
    s->cfg.opts.secret_len = len;
    s->cfg.opts.secret_prev = b;
    s->cfg.opts.secret_prev_len = b ? prev_len : 0;
    return 0;
}
